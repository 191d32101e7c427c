#include "controller/progress/data_ledger.h"

#include "gtest/gtest.h"

namespace loom::controller {
namespace {

TEST(DataLedgerTest, TheDataLedgerCountsSkippedDuplicatedAndReplayedBatches) {
  auto record = [](int64_t step, int64_t batch, int64_t attempt, int32_t layout) {
    loom::v1::StepMetrics m;
    m.set_step(step);
    m.set_data_batch(batch);
    m.set_generation(attempt);
    m.set_layout_generation(layout);
    return m;
  };
  // Attempt 0 trains steps 1-6; a re-plan resumes attempt 1 from step 4
  // (steps 5-6 trained again, under layout 1); steps 7-8 follow.
  std::vector<loom::v1::StepMetrics> records;
  for (int64_t s = 1; s <= 6; ++s) records.push_back(record(s, s - 1, 0, 0));
  for (int64_t s = 5; s <= 8; ++s) records.push_back(record(s, s - 1, 1, 1));
  DataLedger ledger = ComputeDataLedger(records, {});
  EXPECT_EQ(ledger.steps, 8);
  EXPECT_EQ(ledger.first_batch, 0);
  EXPECT_EQ(ledger.last_batch, 7);
  EXPECT_EQ(ledger.skipped, 0);
  EXPECT_EQ(ledger.duplicated, 0);
  EXPECT_EQ(ledger.replayed, 2);
  EXPECT_EQ(ledger.missing_steps, 0);
  EXPECT_EQ(ledger.layout_generations, 2);

  // A resume that jumped a batch, and one that trained a batch twice.
  records.push_back(record(9, 9, 1, 1));   // batch 8 never trained
  records.push_back(record(10, 9, 1, 1));  // batch 9 again
  ledger = ComputeDataLedger(records, {});
  EXPECT_EQ(ledger.skipped, 1);
  EXPECT_EQ(ledger.duplicated, 1);
  // A rollback's skip range covers batch 8.
  loom::v1::SkipRange skip;
  skip.set_begin(8);
  skip.set_end(9);
  EXPECT_EQ(ComputeDataLedger(records, {skip}).skipped, 0);
}

}  // namespace
}  // namespace loom::controller
