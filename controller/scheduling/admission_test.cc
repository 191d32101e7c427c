#include "controller/scheduling/admission.h"

#include <string>
#include <vector>

#include "controller/scheduling/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;
using namespace ::loom::scheduling::testing;  // NOLINT: test builders

constexpr char kCohortOf2[] = R"(
queues:
  - name: a
    cohort: shared
    nominal_quota: {slots: 4}
  - name: b
    cohort: shared
    nominal_quota: {slots: 4}
)";

Decisions Decide(const QueueConfig& config, const ClusterSnapshot& s, absl::Time now = kT0) {
  FairShare fs(config.fair_share_half_life);
  return AdmissionPolicy(config).Decide(s, fs, now);
}

// A snapshot with `n` one-slot workers; `running` jobs' room taken off.
ClusterSnapshot Snapshot(int n, std::vector<RunningJob> running, std::vector<PendingJob> pending) {
  ClusterSnapshot s;
  s.workers = Workers(n);
  for (const RunningJob& r : running) {
    for (const WorkerShare& share : r.placement) {
      for (WorkerFree& w : s.workers) {
        if (w.id == share.worker_id) w.free -= share.amount;
      }
    }
  }
  s.running = std::move(running);
  s.pending = std::move(pending);
  return s;
}

// ---- Quotas, borrowing, reclaim ----

TEST(AdmissionTest, NominalQuotaLimitsAQueueWithoutCohort) {
  const QueueConfig config = Config("queues: [{name: a, nominal_quota: {slots: 4}}]");
  std::vector<PendingJob> pending;
  for (int i = 0; i < 5; ++i) {
    pending.push_back(Pending(absl::StrCat("j", i), "a", 1, 1, 0, kT0 + absl::Seconds(i)));
  }
  const Decisions d = Decide(config, Snapshot(8, {}, pending));
  EXPECT_THAT(AdmittedIds(d), ElementsAre("j0", "j1", "j2", "j3"));
  const Waiting* w = FindWaiting(d, "j4");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->reason, WaitReason::kOverQuota);
  EXPECT_EQ(w->position, 1);
  EXPECT_THAT(w->message, HasSubstr("over quota: queue \"a\" uses 4 slot(s) of its 4 slot(s) "
                                    "(nominal quota); the job needs 1 slot(s)"));
}

TEST(AdmissionTest, BorrowsFromTheCohortUpToTheBorrowingLimit) {
  const QueueConfig config = Config(R"(
queues:
  - {name: a, cohort: shared, nominal_quota: {slots: 2}, borrowing_limit: {slots: 3}}
  - {name: b, cohort: shared, nominal_quota: {slots: 6}}
)");
  std::vector<PendingJob> pending;
  for (int i = 0; i < 7; ++i) {
    pending.push_back(Pending(absl::StrCat("a", i), "a", 1, 1, 0, kT0 + absl::Seconds(i)));
  }
  const Decisions d = Decide(config, Snapshot(8, {}, pending));
  ASSERT_THAT(d.admissions, SizeIs(5));  // 2 nominal + 3 borrowed
  EXPECT_FALSE(d.admissions[1].borrowing);
  EXPECT_TRUE(d.admissions[2].borrowing);
  EXPECT_EQ(FindWaiting(d, "a5")->reason, WaitReason::kOverQuota);
  EXPECT_EQ(FindWaiting(d, "a6")->position, 2);
  EXPECT_THAT(d.preemptions, IsEmpty());
}

TEST(AdmissionTest, CohortCapacityIsTheSumOfNominalQuotas) {
  const QueueConfig config = Config(kCohortOf2);
  // b already borrows all of a's quota; a cluster bigger than the cohort
  // does not let b go beyond 8.
  std::vector<RunningJob> running;
  for (int i = 0; i < 8; ++i)
    running.push_back(Running(absl::StrCat("b", i), "b", {absl::StrCat("w", i)}));
  const Decisions d = Decide(config, Snapshot(12, running, {Pending("b8", "b", 1)}));
  EXPECT_THAT(d.admissions, IsEmpty());
  EXPECT_THAT(FindWaiting(d, "b8")->message,
              HasSubstr("cohort \"shared\" uses 8 slot(s) of its 8"));
}

TEST(AdmissionTest, AJobThatIsNotPreemptibleDoesNotBorrow) {
  const QueueConfig config = Config(kCohortOf2);
  std::vector<PendingJob> pending;
  for (int i = 0; i < 5; ++i) {
    PendingJob j = Pending(absl::StrCat("a", i), "a", 1, 1, 0, kT0 + absl::Seconds(i));
    j.preemptible = false;
    pending.push_back(j);
  }
  const Decisions d = Decide(config, Snapshot(8, {}, pending));
  EXPECT_THAT(d.admissions, SizeIs(4));
  EXPECT_THAT(FindWaiting(d, "a4")->message, HasSubstr("not preemptible may not borrow"));
}

