#include "cli/local_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/cluster_ca.h"
#include "cli/local_postgres.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "controller/service/access.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace loom::cli {
namespace {

// A run file's pid is ours only while that process is a Loom daemon: after
// a reboot or crash the number may belong to anything else.
bool ProcessExists(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

bool Alive(int pid) {
  if (!ProcessExists(pid)) return false;
  auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  return cmdline.ok() && (cmdline->find("loom-") != std::string::npos ||
                          cmdline->find("postgres") != std::string::npos);
}

// Starts `argv` detached (own session, stdio to `log_path`), returns its pid.
absl::StatusOr<int> Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  int logfd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) return absl::PermissionDeniedError(absl::StrCat(log_path, ": ", strerror(errno)));
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Double fork so the daemon is re-parented to init and never becomes a
  // zombie of this short-lived CLI.
  int pidpipe[2];
  if (pipe2(pidpipe, O_CLOEXEC) != 0) {
    close(logfd);
    return absl::InternalError("pipe failed");
  }
  pid_t first = fork();
  if (first < 0) {
    close(logfd);
    close(pidpipe[0]);
    close(pidpipe[1]);
    return absl::ResourceExhaustedError("fork failed");
  }
  if (first == 0) {
    setsid();
    pid_t second = fork();
    if (second != 0) {
      (void)!write(pidpipe[1], &second, sizeof(second));
      _exit(second > 0 ? 0 : 1);
    }
    dup2(logfd, STDOUT_FILENO);
    dup2(logfd, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execvp(argv[0], argv.data());  // a prefix such as "ip netns exec" is found on PATH
    const char msg[] = "loomctl: exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(pidpipe[1]);
  close(logfd);
  pid_t daemon = -1;
  ssize_t n = read(pidpipe[0], &daemon, sizeof(daemon));
  close(pidpipe[0]);
  waitpid(first, nullptr, 0);
  if (n != sizeof(daemon) || daemon <= 0) return absl::InternalError("could not start " + args[0]);
  return static_cast<int>(daemon);
}

std::string Str(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

std::string LastLines(const std::string& path, int n) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text->size()) {
    size_t nl = text->find('\n', start);
    if (nl == std::string::npos) nl = text->size();
    lines.push_back(text->substr(start, nl - start));
    start = nl + 1;
  }
  std::string out;
  for (size_t i = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0; i < lines.size(); ++i) {
    out += "\n    " + lines[i];
  }
  return out;
}

absl::StatusOr<DaemonInfo> WaitReady(const std::string& path, int pid, const std::string& log,
                                     absl::Time deadline) {
  while (absl::Now() < deadline) {
    auto info = ReadReadyFile(path);
    if (info.ok()) return info;
    if (!ProcessExists(pid)) {  // (it may not have exec'd its binary yet)
      return absl::InternalError(absl::StrCat("daemon exited during start-up; log ", log, ":",
                                              LastLines(log, 5)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("daemon did not become ready; see ", log));
}

}  // namespace

absl::StatusOr<int> SpawnDaemon(const std::vector<std::string>& args, const std::string& log_path) {
  return Spawn(args, log_path);
}

static absl::Status WriteArgs(const std::string& home, const std::string& name,
                       const std::vector<std::string>& args) {
  return WritePrivateFile(absl::StrCat(home, "/run/", name, ".args"),
                          absl::StrCat(absl::StrJoin(args, "\n"), "\n"));
}

absl::StatusOr<DaemonInfo> LocalRestart(const std::string& home, const std::string& name,
                                        bool kill_first, absl::Duration grace,
                                        absl::Duration start_timeout) {
  const std::string args_path = absl::StrCat(home, "/run/", name, ".args");
  auto text = ReadFile(args_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "no daemon \"", name, "\" in the local cluster under ", home,
        " (expected controller or worker-<i>; is it up?)"));
  }
  std::vector<std::string> args = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  if (args.empty()) return absl::DataLossError(absl::StrCat(args_path, ": empty"));
  const std::string ready = absl::StrCat(home, "/run/", name, ".json");
  DaemonInfo old;
  if (auto info = ReadReadyFile(ready); info.ok()) old = *info;
  if (old.pid > 0 && Alive(old.pid)) {
    kill(old.pid, kill_first ? SIGKILL : SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    while (Alive(old.pid) && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (Alive(old.pid)) kill(old.pid, SIGKILL);
    // Gone before its successor starts (the store's lock, the port).
    const absl::Time killed = absl::Now() + absl::Seconds(5);
    while (Alive(old.pid) && absl::Now() < killed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  unlink(ready.c_str());  // the new daemon writes its own
  DaemonInfo d;
  d.name = name;
  d.log_path = absl::StrCat(home, "/logs/", name, ".log");
  auto pid = Spawn(args, d.log_path);
  if (!pid.ok()) return pid.status();
  if (name == "postgres") return WaitLocalPostgres(home, *pid, start_timeout);
  auto info = WaitReady(ready, *pid, d.log_path, absl::Now() + start_timeout);
  if (!info.ok()) {
    kill(*pid, SIGKILL);
    return absl::Status(info.status().code(), absl::StrCat(name, ": ", info.status().message()));
  }
  d.pid = info->pid;
  d.alive = true;
  d.grpc_address = info->grpc_address;
  d.metrics_address = info->metrics_address;
  return d;
}

absl::StatusOr<DaemonInfo> ReadReadyFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  google::protobuf::Struct s;
  auto st = google::protobuf::util::JsonStringToMessage(*text, &s);
  if (!st.ok()) return absl::DataLossError(absl::StrCat(path, ": ", st.ToString()));
  DaemonInfo info;
  info.grpc_address = Str(s, "grpc_address");
  info.metrics_address = Str(s, "metrics_address");
  info.console_url = Str(s, "console_url");
  info.role = Str(s, "role");
  auto it = s.fields().find("pid");
  if (it != s.fields().end()) info.pid = static_cast<int>(it->second.number_value());
  info.alive = Alive(info.pid);
  return info;
}

absl::StatusOr<std::vector<DaemonInfo>> LocalUp(const LocalClusterOptions& o) {
  if (o.workers < 1) return absl::InvalidArgumentError("--workers: must be >= 1");
  for (const auto& d : LocalStatus(o.home)) {
    if (d.alive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a local cluster is already up under ", o.home, " (", d.name, " pid ", d.pid,
          "); run `loomctl local down` first"));
    }
  }
  for (const char* sub :
       {"", "/run", "/logs", "/controller", "/controller/checkpoints", "/workers"}) {
    absl::Status s = MakeDirs(o.home + sub, 0700);
    if (!s.ok()) return s;
  }
  // Old run files describe dead daemons.
  if (DIR* d = opendir((o.home + "/run").c_str())) {
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".json") || absl::EndsWith(e->d_name, ".args")) {
        unlink((o.home + "/run/" + e->d_name).c_str());
      }
    }
    closedir(d);
  }
  // Credentials (controller/service/access.h): the local user's token, listed as an
  // admin in the users file; the workers' own token; and the cluster CA
  // with the controller's server certificate and one client certificate
  // per worker, so that everything speaks TLS and workers prove their node.
  auto ensure_token = [](const std::string& path) -> absl::StatusOr<std::string> {
    if (access(path.c_str(), F_OK) != 0) {
      auto token = GenerateToken();
      if (!token.ok()) return token.status();
      absl::Status s = WritePrivateFile(path, *token + "\n");
      if (!s.ok()) return s;
    }
    return ReadTokenFile(path);
  };
  std::string token_path = o.home + "/token";
  auto user_token = ensure_token(token_path);
  if (!user_token.ok()) return user_token.status();
  const std::string worker_token_path = o.home + "/worker-token";
  auto worker_token = ensure_token(worker_token_path);
  if (!worker_token.ok()) return worker_token.status();
  if (*worker_token == *user_token) {
    return absl::FailedPreconditionError(absl::StrCat(
        worker_token_path, " holds the same token as ", token_path,
        ": workers and people must not share one; delete ", worker_token_path));
  }
  const std::string users_path = o.home + "/users";
  if (access(users_path.c_str(), F_OK) != 0) {
    absl::Status s = WritePrivateFile(
        users_path, "# loomctl local up: <name> <reader|user|admin> sha256:<token hash>\n" +
                        controller::UsersFileLine("local", controller::Role::kAdmin, *user_token));
    if (!s.ok()) return s;
  }
  const std::string tls_dir = o.home + "/tls";
  if (absl::Status s = EnsureClusterCa(tls_dir); !s.ok()) return s;
  std::vector<std::string> controller_hosts = {"127.0.0.1", "localhost"};
  if (o.controller_host != "127.0.0.1" && o.controller_host != "localhost") {
    controller_hosts.push_back(o.controller_host);
  }
  for (const std::string& host : o.ha_controller_host) controller_hosts.push_back(host);
  auto server_cert = IssueCertificate(tls_dir, "controller", "loom-controller", /*server=*/true,
                                      controller_hosts);
  if (!server_cert.ok()) return server_cert.status();
  // The local user may also prove itself with a certificate instead of the
  // token (loomctl --tls-cert <home>/tls/user-local.pem --tls-key ...).
  auto user_cert = IssueCertificate(tls_dir, "user-local", "user:local", /*server=*/false);
  if (!user_cert.ok()) return user_cert.status();
  std::vector<DaemonInfo> out;
  std::error_code ec;
  const std::string home = std::filesystem::absolute(o.home, ec).string();
  std::vector<std::string> data_roots = o.data_roots;
  if (data_roots.empty()) {
    data_roots.push_back(home);
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) data_roots.push_back(cwd);
  }

  // --ha (or --store postgres): the database first, then the controllers.
  std::string store_url;
  if (o.ha || o.postgres) {
    auto db = StartLocalPostgres(o.home, o.start_timeout, o.postgres_prefix, o.postgres_host);
    if (!db.ok()) {
      return absl::Status(db.status().code(), absl::StrCat("postgres: ", db.status().message()));
    }
    out.push_back(*db);
    store_url = LocalPostgresUrl(o.home, o.postgres_host);
  }
  std::vector<std::string> controller_addresses;
  const int controllers = o.ha ? 2 : 1;
  for (int c = 0; c < controllers; ++c) {
    DaemonInfo ctl;
    ctl.name = o.ha ? absl::StrCat("controller-", c) : "controller";
    ctl.log_path = absl::StrCat(o.home, "/logs/", ctl.name, ".log");
    const std::string ready = absl::StrCat(o.home, "/run/", ctl.name, ".json");
    const std::string data_dir = absl::StrCat(o.home, "/", ctl.name);
    if (absl::Status s = MakeDirs(data_dir, 0700); !s.ok()) return s;
    std::vector<std::string> ctl_args = static_cast<size_t>(c) < o.ha_controller_prefix.size()
                                            ? o.ha_controller_prefix[c]
                                            : o.controller_prefix;
    const std::string host = static_cast<size_t>(c) < o.ha_controller_host.size()
                                 ? o.ha_controller_host[c]
                                 : o.controller_host;
    const size_t listen_arg = ctl_args.size() + 1;
    for (std::string arg : std::vector<std::string>{
             o.bin_dir + "/loom-controller", "--listen=" + host + ":0", "--data_dir=" + data_dir,
             "--users_file=" + users_path, "--worker_token_file=" + worker_token_path,
             "--tls_cert=" + server_cert->cert_path, "--tls_key=" + server_cert->key_path,
             "--tls_client_ca=" + tls_dir + "/ca.pem", "--ready_file=" + ready,
             "--metrics_listen=127.0.0.1:0",
             absl::StrCat("--worker_timeout_s=", o.worker_timeout_s)}) {
      ctl_args.push_back(std::move(arg));
    }
    // Loom Console on a free port of the controller's host (HTTPS with its
    // certificate); a restart keeps the port, as it keeps --listen's.
    const size_t console_arg = ctl_args.size();
    ctl_args.push_back("--console_port=0");
    if (!o.queues_file.empty()) ctl_args.push_back("--queues=" + o.queues_file);
    if (!store_url.empty()) ctl_args.push_back("--store=" + store_url);
    for (const std::string& flag : o.controller_flags) ctl_args.push_back(flag);
    ctl_args.push_back("--data_root=" + absl::StrJoin(data_roots, ","));
    // One checkpoint root for every controller (with --ha the catalog they
    // share names paths under it).
    ctl_args.push_back(
        absl::StrCat("--checkpoint_root=", home, "/controller/checkpoints,", home, "/checkpoints"));
    auto pid = Spawn(ctl_args, ctl.log_path);
    if (!pid.ok()) {
      LocalDown(o.home).IgnoreError();
      return pid.status();
    }
    auto ready_info = WaitReady(ready, *pid, ctl.log_path, absl::Now() + o.start_timeout);
    if (!ready_info.ok()) {
      kill(*pid, SIGKILL);
      LocalDown(o.home).IgnoreError();
      return absl::Status(ready_info.status().code(),
                          absl::StrCat(ctl.name, ": ", ready_info.status().message()));
    }
    ctl.pid = ready_info->pid;
    ctl.alive = true;
    ctl.grpc_address = ready_info->grpc_address;
    ctl.role = ready_info->role;
    // A restarted controller listens where this one does, so the workers
    // (given this address) find it again.
    ctl_args[listen_arg] = "--listen=" + ctl.grpc_address;
    ctl.console_url = ready_info->console_url;
    if (const size_t colon = ctl.console_url.rfind(':'); colon != std::string::npos) {
      ctl_args[console_arg] = "--console_port=" + ctl.console_url.substr(colon + 1);
    }
    if (absl::Status s = WriteArgs(o.home, ctl.name, ctl_args); !s.ok()) {
      kill(*pid, SIGKILL);
      LocalDown(o.home).IgnoreError();
      return s;
    }
    ctl.metrics_address = ready_info->metrics_address;
    controller_addresses.push_back(ctl.grpc_address);
    out.push_back(ctl);
    if (o.ha && c == 0) {
      // The first leads before the second starts (`local status` then
      // shows controller-0 active): it takes the lease within a second.
      const absl::Time deadline = absl::Now() + o.start_timeout;
      while (absl::Now() < deadline) {
        auto info = ReadReadyFile(ready);
        if (info.ok() && info->role == "active") {
          out.back().role = "active";
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  const std::string controller_flag = absl::StrJoin(controller_addresses, ",");

  const std::string snapshot_root = LocalSnapshotRoot(o.home);
  for (int i = 0; i < o.workers; ++i) {
    DaemonInfo w;
    w.name = absl::StrCat("worker-", i);
    w.log_path = absl::StrCat(o.home, "/logs/", w.name, ".log");
    std::string wready = absl::StrCat(o.home, "/run/", w.name, ".json");
    std::string work = absl::StrCat(o.home, "/workers/", i);
    MakeDirs(work).IgnoreError();
    std::remove((work + "/notice").c_str());  // an old cluster's notice is not this one's
    std::vector<std::string> worker_args;
    if (static_cast<size_t>(i) < o.worker_prefix.size()) worker_args = o.worker_prefix[i];
    const std::string address = static_cast<size_t>(i) < o.worker_address.size()
                                    ? o.worker_address[i]
                                    : std::string("127.0.0.1");
    const std::string node = absl::StrCat("local-", i);
    auto client_cert = IssueCertificate(tls_dir, "worker-" + node, "worker:" + node,
                                        /*server=*/false);
    if (!client_cert.ok()) {
      LocalDown(o.home).IgnoreError();
      return client_cert.status();
    }
    for (std::string arg : std::vector<std::string>{
             o.bin_dir + "/loom-worker", "--controller=" + controller_flag, "--tls",
             // The certificate directory, as on Kubernetes (the loom-worker-tls
             // Secret): the worker picks worker-<node>.pem/.key from it.
             "--tls_ca=" + tls_dir + "/ca.pem", "--tls_cert_dir=" + tls_dir, "--node=" + node,
             "--address=" + address, absl::StrCat("--slots=", o.slots_per_worker),
             absl::StrCat("--memory_bytes=", o.memory_bytes_per_worker),
             absl::StrCat("--warm_ranks=", o.warm_ranks), "--gpus=" + o.gpus_per_worker,
             // Each worker's "node memory" of its own: a node lost is a
             // directory wiped (LocalSnapshotRoot, under /dev/shm).
             "--snapshot_dir=" + (snapshot_root.empty()
                                      ? std::string()
                                      : absl::StrCat(snapshot_root, "/worker-", i)),
             "--work_dir=" + work, "--ready_file=" + wready, "--metrics_listen=127.0.0.1:0",
             // `touch <home>/workers/N/notice` says the node is going away.
             "--notice_file=" + work + "/notice"}) {
      worker_args.push_back(std::move(arg));
    }
    if (!o.notice_url.empty()) {
      worker_args.push_back("--notice_url=" +
                            absl::StrReplaceAll(o.notice_url, {{"{node}", node}}));
    }
    if (absl::Status s = WriteArgs(o.home, w.name, worker_args); !s.ok()) {
      LocalDown(o.home).IgnoreError();
      return s;
    }
    auto wpid = Spawn(worker_args, w.log_path);
    if (!wpid.ok()) {
      LocalDown(o.home).IgnoreError();
      return wpid.status();
    }
    // Each daemon has start_timeout of its own: workers start one after
    // another (their CPU probes would disturb each other), and on a loaded
    // host the first ones' probes took most of a shared budget.
    auto winfo = WaitReady(wready, *wpid, w.log_path, absl::Now() + o.start_timeout);
    if (!winfo.ok()) {
      kill(*wpid, SIGKILL);
      LocalDown(o.home).IgnoreError();
      return absl::Status(winfo.status().code(),
                          absl::StrCat(w.name, ": ", winfo.status().message()));
    }
    w.pid = winfo->pid;
    w.alive = true;
    w.metrics_address = winfo->metrics_address;
    out.push_back(w);
  }
  return out;
}

std::vector<DaemonInfo> LocalStatus(const std::string& home) {
  std::vector<DaemonInfo> out;
  std::vector<std::string> names;
  if (DIR* d = opendir((home + "/run").c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (absl::EndsWith(n, ".json")) names.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    auto info = ReadReadyFile(home + "/run/" + n + ".json");
    if (!info.ok()) continue;
    info->name = n;
    info->log_path = home + "/logs/" + n + ".log";
    if (!info->alive && !info->role.empty()) info->role = "down";
    out.push_back(*info);
  }
  return out;
}

std::string LocalSnapshotRoot(const std::string& home) {
  std::error_code ec;
  if (!std::filesystem::is_directory("/dev/shm", ec)) return "";
  return absl::StrCat(
      "/dev/shm/loom-local-", getuid(), "-",
      absl::Hex(std::hash<std::string>()(std::filesystem::absolute(home).string())));
}

absl::Status LocalDown(const std::string& home, absl::Duration grace) {
  auto daemons = LocalStatus(home);
  // Workers first, so their ranks stop before the controllers go; the
  // database last, once no controller writes to it.
  auto stage = [](const DaemonInfo& d) {
    if (d.name == "postgres") return 2;
    return absl::StartsWith(d.name, "controller") ? 1 : 0;
  };
  for (int s = 0; s <= 2; ++s) {
    for (const auto& d : daemons) {
      // PostgreSQL: SIGINT is its fast shutdown (SIGTERM waits for clients).
      if (stage(d) == s && d.alive) kill(d.pid, d.name == "postgres" ? SIGINT : SIGTERM);
    }
    absl::Time deadline = absl::Now() + grace;
    for (const auto& d : daemons) {
      if (stage(d) != s) continue;
      while (Alive(d.pid) && absl::Now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (Alive(d.pid)) kill(d.pid, SIGKILL);
      unlink((home + "/run/" + d.name + ".json").c_str());
    }
  }
  // The workers' in-memory snapshots (host memory, not the home).
  if (const std::string snapshots = LocalSnapshotRoot(home); !snapshots.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(snapshots, ec);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> LocalControllerChannel(
    const std::string& home, const std::string& address, const grpc::ChannelArguments& args) {
  auto creds = MakeChannelCredentials(/*use_tls=*/true, home + "/tls/ca.pem");
  if (!creds.ok()) return creds.status();
  return grpc::CreateCustomChannel(address, *creds, args);
}

}  // namespace loom::cli
