#include "controller/store.h"

#include <sqlite3.h>

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/loom_store_test_XXXXXX";
  return mkdtemp(tmpl);
}

loom::v1::Job MakeJob(const std::string& id, loom::v1::JobState state, int64_t created) {
  loom::v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_created_unix_ms(created);
  job.mutable_spec()->set_name("tiny");
  auto* t = job.add_history();
  t->set_from(loom::v1::JOB_STATE_UNSPECIFIED);
  t->set_to(loom::v1::PENDING);
  t->set_time_unix_ms(created);
  t->set_reason("submitted");
  return job;
}

// One controller per state directory: a second store on the same
// directory fails while the first is open, naming the holder; closing the
// first frees it.
TEST(StoreTest, SecondOpenOfOneDirectoryIsRefused) {
  const std::string dir = TempDir();
  auto first = Store::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Store::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              ::testing::HasSubstr("in use by another loom-controller (pid " +
                                   std::to_string(getpid()) + ")"));
  first->reset();
  auto third = Store::Open(dir);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(StoreTest, JobsSurviveReopen) {
  std::string dir = TempDir();
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    loom::v1::Job a = MakeJob("tiny-1", loom::v1::PENDING, 1000);
    ASSERT_TRUE((*store)->PutJob(a, 1).ok());
    loom::v1::Job b = MakeJob("tiny-2", loom::v1::PENDING, 2000);
    ASSERT_TRUE((*store)->PutJob(b, 1).ok());
    // b moves on: PENDING -> SCHEDULED.
    auto* t = b.add_history();
    t->set_from(loom::v1::PENDING);
    t->set_to(loom::v1::SCHEDULED);
    t->set_time_unix_ms(2500);
    t->set_reason("placed");
    b.set_state(loom::v1::SCHEDULED);
    ASSERT_TRUE((*store)->PutJob(b, 1).ok());
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "tiny-1");
  EXPECT_EQ((*jobs)[1].id(), "tiny-2");
  EXPECT_EQ((*jobs)[1].state(), loom::v1::SCHEDULED);
  EXPECT_EQ((*jobs)[1].history_size(), 2);
  auto transitions = (*store)->LoadTransitions("tiny-2");
  ASSERT_TRUE(transitions.ok());
  ASSERT_EQ(transitions->size(), 2u);
  EXPECT_EQ((*transitions)[1].to(), loom::v1::SCHEDULED);
  EXPECT_EQ((*transitions)[1].reason(), "placed");
  auto seq = (*store)->MaxJobSequence();
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 2);
}

TEST(StoreTest, StepMetricsNewestLimitOldestFirst) {
  auto store = Store::Open(TempDir());
  ASSERT_TRUE(store.ok());
  std::vector<loom::v1::StepMetrics> steps;
  for (int i = 1; i <= 10; ++i) {
    loom::v1::StepMetrics m;
    m.set_step(i);
    m.set_loss(10.0 - i);
    steps.push_back(m);
  }
  ASSERT_TRUE((*store)->AppendStepMetrics("job-1", steps).ok());
  auto last3 = (*store)->LoadStepMetrics("job-1", 3);
  ASSERT_TRUE(last3.ok());
  ASSERT_EQ(last3->size(), 3u);
  EXPECT_EQ((*last3)[0].step(), 8);
  EXPECT_EQ((*last3)[2].step(), 10);
  EXPECT_DOUBLE_EQ((*last3)[2].loss(), 0.0);
  auto all = (*store)->LoadStepMetrics("job-1", 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 10u);
  auto none = (*store)->LoadStepMetrics("other", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(StoreTest, CheckpointCatalogIsOrderedAndIdempotent) {
  std::string dir = TempDir();
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok());
    for (int step : {40, 20, 60}) {
      loom::v1::CheckpointInfo c;
      c.set_step(step);
      c.set_path("/ckpt/" + std::to_string(step));
      c.set_generation(step == 60 ? 1 : 0);
      ASSERT_TRUE((*store)->PutCheckpoint("job-1", c).ok());
    }
    loom::v1::CheckpointInfo again;
    again.set_step(20);
    again.set_path("/ckpt/20-rewritten");
    ASSERT_TRUE((*store)->PutCheckpoint("job-1", again).ok());
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok());
  auto list = (*store)->LoadCheckpoints("job-1");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].step(), 20);
  EXPECT_EQ((*list)[0].path(), "/ckpt/20-rewritten");
  EXPECT_EQ((*list)[2].step(), 60);
  EXPECT_EQ((*list)[2].generation(), 1);
  EXPECT_TRUE((*store)->LoadCheckpoints("job-2")->empty());
}