TEST(AdmissionTest, ReclaimPreemptsBorrowersOnlyUpToNominal) {
  const QueueConfig config = Config(kCohortOf2);
  std::vector<RunningJob> running;
  for (int i = 0; i < 8; ++i) {
    // b7 has the fewest steps since its checkpoint, then b6, ...
    running.push_back(Running(absl::StrCat("b", i), "b", {absl::StrCat("w", i)}, 1, 0, 100 - i));
  }
  std::vector<PendingJob> pending;
  for (int i = 0; i < 6; ++i) {
    pending.push_back(Pending(absl::StrCat("a", i), "a", 1, 1, 0, kT0 + absl::Seconds(i)));
  }
  const Decisions d = Decide(config, Snapshot(8, running, pending));
  EXPECT_THAT(d.admissions, IsEmpty());
  // Four reclaims, the cheapest victims, one per job of a within nominal.
  EXPECT_THAT(VictimIds(d), ElementsAre("b7", "b6", "b5", "b4"));
  for (const Preemption& p : d.preemptions) {
    EXPECT_EQ(p.reason, PreemptionReason::kReclaim);
    EXPECT_THAT(p.message, HasSubstr("queue \"a\" reclaims its nominal quota from queue \"b\""));
  }
  EXPECT_EQ(d.preemptions[0].for_job_id, "a0");
  EXPECT_EQ(FindWaiting(d, "a0")->reason, WaitReason::kPreempting);
  // a4 and a5 would borrow, and b no longer does: over quota, no preemption.
  EXPECT_EQ(FindWaiting(d, "a4")->reason, WaitReason::kOverQuota);
}

TEST(AdmissionTest, NoReclaimFromAQueueWithinItsNominalQuota) {
  const QueueConfig config = Config(kCohortOf2);
  std::vector<RunningJob> running;
  for (int i = 0; i < 4; ++i)
    running.push_back(Running(absl::StrCat("a", i), "a", {absl::StrCat("w", i)}));
  for (int i = 4; i < 8; ++i)
    running.push_back(Running(absl::StrCat("b", i), "b", {absl::StrCat("w", i)}));
  const Decisions d = Decide(config, Snapshot(8, running, {Pending("a9", "a", 1)}));
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_EQ(FindWaiting(d, "a9")->reason, WaitReason::kOverQuota);
}

// ---- Priority preemption and victim choice ----

TEST(AdmissionTest, HigherPriorityPreemptsTheVictimThatLosesLeastWork) {
  const QueueConfig config = DefaultQueueConfig();
  const std::vector<RunningJob> running = {
      Running("low-10", "default", {"w0"}, 1, 0, 10),
      Running("low-3-old", "default", {"w1"}, 1, 0, 3, kT0 - absl::Hours(2)),
      Running("low-3-new", "default", {"w2"}, 1, 0, 3, kT0 - absl::Minutes(1)),
      Running("prio-5-0", "default", {"w3"}, 1, 5, 0),  // as urgent as the preemptor: spared
  };
  const Decisions d = Decide(config, Snapshot(4, running, {Pending("urgent", "default", 1, 1, 5)}));
  ASSERT_THAT(d.preemptions, SizeIs(1));
  EXPECT_EQ(d.preemptions[0].victim_id, "low-3-new");
  EXPECT_EQ(d.preemptions[0].reason, PreemptionReason::kPriority);
  EXPECT_THAT(d.preemptions[0].message, HasSubstr("priority 5 > 0"));
}

TEST(AdmissionTest, EqualPriorityAndDisabledPreemptionPreemptNobody) {
  const std::vector<RunningJob> running = {Running("r", "default", {"w0"})};
  EXPECT_THAT(
      Decide(DefaultQueueConfig(), Snapshot(1, running, {Pending("p", "default", 1)})).preemptions,
      IsEmpty());
  const QueueConfig off = Config("queues: [{name: default, preemption: false}]");
  const Decisions d = Decide(off, Snapshot(1, running, {Pending("p", "default", 1, 1, 9)}));
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_EQ(FindWaiting(d, "p")->reason, WaitReason::kGangDoesNotFit);
}

