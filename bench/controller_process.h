// A loom-controller child process for the benchmarks that start one
// (control_plane_bench.cc, console_bench.cc).
#ifndef LOOM_BENCH_CONTROLLER_PROCESS_H_
#define LOOM_BENCH_CONTROLLER_PROCESS_H_

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/local_cluster.h"

namespace loom::bench {

// The loom-controller child: started with its output to a log, killed
// (SIGKILL) and reaped when this goes out of scope unless Stop() ran. The
// child also dies with this process (PR_SET_PDEATHSIG).
class ControllerProcess {
 public:
  // `cpus`: the CPUs the controller may run on; nullptr = this process's.
  static absl::StatusOr<std::unique_ptr<ControllerProcess>> Start(
      const std::vector<std::string>& args, const std::string& log_path, const cpu_set_t* cpus) {
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) return absl::ResourceExhaustedError("fork failed");
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      if (cpus != nullptr && sched_setaffinity(0, sizeof(*cpus), cpus) != 0) _exit(126);
      FILE* log = std::freopen(log_path.c_str(), "w", stderr);
      if (log != nullptr) dup2(fileno(stderr), STDOUT_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return std::unique_ptr<ControllerProcess>(new ControllerProcess(pid));
  }
  ~ControllerProcess() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int pid() const { return pid_; }
  // Its ready file (--ready_file) once written, polled every 50 ms for at
  // most `seconds`; UNAVAILABLE when it exits first or the time runs out.
  absl::StatusOr<loom::cli::DaemonInfo> WaitReady(const std::string& ready_file, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    for (;;) {
      absl::StatusOr<loom::cli::DaemonInfo> info = loom::cli::ReadReadyFile(ready_file);
      if (info.ok()) return info;
      if (Exited()) return absl::UnavailableError("the controller exited before it was ready");
      if (std::chrono::steady_clock::now() >= deadline) return info.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  bool Exited() {
    if (!reaped_ && waitpid(pid_, nullptr, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  // SIGTERM, then SIGKILL after `grace`; reaps it.
  void Stop(std::chrono::milliseconds grace) {
    if (Exited()) return;
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (!Exited() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!Exited()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      reaped_ = true;
    }
  }

 private:
  explicit ControllerProcess(int pid) : pid_(pid) {}
  const int pid_;
  bool reaped_ = false;
};

}  // namespace loom::bench

#endif  // LOOM_BENCH_CONTROLLER_PROCESS_H_
