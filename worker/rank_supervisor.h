// Runs each assigned rank as a child process, so that a rank that throws,
// aborts or is OOM-killed cannot take the worker daemon down. Reads the
// rank's stdout (one JSON-encoded loom.v1.RankEvent per line) and reports
// events and the exit (code, signal, last line of its log) through callbacks.
//
// Thread-safe. Each child has one reader thread, joined on exit or in the
// destructor (which kills remaining children).
#ifndef LOOM_WORKER_RANK_SUPERVISOR_H_
#define LOOM_WORKER_RANK_SUPERVISOR_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::worker {

struct RankExit {
  std::string job_id;
  int rank = 0;
  int64_t generation = 0;  // the job attempt the rank belonged to
  int exit_code = 0;  // meaningful when signal == 0
  int signal = 0;
  std::string reason;  // last non-empty line of the rank's log
  std::string log_path;
  // Where this attempt's output lies in log_path (which every attempt of the
  // rank on this worker appends to): [log_begin, log_end); -1 = unknown.
  int64_t log_begin = -1;
  int64_t log_end = -1;
  bool fenced = false;  // killed by KillAll (the worker's lease ran out)
};

struct RankSupervisorOptions {
  std::string rank_binary;     // path to loom-rank
  std::string work_dir;        // per-rank files go to <work_dir>/<job>/rank-<r>.*
  absl::Duration stop_grace = absl::Seconds(5);  // SIGTERM -> SIGKILL
  std::function<void(const std::string& job_id, int rank, int64_t generation,
                     const loom::v1::RankEvent&)>
      on_event;
  std::function<void(const RankExit&)> on_exit;
  // A rank started; its output goes to `log_path` from byte `log_begin` on.
  // Called with the supervisor's lock held: it must not call back into it.
  std::function<void(const std::string& job_id, int rank, int64_t generation,
                     const std::string& log_path, int64_t log_begin)>
      on_start;
  // Warm ranks: rank processes started ahead of need (`loom-rank --warm`)
  // that load LibTorch and then wait for an assignment, so that a restart,
  // a re-plan or a resume on this worker does not pay for process start-up
  // (about 1.5 s of a CPU rank's start here). Up to `warm_ranks` are kept,
  // started once a rank has started on this worker and none has for
  // `warm_after` (a gang's start is not slowed by them); one whose rank
  // binary has changed since is not used. Each costs the memory of an idle
  // process with LibTorch loaded. Their own output before an assignment
  // goes to <work_dir>/warm-ranks.log.
  int warm_ranks = 0;
  absl::Duration warm_after = absl::Seconds(20);
};

class RankSupervisor {
 public:
  explicit RankSupervisor(RankSupervisorOptions options);
  ~RankSupervisor();  // SIGKILLs remaining children and joins readers

  // Starts `argv_extra` appended to the rank binary's argv; `assignment_json`
  // is written to <work_dir>/<job>/rank-<r>.assignment.json and passed as
  // --assignment. ALREADY_EXISTS if that rank is already running here, or
  // already ran here in this generation.
  absl::Status Start(const std::string& job_id, int rank, int64_t generation,
                     const std::string& assignment_json);

  // SIGTERM to every rank of the job (generation > 0: only ranks of that
  // attempt or older), SIGKILL after stop_grace. Returns at once; exits
  // arrive through on_exit.
  void Stop(const std::string& job_id, int64_t generation = 0);
  // SIGUSR1 to every rank of the job (generation as for Stop): each saves
  // a checkpoint at its next step boundary and exits (checkpoint-then-
  // preempt, rank_exit.h). No SIGKILL follows; a later Stop still applies
  // its grace. Returns at once; exits arrive through on_exit.
  void SaveAndStop(const std::string& job_id, int64_t generation = 0);
  void StopAll();
  // SIGKILL to every rank now (a fence: no grace to write anything more).
  void KillAll();

  struct RunningRank {
    std::string job_id;
    int rank = 0;
    int64_t generation = 0;
  };
  std::vector<RunningRank> Running();
  // Warm ranks waiting for an assignment now.
  size_t WarmReady();
  // Ranks running, plus those that have exited and whose on_exit has not
  // returned yet (Running() no longer lists them): 0 once every exit so far
  // has been handed over.
  size_t Unsettled();

 private:
  struct Child {
    pid_t pid = -1;
    int64_t generation = 0;
    std::string log_path;
    int64_t log_begin = -1;
    std::thread reader;
    bool stopping = false;
    bool fenced = false;  // KillAll
    absl::Time stop_deadline;
  };
  struct Warm {
    pid_t pid = -1;
    int to_stdin = -1;     // where its assignment goes (a socket: no SIGPIPE)
    int from_stdout = -1;  // its events, once assigned
    std::string binary;    // BinaryIdentity() when it started
  };
  // Forks and execs `args` with `in_fd` (-1: /dev/null), `out_fd` and
  // `err_fd` as its standard streams, in its own process group, dying with
  // the worker. -1 and `*error` if the fork fails. Called with mu_ held.
  pid_t SpawnLocked(std::vector<std::string> args, int in_fd, int out_fd, int err_fd,
                    std::string* error);
  // The rank binary's device, inode, size and modification time.
  std::string BinaryIdentity() const;
  // A live warm rank of the current binary, if any (others are dropped).
  std::optional<Warm> TakeWarmLocked();
  // Kills a live warm rank (not yet reaped), reaps it and closes its ends.
  static void DropWarm(const Warm& w);
  // A warm rank started now, or nullopt if it could not be.
  std::optional<Warm> SpawnWarmLocked();
  // Reaps warm ranks that died; starts the missing ones when due (see
  // RankSupervisorOptions).
  void MaintainWarmLocked(absl::Time now);
  void ReadLoop(const std::string& job_id, int rank, int64_t generation, int fd, pid_t pid,
                std::string log_path);
  void Reap(const std::string& job_id, int rank, int64_t generation, pid_t pid,
            const std::string& log_path);
  void KillerLoop();

  const RankSupervisorOptions options_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, std::unique_ptr<Child>> children_;  // guarded by mu_
  // Reaped, on_exit not returned. Atomic, not under mu_: after on_exit the
  // reaping thread must not take mu_, since Start joins finished reading
  // threads while holding it.
  std::atomic<int> exits_in_callback_{0};
  std::vector<std::thread> finished_readers_;  // guarded by mu_; joined later
  // (job, rank, generation) of ranks that already ran here: a start sent
  // again (the controller re-sends unconfirmed starts) must not run twice.
  std::set<std::tuple<std::string, int, int64_t>> started_;  // guarded by mu_
  bool shutting_down_ = false;                 // guarded by mu_
  std::vector<Warm> warm_;                     // guarded by mu_
  absl::Time last_start_ = absl::InfinitePast();     // guarded by mu_
  absl::Time next_warm_try_ = absl::InfinitePast();  // guarded by mu_
  std::thread killer_;  // escalates SIGTERM to SIGKILL after the grace period
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_RANK_SUPERVISOR_H_
