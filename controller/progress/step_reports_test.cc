#include "controller/progress/step_reports.h"

#include <string>

#include "controller/jobs/jobs_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::RecoveryEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class StepReportsTest : public JobsFixture {
 protected:
  void SetUp() override {
    JobsFixture::SetUp();
    hub_ = std::make_unique<EventHub>(store_.get(), EventHub::Options{});
    rollbacks_ = std::make_unique<Rollbacks>(jobs_.get(), catalog_.get(), store_.get(), nullptr);
    reports_ =
        std::make_unique<StepReports>(jobs_.get(), &workers_, catalog_.get(), store_.get(),
                                      hub_.get(), &clock_, nullptr, rollbacks_.get(), nullptr);
    a_ = AddWorker("node-a");
  }
  void TearDown() override {
    reports_.reset();
    rollbacks_.reset();
    hub_.reset();
    JobsFixture::TearDown();
  }

  loom::v1::ReportStepMetricsRequest Steps(const JobRecord& rec, int64_t from, int64_t to,
                                           double loss = 3.0) {
    loom::v1::ReportStepMetricsRequest req;
    req.set_worker_id(a_);
    req.set_job_id(rec.job.id());
    req.set_generation(rec.job.generation());
    for (int64_t s = from; s <= to; ++s) {
      loom::v1::StepMetrics* m = req.add_events()->mutable_step();
      m->set_step(s);
      m->set_loss(loss + 0.001 * (s % 7));
      m->set_grad_norm(1.0);
      m->set_data_batch(s);
    }
    return req;
  }

  // Applies `req` and waits for its write, as the controller does.
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> Report(
      const loom::v1::ReportStepMetricsRequest& req) {
    StepReports::Applied applied = reports_->Apply(req);
    if (applied.write == nullptr) return std::move(applied.response);
    const absl::Status durable = store_->Wait(applied.write);
    return reports_->Finish(req.job_id(), req.generation(), std::move(applied), durable);
  }

  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<Rollbacks> rollbacks_;
  std::unique_ptr<StepReports> reports_;
  std::string a_;
};

TEST_F(StepReportsTest, StepsMoveTheAttemptOnAreStoredOnceAndARetryIsNotAppliedAgain) {
  JobRecord& rec = AddJob("job-1", loom::v1::SCHEDULED, {a_});
  ASSERT_TRUE(Report(Steps(rec, 1, 5)).ok());
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  EXPECT_EQ(rec.attempt_last_step, 5);
  ASSERT_TRUE(Report(Steps(rec, 3, 6)).ok());  // 3..5 are a retry
  EXPECT_EQ(rec.attempt_last_step, 6);
  auto stored = store_->LoadStepMetrics("job-1", 100);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), 6u);
  EXPECT_EQ(Stored("job-1").summary().last_step(), 6);
}

TEST_F(StepReportsTest, ReportsThatMayNotBeAppliedAreRefusedWithTheirReason) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_});
  loom::v1::ReportStepMetricsRequest req = Steps(rec, 1, 1);
  req.set_worker_id("w-unknown");
  EXPECT_EQ(Report(req).status().code(), absl::StatusCode::kNotFound);
  req = Steps(rec, 1, 1);
  req.set_job_id("nope");
  EXPECT_EQ(Report(req).status().code(), absl::StatusCode::kNotFound);
  // A worker holding no rank of the attempt.
  req = Steps(rec, 1, 1);
  req.set_worker_id(AddWorker("node-b"));
  EXPECT_EQ(Report(req).status().code(), absl::StatusCode::kPermissionDenied);
  // A checkpoint event no rank sends.
  req = Steps(rec, 1, 1);
  req.add_events()->mutable_checkpoint()->set_status("maybe");
  absl::Status s = Report(req).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("events[1].checkpoint.status"));
  EXPECT_EQ(rec.attempt_last_step, -1);  // nothing was applied
}

TEST_F(StepReportsTest, AStaleAttemptsCheckpointIsRecordedAndItsRanksToldToStop) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_});
  loom::v1::ReportStepMetricsRequest req = Steps(rec, 1, 1);
  rec.job.set_generation(2);
  req.set_generation(1);
  loom::v1::CheckpointInfo* c = req.add_events()->mutable_checkpoint();
  c->set_step(40);
  c->set_path(dir_ + "/ckpt/job-1/step_40");
  c->set_status("committed");
  absl::Status s = Report(req).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("stale attempt"));
  auto listed = catalog_->List("job-1");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].generation(), 1);
}

TEST_F(StepReportsTest, CheckpointEventsEnterTheCatalogTheSummaryAndTheEvents) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_});
  loom::v1::ReportStepMetricsRequest req = Steps(rec, 1, 10);
  loom::v1::CheckpointInfo* ok = req.add_events()->mutable_checkpoint();
  ok->set_step(10);
  ok->set_path(dir_ + "/ckpt/job-1/step_10");
  ok->set_status("committed");
  loom::v1::CheckpointInfo* failed = req.add_events()->mutable_checkpoint();
  failed->set_step(20);
  failed->set_status("failed");
  failed->set_error("No space left on device");
  ASSERT_TRUE(Report(req).ok());
  EXPECT_EQ(rec.newest_checkpoint_step, 10);
  EXPECT_EQ(rec.job.summary().checkpoints_written(), 1);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::CHECKPOINT_FAILED));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("No space left on device"));
  // The log has the checkpoint and the failure, written with the job.
  auto logged = store_->LoadEvents("job-1", 0, 0);
  ASSERT_TRUE(logged.ok()) << logged.status();
  int checkpoints = 0, recovery = 0;
  for (const Store::LoggedEvent& e : *logged) {
    checkpoints += e.kind == Store::kLoggedCheckpoint ? 1 : 0;
    recovery += e.kind == Store::kLoggedRecovery ? 1 : 0;
  }
  EXPECT_EQ(checkpoints, 1);
  EXPECT_EQ(recovery, 1);
}

