#include "controller/progress/goodput.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::controller {
namespace {

void Transition(loom::v1::Job* job, loom::v1::JobState to, double at_seconds) {
  auto* t = job->add_history();
  t->set_to(to);
  t->set_time_unix_ms(static_cast<int64_t>(at_seconds * 1000));
}

// `count` steps of 1 s each, the first ending at `first_end`, each waiting
// 0.1 s for data; the step ending at `stall_at` also stalls 0.5 s on a save.
void Steps(std::vector<loom::v1::StepMetrics>* steps, double first_end, int count,
           double stall_at = -1) {
  for (int i = 0; i < count; ++i) {
    loom::v1::StepMetrics s;
    s.set_step(static_cast<int64_t>(steps->size()) + 1);
    s.set_time_unix_ms(static_cast<int64_t>((first_end + i) * 1000));
    s.set_step_time_seconds(1.0);
    s.set_data_wait_seconds(0.1);
    if (first_end + i == stall_at) s.set_checkpoint_stall_seconds(0.5);
    steps->push_back(s);
  }
}

// Queued 10 s; an attempt whose first step starts 4 s after its placement,
// 10 steps, then a failure that loses 3 steps; 5 s waiting again; a second
// attempt of 10 steps; the end.
TEST(GoodputTest, SplitsAJobsWallTimeIntoBucketsThatAddUp) {
  loom::v1::Job job;
  std::vector<loom::v1::StepMetrics> steps;
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 10);
  Transition(&job, loom::v1::RUNNING, 12);
  Steps(&steps, 15, 10, /*stall_at=*/20);
  Transition(&job, loom::v1::PENDING, 25);
  auto* restart = job.add_events();
  restart->set_kind(loom::v1::RecoveryEvent::RESTART);
  restart->set_time_unix_ms(25000);
  restart->set_steps_lost(3);
  restart->set_checkpoint_step(10);  // the second attempt's steps are 11-20
  Transition(&job, loom::v1::SCHEDULED, 30);
  Transition(&job, loom::v1::RUNNING, 31);
  Steps(&steps, 33, 10);
  Transition(&job, loom::v1::SUCCEEDED, 43);

  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  EXPECT_DOUBLE_EQ(b.wall, 43);  // ended: `now` does not count
  EXPECT_DOUBLE_EQ(b.queued, 10);
  EXPECT_DOUBLE_EQ(b.recovery_waiting, 5);
  EXPECT_DOUBLE_EQ(b.preempted_waiting, 0);
  EXPECT_DOUBLE_EQ(b.startup, 4 + 2);
  EXPECT_NEAR(b.data_stall, 2.0, 1e-9);
  EXPECT_NEAR(b.checkpoint_stall, 0.5, 1e-9);
  EXPECT_NEAR(b.redone, 3.0, 1e-9);            // 3 steps at the median 1 s
  EXPECT_NEAR(b.productive, 20 - 2.0 - 0.5 - 3.0, 1e-9);
  EXPECT_NEAR(b.unaccounted, 2.0, 1e-9);       // 24..25 and 42..43: after the last steps
  const double sum = b.queued + b.preempted_waiting + b.recovery_waiting + b.startup +
                     b.checkpoint_restore + b.evaluation + b.productive + b.data_stall +
                     b.checkpoint_stall + b.redone + b.unaccounted;
  EXPECT_NEAR(sum, b.wall, 1e-9);
  EXPECT_NEAR(b.ettr(), 14.5 / 33.0, 1e-9);
}

// A fresh run reports its initial validation as step 0 (no step time, its
// eval_seconds) before step 1: that pass is evaluation, not start-up too.
// Counted twice, the buckets summed to more than the wall time (the demo
// printed "unaccounted -0.2").
TEST(GoodputTest, TheInitialValidationIsCountedOnce) {
  loom::v1::Job job;
  std::vector<loom::v1::StepMetrics> steps;
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 1);
  Transition(&job, loom::v1::RUNNING, 1.5);
  loom::v1::StepMetrics initial;  // placed at 1, 1 s of start-up, 2 s of validation
  initial.set_step(0);
  initial.set_time_unix_ms(4000);
  initial.set_eval_seconds(2.0);
  Steps(&steps, 5, 3);  // steps 1..3 end at 5, 6, 7
  steps.push_back(initial);
  Transition(&job, loom::v1::SUCCEEDED, 7);
  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  EXPECT_DOUBLE_EQ(b.wall, 7);
  EXPECT_DOUBLE_EQ(b.queued, 1);
  EXPECT_NEAR(b.startup, 1.0, 1e-9);
  EXPECT_NEAR(b.evaluation, 2.0, 1e-9);
  EXPECT_NEAR(b.productive + b.data_stall, 3.0, 1e-9);
  EXPECT_NEAR(b.unaccounted, 0.0, 1e-9);
  for (const GoodputBuckets::Named& bucket : b.List()) {
    EXPECT_GE(bucket.seconds, 0) << bucket.label;
  }
}

