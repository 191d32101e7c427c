#include "controller/drains/drains.h"

#include <limits>
#include <string>
#include <vector>

#include "controller/jobs/jobs_test_fixture.h"
#include "controller/recovery/recovery_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Cordons and drains over the real table, registry, catalog and store; a
// drain's moves go through the preemptor and, for elastic jobs, the
// replanner, as in the controller.
class DrainsTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    queues_.preemption_grace = absl::Seconds(60);
    preemptor_ = std::make_unique<Preemptor>(jobs_.get(), &ranks_, catalog_.get(), &clock_, nullptr,
                                             &queues_);
    replanner_ = std::make_unique<Replanner>(jobs_.get(), &workers_, catalog_.get(),
                                             preemptor_.get(), &clock_, nullptr, &queues_,
                                             Replanner::Options{absl::Seconds(1)});
    drains_ = std::make_unique<Drains>(jobs_.get(), &workers_, preemptor_.get(), replanner_.get(),
                                       catalog_.get(), store_.get(), &schedule_, &clock_);
    preemptor_->SetMoveHandler(MoveIntent::kDrain, drains_.get());
    for (const char* node : {"node-a", "node-b", "node-c"}) w_.push_back(AddWorker(node, 1));
  }
  void TearDown() override {
    drains_.reset();
    replanner_.reset();
    preemptor_.reset();
    JobsFixture::TearDown();
  }

  static loom::v1::JobSpec Fixed() {
    loom::v1::JobSpec spec = TinyGptSpec("fixed");
    spec.mutable_schedule()->set_total_steps(1000);
    return spec;
  }
  static loom::v1::JobSpec Elastic(int ranks) {
    loom::v1::JobSpec spec = Fixed();
    spec.mutable_resources()->set_workers(ranks);
    spec.mutable_resources()->set_ranks(ranks);
    spec.mutable_elastic()->set_min_ranks(1);
    spec.mutable_elastic()->set_max_ranks(3);
    return spec;
  }
  loom::v1::DrainNodeRequest DrainOf(const std::string& node, int64_t deadline = 0) {
    loom::v1::DrainNodeRequest r;
    r.set_node(node);
    r.set_reason("kernel upgrade");
    r.set_deadline_seconds(deadline);
    return r;
  }
  std::vector<Store::CordonRow> StoredCordons() {
    auto rows = store_->LoadCordons(clock_.NowUnixMillis());
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() ? *rows : std::vector<Store::CordonRow>{};
  }

  scheduling::QueueConfig queues_ = scheduling::DefaultQueueConfig();
  ScheduleSignal schedule_;
  std::unique_ptr<Preemptor> preemptor_;
  std::unique_ptr<Replanner> replanner_;
  std::unique_ptr<Drains> drains_;
  std::vector<std::string> w_;
};

TEST_F(DrainsTest, AnOperatorsCordonLastsUntilUncordonedAndIsStored) {
  loom::v1::CordonNodeRequest req;
  req.set_node("node-a");
  req.set_reason("bad DIMM");
  auto r = drains_->Cordon(req, "user 'ada'");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 1);
  EXPECT_TRUE(r->workers(0).cordoned());
  EXPECT_EQ(r->workers(0).cordoned_until_unix_ms(), 0);  // until uncordoned
  EXPECT_EQ(r->workers(0).cordon_reason(), "cordoned by user 'ada': bad DIMM");
  clock_.Advance(absl::Hours(24 * 30));
  EXPECT_TRUE(workers_.IsCordoned("node-a"));
  for (const WorkerOffer& o : workers_.Offers(false)) EXPECT_NE(o.info.node(), "node-a");
  // A restarted controller loads it (Store::LoadCordons, JobManager::Recover).
  ASSERT_EQ(StoredCordons().size(), 1u);
  EXPECT_EQ(StoredCordons()[0].until_unix_ms, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(WorkerRegistry::CordonEndFromUnixMillis(StoredCordons()[0].until_unix_ms),
            absl::InfiniteFuture());

  // A slow rank's shorter cordon does not shorten it.
  workers_.Cordon("node-a", clock_.Now() + absl::Seconds(600), "a slow rank");
  clock_.Advance(absl::Seconds(601));
  EXPECT_TRUE(workers_.IsCordoned("node-a"));

  loom::v1::UncordonNodeRequest un;
  un.set_node("node-a");
  schedule_.Reset();
  auto back = drains_->Uncordon(un, "user 'ada'");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->workers(0).cordoned());
  EXPECT_FALSE(workers_.IsCordoned("node-a"));
  EXPECT_TRUE(StoredCordons().empty());
  EXPECT_TRUE(schedule_.Due(clock_.Now()));  // its slots can take ranks again
}