TEST(AdmissionTest, VictimSetIsMinimalAndWholeGangs) {
  // w0 and w1 hold one slot each, w2 two. The urgent gang needs one
  // worker with two slots: preempting the two cheap one-slot jobs would not
  // help, so only the two-slot gang goes, whole.
  ClusterSnapshot s;
  s.workers = {{"w0", {0, 0}}, {"w1", {0, 0}}, {"w2", {0, 0}}};
  s.running = {Running("cheap0", "default", {"w0"}, 1, 0, 0),
               Running("cheap1", "default", {"w1"}, 1, 0, 1),
               Running("pair", "default", {"w2"}, 2, 0, 2)};
  s.pending = {Pending("urgent", "default", 1, 2, 9)};
  const Decisions d = Decide(DefaultQueueConfig(), s);
  EXPECT_THAT(VictimIds(d), ElementsAre("pair"));
}

TEST(AdmissionTest, NoThrashAJobPreemptedLatelyIsSpared) {
  QueueConfig config = DefaultQueueConfig();
  config.min_run_time = absl::Minutes(5);
  RunningJob resumed = Running("resumed", "default", {"w0"}, 1, 0, 0, kT0 - absl::Minutes(1));
  resumed.last_preempted = kT0 - absl::Minutes(2);
  RunningJob other = Running("other", "default", {"w1"}, 1, 0, 50);
  const Decisions d =
      Decide(config, Snapshot(2, {resumed, other}, {Pending("urgent", "default", 1, 1, 9)}));
  EXPECT_THAT(VictimIds(d), ElementsAre("other"));  // costlier, but not protected
  // Once the window has passed, the cheaper victim is taken again.
  const Decisions later =
      Decide(config, Snapshot(2, {resumed, other}, {Pending("urgent", "default", 1, 1, 9)}),
             kT0 + absl::Minutes(5));
  EXPECT_THAT(VictimIds(later), ElementsAre("resumed"));
  // Protected and alone: nobody is preempted.
  const Decisions alone =
      Decide(config, Snapshot(1, {resumed}, {Pending("urgent", "default", 1, 1, 9)}));
  EXPECT_THAT(alone.preemptions, IsEmpty());
}

TEST(AdmissionTest, APreemptorEvictsNobodyElseWhileItsVictimsSave) {
  RunningJob saving = Running("victim", "default", {"w0"}, 1, 0, 0);
  saving.saving = true;
  saving.preempted_for = "urgent";
  RunningJob another = Running("another", "default", {"w1"}, 1, 0, 0);
  // urgent needs two workers: its victim's and one more. Until the victim
  // has saved it preempts nobody else.
  const Decisions d =
      Decide(DefaultQueueConfig(),
             Snapshot(2, {saving, another}, {Pending("urgent", "default", 2, 1, 9)}));
  EXPECT_THAT(d.preemptions, IsEmpty());
  const Waiting* w = FindWaiting(d, "urgent");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->reason, WaitReason::kPreempting);
  EXPECT_THAT(w->message, HasSubstr("waiting for 1 preempted job(s) to save and stop: victim"));
}

TEST(AdmissionTest, RoomFreedForAPreemptorIsNotTakenByOthers) {
  // The victim is saving for `urgent`; a free worker w1 exists. A later,
  // small job of another queue must not take the room urgent was promised.
  const QueueConfig config = Config("queues: [{name: other}]");
  RunningJob saving = Running("victim", "default", {"w0"}, 1, 0, 0);
  saving.saving = true;
  saving.preempted_for = "urgent";
  const Decisions d =
      Decide(config,
             Snapshot(2, {saving},
                      {Pending("urgent", "default", 2, 1, 9), Pending("small", "other", 1, 1, 0)}));
  EXPECT_THAT(d.admissions, IsEmpty());
  EXPECT_EQ(FindWaiting(d, "small")->reason, WaitReason::kGangDoesNotFit);
}

TEST(AdmissionTest, PreemptionOnlyWhenTheVictimsLetTheJobStart) {
  // Two low jobs, the urgent gang needs 3 workers of 2: nobody is preempted.
  const std::vector<RunningJob> running = {Running("l0", "default", {"w0"}),
                                           Running("l1", "default", {"w1"})};
  const Decisions d =
      Decide(DefaultQueueConfig(), Snapshot(2, running, {Pending("big", "default", 3, 1, 9)}));
  EXPECT_THAT(d.preemptions, IsEmpty());
  EXPECT_THAT(FindWaiting(d, "big")->message, HasSubstr("even when idle"));
}

// ---- Gangs, reservations, backfill ----

TEST(AdmissionTest, TwoWholeClusterGangsOneRunsOneWaits) {
  const Decisions d =
      Decide(DefaultQueueConfig(),
             Snapshot(4, {}, {Pending("x", "default", 4), Pending("y", "default", 4)}));
  ASSERT_THAT(d.admissions, SizeIs(1));
  EXPECT_EQ(d.admissions[0].job_id, "x");  // same submit time: by id
  EXPECT_THAT(d.admissions[0].placement, SizeIs(4));
  EXPECT_EQ(FindWaiting(d, "y")->reason, WaitReason::kGangDoesNotFit);
  EXPECT_THAT(d.preemptions, IsEmpty());
}

