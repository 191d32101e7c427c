#include "worker/rank_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "worker/engine/openmp_wait.h"

namespace loom::worker {
namespace {

std::string LastLogLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    std::string t(absl::StripAsciiWhitespace(line));
    if (!t.empty()) last = t;
  }
  if (last.size() > 500) last = last.substr(last.size() - 500);
  return last;
}

}  // namespace

RankSupervisor::RankSupervisor(RankSupervisorOptions options) : options_(std::move(options)) {
  killer_ = std::thread([this] { KillerLoop(); });
}

RankSupervisor::~RankSupervisor() {
  std::vector<std::thread> readers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [key, child] : children_) kill(-child->pid, SIGKILL);
    for (const Warm& w : warm_) DropWarm(w);
    warm_.clear();
  }
  killer_.join();
  // Readers end when the killed children close their pipes.
  for (;;) {
    std::unique_ptr<Child> child;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (children_.empty()) break;
      // Take ownership so Reap does not find it; the reader still reaps.
      auto it = children_.begin();
      child = std::move(it->second);
      children_.erase(it);
    }
    if (child->reader.joinable()) child->reader.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : finished_readers_) {
    if (t.joinable()) t.join();
  }
}

pid_t RankSupervisor::SpawnLocked(std::vector<std::string> args, int in_fd, int out_fd, int err_fd,
                                  std::string* error) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The worker's environment, with the OpenMP wait policy a training
  // process wants (engine/openmp_wait.h) unless the operator chose one: the
  // rank would otherwise set it and exec itself again, loading LibTorch
  // twice (0.7-0.9 s of every rank's start on this project's machines).
  std::vector<std::string> env;
  bool policy_chosen = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view var(*e);
    policy_chosen |=
        absl::StartsWith(var, "OMP_WAIT_POLICY=") || absl::StartsWith(var, "GOMP_SPINCOUNT=");
    if (!absl::StartsWith(var, "LOOM_OPENMP_WAIT_SET=")) env.emplace_back(var);
  }
  if (!policy_chosen) {
    env.push_back(absl::StrCat("GOMP_SPINCOUNT=", engine::kTrainingSpinCount));
    env.push_back("LOOM_OPENMP_WAIT_SET=1");  // its log says Loom chose it
  }
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) {
    *error = absl::StrCat("fork: ", std::strerror(errno));
    return -1;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    setpgid(0, 0);  // its own group, so signals to the worker's group skip it
    // A rank never outlives its worker: if the daemon dies, so do its ranks.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    int in = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, STDIN_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "loom-worker: exec of the rank binary failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  return pid;
}

