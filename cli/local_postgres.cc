#include "cli/local_postgres.h"

#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/json_writer.h"
#include "common/postgres_install.h"

namespace loom::cli {

// local_cluster.cc
absl::StatusOr<int> SpawnDaemon(const std::vector<std::string>& args, const std::string& log_path);

namespace {

std::string AbsoluteHome(const std::string& home) {
  std::error_code ec;
  return std::filesystem::absolute(home, ec).lexically_normal().string();
}

// Under root: run as the postgres user (setpriv execs, so the pid stays).
std::vector<std::string> UserPrefix() {
  if (geteuid() != 0) return {};
  return {"setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", "--"};
}

}  // namespace

std::string LocalPostgresDir(const std::string& home) {
  const std::string abs = AbsoluteHome(home);
  if (geteuid() != 0) return abs + "/postgres";
  return absl::StrFormat("/var/lib/loom-local/%016x", std::hash<std::string>()(abs));
}

std::string LocalPostgresUrl(const std::string& home, const std::string& tcp_host) {
  if (!tcp_host.empty()) return absl::StrCat("postgresql://loom@", tcp_host, ":5432/loom");
  return absl::StrCat("postgresql://loom@/loom?host=", LocalPostgresDir(home), "&port=5432");
}

absl::Status RemoveLocalPostgres(const std::string& home) {
  const std::string dir = LocalPostgresDir(home);
  auto pidfile = ReadFile(dir + "/data/postmaster.pid");
  if (pidfile.ok()) {
    const int pid = std::atoi(pidfile->c_str());
    if (pid > 0 && kill(pid, 0) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("PostgreSQL (pid ", pid, ") still runs on ", dir));
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("removing ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<DaemonInfo> WaitLocalPostgres(const std::string& home, int pid,
                                             absl::Duration start_timeout) {
  const std::string dir = LocalPostgresDir(home);
  const std::string admin = absl::StrCat("postgresql://loom@/postgres?host=", dir, "&port=5432");
  const std::string log = home + "/logs/postgres.log";
  const absl::Time deadline = absl::Now() + start_timeout;
  while (PQping(admin.c_str()) != PQPING_OK) {
    if (kill(pid, 0) != 0) {
      return absl::InternalError(absl::StrCat("postgres exited during start-up; see ", log));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("postgres did not answer; see ", log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Database "loom", once.
  PGconn* conn = PQconnectdb(admin.c_str());
  absl::Status made = absl::OkStatus();
  if (PQstatus(conn) != CONNECTION_OK) {
    made = absl::UnavailableError(absl::StrCat("postgres: ", PQerrorMessage(conn)));
  } else {
    PGresult* has = PQexec(conn, "SELECT 1 FROM pg_database WHERE datname = 'loom';");
    const bool exists = PQresultStatus(has) == PGRES_TUPLES_OK && PQntuples(has) == 1;
    PQclear(has);
    if (!exists) {
      PGresult* created = PQexec(conn, "CREATE DATABASE loom;");
      if (PQresultStatus(created) != PGRES_COMMAND_OK) {
        made = absl::InternalError(absl::StrCat("CREATE DATABASE loom: ", PQerrorMessage(conn)));
      }
      PQclear(created);
    }
  }
  PQfinish(conn);
  if (!made.ok()) return made;
  DaemonInfo d;
  d.name = "postgres";
  d.pid = pid;
  d.alive = true;
  d.log_path = log;
  d.role = "database";
  absl::Status s = WritePrivateFile(
      home + "/run/postgres.json",
      [&] {
        JsonWriter w;
        w.BeginObject();
        w.Field("pid", static_cast<int>(pid));
        w.Field("role", "database");
        w.Field("socket_dir", dir);
        w.EndObject();
        return w.Finish();
      }());
  if (!s.ok()) return s;
  return d;
}

absl::StatusOr<DaemonInfo> StartLocalPostgres(const std::string& home, absl::Duration start_timeout,
                                              const std::vector<std::string>& prefix,
                                              const std::string& tcp_host) {
  const std::string bin = PostgresBinDir();
  if (bin.empty()) {
    return absl::FailedPreconditionError(
        "local up --ha needs a PostgreSQL server (/usr/lib/postgresql/*/bin/postgres): run "
        "./scripts/install-deps.sh (package postgresql)");
  }
  const std::string dir = LocalPostgresDir(home);
  if (geteuid() == 0) {
    // The postgres user passes through the parent, and only it enters dir.
    const std::string parent = dir.substr(0, dir.rfind('/'));
    if (absl::Status s = MakeDirs(parent, 0755); !s.ok()) return s;
    chmod(parent.c_str(), 0755);
  }
  if (absl::Status s = MakeDirs(dir, 0700); !s.ok()) return s;
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) {
      return absl::FailedPreconditionError(
          "running as root, PostgreSQL must run as another user, and there is no user "
          "`postgres` (install the postgresql package)");
    }
    if (chown(dir.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("chown ", dir, " to postgres"));
    }
  }
  const std::string log = home + "/logs/postgres.log";
  if (access((dir + "/data/PG_VERSION").c_str(), F_OK) != 0) {
    std::vector<std::string> initdb = UserPrefix();
    for (std::string a : {bin + "/initdb", std::string("-D"), dir + "/data", std::string("-U"),
                          std::string("loom"), std::string("--auth=trust"), std::string("-E"),
                          std::string("UTF8"), std::string("--locale=C")}) {
      initdb.push_back(std::move(a));
    }
    std::string cmd;
    for (const std::string& a : initdb) absl::StrAppend(&cmd, "'", a, "' ");
    absl::StrAppend(&cmd, ">> '", log, "' 2>&1");
    if (std::system(cmd.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("initdb failed; see ", log));
    }
  }
  // The namespace first (entering it takes root), then the user.
  std::vector<std::string> args = prefix;
  for (const std::string& a : UserPrefix()) args.push_back(a);
  for (std::string a : {bin + "/postgres", std::string("-D"), dir + "/data", std::string("-k"), dir,
                        std::string("-p"), std::string("5432"), std::string("-c"),
                        "listen_addresses=" + tcp_host}) {
    args.push_back(std::move(a));
  }
  // Over TCP, trust the superuser from tcp_host's /24 only (a lab network).
  if (!tcp_host.empty()) {
    const std::string hba = dir + "/data/pg_hba.conf";
    const std::string net = tcp_host.substr(0, tcp_host.rfind('.'));
    const std::string line = absl::StrCat("host all loom ", net, ".0/24 trust");
    auto text = ReadFile(hba);
    if (!text.ok()) return text.status();
    if (text->find(line) == std::string::npos) {
      if (absl::Status s = WriteFileAtomically(hba, absl::StrCat(*text, line, "\n"), 0600);
          !s.ok()) {
        return s;
      }
      if (geteuid() == 0) {
        const passwd* pw = getpwnam("postgres");
        if (pw == nullptr || chown(hba.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
          return absl::PermissionDeniedError("chown " + hba);
        }
      }
    }
  }
  if (absl::Status s = WritePrivateFile(home + "/run/postgres.args",
                                        absl::StrCat(absl::StrJoin(args, "\n"), "\n"));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<int> pid = SpawnDaemon(args, log);
  if (!pid.ok()) return pid.status();
  absl::StatusOr<DaemonInfo> ready = WaitLocalPostgres(home, *pid, start_timeout);
  if (!ready.ok()) kill(*pid, SIGKILL);
  return ready;
}

}  // namespace loom::cli
