// Builders for the scheduling tests. Test-only.
#ifndef LOOM_CONTROLLER_SCHEDULING_TEST_UTIL_H_
#define LOOM_CONTROLLER_SCHEDULING_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "controller/scheduling/queue_config.h"
#include "controller/scheduling/snapshot.h"
#include "gtest/gtest.h"

namespace loom::scheduling::testing {

inline const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

inline QueueConfig Config(const std::string& yaml) {
  auto config = ParseQueueConfig(yaml);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DefaultQueueConfig();
}

// Workers w0..w{n-1}, each with `each` free.
inline std::vector<WorkerFree> Workers(int n, Resources each = {1, 0}) {
  std::vector<WorkerFree> out;
  for (int i = 0; i < n; ++i) out.push_back({absl::StrCat("w", i), each});
  return out;
}

inline PendingJob Pending(std::string id, std::string queue, int workers, int slots_each = 1,
                          int priority = 0, absl::Time submitted = kT0) {
  PendingJob j;
  j.id = std::move(id);
  j.queue = std::move(queue);
  j.priority = priority;
  j.gang = GangDemand::Even(workers, {slots_each, 0});
  j.submit_time = submitted;
  return j;
}

// A running job holding `slots` on each of `workers`; the caller takes that
// room off the snapshot's free figures.
inline RunningJob Running(std::string id, std::string queue, std::vector<std::string> workers,
                          int slots = 1, int priority = 0, int64_t steps = 0,
                          absl::Time started = kT0 - absl::Hours(1)) {
  RunningJob r;
  r.id = std::move(id);
  r.queue = std::move(queue);
  r.priority = priority;
  for (auto& w : workers) r.placement.push_back({std::move(w), {slots, 0}});
  r.start_time = started;
  r.steps_since_checkpoint = steps;
  return r;
}

inline const Waiting* FindWaiting(const Decisions& d, const std::string& id) {
  for (const Waiting& w : d.waiting) {
    if (w.job_id == id) return &w;
  }
  return nullptr;
}

inline std::vector<std::string> AdmittedIds(const Decisions& d) {
  std::vector<std::string> ids;
  for (const Admission& a : d.admissions) ids.push_back(a.job_id);
  return ids;
}

inline std::vector<std::string> VictimIds(const Decisions& d) {
  std::vector<std::string> ids;
  for (const Preemption& p : d.preemptions) ids.push_back(p.victim_id);
  return ids;
}

}  // namespace loom::scheduling::testing

#endif  // LOOM_CONTROLLER_SCHEDULING_TEST_UTIL_H_