std::string RankSupervisor::BinaryIdentity() const {
  struct stat st {};
  if (stat(options_.rank_binary.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

std::optional<RankSupervisor::Warm> RankSupervisor::TakeWarmLocked() {
  const std::string binary = BinaryIdentity();
  while (!warm_.empty()) {
    Warm w = warm_.front();
    warm_.erase(warm_.begin());
    // Alive, and of the binary a cold start would run now.
    if (waitpid(w.pid, nullptr, WNOHANG) != 0) {  // ended, now reaped
      close(w.to_stdin);
      close(w.from_stdout);
      continue;
    }
    if (w.binary == binary) return w;
    DropWarm(w);
  }
  return std::nullopt;
}

void RankSupervisor::DropWarm(const Warm& w) {
  close(w.to_stdin);
  close(w.from_stdout);
  kill(w.pid, SIGKILL);
  while (waitpid(w.pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void RankSupervisor::MaintainWarmLocked(absl::Time now) {
  for (size_t i = 0; i < warm_.size();) {
    if (waitpid(warm_[i].pid, nullptr, WNOHANG) != 0) {
      // It ended (and is reaped) before any assignment: a binary that cannot
      // wait (one from before warm ranks), or a kill. Not again at once.
      close(warm_[i].to_stdin);
      close(warm_[i].from_stdout);
      warm_.erase(warm_.begin() + i);
      next_warm_try_ = now + std::max(options_.warm_after, absl::Seconds(10));
    } else {
      ++i;
    }
  }
  // Only where ranks run, and not while a gang starts: its ranks would share
  // the CPU with these ones' start.
  if (last_start_ == absl::InfinitePast() || now - last_start_ < options_.warm_after) return;
  if (now < next_warm_try_) return;
  while (static_cast<int>(warm_.size()) < options_.warm_ranks) {
    std::optional<Warm> w = SpawnWarmLocked();
    if (!w.has_value()) {
      next_warm_try_ = now + std::max(options_.warm_after, absl::Seconds(1));
      return;
    }
    warm_.push_back(*w);
  }
}

std::optional<RankSupervisor::Warm> RankSupervisor::SpawnWarmLocked() {
  int to_child[2], from_child[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_child) != 0) return std::nullopt;
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return std::nullopt;
  }
  (void)fcntl(from_child[1], F_SETPIPE_SZ, 1 << 20);  // as for a rank started cold
  (void)MakeDirs(options_.work_dir);
  const std::string log = absl::StrCat(options_.work_dir, "/warm-ranks.log");
  const int logfd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  std::string error;
  Warm w;
  w.binary = BinaryIdentity();
  w.pid = logfd < 0 ? -1
                    : SpawnLocked({options_.rank_binary, "--warm"}, to_child[1], from_child[1],
                                  logfd, &error);
  close(to_child[1]);
  close(from_child[1]);
  if (logfd >= 0) close(logfd);
  if (w.pid < 0) {
    close(to_child[0]);
    close(from_child[0]);
    return std::nullopt;
  }
  w.to_stdin = to_child[0];
  w.from_stdout = from_child[0];
  return w;
}

size_t RankSupervisor::WarmReady() {
  std::lock_guard<std::mutex> lock(mu_);
  return warm_.size();
}

absl::Status RankSupervisor::Start(const std::string& job_id, int rank, int64_t generation,
                                   const std::string& assignment_json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::UnavailableError("worker is shutting down");
  auto key = std::make_pair(job_id, rank);
  if (children_.count(key)) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " of ", job_id, " already runs here"));
  }
  if (!started_.insert({job_id, rank, generation}).second) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " of ", job_id, " attempt ",
                                                 generation, " already ran here"));
  }
  // Join readers of children that have finished.
  for (auto& t : finished_readers_) {
    if (t.joinable()) t.join();
  }
  finished_readers_.clear();

  std::string dir = absl::StrCat(options_.work_dir, "/", job_id);
  absl::Status made = MakeDirs(dir);
  if (!made.ok()) return made;
  std::string base = absl::StrCat(dir, "/rank-", rank);
  std::string assignment_path = base + ".assignment.json";
  std::string log_path = base + ".log";
  {
    std::ofstream out(assignment_path, std::ios::trunc);
    out << assignment_json;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", assignment_path));
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Room for ~1,000 step events (a JSON line each), so a worker that stalls
  // for a moment (a long disk write, a pause) does not stall its ranks'
  // training on a full pipe. Best effort: the default 64 KiB stays if the
  // system refuses (fs.pipe-max-size, or an unprivileged user's pipe quota).
  (void)fcntl(pipefd[1], F_SETPIPE_SZ, 1 << 20);
  int logfd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  // (O_APPEND: this attempt's output starts at the current end.)
  const int64_t log_begin = static_cast<int64_t>(lseek(logfd, 0, SEEK_END));
  pid_t pid = -1;
  int read_fd = -1;
  if (std::optional<Warm> warm = TakeWarmLocked()) {
    // A warm rank: LibTorch is loaded; it opens its log itself (appending,
    // from log_begin on) and reads the assignment.
    const std::string line = absl::StrCat(assignment_path, "\t", log_path, "\n");
    if (send(warm->to_stdin, line.data(), line.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(line.size())) {
      pid = warm->pid;
      read_fd = warm->from_stdout;
    } else {  // it died meanwhile: a cold start instead
      close(warm->from_stdout);
      kill(warm->pid, SIGKILL);
      waitpid(warm->pid, nullptr, 0);
    }
    close(warm->to_stdin);
  }
  if (pid >= 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    close(logfd);
  } else {
    std::string error;
    pid = SpawnLocked({options_.rank_binary, "--assignment", assignment_path}, -1, pipefd[1], logfd,
                      &error);
    close(pipefd[1]);
    close(logfd);
    if (pid < 0) {
      close(pipefd[0]);
      return absl::ResourceExhaustedError(error);
    }
    read_fd = pipefd[0];
  }
  last_start_ = absl::Now();
  auto child = std::make_unique<Child>();
  child->pid = pid;
  child->generation = generation;
  child->log_path = log_path;
  child->log_begin = log_begin;
  child->reader = std::thread([this, job_id, rank, generation, read_fd, pid, log_path] {
    ReadLoop(job_id, rank, generation, read_fd, pid, log_path);
  });
  children_[key] = std::move(child);
  if (options_.on_start) options_.on_start(job_id, rank, generation, log_path, log_begin);
  return absl::OkStatus();
}

void RankSupervisor::ReadLoop(const std::string& job_id, int rank, int64_t generation, int fd,
                              pid_t pid, std::string log_path) {
  std::string buf;
  char chunk[4096];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line.empty()) continue;
      loom::v1::RankEvent event;
      if (google::protobuf::util::JsonStringToMessage(line, &event).ok()) {
        if (options_.on_event) options_.on_event(job_id, rank, generation, event);
      }
      // Lines that are not events are ignored: a rank's own logging goes to
      // stderr, which is its log file.
    }
  }
  close(fd);
  Reap(job_id, rank, generation, pid, log_path);
}