// Reports from a host whose clock runs ahead overlap the wall time: no
// bucket goes negative, and they still sum to it.
TEST(GoodputTest, ReportsThatOverlapTheWallTimeLeaveNoBucketNegative) {
  loom::v1::Job job;
  std::vector<loom::v1::StepMetrics> steps;
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 1);
  Transition(&job, loom::v1::RUNNING, 1.1);
  Steps(&steps, 2.5, 3);      // 3 s of steps reported by 4.5 ...
  steps[0].set_step_time_seconds(2.4);  // ... one of them claiming more than it had
  Transition(&job, loom::v1::SUCCEEDED, 4.5);
  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  double sum = 0;
  for (const GoodputBuckets::Named& bucket : b.List()) {
    EXPECT_GE(bucket.seconds, 0) << bucket.label;
    sum += bucket.seconds;
  }
  EXPECT_NEAR(sum, b.wall, 1e-9);
  EXPECT_DOUBLE_EQ(b.unaccounted, 0);
}

// Queued 5 s; an attempt of 5 steps; preempted with 0 steps lost and 7 s
// back in the queue; the second attempt spends 1.5 s of its 3 s start-up
// loading the checkpoint, then 5 steps.
TEST(GoodputTest, PreemptedWaitingAndTheRestoreAreBucketsOfTheirOwn) {
  loom::v1::Job job;
  std::vector<loom::v1::StepMetrics> steps;
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 5);
  Transition(&job, loom::v1::RUNNING, 6);
  Steps(&steps, 8, 5);
  Transition(&job, loom::v1::PREEMPTED, 13);
  auto* preempted = job.add_events();
  preempted->set_kind(loom::v1::RecoveryEvent::PREEMPTED);
  preempted->set_time_unix_ms(13000);
  preempted->set_steps_lost(0);
  preempted->set_checkpoint_step(5);
  Transition(&job, loom::v1::SCHEDULED, 20);
  Transition(&job, loom::v1::RUNNING, 21);
  const size_t first_resumed = steps.size();
  Steps(&steps, 24, 5);
  steps[first_resumed].set_checkpoint_restore_seconds(1.5);
  Transition(&job, loom::v1::SUCCEEDED, 28);

  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  EXPECT_DOUBLE_EQ(b.wall, 28);
  EXPECT_DOUBLE_EQ(b.queued, 5);
  EXPECT_DOUBLE_EQ(b.preempted_waiting, 7);
  EXPECT_DOUBLE_EQ(b.recovery_waiting, 0);
  EXPECT_NEAR(b.checkpoint_restore, 1.5, 1e-9);
  EXPECT_NEAR(b.startup, 2 + 1.5, 1e-9);
  EXPECT_NEAR(b.redone, 0, 1e-9);
  EXPECT_NEAR(b.data_stall, 1.0, 1e-9);
  EXPECT_NEAR(b.productive, 9.0, 1e-9);
  EXPECT_NEAR(b.unaccounted, 1.0, 1e-9);  // 12..13: after the first attempt's last step
  EXPECT_NEAR(b.ettr(), 9.0 / 16.0, 1e-9);

  // A preemption that lost steps: they are redone work.
  preempted->set_steps_lost(2);
  const GoodputBuckets lost = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  EXPECT_NEAR(lost.redone, 2.0, 1e-9);
  EXPECT_NEAR(lost.productive, 7.0, 1e-9);
}

// A run that reports every 10th step (or whose series was thinned): each
// report stands for the 10 steps since the previous one.
TEST(GoodputTest, SparseReportsStandForTheStepsBetweenThem) {
  loom::v1::Job job;
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 0);
  Transition(&job, loom::v1::RUNNING, 1);
  std::vector<loom::v1::StepMetrics> steps;
  for (int i = 1; i <= 10; ++i) {  // steps 10, 20, ..., 100, 1 s each
    loom::v1::StepMetrics s;
    s.set_step(10 * i);
    s.set_time_unix_ms((2 + 10 * i) * 1000);
    s.set_step_time_seconds(1.0);
    s.set_data_wait_seconds(0.1);
    if (i == 5) s.set_checkpoint_stall_seconds(0.5);
    if (i == 10) s.set_eval_seconds(0.75);  // validated after step 100
    steps.push_back(s);
  }
  Transition(&job, loom::v1::SUCCEEDED, 103);
  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  // Steps 1-10 ran back to back before the first report at 12 s.
  EXPECT_DOUBLE_EQ(b.startup, 2);
  EXPECT_NEAR(b.data_stall, 10.0, 1e-9);
  EXPECT_NEAR(b.checkpoint_stall, 0.5, 1e-9);
  EXPECT_NEAR(b.productive, 100 - 10.0 - 0.5, 1e-9);
  EXPECT_NEAR(b.evaluation, 0.75, 1e-9);
  EXPECT_NEAR(b.unaccounted, 1 - 0.75, 1e-9);
}

