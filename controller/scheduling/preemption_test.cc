#include "controller/scheduling/preemption.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

using ::testing::ElementsAre;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

RunningJob Job(std::string id, int64_t steps, int priority, absl::Duration started_ago) {
  RunningJob r;
  r.id = std::move(id);
  r.steps_since_checkpoint = steps;
  r.priority = priority;
  r.start_time = kNow - started_ago;
  return r;
}

TEST(PreemptionTest, VictimOrderLosesLeastWork) {
  std::vector<RunningJob> jobs = {
      Job("old-low", 5, 0, absl::Hours(2)),       Job("new-low", 5, 0, absl::Minutes(1)),
      Job("fresh-ckpt", 0, 9, absl::Hours(1)),    Job("mid-prio", 5, 3, absl::Minutes(1)),
      Job("many-steps", 50, 0, absl::Minutes(1)),
  };
  std::sort(jobs.begin(), jobs.end(), CheaperVictim);
  std::vector<std::string> ids;
  for (const RunningJob& j : jobs) ids.push_back(j.id);
  // Fewest steps since checkpoint, then lowest priority, then most recent.
  EXPECT_THAT(ids, ElementsAre("fresh-ckpt", "new-low", "old-low", "mid-prio", "many-steps"));
}

TEST(PreemptionTest, NoThrashWindowOnlyAfterAPreemption) {
  const absl::Duration min_run = absl::Minutes(5);
  RunningJob never = Job("a", 0, 0, absl::Seconds(10));
  EXPECT_FALSE(ProtectedFromPreemption(never, min_run, kNow));
  RunningJob again = never;
  again.last_preempted = kNow - absl::Minutes(1);
  EXPECT_TRUE(ProtectedFromPreemption(again, min_run, kNow));
  EXPECT_FALSE(Preemptible(again, min_run, kNow));
  EXPECT_FALSE(ProtectedFromPreemption(again, min_run, kNow + absl::Minutes(5)));
  RunningJob saving = never;
  saving.saving = true;
  EXPECT_FALSE(Preemptible(saving, min_run, kNow));
  RunningJob pinned = never;
  pinned.preemptible = false;
  EXPECT_FALSE(Preemptible(pinned, min_run, kNow));
}

TEST(PreemptionTest, VictimSetIsMinimal) {
  // Candidates in cost order hold 1, 1, 4 slots; the job needs 4.
  const std::vector<int> sizes = {1, 1, 4};
  auto fits = [&](const std::vector<int>& chosen) {
    int sum = 0;
    for (int c : chosen) sum += sizes[c];
    return sum >= 4;
  };
  auto all = [](int, const std::vector<int>&) { return true; };
  // Greedy takes 0, 1, 2; the minimal set spares the two small ones.
  EXPECT_THAT(*ChooseVictims(3, fits, all), ElementsAre(2));
  // When the small ones are enough, the big one is spared (cheapest first).
  const std::vector<int> small_enough = {2, 2, 4};
  auto fits2 = [&](const std::vector<int>& chosen) {
    int sum = 0;
    for (int c : chosen) sum += small_enough[c];
    return sum >= 4;
  };
  EXPECT_THAT(*ChooseVictims(3, fits2, all), ElementsAre(0, 1));
  // Nobody is preempted when all of them are not enough.
  auto never = [](const std::vector<int>&) { return false; };
  EXPECT_FALSE(ChooseVictims(3, never, all).has_value());
  // A candidate that is not allowed is skipped.
  auto not_two = [](int c, const std::vector<int>&) { return c != 2; };
  EXPECT_THAT(*ChooseVictims(3, fits2, not_two), ElementsAre(0, 1));
}

}  // namespace
}  // namespace loom::scheduling
