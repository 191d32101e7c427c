#include "controller/store/postgres_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/postgres_install.h"

namespace loom::controller::store {
namespace {

int FreeLoopbackPort(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  addr.sin_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

// Forks and execs argv as uid/gid (when non-zero), output to `log`; the
// child gets SIGQUIT when this process dies.
pid_t Spawn(const std::vector<std::string>& argv, uid_t uid, gid_t gid, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);  // a terminal's ^C goes to the test, which stops us
  if (uid != 0) {
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
  }
  prctl(PR_SET_PDEATHSIG, SIGQUIT);  // after setuid, which clears it
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  execv(args[0], args.data());
  _exit(127);
}

void RemoveTree(const std::string& path) {
  const std::string cmd = absl::StrCat("rm -rf '", path, "'");
  if (std::system(cmd.c_str()) != 0) {
    // Best effort: a temporary directory left behind is not a failure.
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostgresTestServer>> PostgresTestServer::Start(Options options) {
  std::unique_ptr<PostgresTestServer> server(new PostgresTestServer());
  server->options_ = std::move(options);
  server->bindir_ = PostgresBinDir();
  if (server->bindir_.empty()) {
    return absl::FailedPreconditionError(
        "no PostgreSQL server under /usr/lib/postgresql/*/bin: run ./scripts/install-deps.sh "
        "(package postgresql), or point LOOM_PG_BINDIR at one");
  }
  char tmpl[] = "/tmp/loom_pg_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  server->dir_ = tmpl;
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) pw = getpwnam("nobody");
    if (pw == nullptr)
      return absl::FailedPreconditionError("running as root, and no user postgres");
    server->uid_ = pw->pw_uid;
    server->gid_ = pw->pw_gid;
    if (chown(server->dir_.c_str(), server->uid_, server->gid_) != 0) {
      return absl::InternalError(absl::StrCat("chown ", server->dir_));
    }
  }
  const std::string log = server->dir_ + "/initdb.log";
  const pid_t initdb = Spawn({server->bindir_ + "/initdb", "-D", server->dir_ + "/data", "-U",
                              "loom", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"},
                             server->uid_, server->gid_, log);
  int status = 0;
  if (initdb < 0 || waitpid(initdb, &status, 0) != initdb || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("initdb failed: ", Tail(log)));
  }
  server->port_ =
      server->options_.tcp_address.empty() ? 5432 : FreeLoopbackPort(server->options_.tcp_address);
  if (server->port_ == 0) return absl::InternalError("no free loopback port");
  if (absl::Status s = server->Launch(); !s.ok()) return s;
  if (absl::Status s = server->CreateDatabase("loom"); !s.ok()) return s;
  return server;
}

absl::Status PostgresTestServer::Launch() {
  std::vector<std::string> argv = {bindir_ + "/postgres",
                                   "-D",
                                   dir_ + "/data",
                                   "-k",
                                   dir_,
                                   "-p",
                                   std::to_string(port_),
                                   "-c",
                                   absl::StrCat("listen_addresses=", options_.tcp_address),
                                   "-c",
                                   absl::StrCat("fsync=", options_.fsync ? "on" : "off"),
                                   "-c",
                                   "max_connections=200",
                                   "-c",
                                   "shared_buffers=32MB"};
  for (const std::string& setting : options_.settings) {
    argv.push_back("-c");
    argv.push_back(setting);
  }
  pid_ = Spawn(argv, uid_, gid_, dir_ + "/server.log");
  if (pid_ < 0) return absl::InternalError("fork failed");
  return WaitReady();
}

absl::Status PostgresTestServer::WaitReady() {
  const std::string url = SocketUrl("postgres");
  // Bounded: a server that is not up in 60 s will not come up.
  for (int i = 0; i < 600; ++i) {
    if (PQping(url.c_str()) == PQPING_OK) return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat("postgres exited at start: ", Tail(dir_ + "/server.log")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("postgres not ready after 60 s: ", Tail(dir_ + "/server.log")));
}

PostgresTestServer::~PostgresTestServer() {
  if (pid_ > 0) {
    kill(pid_, SIGQUIT);  // immediate shutdown: nothing here needs a clean one
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (!dir_.empty()) RemoveTree(dir_);
}

absl::Status PostgresTestServer::Kill() {
  if (pid_ <= 0) return absl::FailedPreconditionError("postgres is not running");
  // The whole server, as a crash takes it: the postmaster and its backends
  // (its process group). A backend orphaned by its postmaster's death goes
  // on serving its connection until it notices, so killing the postmaster
  // alone let a write through "while the server was down".
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return absl::OkStatus();
}

absl::Status PostgresTestServer::Restart() {
  // The killed server's backends linger a moment; a new server refuses to
  // start while they hold its shared memory. A few tries, a second apart.
  absl::Status s;
  for (int attempt = 0; attempt < 10; ++attempt) {
    s = Launch();
    if (s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return s;
}

absl::Status PostgresTestServer::CreateDatabase(const std::string& name) {
  PGconn* conn = PQconnectdb(SocketUrl("postgres").c_str());
  absl::Status s = absl::OkStatus();
  if (PQstatus(conn) != CONNECTION_OK) {
    s = absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn)));
  } else {
    PGresult* res = PQexec(conn, absl::StrCat("CREATE DATABASE \"", name, "\";").c_str());
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      s = absl::InternalError(absl::StrCat("CREATE DATABASE ", name, ": ", PQerrorMessage(conn)));
    }
    PQclear(res);
  }
  PQfinish(conn);
  return s;
}

std::string PostgresTestServer::SocketUrl(const std::string& database) const {
  return absl::StrCat("postgresql://loom@/", database, "?host=", dir_, "&port=", port_);
}

std::string PostgresTestServer::TcpUrl(const std::string& database) const {
  if (options_.tcp_address.empty()) return "";
  return absl::StrCat("postgresql://loom@", options_.tcp_address, ":", port_, "/", database);
}

}  // namespace loom::controller::store
