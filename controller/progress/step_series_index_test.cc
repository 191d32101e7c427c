#include "controller/progress/step_series_index.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

class StepSeriesIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_step_series_index_testXXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    index_ = std::make_unique<StepSeriesIndex>(store_.get());
  }
  void TearDown() override {
    index_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Records steps [from, to] of job "j" with loss `loss(step)`, and keeps
  // them as the latest record of each step.
  void Record(int64_t from, int64_t to, double (*loss)(int64_t)) {
    std::vector<loom::v1::StepMetrics> batch;
    for (int64_t s = from; s <= to; ++s) {
      loom::v1::StepMetrics m;
      m.set_step(s);
      m.set_loss(loss(s));
      m.set_tokens_seen(s * 100);
      latest_[s] = static_cast<float>(m.loss());
      batch.push_back(m);
      if (batch.size() == 1000 || s == to) {
        ASSERT_TRUE(store_->AppendStepMetrics("j", batch).ok());
        batch.clear();
      }
    }
  }

  loom::v1::GetStepSeriesResponse Query(int buckets, int64_t generation, int64_t resume,
                                        int64_t from = 0, int64_t to = 0) {
    loom::v1::GetStepSeriesRequest r;
    r.set_job_id("j");
    r.set_buckets(buckets);
    r.set_from_step(from);
    r.set_to_step(to);
    r.add_series("loss");
    auto got = index_->Query(r, generation, resume);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : loom::v1::GetStepSeriesResponse();
  }

  // Every bucket's first, last, min and max are those of the latest
  // records of the steps it says it holds; the buckets cover the range in
  // order, without overlap.
  void ExpectExact(const loom::v1::GetStepSeriesResponse& r, int64_t from, int64_t to) {
    int64_t next = from;
    int64_t steps = 0;
    for (int i = 0; i < r.bucket_first_step_size(); ++i) {
      const int64_t a = r.bucket_first_step(i), b = r.bucket_last_step(i);
      ASSERT_EQ(a, next) << "bucket " << i;
      ASSERT_LE(a, b);
      float lo = latest_.at(a), hi = lo;
      for (int64_t s = a; s <= b; ++s) {
        lo = std::min(lo, latest_.at(s));
        hi = std::max(hi, latest_.at(s));
      }
      EXPECT_EQ(r.series(0).first(i), latest_.at(a)) << "bucket " << i;
      EXPECT_EQ(r.series(0).last(i), latest_.at(b)) << "bucket " << i;
      EXPECT_EQ(r.series(0).min(i), lo) << "bucket " << i;
      EXPECT_EQ(r.series(0).max(i), hi) << "bucket " << i;
      steps += b - a + 1;
      next = b + 1;
    }
    EXPECT_EQ(next, to + 1);
    EXPECT_EQ(r.steps(), steps);
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StepSeriesIndex> index_;
  std::map<int64_t, float> latest_;
};

double Wavy(int64_t s) { return 3.0 + ((s * 7919) % 101) / 100.0 + (s == 7777 ? 20 : 0); }
double Flat(int64_t) { return 1.0; }

TEST_F(StepSeriesIndexTest, BlocksAnswerLikeTheStepsAndFollowNewStepsAndRollbacks) {
  ASSERT_NO_FATAL_FAILURE(Record(1, 10'000, Wavy));
  auto r = Query(100, /*generation=*/0, /*resume=*/-1);
  EXPECT_EQ(r.first_step(), 1);
  EXPECT_EQ(r.last_step(), 10'000);
  ASSERT_NO_FATAL_FAILURE(ExpectExact(r, 1, 10'000));
  EXPECT_EQ(index_->BlocksOf("j"), 10'000u / 32);  // the complete blocks
  // The spike is some bucket's maximum.
  EXPECT_EQ(*std::max_element(r.series(0).max().begin(), r.series(0).max().end()),
            static_cast<float>(Wavy(7777)));

  // New steps: the next query has them, and the index grew.
  ASSERT_NO_FATAL_FAILURE(Record(10'001, 12'000, Wavy));
  r = Query(100, 0, -1);
  EXPECT_EQ(r.last_step(), 12'000);
  ASSERT_NO_FATAL_FAILURE(ExpectExact(r, 1, 12'000));
  EXPECT_EQ(index_->BlocksOf("j"), 12'000u / 32);

  // A rollback: generation 1 resumed at step 5000 re-records 5000..12000
  // flat. The blocks from there are read again; those before are kept.
  ASSERT_NO_FATAL_FAILURE(Record(5'000, 12'000, Flat));
  r = Query(100, 1, 5'000);
  ASSERT_NO_FATAL_FAILURE(ExpectExact(r, 1, 12'000));
  EXPECT_EQ(r.series(0).max(r.bucket_first_step_size() - 1), 1.0f);

  // Zoomed in (fewer than 64 steps a bucket): read from the steps.
  r = Query(100, 1, 5'000, 4'950, 5'100);
  ASSERT_NO_FATAL_FAILURE(ExpectExact(r, 4'950, 5'100));
  EXPECT_EQ(r.bucket_first_step_size(), 100);
  // A range not on block edges, from the blocks and both ends' steps.
  r = Query(10, 1, 5'000, 1'001, 9'999);
  ASSERT_NO_FATAL_FAILURE(ExpectExact(r, 1'001, 9'999));
}

TEST_F(StepSeriesIndexTest, AJobWithoutStepsAnswersEmpty) {
  loom::v1::GetStepSeriesRequest r;
  r.set_job_id("none");
  auto got = index_->Query(r, 0, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->steps(), 0);
  EXPECT_EQ(got->bucket_first_step_size(), 0);
  r.set_buckets(-1);
  EXPECT_EQ(index_->Query(r, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The store's chunked scan that builds the index: every record in (step,
// record) order, each once, whatever the chunk size and wherever a chunk
// ends (in the middle of a step's repeated records too), within [from, to].
TEST_F(StepSeriesIndexTest, StoreScanVisitsEveryRecordOnceAcrossChunks) {
  std::vector<loom::v1::StepMetrics> batch;
  for (int64_t s = 1; s <= 20; ++s) {
    for (int again = 0; again < (s == 7 ? 3 : 1); ++again) {
      loom::v1::StepMetrics m;
      m.set_step(s);
      m.set_loss(static_cast<double>(s) + again / 10.0);
      batch.push_back(m);
    }
  }
  ASSERT_TRUE(store_->AppendStepMetrics("j", batch).ok());
  for (int chunk : {1, 2, 3, 5, 100}) {
    std::vector<double> seen;
    ASSERT_TRUE(
        store_
            ->ScanStepMetrics(
                "j", 5, 9, [&](const loom::v1::StepMetrics& m) { seen.push_back(m.loss()); }, chunk)
            .ok());
    EXPECT_THAT(seen, ::testing::ElementsAre(5, 6, 7, 7.1, 7.2, 8, 9)) << "chunk " << chunk;
  }
}

}  // namespace
}  // namespace loom::controller