TEST(AdmissionTest, HeadGangReservesAndOnlyShortOrPreemptibleJobsRunAhead) {
  // w0..w2 busy until +100 s, +200 s, +300 s; w3 and w4 free. The 5-worker
  // gang at the head reserves w3, w4 and starts at +300 s.
  std::vector<RunningJob> running;
  for (int i = 0; i < 3; ++i) {
    RunningJob r = Running(absl::StrCat("r", i), "default", {absl::StrCat("w", i)});
    r.expected_end = kT0 + absl::Seconds(100 * (i + 1));
    r.preemptible = false;
    running.push_back(r);
  }
  PendingJob gang = Pending("gang", "default", 5, 1, 0, kT0 - absl::Minutes(10));
  PendingJob short_job = Pending("short", "default", 1, 1, 0, kT0 - absl::Minutes(5));
  short_job.expected_runtime = absl::Seconds(250);  // ends before +300 s
  short_job.preemptible = false;
  PendingJob long_job = Pending("long", "default", 1, 1, 0, kT0 - absl::Minutes(4));
  long_job.expected_runtime = absl::Seconds(1000);
  long_job.preemptible = false;
  PendingJob spare = Pending("spare", "default", 1, 1, 0, kT0 - absl::Minutes(3));  // preemptible
  const Decisions d =
      Decide(DefaultQueueConfig(), Snapshot(5, running, {gang, short_job, long_job, spare}));

  const Waiting* g = FindWaiting(d, "gang");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->reason, WaitReason::kGangDoesNotFit);
  EXPECT_EQ(g->expected_start, kT0 + absl::Seconds(300));
  EXPECT_EQ(g->position, 1);
  ASSERT_THAT(d.admissions, SizeIs(2));
  EXPECT_EQ(d.admissions[0].job_id, "short");
  EXPECT_FALSE(d.admissions[0].opportunistic);
  EXPECT_EQ(d.admissions[1].job_id, "spare");
  EXPECT_TRUE(d.admissions[1].opportunistic);
  const Waiting* l = FindWaiting(d, "long");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->reason, WaitReason::kCapacityReserved);
  EXPECT_EQ(l->blocking_job_id, "gang");
  EXPECT_EQ(l->position, 2);
  EXPECT_THAT(l->message,
              HasSubstr("capacity reserved for job gang, expected to start in about 300s"));
}

TEST(AdmissionTest, OpportunisticJobsAreTheFirstVictimsOfTheHolder) {
  // The holder's room is all free but for one opportunistic job.
  RunningJob opp = Running("opp", "default", {"w1"}, 1, 0, 500);
  opp.opportunistic = true;
  RunningJob normal = Running("normal", "default", {"w2"}, 1, 0, 0);
  normal.preemptible = false;
  const Decisions d =
      Decide(DefaultQueueConfig(), Snapshot(3, {opp, normal}, {Pending("gang", "default", 2)}));
  ASSERT_THAT(d.preemptions, SizeIs(1));
  EXPECT_EQ(d.preemptions[0].victim_id, "opp");
  EXPECT_EQ(d.preemptions[0].reason, PreemptionReason::kReservation);
}

TEST(AdmissionTest, UnknownQueueWaitsWithItsReason) {
  const Decisions d = Decide(DefaultQueueConfig(), Snapshot(1, {}, {Pending("j", "gone", 1)}));
  EXPECT_EQ(FindWaiting(d, "j")->reason, WaitReason::kUnknownQueue);
  EXPECT_THAT(d.admissions, IsEmpty());
}

TEST(AdmissionTest, FairShareOrdersQueuesByDecayedUsageOverWeight) {
  const QueueConfig config = Config(R"(
queues:
  - {name: a, weight: 1}
  - {name: b, weight: 1}
)");
  FairShare fs(absl::Minutes(10));
  fs.Observe(kT0 - absl::Hours(1), {{"a", {4, 0}}});
  fs.Observe(kT0, {});  // a used 4 slots lately, b nothing
  const Decisions d = AdmissionPolicy(config).Decide(
      Snapshot(2, {},
               {Pending("a0", "a", 1, 1, 0, kT0 - absl::Hours(1)), Pending("a1", "a", 1),
                Pending("b0", "b", 1), Pending("b1", "b", 1)}),
      fs, kT0);
  // b goes first though a's jobs are older; then a, since b's admission counts.
  EXPECT_THAT(AdmittedIds(d), ElementsAre("b0", "b1"));
  EXPECT_EQ(FindWaiting(d, "a0")->position, 1);
}

}  // namespace
}  // namespace loom::scheduling