TEST(StoreTest, WorkersKeepZoneAndRack) {
  std::string dir = TempDir();
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutWorker({"w-1", "node-a", "10.0.0.1", "zone-a", "rack-3", 1000}).ok());
    ASSERT_TRUE((*store)->PutWorker({"w-2", "node-b", "10.0.0.2", "", "", 2000}).ok());
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto workers = (*store)->LoadWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].id, "w-1");
  EXPECT_EQ((*workers)[0].zone, "zone-a");
  EXPECT_EQ((*workers)[0].rack, "rack-3");
  EXPECT_EQ((*workers)[0].registered_unix_ms, 1000);
  EXPECT_EQ((*workers)[1].zone, "");
  EXPECT_EQ((*workers)[1].rack, "");
}

TEST(StoreTest, CordonsSurviveReopenAndExpire) {
  std::string dir = TempDir();
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutCordon({"node-a", 5000, "slow rank 1"}).ok());
    ASSERT_TRUE((*store)->PutCordon({"node-b", 9000, "slow rank 2"}).ok());
    ASSERT_TRUE((*store)->PutCordon({"node-a", 7000, "slow again"}).ok());  // replaces
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto cordons = (*store)->LoadCordons(6000);
  ASSERT_TRUE(cordons.ok()) << cordons.status();
  ASSERT_EQ(cordons->size(), 2u);
  EXPECT_EQ((*cordons)[0].node, "node-a");
  EXPECT_EQ((*cordons)[0].until_unix_ms, 7000);
  EXPECT_EQ((*cordons)[0].reason, "slow again");
  EXPECT_EQ((*cordons)[1].node, "node-b");
  EXPECT_EQ((*store)->LoadCordons(8000)->size(), 1u);
  EXPECT_TRUE((*store)->LoadCordons(9000)->empty());
}