TEST_F(DrainsTest, ACordonForATimeEndsByItself) {
  loom::v1::CordonNodeRequest req;
  req.set_node("node-b");
  req.set_seconds(60);
  schedule_.Reset();
  auto r = drains_->Cordon(req, "user 'ada'");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->workers(0).cordoned_until_unix_ms(), clock_.NowUnixMillis() + 60000);
  EXPECT_EQ(r->workers(0).cordon_reason(), "cordoned by user 'ada'");
  EXPECT_TRUE(schedule_.Due(clock_.Now() + absl::Seconds(60)));  // placement runs at its end
  clock_.Advance(absl::Seconds(60));
  EXPECT_FALSE(workers_.IsCordoned("node-b"));
  EXPECT_TRUE(StoredCordons().empty());
}

TEST_F(DrainsTest, BadRequestsNameTheFieldAndChangeNothing) {
  loom::v1::CordonNodeRequest req;
  EXPECT_THAT(drains_->Cordon(req, "").status().message(), HasSubstr("node: must not be empty"));
  req.set_node("node-z");
  auto unknown = drains_->Cordon(req, "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("loomctl workers"));
  req.set_node("node-a");
  req.set_seconds(-1);
  EXPECT_THAT(drains_->Cordon(req, "").status().message(), HasSubstr("seconds: -1"));
  req.set_seconds(0);
  req.set_reason(std::string(Drains::kMaxReasonBytes + 1, 'x'));
  EXPECT_THAT(drains_->Cordon(req, "").status().message(), HasSubstr("reason: 513 bytes"));
  loom::v1::DrainNodeRequest drain = DrainOf("node-a", Drains::kMaxDeadlineSeconds + 1);
  EXPECT_THAT(drains_->Drain(drain, "").status().message(), HasSubstr("deadline_seconds"));
  loom::v1::UncordonNodeRequest un;
  EXPECT_EQ(drains_->Uncordon(un, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(workers_.IsCordoned("node-a"));
  EXPECT_TRUE(StoredCordons().empty());
}

TEST_F(DrainsTest, ADrainedJobSavesStopsAndIsPlacedAgainWithoutLosingAStepOrARestart) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {w_[0]}, Fixed());
  JobRecord& other = AddJob("job-2", loom::v1::RUNNING, {w_[1]}, Fixed());
  Commit(rec, 4);
  Trained(rec, 6);
  auto r = drains_->Drain(DrainOf("node-a", 120), "user 'ada'");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->moving_job_ids(), ElementsAre("job-1"));
  EXPECT_TRUE(r->workers(0).cordoned());
  EXPECT_EQ(r->workers(0).cordon_reason(), "drained by user 'ada': kernel upgrade");
  EXPECT_FALSE(other.preempting.has_value());
  // Asked to save and stop, with the drain's deadline.
  ASSERT_TRUE(rec.preempting.has_value());
  EXPECT_EQ(rec.preempting->intent, MoveIntent::kDrain);
  EXPECT_EQ(rec.preempting->deadline, clock_.Now() + absl::Seconds(120));
  const std::vector<loom::v1::WorkerCommand> sent = TakeCommands(w_[0]);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].stop().checkpoint_first());
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING));
  EXPECT_EQ(rec.job.events(0).cause(), kCauseDrain);
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("node node-a is draining (by user 'ada': kernel upgrade)"));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("within 120s"));
  // The ask is stored before the ranks act.
  EXPECT_THAT(EventKinds(Stored("job-1")), ElementsAre(RecoveryEvent::DRAINING));

  // The ranks saved at step 7 and stopped.
  clock_.Advance(absl::Seconds(2));
  Trained(rec, 7);
  Commit(rec, 7);
  RanksExited(rec);
  preemptor_->Finish(rec);
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 0);
  EXPECT_EQ(rec.job.preemptions(), 0);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING, RecoveryEvent::DRAINED));
  const RecoveryEvent& drained = rec.job.events(1);
  EXPECT_EQ(drained.checkpoint_step(), 7);
  EXPECT_EQ(drained.steps_lost(), 0);
  EXPECT_THAT(drained.message(), HasSubstr("0 steps lost"));
  EXPECT_THAT(rec.job.reason(), HasSubstr("node node-a was drained; placed again without it"));
  // Placement now leaves node-a out.
  for (const WorkerOffer& o : workers_.Offers(false)) EXPECT_NE(o.info.node(), "node-a");
}

