#include "controller/progress/goodput_board.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::controller {
namespace {

// A job queued 10 s, then running from t=10 s with `steps` 1-second steps
// (the first ending at t=12 s); ended at t=12+steps when `ended`.
loom::v1::Job MakeJob(const std::string& id, bool ended, int steps) {
  loom::v1::Job job;
  job.set_id(id);
  auto add = [&job](loom::v1::JobState to, double at) {
    auto* t = job.add_history();
    t->set_to(to);
    t->set_time_unix_ms(static_cast<int64_t>(at * 1000));
  };
  add(loom::v1::PENDING, 0);
  add(loom::v1::SCHEDULED, 10);
  add(loom::v1::RUNNING, 10.5);
  if (ended) add(loom::v1::SUCCEEDED, 12 + steps);
  job.set_state(ended ? loom::v1::SUCCEEDED : loom::v1::RUNNING);
  job.set_updated_unix_ms(ended ? (12 + steps) * 1000 : 10500);
  return job;
}

std::vector<loom::v1::StepMetrics> MakeSteps(int count) {
  std::vector<loom::v1::StepMetrics> out;
  for (int i = 0; i < count; ++i) {
    loom::v1::StepMetrics s;
    s.set_step(i + 1);
    s.set_time_unix_ms((12 + i) * 1000);
    s.set_step_time_seconds(1.0);
    out.push_back(s);
  }
  return out;
}

struct Fixture {
  int reads = 0;
  int steps = 10;
  GoodputBoard board{
      [this](const std::string& id) -> absl::StatusOr<std::vector<loom::v1::StepMetrics>> {
        ++reads;
        if (id == "gone") return absl::NotFoundError("job gone: no such job");
        return MakeSteps(steps);
      },
      absl::Seconds(5), /*max_jobs=*/3};
};

const double kT0 = 100;  // seconds: "now" in these tests

TEST(GoodputBoardTest, AnswersBucketsThatSumToTheWallTimeWithTheirNamesAndEttr) {
  Fixture f;
  absl::StatusOr<loom::v1::GetGoodputResponse> got =
      f.board.Get(MakeJob("a", true, 10), absl::FromUnixSeconds(kT0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_DOUBLE_EQ(got->wall_seconds(), 22);  // ended at 22 s: `now` does not count
  double sum = 0;
  std::vector<std::string> names;
  for (const loom::v1::GoodputBucket& b : got->buckets()) {
    EXPECT_GE(b.seconds(), 0) << b.name();
    EXPECT_FALSE(b.description().empty()) << b.name();
    sum += b.seconds();
    names.push_back(b.name());
  }
  EXPECT_NEAR(sum, got->wall_seconds(), 1e-9);
  ASSERT_EQ(names.size(), 11u);
  EXPECT_EQ(names.front(), "queued");
  EXPECT_EQ(names.back(), "unaccounted");
  EXPECT_EQ(got->step_reports(), 10);
  EXPECT_EQ(got->computed_unix_ms(), kT0 * 1000);
  // 10 productive seconds of the 12 after the queue.
  EXPECT_NEAR(got->ettr(), 10.0 / 12.0, 1e-9);

  const GoodputBuckets back = GoodputBoard::FromResponse(*got);
  EXPECT_DOUBLE_EQ(back.queued, 10);
  EXPECT_DOUBLE_EQ(back.productive, 10);
  EXPECT_DOUBLE_EQ(back.wall, 22);
  EXPECT_NEAR(back.ettr(), got->ettr(), 1e-12);
}

TEST(GoodputBoardTest, ARunningJobsFiguresAreReadAgainOnceOlderThanMaxAge) {
  Fixture f;
  const loom::v1::Job job = MakeJob("a", false, 10);
  ASSERT_TRUE(f.board.Get(job, absl::FromUnixSeconds(kT0)).ok());
  f.steps = 20;
  absl::StatusOr<loom::v1::GetGoodputResponse> again =
      f.board.Get(job, absl::FromUnixSeconds(kT0 + 4));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(f.reads, 1);  // kept: 4 s old
  EXPECT_EQ(again->step_reports(), 10);
  again = f.board.Get(job, absl::FromUnixSeconds(kT0 + 5));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(f.reads, 2);
  EXPECT_EQ(again->step_reports(), 20);
  EXPECT_DOUBLE_EQ(again->wall_seconds(), kT0 + 5);  // still going: up to now
  // Refresh always reads.
  ASSERT_TRUE(f.board.Refresh(job, absl::FromUnixSeconds(kT0 + 6)).ok());
  EXPECT_EQ(f.reads, 3);
}

TEST(GoodputBoardTest, FiguresFromNoStepReportsAreReadAgainAtOnce) {
  Fixture f;
  f.steps = 0;
  const loom::v1::Job job = MakeJob("a", false, 0);
  absl::StatusOr<loom::v1::GetGoodputResponse> got = f.board.Get(job, absl::FromUnixSeconds(kT0));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->step_reports(), 0);
  EXPECT_EQ(got->ettr(), 0);
  // Its first reports come a second later: they are answered, not the
  // figures of a job that has not trained.
  f.steps = 10;
  got = f.board.Get(job, absl::FromUnixSeconds(kT0 + 1));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(f.reads, 2);
  EXPECT_EQ(got->step_reports(), 10);
  EXPECT_GT(got->ettr(), 0);
  // Figures with reports are kept as before.
  ASSERT_TRUE(f.board.Get(job, absl::FromUnixSeconds(kT0 + 2)).ok());
  EXPECT_EQ(f.reads, 2);
}

TEST(GoodputBoardTest, AnEndedJobsFiguresAreKeptUntilItsRecordChanges) {
  Fixture f;
  loom::v1::Job job = MakeJob("a", true, 10);
  ASSERT_TRUE(f.board.Get(job, absl::FromUnixSeconds(kT0)).ok());
  ASSERT_TRUE(f.board.Get(job, absl::FromUnixSeconds(kT0 + 3600)).ok());
  EXPECT_EQ(f.reads, 1);
  job.set_updated_unix_ms(job.updated_unix_ms() + 1);  // changed after it ended
  ASSERT_TRUE(f.board.Get(job, absl::FromUnixSeconds(kT0 + 3601)).ok());
  EXPECT_EQ(f.reads, 2);
}

TEST(GoodputBoardTest, FiguresComputedWhileRunningAreNotFinalOnceTheJobEnds) {
  Fixture f;
  ASSERT_TRUE(f.board.Get(MakeJob("a", false, 10), absl::FromUnixSeconds(kT0)).ok());
  absl::StatusOr<loom::v1::GetGoodputResponse> ended =
      f.board.Get(MakeJob("a", true, 10), absl::FromUnixSeconds(kT0 + 10));
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(f.reads, 2);
  EXPECT_DOUBLE_EQ(ended->wall_seconds(), 22);
}

TEST(GoodputBoardTest, KeepsAtMostMaxJobsDroppingTheLeastRecentlyComputed) {
  Fixture f;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        f.board.Get(MakeJob(std::string(1, 'a' + i), true, 10), absl::FromUnixSeconds(kT0 + i))
            .ok());
  }
  EXPECT_EQ(f.board.size(), 3u);
  // "e" (newest) is kept; "a" (oldest) was dropped and is read again.
  ASSERT_TRUE(f.board.Get(MakeJob("e", true, 10), absl::FromUnixSeconds(kT0 + 10)).ok());
  EXPECT_EQ(f.reads, 5);
  ASSERT_TRUE(f.board.Get(MakeJob("a", true, 10), absl::FromUnixSeconds(kT0 + 11)).ok());
  EXPECT_EQ(f.reads, 6);
}

TEST(GoodputBoardTest, AStepReadErrorIsAnsweredAndNothingIsKept) {
  Fixture f;
  absl::StatusOr<loom::v1::GetGoodputResponse> got =
      f.board.Get(MakeJob("gone", true, 10), absl::FromUnixSeconds(kT0));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.board.size(), 0u);
}

}  // namespace
}  // namespace loom::controller
