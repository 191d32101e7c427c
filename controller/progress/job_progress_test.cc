#include "controller/progress/job_progress.h"

#include "gtest/gtest.h"

namespace loom::controller {
namespace {

loom::v1::StepMetrics Step(int64_t step, double loss, int64_t time_ms, int64_t tokens) {
  loom::v1::StepMetrics m;
  m.set_step(step);
  m.set_loss(loss);
  m.set_time_unix_ms(time_ms);
  m.set_tokens_seen(tokens);
  m.set_tokens_per_second(100);
  m.set_data_batch(step + 10);
  m.set_energy_joules(2);
  return m;
}

TEST(JobProgressTest, StepsFillTheSummaryAndTheAttemptsProgress) {
  JobRecord rec;
  rec.job.add_ranks();
  rec.job.add_ranks();
  loom::v1::StepMetrics initial;  // step 0: the untrained model's validation
  initial.set_val_loss(5.5);
  initial.set_has_val_loss(true);
  ApplyStepReport(initial, 1000, &rec);
  EXPECT_EQ(rec.job.summary().last_step(), 0);
  EXPECT_EQ(rec.attempt_last_step, -1) << "step 0 is no training step";
  EXPECT_DOUBLE_EQ(rec.job.summary().first_val_loss(), 5.5);

  ApplyStepReport(Step(1, 4.0, 2000, 800), 2000, &rec);
  ApplyStepReport(Step(2, 3.5, 3000, 1600), 3000, &rec);
  loom::v1::StepMetrics third = Step(3, 3.0, 4000, 2400);
  third.set_val_loss(3.25);
  third.set_has_val_loss(true);
  ApplyStepReport(third, 4000, &rec);
  const loom::v1::JobSummary& sum = rec.job.summary();
  EXPECT_EQ(sum.last_step(), 3);
  EXPECT_DOUBLE_EQ(sum.first_loss(), 4.0);
  EXPECT_DOUBLE_EQ(sum.last_loss(), 3.0);
  EXPECT_DOUBLE_EQ(sum.first_val_loss(), 5.5);
  EXPECT_DOUBLE_EQ(sum.last_val_loss(), 3.25);
  // From step 1's report on: 1,600 tokens in 2 s.
  EXPECT_DOUBLE_EQ(sum.tokens_per_second(), 800);
  EXPECT_DOUBLE_EQ(sum.energy_joules(), 4) << "the reporting rank's, times the ranks";
  EXPECT_EQ(rec.attempt_last_step, 3);
  EXPECT_EQ(rec.step_batches.at(2), 12);
}

TEST(JobProgressTest, AReplayedStepForgetsTheBatchesAfterItAndRestartsTheDiagnosis) {
  JobRecord rec;
  rec.rendezvous_retries = 2;
  for (int64_t s = 1; s <= 5; ++s) {
    loom::v1::StepMetrics m = Step(s, 3.0, 1000 * s, 100 * s);
    m.set_compute_seconds(0.9);
    m.set_step_time_seconds(1.0);
    ApplyStepReport(m, 1000 * s, &rec);
  }
  EXPECT_EQ(rec.rendezvous_retries, 0) << "the attempt's ranks joined";
  EXPECT_EQ(rec.recent_steps.size(), 5u);
  EXPECT_EQ(rec.job.diagnosis().time_unix_ms(), 5000);
  // The next attempt resumes from step 3's checkpoint.
  loom::v1::StepMetrics again = Step(4, 3.0, 9000, 400);
  again.set_data_batch(40);
  again.set_compute_seconds(0.9);
  again.set_step_time_seconds(1.0);
  ApplyStepReport(again, 9000, &rec);
  EXPECT_EQ(rec.recent_steps.size(), 1u);
  EXPECT_EQ(rec.attempt_last_step, 4);
  EXPECT_EQ(rec.step_batches.count(5), 0u);
  EXPECT_EQ(rec.step_batches.at(4), 40);
}

TEST(JobProgressTest, TheBatchesKeptAreBounded) {
  JobRecord rec;
  for (int64_t s = 1; s <= static_cast<int64_t>(kMaxStepBatchesKept) + 10; ++s) {
    ApplyStepReport(Step(s, 3.0, s, s), s, &rec);
  }
  EXPECT_EQ(rec.step_batches.size(), kMaxStepBatchesKept);
  EXPECT_EQ(rec.step_batches.begin()->first, 11);
}

TEST(JobProgressTest, RemainingRuntimeFromTheMeasuredStepElseThePlanElseUnknown) {
  loom::v1::Job job;
  job.mutable_spec()->mutable_schedule()->set_total_steps(1000);
  job.mutable_spec()->mutable_batch()->set_global_batch(8);
  job.mutable_spec()->mutable_model()->mutable_gpt()->set_seq_len(128);
  EXPECT_EQ(EstimatedRemainingRuntime(job), absl::InfiniteDuration());
  // Planned at 0.5 s a step: 1,000 steps, twice over.
  job.mutable_plan()->mutable_layout()->set_step_seconds(0.5);
  EXPECT_EQ(EstimatedRemainingRuntime(job), absl::Seconds(1000));
  // 600 steps done at 2,048 tokens/s, 1,024 tokens a step: 400 x 0.5 s x 1.2.
  job.mutable_summary()->set_last_step(600);
  job.mutable_summary()->set_last_tokens_per_second(2048);
  EXPECT_EQ(EstimatedRemainingRuntime(job), absl::Seconds(240));
  job.mutable_summary()->set_last_step(1000);
  EXPECT_EQ(EstimatedRemainingRuntime(job), absl::ZeroDuration());
}

}  // namespace
}  // namespace loom::controller