// Upload outcomes from the rank-0 worker: recorded whatever the job's state
// and attempt (an upload may finish after the job did), never counted as a
// commit, and a failure is an event the job keeps.
TEST_F(StepReportsTest, UploadOutcomesAreRecordedAfterTheAttemptAndTheJobEnded) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_});
  loom::v1::ReportStepMetricsRequest req = Steps(rec, 1, 10);
  loom::v1::CheckpointInfo* c = req.add_events()->mutable_checkpoint();
  c->set_step(10);
  c->set_path(dir_ + "/ckpt/job-1/step-000000010");
  ASSERT_TRUE(Report(req).ok());
  rec.job.set_state(loom::v1::SUCCEEDED);
  rec.job.set_generation(3);  // and a later attempt since

  loom::v1::ReportStepMetricsRequest up;
  up.set_worker_id(AddWorker("node-b"));  // no longer holds a rank
  up.set_job_id("job-1");
  up.set_generation(0);
  loom::v1::CheckpointInfo* u = up.add_events()->mutable_checkpoint();
  u->set_step(10);
  u->set_path(dir_ + "/ckpt/job-1/step-000000010");
  u->set_status(kCheckpointUploaded);
  u->set_remote_url("s3://bucket/runs/job-1/step-000000010");
  u->set_upload_seconds(1.5);
  loom::v1::CheckpointInfo* f = up.add_events()->mutable_checkpoint();
  f->set_step(20);
  f->set_path(dir_ + "/ckpt/job-1/step-000000020");
  f->set_status(kCheckpointUploadFailed);
  f->set_error("worker on node node-a: PUT s3://bucket/...: HTTP 503 SlowDown");
  auto resp = Report(up);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_FALSE(resp->stop());
  auto listed = catalog_->List("job-1");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].remote_url(), "s3://bucket/runs/job-1/step-000000010");
  EXPECT_EQ(rec.job.summary().checkpoints_written(), 1);
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::CHECKPOINT_UPLOAD_FAILED));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("HTTP 503 SlowDown"));
  EXPECT_THAT(rec.job.events(0).message(), HasSubstr("step 20 was not uploaded"));

  // An upload report without its remote copy is refused.
  u->clear_remote_url();
  absl::Status bad = Report(up).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("s3:// remote_url"));
}

TEST_F(StepReportsTest, SnapshotStepsAreKeptForTheAttemptAndASnapshotsOffIsAnEvent) {
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_});
  loom::v1::ReportStepMetricsRequest req = Steps(rec, 1, 1);
  req.mutable_events(0)->mutable_step()->add_rank_snapshot_steps(1);
  loom::v1::CheckpointInfo* off = req.add_events()->mutable_checkpoint();
  off->set_status("snapshots_off");
  off->set_error("two snapshots of 90 MiB do not fit in the 64 MiB free in /dev/shm/x");
  ASSERT_TRUE(Report(req).ok());
  EXPECT_THAT(rec.attempt_snapshot_steps, ElementsAre(1));
  ASSERT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SNAPSHOTS_OFF));
  EXPECT_THAT(rec.job.events(0).message(),
              HasSubstr("in-memory snapshots are off for this attempt on node node-a "
                        "(restarts resume from checkpoints): two snapshots of 90 MiB"));
  // Not a checkpoint: the catalog has none, and the stored series no
  // per-rank column.
  EXPECT_EQ(catalog_->NewestGoodStep("job-1", -1), 0);
  auto stored = store_->LoadStepMetrics("job-1", 100);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].rank_snapshot_steps_size(), 0);
  // One without its reason is refused.
  loom::v1::ReportStepMetricsRequest bare = Steps(rec, 2, 2);
  bare.add_events()->mutable_checkpoint()->set_status("snapshots_off");
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> refused = Report(bare);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("snapshots_off needs its reason"));
}

TEST_F(StepReportsTest, ALossSpikeGoesToTheRollbacksAndTheRanksAreToldToStop) {
  loom::v1::JobSpec spec;
  spec.mutable_recovery()->set_rollback_distance(20);
  JobRecord& rec = AddJob("job-1", loom::v1::RUNNING, {a_}, spec);
  Commit(rec, 80);
  // The detector decides only after 64 steps of history.
  ASSERT_TRUE(Report(Steps(rec, 1, 100)).ok());
  EXPECT_EQ(rec.job.state(), loom::v1::RUNNING);
  auto answer = Report(Steps(rec, 101, 101, /*loss=*/40.0));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->stop());
  EXPECT_EQ(rec.job.state(), loom::v1::PENDING);
  EXPECT_THAT(EventKinds(rec), ElementsAre(RecoveryEvent::SPIKE, RecoveryEvent::ROLLBACK));
  EXPECT_EQ(rec.job.resume_step(), 80);
  EXPECT_EQ(rec.job.events(0).step(), 101);
}

}  // namespace
}  // namespace loom::controller