void RankSupervisor::Reap(const std::string& job_id, int rank, int64_t generation, pid_t pid,
                          const std::string& log_path) {
  int wstatus = 0;
  int rc;
  while ((rc = waitpid(pid, &wstatus, 0)) < 0 && errno == EINTR) {
  }
  RankExit exit;
  exit.job_id = job_id;
  exit.rank = rank;
  exit.generation = generation;
  exit.log_path = log_path;
  if (rc < 0) {
    // Never report an unknown end as success.
    exit.exit_code = 255;
    exit.reason = absl::StrCat("could not collect the rank's exit status: ", std::strerror(errno));
    if (options_.on_exit) options_.on_exit(exit);
    return;
  } else if (WIFSIGNALED(wstatus)) {
    exit.signal = WTERMSIG(wstatus);
    exit.exit_code = 128 + exit.signal;
  } else {
    exit.exit_code = WEXITSTATUS(wstatus);
  }
  exit.reason = LastLogLine(log_path);
  struct stat log_stat;
  if (stat(log_path.c_str(), &log_stat) == 0) exit.log_end = static_cast<int64_t>(log_stat.st_size);
  if (exit.signal == SIGKILL && exit.reason.empty()) {
    exit.reason = "killed (SIGKILL: out of memory, or stopped after the grace period)";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = children_.find({job_id, rank});
    if (it != children_.end() && it->second->pid == pid) {
      exit.fenced = it->second->fenced;
      exit.log_begin = it->second->log_begin;
      finished_readers_.push_back(std::move(it->second->reader));
      children_.erase(it);
    }
    ++exits_in_callback_;
  }
  if (exit.fenced) {
    exit.reason = "killed by its worker: the worker's lease with the controller ran out";
  }
  if (options_.on_exit) options_.on_exit(exit);
  --exits_in_callback_;
}

size_t RankSupervisor::Unsettled() {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size() + static_cast<size_t>(exits_in_callback_.load());
}

void RankSupervisor::Stop(const std::string& job_id, int64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, child] : children_) {
    if (key.first != job_id || child->stopping) continue;
    if (generation > 0 && child->generation > generation) continue;
    child->stopping = true;
    child->stop_deadline = absl::Now() + options_.stop_grace;
    kill(-child->pid, SIGTERM);  // the rank leads its own process group
  }
}

void RankSupervisor::SaveAndStop(const std::string& job_id, int64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, child] : children_) {
    if (key.first != job_id || child->stopping) continue;
    if (generation > 0 && child->generation > generation) continue;
    kill(-child->pid, SIGUSR1);
  }
}

void RankSupervisor::StopAll() {
  std::vector<std::string> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, child] : children_) jobs.push_back(key.first);
  }
  for (const auto& j : jobs) Stop(j);
}

void RankSupervisor::KillAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, child] : children_) {
    child->stopping = true;
    child->fenced = true;
    child->stop_deadline = absl::InfiniteFuture();
    kill(-child->pid, SIGKILL);
  }
}

std::vector<RankSupervisor::RunningRank> RankSupervisor::Running() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RunningRank> out;
  for (auto& [key, child] : children_) out.push_back({key.first, key.second, child->generation});
  return out;
}

void RankSupervisor::KillerLoop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) return;
      absl::Time now = absl::Now();
      for (auto& [key, child] : children_) {
        if (child->stopping && now >= child->stop_deadline) {
          kill(-child->pid, SIGKILL);
          child->stop_deadline = absl::InfiniteFuture();
        }
      }
      if (options_.warm_ranks > 0) MaintainWarmLocked(now);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace loom::worker
