// A Jepsen-style run of active/standby controllers, shared by
// tests/failover_test.cc and `./bench/run.sh failover`.
//
// The cluster: `local up --ha` with every daemon in a network namespace of
// its own (tests/netns_lab.h): PostgreSQL in member 0 (over TCP), the two
// controllers in members 1 and 2, the workers after them, and the client
// (loomctl) in the last. Throughout, the client submits small two-rank jobs
// (gangs), some of priority class "high" that preempt the others
// (checkpoint first), and cancels some; the workers train them and report. Each
// cycle faults the controller that leads, one of:
//   kill       kill -9 (then `local restart` brings it back, a standby);
//   pause      SIGSTOP past the lease, SIGCONT once another leads;
//   partition  iptables DROP between it and the database (it keeps
//              reaching the workers), healed once another leads.
// and measures the failover: from the fault to the first request the new
// leader answers. Afterwards a checker reads the history (the client's
// acknowledgements, the daemons' logs) and the database (through the
// controller) and counts what must be zero. Needs root (namespaces).
// Bounded: `cycles` cycles, each waiting at most a minute for any state.
#ifndef LOOM_TESTS_FAILOVER_CLUSTER_H_
#define LOOM_TESTS_FAILOVER_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::testing {

struct FailoverOptions {
  std::string bin_dir;  // loomctl, loom-controller, loom-worker, loom-rank
  int cycles = 3;
  // Faults, taken in turn.
  std::vector<std::string> kinds = {"kill", "pause", "partition"};
  double lease_s = 2.0;
  int workers = 2;
  // Progress lines (may be empty).
  std::function<void(const std::string&)> log;
};

struct FailoverCycle {
  std::string kind;
  std::string from;  // the controller faulted
  std::string to;    // the one that took over
  double failover_seconds = 0;
};

struct FailoverResult {
  std::vector<FailoverCycle> cycles;
  double p50_seconds = 0, p99_seconds = 0, max_seconds = 0;
  // The checker's counts: what the issue requires to be zero.
  int double_scheduled_gangs = 0;  // one (job, attempt, rank) started twice
  // Acknowledged submissions, cancels, steps and checkpoints, and steps a
  // preemption lost.
  int lost_acked_writes = 0;
  int epochs_backwards = 0;        // a worker or the leaders' sequence going back
  // What was checked, for the report.
  int acked_submissions = 0, acked_cancels = 0, jobs_checked = 0, preemptions = 0;
  int64_t steps_checked = 0, checkpoints_checked = 0, gang_starts = 0;
  std::vector<int64_t> leader_epochs;  // in the order they led
  std::string checker_output;          // the checker's printout, one finding a line
  std::string one_failover;            // the event log of the first failover
};

absl::StatusOr<FailoverResult> RunFailoverCycles(const FailoverOptions& options);

}  // namespace loom::testing

#endif  // LOOM_TESTS_FAILOVER_CLUSTER_H_