TEST_F(DrainsTest, ASaveThatMissesTheDeadlineIsStoppedAndItsLostStepsAreCounted) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {w_[0]}, Fixed());
  Commit(rec, 4);
  Trained(rec, 9);
  ASSERT_TRUE(drains_->Drain(DrainOf("node-a", 5), "user 'ada'").ok());
  TakeCommands(w_[0]);
  clock_.Advance(absl::Seconds(5));
  preemptor_->CheckGraces();
  const std::vector<loom::v1::WorkerCommand> sent = TakeCommands(w_[0]);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].stop().checkpoint_first());  // the plain stop
  EXPECT_THAT(rec.job.reason(), HasSubstr("moving off draining node node-a"));
  RanksExited(rec);
  preemptor_->Finish(rec);
  const RecoveryEvent& drained = rec.job.events(rec.job.events_size() - 1);
  EXPECT_EQ(drained.kind(), RecoveryEvent::DRAINED);
  EXPECT_EQ(drained.checkpoint_step(), 4);
  EXPECT_EQ(drained.steps_lost(), 5);
  EXPECT_THAT(drained.message(), HasSubstr("stopped at the deadline"));
  EXPECT_THAT(drained.message(), HasSubstr("5 step(s) lost"));
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.restarts(), 0);
}

TEST_F(DrainsTest, AJobNotYetTrainingMovesAtOnce) {
  JobRecord& rec = AddJob("job-1", loom::v1::SCHEDULED, {w_[0]}, Fixed());
  ASSERT_TRUE(drains_->Drain(DrainOf("node-a"), "user 'ada'").ok());
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING, RecoveryEvent::DRAINED));
  EXPECT_EQ(rec.job.events(1).steps_lost(), 0);
  EXPECT_THAT(rec.job.events(1).message(), HasSubstr("nothing lost"));
}

TEST_F(DrainsTest, AnElasticJobIsReplannedWithoutTheDrainedNode) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w_, Elastic(3));
  Commit(rec, 5);
  Trained(rec, 5);
  ASSERT_TRUE(drains_->Drain(DrainOf("node-c"), "user 'ada'").ok());
  ASSERT_TRUE(rec.preempting.has_value());
  EXPECT_EQ(rec.preempting->deadline, clock_.Now() + queues_.preemption_grace);
  const absl::Time drained_at = clock_.Now();
  RanksExited(rec);
  preemptor_->Finish(rec);
  // Not re-planned yet: another node of its pool may drain next.
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.not_before, drained_at + Drains::kSettle);
  EXPECT_THAT(rec.job.reason(), HasSubstr("re-planned once no node has drained for 5s"));
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING, RecoveryEvent::DRAINED));
  drains_->Tick();
  EXPECT_EQ(rec.job.events_size(), 2);
  clock_.Advance(Drains::kSettle);
  ASSERT_TRUE(workers_.RecordHeartbeat(w_[0], 29500).ok());
  ASSERT_TRUE(workers_.RecordHeartbeat(w_[1], 29500).ok());
  drains_->Tick();
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_EQ(rec.job.spec().resources().ranks(), 2);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING, RecoveryEvent::DRAINED,
                                           RecoveryEvent::REPLANNED));
  EXPECT_EQ(rec.job.events(2).cause(), kCauseDrain);
  EXPECT_EQ(rec.job.events(2).steps_lost(), 0);
  EXPECT_THAT(rec.job.events(2).message(), HasSubstr("node node-c was drained"));
  EXPECT_EQ(rec.job.restarts(), 0);
}