// An elastic job preempted at step 5, then re-planned twice (a worker lost
// after step 10 with 2 steps lost, and grown back at step 13): each attempt
// resumes from its own event's checkpoint, not an older event's, and the
// steps a re-plan undid are redone work.
TEST(GoodputTest, ReplannedAttemptsResumeFromTheirOwnCheckpoint) {
  loom::v1::Job job;
  std::vector<loom::v1::StepMetrics> steps;
  auto event = [&](loom::v1::RecoveryEvent::Kind kind, double at, int64_t checkpoint,
                   int64_t lost) {
    auto* e = job.add_events();
    e->set_kind(kind);
    e->set_time_unix_ms(static_cast<int64_t>(at * 1000));
    e->set_checkpoint_step(checkpoint);
    e->set_steps_lost(lost);
  };
  auto steps_from = [&](int64_t first, int count, double first_end) {
    for (int i = 0; i < count; ++i) {
      loom::v1::StepMetrics s;
      s.set_step(first + i);
      s.set_time_unix_ms(static_cast<int64_t>((first_end + i) * 1000));
      s.set_step_time_seconds(1.0);
      steps.push_back(s);
    }
  };
  Transition(&job, loom::v1::PENDING, 0);
  Transition(&job, loom::v1::SCHEDULED, 0);
  Transition(&job, loom::v1::RUNNING, 1);
  steps_from(1, 5, 2);  // steps 1-5 end at 2..6
  event(loom::v1::RecoveryEvent::PREEMPTED, 7, 5, 0);
  Transition(&job, loom::v1::PREEMPTED, 7);
  event(loom::v1::RecoveryEvent::REPLANNED, 7, 5, 0);  // back at once, smaller
  Transition(&job, loom::v1::PENDING, 7);
  Transition(&job, loom::v1::SCHEDULED, 7);
  Transition(&job, loom::v1::RUNNING, 8);
  steps_from(6, 7, 9);                                   // steps 6-12 end at 9..15
  event(loom::v1::RecoveryEvent::REPLANNED, 16, 10, 2);  // lost 11-12
  Transition(&job, loom::v1::PENDING, 16);
  Transition(&job, loom::v1::SCHEDULED, 17);
  Transition(&job, loom::v1::RUNNING, 18);
  steps_from(11, 3, 19);                                 // steps 11-13 end at 19..21
  event(loom::v1::RecoveryEvent::REPLANNED, 22, 13, 0);  // grown back
  Transition(&job, loom::v1::PENDING, 22);
  Transition(&job, loom::v1::SCHEDULED, 22);
  Transition(&job, loom::v1::RUNNING, 23);
  steps_from(14, 2, 24);  // steps 14-15 end at 24..25
  Transition(&job, loom::v1::SUCCEEDED, 25);

  const GoodputBuckets b = ComputeGoodput(job, steps, absl::FromUnixSeconds(1000));
  // 17 steps of 1 s trained, 2 of them redone; each attempt's first step
  // starts 1 s after its placement.
  EXPECT_NEAR(b.redone, 2.0, 1e-9);
  EXPECT_NEAR(b.productive, 15.0, 1e-9);
  EXPECT_NEAR(b.startup, 4 * 1.0, 1e-9);
  EXPECT_LE(b.productive, b.wall);
  EXPECT_NEAR(b.ettr(), 15.0 / 25.0, 1e-9);
}

TEST(GoodputTest, AJobStillGoingEndsAtNowAndOneNeverPlacedIsAllQueue) {
  loom::v1::Job job;
  Transition(&job, loom::v1::PENDING, 100);
  const GoodputBuckets waiting = ComputeGoodput(job, {}, absl::FromUnixSeconds(160));
  EXPECT_DOUBLE_EQ(waiting.wall, 60);
  EXPECT_DOUBLE_EQ(waiting.queued, 60);
  EXPECT_DOUBLE_EQ(waiting.unaccounted, 0);
  EXPECT_EQ(waiting.ettr(), 0);
  // Placed, no step reported yet: all start-up so far.
  Transition(&job, loom::v1::SCHEDULED, 130);
  const GoodputBuckets starting = ComputeGoodput(job, {}, absl::FromUnixSeconds(160));
  EXPECT_DOUBLE_EQ(starting.queued, 30);
  EXPECT_DOUBLE_EQ(starting.startup, 30);
  EXPECT_DOUBLE_EQ(starting.unaccounted, 0);
  EXPECT_EQ(ComputeGoodput(loom::v1::Job(), {}, absl::FromUnixSeconds(1)).wall, 0);
}

}  // namespace
}  // namespace loom::controller
