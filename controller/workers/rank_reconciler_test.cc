#include "controller/workers/rank_reconciler.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "common/clock.h"
#include "controller/store/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

class RankReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_rank_reconciler_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    store_ = *Store::Open(dir_);
    jobs_ = std::make_unique<JobTable>(store_.get(), &clock_);
    worker_.info.set_id("w-1");
  }
  void TearDown() override {
    jobs_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A job in `state` at attempt `generation`, with rank `rank` placed on
  // worker w-1.
  JobRecord& Job(const std::string& id, loom::v1::JobState state, int64_t generation, int rank) {
    JobRecord& rec = jobs_->Add(id);
    rec.job.set_id(id);
    rec.job.set_generation(generation);
    jobs_->RecordTransition(rec, state, "test");
    auto* a = rec.job.add_ranks();
    a->set_rank(rank);
    a->set_worker_id("w-1");
    return rec;
  }

  static void Runs(loom::v1::HeartbeatRequest* req, const std::string& job, int rank,
                   int64_t generation) {
    auto* r = req->add_running();
    r->set_job_id(job);
    r->set_rank(rank);
    r->set_generation(generation);
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<JobTable> jobs_;
  WorkerRegistry::Worker worker_;
};

TEST_F(RankReconcilerTest, ConfirmsCurrentRanksAndStopsEverythingElseOnce) {
  Job("run-1", loom::v1::RUNNING, 2, 0);
  Job("done-2", loom::v1::SUCCEEDED, 0, 0);
  Job("moved-3", loom::v1::RUNNING, 1, 0).job.mutable_ranks(0)->set_worker_id("w-9");
  loom::v1::HeartbeatRequest req;
  Runs(&req, "run-1", 0, 2);    // current: confirmed
  Runs(&req, "run-1", 0, 1);    // an older attempt of it
  Runs(&req, "done-2", 0, 0);   // its job ended
  Runs(&req, "gone-4", 0, 0);   // a job the controller does not know
  Runs(&req, "moved-3", 0, 1);  // placed on another worker
  const RankReconciliation r = ReconcileRunningRanks(req, worker_, *jobs_);
  EXPECT_THAT(r.confirmed, ElementsAre(Pair("run-1", 0)));
  ASSERT_EQ(r.stops.size(), 4u);
  EXPECT_EQ(r.stops[0].job_id(), "run-1");
  EXPECT_EQ(r.stops[0].generation(), 1);
  EXPECT_THAT(r.stops[0].reason(), HasSubstr("attempt 1 is stale (the job runs attempt 2)"));
  EXPECT_EQ(r.stops[1].reason(), "job already ended");
  EXPECT_EQ(r.stops[2].reason(), "unknown job");
  EXPECT_THAT(r.stops[3].reason(), HasSubstr("is not placed on worker w-1"));
  EXPECT_EQ(r.running.size(), 4u);
  EXPECT_EQ(r.running_attempts.size(), 5u);

  // A stop already queued on the worker is not asked again.
  loom::v1::WorkerCommand queued;
  queued.mutable_stop()->set_job_id("done-2");
  worker_.pending_commands.push_back(queued);
  loom::v1::WorkerCommand stale;
  stale.mutable_stop()->set_job_id("run-1");
  stale.mutable_stop()->set_generation(1);
  worker_.pending_commands.push_back(stale);
  EXPECT_EQ(ReconcileRunningRanks(req, worker_, *jobs_).stops.size(), 2u);
}

TEST_F(RankReconcilerTest, ARankAwaitingReadoptionIsNeitherConfirmedNorStopped) {
  JobRecord& rec = Job("adopt-1", loom::v1::RUNNING, 1, 0);
  rec.job.mutable_ranks(0)->set_worker_id("w-old");  // its worker's id before the restart
  rec.adopt_deadline = clock_.Now() + absl::Seconds(10);
  loom::v1::HeartbeatRequest req;
  Runs(&req, "adopt-1", 0, 1);
  const RankReconciliation r = ReconcileRunningRanks(req, worker_, *jobs_);
  EXPECT_TRUE(r.confirmed.empty());
  EXPECT_TRUE(r.stops.empty());
}

TEST_F(RankReconcilerTest, DueStartsForgetsConfirmedAndStaleOnesAndResendsTheRest) {
  Job("a-1", loom::v1::SCHEDULED, 3, 0);
  Job("b-2", loom::v1::SCHEDULED, 1, 0);
  Job("c-3", loom::v1::PENDING, 2, 0);  // requeued since
  const absl::Time t0 = clock_.Now();
  auto start = [&](const std::string& job, int64_t generation, absl::Time sent) {
    loom::v1::StartRank s;
    s.set_job_id(job);
    s.set_rank(0);
    s.set_generation(generation);
    worker_.unacked[{job, 0}] = {s, sent};
  };
  start("a-1", 3, t0);
  start("b-2", 1, t0);
  start("c-3", 1, t0);
  const std::set<std::tuple<std::string, int, int64_t>> running = {{"b-2", 0, 1}};
  // Not yet due: nothing resent, but the confirmed and the stale are gone.
  EXPECT_TRUE(
      DueStarts(running, *jobs_, t0 + absl::Seconds(1), absl::Seconds(3), &worker_).empty());
  ASSERT_EQ(worker_.unacked.size(), 1u);
  const std::vector<loom::v1::StartRank> due =
      DueStarts({}, *jobs_, t0 + absl::Seconds(4), absl::Seconds(3), &worker_);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].job_id(), "a-1");
  EXPECT_EQ(worker_.unacked.begin()->second.second, t0 + absl::Seconds(4)) << "sent again now";
  EXPECT_TRUE(DueStarts({}, *jobs_, t0 + absl::Seconds(5), absl::Seconds(3), &worker_).empty());
}

}  // namespace
}  // namespace loom::controller