TEST_F(DrainsTest, NodesDrainedSecondsApartCauseOneReplan) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, w_, Elastic(3));
  Commit(rec, 5);
  Trained(rec, 5);
  ASSERT_TRUE(drains_->Drain(DrainOf("node-c"), "user 'ada'").ok());
  clock_.Advance(absl::Seconds(1));
  RanksExited(rec);
  preemptor_->Finish(rec);
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  // Three seconds later the pool's next node drains: the job still waits.
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(drains_->Drain(DrainOf("node-b"), "user 'ada'").ok());
  EXPECT_EQ(rec.not_before, clock_.Now() + Drains::kSettle);
  clock_.Advance(absl::Seconds(3));
  drains_->Tick();
  EXPECT_EQ(rec.job.layout_generation(), 0);  // not yet
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(workers_.RecordHeartbeat(w_[0], 29500).ok());
  drains_->Tick();
  // One re-plan, onto the one node left.
  EXPECT_EQ(rec.job.layout_generation(), 1);
  EXPECT_EQ(rec.job.spec().resources().ranks(), 1);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING, RecoveryEvent::DRAINED,
                                           RecoveryEvent::REPLANNED));
  EXPECT_THAT(rec.job.events(2).message(), HasSubstr("nodes node-b, node-c were drained"));
  EXPECT_EQ(rec.not_before, absl::InfinitePast());
}

TEST_F(DrainsTest, ANodesNoticeDrainsItOnceByTheDeadlineAndItsCordonEndsAfter) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {w_[0]}, Fixed());
  Trained(rec, 12);
  loom::v1::NodeNotice notice;
  notice.set_source("aws-spot");
  notice.set_detail("spot instance-action terminate at 2026-12-07T08:22:00Z");
  notice.set_deadline_unix_ms(clock_.NowUnixMillis() + 118000);
  const loom::v1::WorkerInfo worker = workers_.Find(w_[0])->info;
  drains_->Notice(worker, notice);
  ASSERT_TRUE(rec.preempting.has_value());
  EXPECT_EQ(rec.preempting->deadline, clock_.Now() + absl::Seconds(118));
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::DRAINING));
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr(absl::StrCat("by worker ", w_[0],
                                     ": aws-spot notice, 118s before the node goes; spot "
                                     "instance-action terminate")));
  EXPECT_EQ(TakeCommands(w_[0]).size(), 1u);
  // The same notice again (every heartbeat carries it): nothing more.
  clock_.Advance(absl::Seconds(1));
  drains_->Notice(worker, notice);
  EXPECT_EQ(rec.job.events_size(), 1);
  EXPECT_TRUE(TakeCommands(w_[0]).empty());
  // The cordon ends a minute after the deadline: a node back under the
  // same name takes ranks again.
  EXPECT_TRUE(workers_.IsCordoned("node-a"));
  clock_.Advance(absl::Seconds(117 + 60));
  EXPECT_FALSE(workers_.IsCordoned("node-a"));
}

TEST_F(DrainsTest, ANodeBackUnderANewWorkerIsUncordonedUnlessAnOperatorCordonedIt) {
  loom::v1::NodeNotice notice;
  notice.set_source("sigterm");
  notice.set_deadline_unix_ms(clock_.NowUnixMillis() + 25000);
  drains_->Notice(workers_.Find(w_[0])->info, notice);
  EXPECT_TRUE(workers_.IsCordoned("node-a"));
  drains_->Registered("node-a", w_[0]);  // the same worker: still going
  EXPECT_TRUE(workers_.IsCordoned("node-a"));
  drains_->Registered("node-a", "node-a-new");  // its daemon came back
  EXPECT_FALSE(workers_.IsCordoned("node-a"));
  EXPECT_TRUE(StoredCordons().empty());
  // An operator's drain is not lifted by a new worker.
  ASSERT_TRUE(drains_->Drain(DrainOf("node-b"), "user 'ada'").ok());
  drains_->Registered("node-b", "node-b-new");
  EXPECT_TRUE(workers_.IsCordoned("node-b"));
}

}  // namespace
}  // namespace loom::controller