// A database written before workers had zone and rack (the workers table as
// first released) opens, keeps its rows, and takes new registrations.
TEST(StoreTest, OldWorkersTableIsMigrated) {
  std::string dir = TempDir();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/loom.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE workers (id TEXT PRIMARY KEY, node TEXT NOT NULL, "
                           "address TEXT NOT NULL, registered_unix_ms INTEGER NOT NULL);"
                           "INSERT INTO workers VALUES ('old-1', 'node-a', '10.0.0.1', 500);",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  for (int open = 0; open < 2; ++open) {  // the second open finds nothing to migrate
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    if (open == 0) {
      ASSERT_TRUE((*store)->PutWorker({"new-1", "node-b", "10.0.0.2", "z", "r", 600}).ok());
    }
    auto workers = (*store)->LoadWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    ASSERT_EQ(workers->size(), 2u);
    EXPECT_EQ((*workers)[0].id, "old-1");
    EXPECT_EQ((*workers)[0].node, "node-a");
    EXPECT_EQ((*workers)[0].zone, "");
    EXPECT_EQ((*workers)[0].rack, "");
    EXPECT_EQ((*workers)[1].zone, "z");
    EXPECT_EQ((*workers)[1].rack, "r");
  }
}

TEST(StoreTest, OpenFailsOnMissingDirectory) {
  auto store = Store::Open("/nonexistent/loom/dir");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
}

// Group commit: reports written from many threads at once all become
// durable, share transactions, and the job row ends as the newest snapshot
// put in line (an older one never overwrites it).
TEST(StoreTest, ConcurrentWritesShareTransactionsInOrder) {
  const std::string dir = TempDir();
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    constexpr int kThreads = 8, kPerThread = 50;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        loom::v1::Job job = MakeJob("job-" + std::to_string(t + 1), loom::v1::RUNNING, 1000 + t);
        for (int i = 1; i <= kPerThread; ++i) {
          loom::v1::StepMetrics m;
          m.set_step(i);
          job.mutable_summary()->set_last_step(i);
          EXPECT_TRUE((*store)->PutJobAndSteps(job, i == 1 ? 1 : 0, {m}).ok());
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ((*store)->writes_committed(), kThreads * kPerThread);
    // Eight writers waiting on one fsync at a time are grouped (the exact
    // count depends on the scheduler; one write a batch would mean none).
    EXPECT_LT((*store)->batches_committed(), kThreads * kPerThread);
    std::cout << "[ group commit ] " << (*store)->writes_committed() << " writes in "
              << (*store)->batches_committed() << " transactions" << std::endl;

    // One thread: two snapshots in line, then one wait for both.
    loom::v1::Job job = MakeJob("order-9", loom::v1::RUNNING, 5000);
    job.mutable_summary()->set_last_step(1);
    Store::Ticket first = (*store)->Enqueue(&job, 1, {}, job.id());
    job.mutable_summary()->set_last_step(2);
    Store::Ticket second = (*store)->Enqueue(&job, 0, {}, job.id());
    EXPECT_TRUE((*store)->Wait(second).ok());
    EXPECT_TRUE((*store)->Wait(first).ok());
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 9u);
  for (const auto& job : *jobs) {
    EXPECT_EQ(job.summary().last_step(), job.id() == "order-9" ? 2 : 50) << job.id();
    if (job.id() == "order-9") continue;
    auto steps = (*store)->LoadStepMetrics(job.id(), 0);
    ASSERT_TRUE(steps.ok());
    ASSERT_EQ(steps->size(), 50u) << job.id();
    for (int i = 0; i < 50; ++i) EXPECT_EQ((*steps)[i].step(), i + 1);
  }
}

// WhenDurable answers from the store's own thread once the write is
// committed, in the order the writes were put in line, grouping those that
// wait together; writes still waited for when the store closes are
// committed and answered first.
TEST(StoreTest, WhenDurableAnswersFromItsOwnThreadOnceCommitted) {
  const std::string dir = TempDir();
  constexpr int kWrites = 200;
  {
    auto store = Store::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    std::mutex mu;
    std::vector<int> answered;  // write numbers, in the order answered
    int failed = 0;
    bool on_caller_thread = false;
    const std::thread::id caller = std::this_thread::get_id();
    loom::v1::Job job = MakeJob("async-1", loom::v1::RUNNING, 1000);
    for (int i = 1; i <= kWrites; ++i) {
      loom::v1::StepMetrics m;
      m.set_step(i);
      job.mutable_summary()->set_last_step(i);
      (*store)->WhenDurable((*store)->Enqueue(&job, i == 1 ? 1 : 0, {m}, job.id()),
                            [&, i](absl::Status s) {
                              std::lock_guard<std::mutex> lock(mu);
                              answered.push_back(i);
                              failed += s.ok() ? 0 : 1;
                              on_caller_thread |= std::this_thread::get_id() == caller;
                            });
    }
    // Closing the store waits for every answer (no sleep here).
    store->reset();
    EXPECT_EQ(failed, 0);
    EXPECT_FALSE(on_caller_thread);
    ASSERT_EQ(answered.size(), static_cast<size_t>(kWrites));
    for (int i = 0; i < kWrites; ++i) ASSERT_EQ(answered[i], i + 1);
  }
  auto store = Store::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto steps = (*store)->LoadStepMetrics("async-1", 0);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(steps->size(), static_cast<size_t>(kWrites));
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].summary().last_step(), kWrites);
}

// A finished job's series thinned to `keep` rows keeps the first and the
// last step and spaces the rest evenly.
TEST(StoreTest, ThinStepMetricsKeepsEvenlySpacedStepsWithTheEnds) {
  auto store = Store::Open(TempDir());
  ASSERT_TRUE(store.ok());
  std::vector<loom::v1::StepMetrics> steps;
  for (int i = 1; i <= 1000; ++i) {
    loom::v1::StepMetrics m;
    m.set_step(i);
    steps.push_back(m);
  }
  ASSERT_TRUE((*store)->AppendStepMetrics("long-1", steps).ok());
  ASSERT_TRUE((*store)->AppendStepMetrics("short-2", {steps[0], steps[1]}).ok());
  auto deleted = (*store)->ThinStepMetrics("long-1", 11);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 989);
  auto kept = (*store)->LoadStepMetrics("long-1", 0);
  ASSERT_TRUE(kept.ok());
  std::vector<int64_t> got;
  for (const auto& m : *kept) got.push_back(m.step());
  EXPECT_THAT(got, ::testing::ElementsAre(1, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000));
  EXPECT_EQ(*(*store)->ThinStepMetrics("short-2", 11), 0);
  EXPECT_EQ((*store)->LoadStepMetrics("short-2", 0)->size(), 2u);
  EXPECT_EQ((*store)->ThinStepMetrics("long-1", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::controller
