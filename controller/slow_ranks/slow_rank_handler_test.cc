#include "controller/slow_ranks/slow_rank_handler.h"

#include <string>
#include <vector>

#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Slow ranks over the real table, registry and store; a move off a node
// goes through the preemptor, which slow ranks depend on by design.
class SlowRankHandlerTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    preemptor_ = std::make_unique<Preemptor>(jobs_.get(), &ranks_, catalog_.get(), &clock_,
                                             nullptr, &queues_);
    handler_ = std::make_unique<SlowRankHandler>(jobs_.get(), &workers_, store_.get(),
                                                 preemptor_.get(), nullptr, &clock_, nullptr,
                                                 &schedule_);
  }
  void TearDown() override {
    handler_.reset();
    preemptor_.reset();
    JobsFixture::TearDown();
  }

  static loom::v1::JobSpec Spec(const std::string& action) {
    loom::v1::JobSpec spec;
    spec.mutable_recovery()->mutable_slow_rank()->set_action(action);
    spec.mutable_recovery()->mutable_slow_rank()->set_cordon_seconds(600);
    return spec;
  }

  // Steps 1..`steps`, one a second, rank 2 three times slower than 0 and 1.
  void Train(JobRecord& rec, int steps) {
    const RecoveryOptions recovery = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
    for (int s = 1; s <= steps; ++s) {
      loom::v1::StepMetrics m;
      m.set_step(s);
      m.set_time_unix_ms(clock_.NowUnixMillis());
      m.add_rank_compute_seconds(1.0 + 0.01 * (s % 3));
      m.add_rank_compute_seconds(1.0 - 0.01 * (s % 2));
      m.add_rank_compute_seconds(3.0);
      Trained(rec, s);
      handler_->Observe(rec, m, recovery);
      clock_.Advance(absl::Seconds(1));
    }
  }

  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  ScheduleSignal schedule_;
  std::unique_ptr<Preemptor> preemptor_;
  std::unique_ptr<SlowRankHandler> handler_;
};

TEST_F(SlowRankHandlerTest, ReportNamesTheRankWithItsEvidenceAndChangesNothing) {
  const std::vector<std::string> w = {AddWorker("node-a"), AddWorker("node-b"),
                                      AddWorker("node-c")};
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w, Spec("report"));
  Train(rec, 12);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SLOW_RANK));
  const RecoveryEvent& ev = rec.job.events(0);
  EXPECT_EQ(ev.rank(), 2);
  EXPECT_EQ(ev.worker_id(), w[2]);
  EXPECT_NEAR(ev.slowdown(), 3.0, 0.1);
  EXPECT_THAT(ev.message(), HasSubstr("on worker " + w[2] + " (node node-c)"));
  EXPECT_THAT(ev.message(), HasSubstr("\"report\": nothing else is done"));
  EXPECT_FALSE(workers_.IsCordoned("node-c"));
  EXPECT_FALSE(rec.preempting.has_value());
  // One finding per attempt: no second event for the same rank.
  Train(rec, 12);
  EXPECT_EQ(rec.job.events_size(), 1);
}

TEST_F(SlowRankHandlerTest, CordonMovesTheJobOffTheNodeWhenItsGangFitsElsewhere) {
  const std::vector<std::string> w = {AddWorker("node-a", 1), AddWorker("node-b", 1),
                                      AddWorker("node-c", 1)};
  AddWorker("node-d", 1);
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w, Spec("cordon"));
  schedule_.Reset();
  Train(rec, 12);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SLOW_RANK));
  EXPECT_TRUE(workers_.IsCordoned("node-c"));
  EXPECT_TRUE(schedule_.Due(clock_.Now()));
  // The cordon outlives a controller restart.
  auto cordons = store_->LoadCordons(clock_.NowUnixMillis());
  ASSERT_TRUE(cordons.ok());
  ASSERT_EQ(cordons->size(), 1u);
  EXPECT_EQ((*cordons)[0].node, "node-c");
  // The ranks save and stop to move off it.
  ASSERT_TRUE(rec.preempting.has_value());
  EXPECT_EQ(rec.preempting->intent, MoveIntent::kAwayFromNode);
  EXPECT_EQ(rec.preempting->away_from_node, "node-c");
  EXPECT_TRUE(TakeCommands(w[0])[0].stop().checkpoint_first());
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("to place the job again without it"));
}

TEST_F(SlowRankHandlerTest, CordonWithNowhereElseToGoKeepsTheJobRunning) {
  const std::vector<std::string> w = {AddWorker("node-a", 1), AddWorker("node-b", 1),
                                      AddWorker("node-c", 1)};
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w, Spec("cordon"));
  Train(rec, 12);
  EXPECT_TRUE(workers_.IsCordoned("node-c"));
  EXPECT_FALSE(rec.preempting.has_value());
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("its gang does not fit elsewhere, so the job keeps running there"));
}

}  // namespace
}  // namespace loom::controller
