#include "controller/progress/series_warmer.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

class SeriesWarmerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_series_warmer_testXXXXXX";
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

  // A job of `steps` recorded steps, last active at `active_ms`.
  loom::v1::Job Job(const std::string& id, int64_t steps, int64_t active_ms) {
    std::vector<loom::v1::StepMetrics> batch;
    for (int64_t s = 1; s <= steps; ++s) {
      loom::v1::StepMetrics m;
      m.set_step(s);
      m.set_loss(1.0 / static_cast<double>(s));
      batch.push_back(m);
    }
    EXPECT_TRUE(store_->AppendStepMetrics(id, batch).ok());
    loom::v1::Job job;
    job.set_id(id);
    job.mutable_summary()->set_last_step(steps);
    job.mutable_summary()->set_last_step_unix_ms(active_ms);
    return job;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StepSeriesIndex> index_;
};

// Once the controller leads: the long jobs, newest first, and no short one.
TEST_F(SeriesWarmerTest, WarmsTheLongJobsOnceLeading) {
  const int64_t n = SeriesWarmer::kMinSteps;
  std::vector<loom::v1::Job> jobs = {Job("old-long", n, 1000), Job("short", 500, 3000),
                                     Job("new-long", n + 100, 2000)};
  std::atomic<bool> leading{false};
  SeriesWarmer warmer(
      index_.get(), [&] { return jobs; }, [&] { return leading.load(); });
  usleep(700 * 1000);
  EXPECT_TRUE(warmer.warmed().empty()) << "warmed while standing by";
  EXPECT_EQ(index_->BlocksOf("new-long"), 0u);
  leading = true;
  warmer.WaitDone();
  EXPECT_THAT(warmer.warmed(), ::testing::ElementsAre("new-long", "old-long"));
  EXPECT_EQ(index_->BlocksOf("new-long"), static_cast<size_t>((n + 100) / 32));
  EXPECT_GT(index_->BlocksOf("old-long"), 0u);
  EXPECT_EQ(index_->BlocksOf("short"), 0u);
}

// A warmer that never leads warms nothing, and its destruction ends its
// wait (a hang here is the failure, caught by the test's timeout).
TEST_F(SeriesWarmerTest, StopsWhileStandingBy) {
  std::vector<loom::v1::Job> jobs = {Job("long", SeriesWarmer::kMinSteps, 1000)};
  auto warmer = std::make_unique<SeriesWarmer>(
      index_.get(), [&] { return jobs; }, [] { return false; });
  usleep(600 * 1000);
  EXPECT_TRUE(warmer->warmed().empty());
  warmer.reset();
  EXPECT_EQ(index_->BlocksOf("long"), 0u);
}

}  // namespace
}  // namespace loom::controller
