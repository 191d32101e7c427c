// The controller's queues: who may use how much of the cluster,
// who lends to whom, and how preemption behaves. Parsed from a YAML file the
// controller reads at start-up (and again on SIGHUP):
//
//   fair_share:
//     half_life_seconds: 3600       # decay of past usage; > 0 (default 1 h)
//   preemption:
//     grace_seconds: 30             # save-then-stop grace; >= 0 (default 30)
//     min_run_time_seconds: 300     # a job preempted before is not preempted
//                                   # again until it has run this long (300)
//   priority_classes:               # name -> integer; higher runs first
//     low: 0
//     urgent: 1000
//   queues:
//     - name: research              # 1-63 of [a-z0-9-], unique
//       cohort: shared              # queues of one cohort lend each other
//                                   # their unused nominal quota
//       nominal_quota: {slots: 16, gpus: 8}   # each omitted: unlimited
//       borrowing_limit: {slots: 8}           # beyond nominal; cohort only;
//                                             # each omitted: unlimited
//       weight: 1                   # fair-share weight; > 0 (default 1)
//       preemption: true            # higher priority preempts lower within
//                                   # this queue (default true)
//       submit_roles: [admin]       # who may submit: user, admin (default
//                                   # both)
//
// A queue named `default` always exists: when the file does not define it,
// it is added with unlimited quota, weight 1, no cohort, preemption on, so a
// controller without a queue file schedules as before plus priorities.
//
// Every error is INVALID_ARGUMENT naming the field path, e.g.
// "queues[2].nominal_quota.slots: must be >= 0, got -1". Unknown and
// repeated keys are errors.
//
// Plain values; thread-compatible.
#ifndef LOOM_CONTROLLER_SCHEDULING_QUEUE_CONFIG_H_
#define LOOM_CONTROLLER_SCHEDULING_QUEUE_CONFIG_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/scheduling/resources.h"

namespace loom::scheduling {

inline constexpr char kDefaultQueue[] = "default";
// Priorities, integers or classes, lie in [-kMaxPriority, kMaxPriority]
// (as common/jobspec_rules.h bounds scheduling.priority).
inline constexpr int kMaxPriority = 1000000;

struct QueueSpec {
  std::string name;
  // Empty: the queue neither lends nor borrows; its limit is its nominal
  // quota.
  std::string cohort;
  // What the queue is guaranteed: a queue within its nominal quota may
  // reclaim it from borrowers of its cohort by preemption.
  Resources nominal_quota = Resources::Unlimited();
  // How far beyond its nominal quota the queue may borrow from its cohort's
  // unused nominal quota (Kueue's borrowingLimit).
  Resources borrowing_limit = Resources::Unlimited();
  // Fair-share weight: queues share the cohort's lendable capacity (and the
  // admission order) in proportion to their weights. > 0.
  double weight = 1.0;
  // Within-queue priority preemption: a pending job preempts running jobs
  // of the same queue with a strictly lower priority.
  bool preemption = true;
  // The roles whose members may submit to the queue ("user", "admin"; the
  // controller's access.h roles that may submit at all). Empty: both.
  std::vector<std::string> submit_roles;

  // Whether a caller of `role` ("user", "admin") may submit to the queue.
  bool AcceptsRole(absl::string_view role) const;
  // nominal_quota + borrowing_limit with a cohort, nominal_quota without;
  // saturated at kUnlimited.
  Resources Limit() const;
};

struct QueueConfig {
  std::vector<QueueSpec> queues;                // file order; `default` included
  std::map<std::string, int> priority_classes;  // name -> priority
  absl::Duration fair_share_half_life = absl::Hours(1);
  absl::Duration preemption_grace = absl::Seconds(30);
  absl::Duration min_run_time = absl::Minutes(5);

  // nullptr when there is no such queue.
  const QueueSpec* Find(absl::string_view name) const;

  // A job's scheduling.queue: "" means `default`. INVALID_ARGUMENT
  // "scheduling.queue: unknown queue \"x\" (queues: a, b, default)".
  absl::StatusOr<const QueueSpec*> ResolveQueue(absl::string_view name) const;

  // A job's scheduling.priority: an integer, or a class named in
  // priority_classes; "" means 0. INVALID_ARGUMENT
  // "scheduling.priority: unknown priority class \"x\" (classes: low, urgent)".
  absl::StatusOr<int> ResolvePriority(absl::string_view value) const;

  // The sum of the nominal quotas of the queues in `cohort` (saturated);
  // for a queue without a cohort, use its own nominal quota instead.
  Resources CohortCapacity(absl::string_view cohort) const;
};

// The configuration when no file is given: only `default`.
QueueConfig DefaultQueueConfig();

// Parses the YAML text above. An empty document gives DefaultQueueConfig().
absl::StatusOr<QueueConfig> ParseQueueConfig(absl::string_view yaml);

// Reads and parses a file; NOT_FOUND etc. from reading, else as above.
absl::StatusOr<QueueConfig> LoadQueueConfigFile(const std::string& path);

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_QUEUE_CONFIG_H_
