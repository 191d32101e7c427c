#include "controller/store/store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/store/migrations.h"
#include "controller/store/postgres_test_server.h"
#include "controller/store/sqlite_connection.h"
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

// The same suite runs on both backends (the same code above the
// store). On PostgreSQL each test gets a database of its own on one
// server the binary starts; "reopening" connects again to it.
class StoreBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (server_ != nullptr) return;
    auto started = store::PostgresTestServer::Start();
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;  // stops it and removes its directory
    server_ = nullptr;
  }
  void SetUp() override {
    if (postgres()) {
      ASSERT_NE(server_, nullptr);
      static int databases = 0;
      database_ = "store_" + std::to_string(++databases);
      ASSERT_TRUE(server_->CreateDatabase(database_).ok());
    } else {
      dir_ = TempDir();
    }
  }
  bool postgres() const { return GetParam() == "postgres"; }
  // Opens the test's store (again): the same directory or database.
  absl::StatusOr<std::unique_ptr<Store>> OpenStore() {
    if (!postgres()) return Store::Open(dir_);
    store::PostgresOptions options;
    options.url = server_->SocketUrl(database_);
    return Store::OpenPostgres(options);
  }

  // A connection of its own to the test's database, beside the store (what
  // an older or newer release would have left there).
  void OpenRawConnection(std::unique_ptr<store::SqlConnection>* conn) {
    if (postgres()) {
      store::PostgresOptions options;
      options.url = server_->SocketUrl(database_);
      auto c = store::PostgresConnection::Open(options);
      ASSERT_TRUE(c.ok()) << c.status();
      *conn = *std::move(c);
    } else {
      auto c = store::SqliteConnection::Open(dir_ + "/loom.db");
      ASSERT_TRUE(c.ok()) << c.status();
      *conn = *std::move(c);
    }
  }

  static store::PostgresTestServer* server_;  // shared by the suite's tests
  std::string dir_;
  std::string database_;
};
store::PostgresTestServer* StoreBackendTest::server_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Backends, StoreBackendTest, ::testing::Values("sqlite", "postgres"),
                         [](const auto& info) { return info.param; });

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

TEST_P(StoreBackendTest, JobsSurviveReopen) {
  {
    auto store = OpenStore();
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
  auto store = OpenStore();
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

TEST_P(StoreBackendTest, StepMetricsNewestLimitOldestFirst) {
  auto store = OpenStore();
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

TEST_P(StoreBackendTest, CheckpointCatalogIsOrderedAndIdempotent) {
  {
    auto store = OpenStore();
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
  auto store = OpenStore();
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

TEST_P(StoreBackendTest, WorkersKeepZoneAndRack) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutWorker({"w-1", "node-a", "10.0.0.1", "zone-a", "rack-3", 1000}).ok());
    ASSERT_TRUE((*store)->PutWorker({"w-2", "node-b", "10.0.0.2", "", "", 2000}).ok());
  }
  auto store = OpenStore();
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

TEST_P(StoreBackendTest, CordonsSurviveReopenAndExpire) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutCordon({"node-a", 5000, "slow rank 1"}).ok());
    ASSERT_TRUE((*store)->PutCordon({"node-b", 9000, "slow rank 2"}).ok());
    ASSERT_TRUE((*store)->PutCordon({"node-a", 7000, "slow again"}).ok());  // replaces
  }
  auto store = OpenStore();
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
TEST_P(StoreBackendTest, ConcurrentWritesShareTransactionsInOrder) {
  {
    auto store = OpenStore();
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
  auto store = OpenStore();
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
TEST_P(StoreBackendTest, WhenDurableAnswersFromItsOwnThreadOnceCommitted) {
  constexpr int kWrites = 200;
  {
    auto store = OpenStore();
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
  auto store = OpenStore();
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
TEST_P(StoreBackendTest, ThinStepMetricsKeepsEvenlySpacedStepsWithTheEnds) {
  auto store = OpenStore();
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

// Every job write takes the next change number: a reader passing back the
// newest it saw gets exactly the jobs written since.
TEST_P(StoreBackendTest, LoadJobsChangedSinceReturnsEachWriteOnce) {
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  int64_t newest = 0;
  auto none = st.LoadJobsChangedSince(-1, &newest);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(newest, -1);
  ASSERT_TRUE(st.PutJob(MakeJob("a-1", loom::v1::PENDING, 1000), 1).ok());
  ASSERT_TRUE(st.PutJob(MakeJob("b-2", loom::v1::PENDING, 2000), 1).ok());
  auto first = st.LoadJobsChangedSince(-1, &newest);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 2u);
  const int64_t after_two = newest;
  EXPECT_GT(after_two, 0);
  EXPECT_TRUE(st.LoadJobsChangedSince(after_two, &newest)->empty());
  EXPECT_EQ(newest, after_two);
  // Two writes of a, put in line together (one batch or two): a comes back
  // once, as its newest snapshot.
  loom::v1::Job a = MakeJob("a-1", loom::v1::RUNNING, 1000);
  Store::Ticket t1 = st.Enqueue(&a, 0, {}, a.id());
  a.set_state(loom::v1::SUCCEEDED);
  Store::Ticket t2 = st.Enqueue(&a, 0, {}, a.id());
  ASSERT_TRUE(st.Wait(t2).ok());
  ASSERT_TRUE(st.Wait(t1).ok());
  auto changed = st.LoadJobsChangedSince(after_two, &newest);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_EQ(changed->size(), 1u);
  EXPECT_EQ((*changed)[0].id(), "a-1");
  EXPECT_EQ((*changed)[0].state(), loom::v1::SUCCEEDED);
  EXPECT_GT(newest, after_two);
}

Store::LoggedEvent Event(const std::string& job, int64_t idx, const std::string& payload = "") {
  Store::LoggedEvent e;
  e.job_id = job;
  e.idx = idx;
  e.kind = 1;
  e.time_unix_ms = 1000 + idx;
  e.payload = payload.empty() ? absl::StrCat(job, "#", idx) : payload;
  return e;
}

// The event log numbers entries 1, 2, 3, ... in commit order with no gap,
// whatever writes carried them (four threads at once, with job rows and
// without); each job's entries come back in its own order; a reader that
// passes back the last number it saw gets exactly the rest.
TEST_P(StoreBackendTest, EventLogIsNumberedInCommitOrderWithoutGaps) {
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  EXPECT_EQ(*st.LastEventSeq(), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&st, t] {
      const std::string job = absl::StrCat("job-", t);
      for (int i = 0; i < 25; ++i) {
        if (i % 5 == 0) {
          const loom::v1::Job row = MakeJob(job, loom::v1::RUNNING, 1000);
          EXPECT_TRUE(st.Wait(st.Enqueue(&row, 0, {}, job, {Event(job, i)})).ok());
        } else {
          EXPECT_TRUE(st.AppendEvents({Event(job, i)}).ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto all = st.LoadEvents("", 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 100u);
  std::map<std::string, int64_t> next_idx;
  for (size_t i = 0; i < all->size(); ++i) {
    const Store::LoggedEvent& e = (*all)[i];
    EXPECT_EQ(e.seq, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(e.idx, next_idx[e.job_id]++) << e.job_id;  // each job's own order
    EXPECT_EQ(e.payload, absl::StrCat(e.job_id, "#", e.idx));
    EXPECT_EQ(e.time_unix_ms, 1000 + e.idx);
  }
  EXPECT_EQ(*st.LastEventSeq(), 100);
  // Resuming: one job's after a seq, in pages.
  int64_t last = 0;
  std::vector<int64_t> seen;
  for (int page = 0; page < 10; ++page) {
    auto got = st.LoadEvents("job-2", last, 7);
    ASSERT_TRUE(got.ok()) << got.status();
    if (got->empty()) break;
    for (const auto& e : *got) {
      EXPECT_EQ(e.job_id, "job-2");
      EXPECT_GT(e.seq, last);
      last = e.seq;
      seen.push_back(e.idx);
    }
  }
  ASSERT_EQ(seen.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(seen[i], i);
  // The log survives a reopen.
  store->reset();
  auto reopened = OpenStore();
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*(*reopened)->LastEventSeq(), 100);
}

// A write retried after its answer was lost stores each entry once and
// takes no number for the copy; a fenced write appends nothing and leaves
// no gap behind it. The listener hears of exactly what was stored, in order.
TEST_P(StoreBackendTest, EventLogStoresARetriedEntryOnceAndAFencedWriteNotAtAll) {
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  std::vector<std::string> heard;  // "seq idx" of each entry the listener got
  st.AddLoggedEventsListener(&heard, [&heard](const std::vector<Store::LoggedEvent>& logged) {
    for (const auto& e : logged) heard.push_back(absl::StrCat(e.seq, " ", e.idx));
  });
  ASSERT_TRUE(st.AppendEvents({Event("a", 0), Event("a", 1)}).ok());
  ASSERT_TRUE(st.AppendEvents({Event("a", 1, "the retry"), Event("a", 2)}).ok());
  auto events = st.LoadEvents("a", 0, 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[1].payload, "a#1");  // the first write's, kept
  EXPECT_EQ((*events)[2].seq, 3);
  // Fenced on an epoch that does not hold the lease (nobody has led yet):
  // ABORTED, nothing appended.
  st.SetFencingEpoch(7);
  const absl::Status fenced = st.AppendEvents({Event("a", 3)});
  EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted) << fenced;
  st.SetFencingEpoch(0);
  ASSERT_TRUE(st.AppendEvents({Event("a", 3)}).ok());
  events = st.LoadEvents("", 0, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ(events->back().seq, 4);
  EXPECT_EQ(events->back().idx, 3);
  EXPECT_THAT(heard, ::testing::ElementsAre("1 0", "2 1", "3 2", "4 3"));
  st.RemoveLoggedEventsListener(&heard);
}

// Retention of an ended job's log: every transition stays, and the newest
// `keep` other entries; other jobs' entries are not touched.
TEST_P(StoreBackendTest, PruningAJobsEventsKeepsItsTransitionsAndNewestOthers) {
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  std::vector<Store::LoggedEvent> events;
  for (int i = 1; i <= 10; ++i) {
    Store::LoggedEvent e = Event("a", i);
    e.kind = i % 3 == 0 ? Store::kLoggedTransition : Store::kLoggedCheckpoint;
    events.push_back(e);
  }
  events.push_back(Event("b", 1));
  events.back().kind = Store::kLoggedRecovery;
  ASSERT_TRUE(st.AppendEvents(events).ok());
  auto pruned = st.PruneEvents("a", 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(*pruned, 5);  // of the 7 others (1 2 4 5 7 8 10), 8 and 10 stay
  std::vector<int64_t> left;
  for (const auto& e : *st.LoadEvents("a", 0, 0)) left.push_back(e.idx);
  EXPECT_EQ(left, (std::vector<int64_t>{3, 6, 8, 9, 10}));
  EXPECT_EQ(st.LoadEvents("b", 0, 0)->size(), 1u);
  EXPECT_EQ(*st.PruneEvents("a", 2), 0);  // again: nothing more
  EXPECT_EQ(st.PruneEvents("a", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// A database of schema version 3 (before the event log, the rank logs and
// the console's tables) is brought forward on open: the tables are made,
// its jobs kept.
TEST_P(StoreBackendTest, ADatabaseFromBeforeTheEventLogIsBroughtForward) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(MakeJob("old-1", loom::v1::PENDING, 1000), 1).ok());
  }
  {
    std::unique_ptr<store::SqlConnection> conn;
    ASSERT_NO_FATAL_FAILURE(OpenRawConnection(&conn));
    ASSERT_TRUE(conn->Exec("DROP TABLE job_events;").ok());
    if (!postgres()) ASSERT_TRUE(conn->Exec("DROP TABLE rank_log_search;").ok());
    ASSERT_TRUE(conn->Exec("DROP TABLE rank_log_chunks;").ok());
    ASSERT_TRUE(conn->Exec("DROP TABLE rank_logs;").ok());
    ASSERT_TRUE(conn->Exec("DROP TABLE console_sessions;").ok());
    ASSERT_TRUE(conn->Exec("DROP TABLE consoles;").ok());
    ASSERT_TRUE(conn->Exec("ALTER TABLE leader DROP COLUMN console_url;").ok());
    ASSERT_TRUE(conn->Exec("DELETE FROM schema_migrations WHERE version >= 4;").ok());
  }
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store::LatestSchemaVersion(), 6);
  auto log = (*store)->AppendLog("old-1", 0, 0, 0, "a line\n", false, 4096);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->end, 7);
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  ASSERT_TRUE((*store)->AppendEvents({Event("old-1", 0)}).ok());
  EXPECT_EQ(*(*store)->LastEventSeq(), 1);
}

// A database whose schema a newer Loom wrote is refused with a message that
// says so, and left as it was.
TEST_P(StoreBackendTest, NewerSchemaIsRefused) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store.ok()) << store.status();
  }
  {
    // What a later release would have recorded.
    std::unique_ptr<store::SqlConnection> conn;
    ASSERT_NO_FATAL_FAILURE(OpenRawConnection(&conn));
    ASSERT_TRUE(conn->Exec("INSERT INTO schema_migrations (version, description, "
                           "applied_unix_ms) VALUES (999, 'from the future', 0);")
                    .ok());
  }
  auto store = OpenStore();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              ::testing::HasSubstr("has schema version 999, newer than this loom-controller "
                                   "knows (" +
                                   std::to_string(store::LatestSchemaVersion()) + ")"));
}

// The lease: one holder at a time, renewals keep the epoch, a holder that
// stops renewing loses it to the next, and every change of holder adds one
// to the epoch. Fenced writes of the old epoch then change nothing.
TEST_P(StoreBackendTest, LeaseMovesOnlyWhenExpiredAndFencesTheOldEpoch) {
  auto a = OpenStore();
  ASSERT_TRUE(a.ok()) << a.status();
  // PostgreSQL: a second controller of its own; SQLite has one per file.
  std::unique_ptr<Store> b_owned;
  Store* b = a->get();
  if (postgres()) {
    auto opened = OpenStore();
    ASSERT_TRUE(opened.ok()) << opened.status();
    b_owned = *std::move(opened);
    b = b_owned.get();
  }
  auto first = (*a)->AcquireLease("ctl-a", "10.0.0.1:7000", absl::Milliseconds(300));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->held_by("ctl-a"));
  EXPECT_EQ(first->epoch, 1);
  auto refused = b->AcquireLease("ctl-b", "10.0.0.2:7000", absl::Seconds(2));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->held_by("ctl-b"));
  EXPECT_EQ(refused->holder, "ctl-a");
  EXPECT_EQ(refused->address, "10.0.0.1:7000");
  auto renewed = (*a)->AcquireLease("ctl-a", "10.0.0.1:7000", absl::Milliseconds(300));
  ASSERT_TRUE(renewed.ok());
  EXPECT_EQ(renewed->epoch, 1);
  EXPECT_GE(renewed->expires_unix_ms, first->expires_unix_ms);

  (*a)->SetFencingEpoch(1);
  ASSERT_TRUE((*a)->PutJob(MakeJob("fenced-1", loom::v1::PENDING, 1000), 1).ok());
  // a stops renewing; b takes over once the lease has run out (bounded).
  Store::Lease taken;
  for (int i = 0; i < 100 && !taken.held_by("ctl-b"); ++i) {
    auto tried = b->AcquireLease("ctl-b", "10.0.0.2:7000", absl::Seconds(5));
    ASSERT_TRUE(tried.ok()) << tried.status();
    taken = *tried;
    if (!taken.held_by("ctl-b")) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(taken.held_by("ctl-b"));
  EXPECT_EQ(taken.epoch, 2);

  // Every kind of write from epoch 1 is refused now, and lands nowhere.
  const absl::StatusCode aborted = absl::StatusCode::kAborted;
  absl::Status job = (*a)->PutJob(MakeJob("fenced-2", loom::v1::PENDING, 2000), 1);
  EXPECT_EQ(job.code(), aborted) << job;
  EXPECT_THAT(std::string(job.message()), ::testing::HasSubstr("epoch 1 no longer holds"));
  loom::v1::CheckpointInfo ckpt;
  ckpt.set_step(10);
  EXPECT_EQ((*a)->PutCheckpoint("fenced-1", ckpt).code(), aborted);
  EXPECT_EQ((*a)->PutWorker({"w-1", "n", "a", "", "", 1}).code(), aborted);
  EXPECT_EQ((*a)->PutCordon({"n", 1, "r"}).code(), aborted);
  EXPECT_EQ((*a)->AppendStepMetrics("fenced-1", {loom::v1::StepMetrics()}).code(), aborted);
  // A renewal by the old holder does not take it back.
  auto late = (*a)->AcquireLease("ctl-a", "10.0.0.1:7000", absl::Seconds(2));
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->held_by("ctl-a"));
  EXPECT_EQ(late->epoch, 2);

  b->SetFencingEpoch(2);
  ASSERT_TRUE(b->PutJob(MakeJob("new-3", loom::v1::PENDING, 3000), 1).ok());
  auto jobs = b->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  std::vector<std::string> ids;
  for (const auto& j : *jobs) ids.push_back(j.id());
  EXPECT_THAT(ids, ::testing::ElementsAre("fenced-1", "new-3"));
  EXPECT_TRUE(b->LoadCheckpoints("fenced-1")->empty());
  EXPECT_TRUE(b->LoadWorkers()->empty());
  EXPECT_TRUE(b->LoadStepMetrics("fenced-1", 0)->empty());

  // A clean stop releases it: the next holder need not wait, and starts a
  // new epoch even if it is the same controller.
  ASSERT_TRUE(b->ReleaseLease("ctl-b").ok());
  auto next = (*a)->AcquireLease("ctl-a", "10.0.0.1:7000", absl::Seconds(2));
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->held_by("ctl-a"));
  EXPECT_EQ(next->epoch, 3);
  auto read = b->ReadLease();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->holder, "ctl-a");
  EXPECT_EQ(read->epoch, 3);
  // force: a SQLite controller whose directory lock proves the last one gone.
  auto forced = b->AcquireLease("ctl-b", "10.0.0.2:7000", absl::Seconds(2), /*force=*/true);
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(forced->held_by("ctl-b"));
  EXPECT_EQ(forced->epoch, 4);
}

// Console sessions are kept by the hashes of their id and token, found by
// any controller of the store, deleted on logout, and the expired ones go
// when a new one is recorded. Each controller's console URL is listed, and
// the leader's rides in the lease row.
TEST_P(StoreBackendTest, ConsoleSessionsAndURLs) {
  auto store = OpenStore();
  ASSERT_TRUE(store.ok()) << store.status();
  Store& st = **store;
  const std::string a(64, 'a'), b(64, 'b'), token(64, 'c');
  ASSERT_TRUE(st.PutSession({a, "alice", token, 1000, 5000}).ok());
  auto got = st.GetSession(a);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->user, "alice");
  EXPECT_EQ(got->token_sha256, token);
  EXPECT_EQ(got->expires_unix_ms, 5000);
  EXPECT_FALSE(st.PutSession({a, "alice", token, 1000, 5000}).ok());  // an id never repeats
  EXPECT_EQ(st.PutSession({"", "alice", token, 1, 2}).code(), absl::StatusCode::kInvalidArgument);
  // Recorded after `a` expired: `a` goes.
  ASSERT_TRUE(st.PutSession({b, "bob", token, 6000, 9000}).ok());
  EXPECT_TRUE(absl::IsNotFound(st.GetSession(a).status()));
  ASSERT_TRUE(st.DeleteSession(b).ok());
  EXPECT_TRUE(absl::IsNotFound(st.GetSession(b).status()));
  EXPECT_TRUE(st.DeleteSession(b).ok());

  ASSERT_TRUE(st.PutConsole("ctl-a", "https://10.0.0.1:7443", 100).ok());
  ASSERT_TRUE(st.PutConsole("ctl-b", "https://10.0.0.2:7443", 200).ok());
  ASSERT_TRUE(st.PutConsole("ctl-a", "https://10.0.0.1:7444", 300).ok());  // restarted
  auto urls = st.LoadConsoles(150);
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_EQ(*urls, (std::vector<std::string>{"https://10.0.0.1:7444", "https://10.0.0.2:7443"}));
  EXPECT_EQ(st.LoadConsoles(250)->size(), 1u);

  auto lease = st.AcquireLease("ctl-a", "10.0.0.1:7000", absl::Seconds(5), /*force=*/false,
                               "https://10.0.0.1:7444");
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->console_url, "https://10.0.0.1:7444");
  EXPECT_EQ(st.ReadLease()->console_url, "https://10.0.0.1:7444");
}

// Two controllers starting together on an empty database: one migrates,
// the other finds the work done; both work.
TEST(StorePostgresTest, ConcurrentFirstOpensMigrateOnce) {
  auto server = store::PostgresTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  store::PostgresOptions options;
  options.url = (*server)->SocketUrl("loom");
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { results[i] = Store::OpenPostgres(options).status(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

// A server that cannot be reached is UNAVAILABLE with where and why; a
// server that restarts under an open store costs the calls made while it
// was down, and the next call reconnects.
TEST(StorePostgresTest, UnreachableAndRestartedServer) {
  store::PostgresOptions nowhere;
  nowhere.url = "postgresql://loom@/loom?host=/nonexistent-loom-socket-dir";
  auto refused = Store::OpenPostgres(nowhere);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("cannot connect to PostgreSQL at " + nowhere.url));

  auto server = store::PostgresTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  store::PostgresOptions missing;
  missing.url = (*server)->SocketUrl("no_such_database");
  EXPECT_EQ(Store::OpenPostgres(missing).status().code(), absl::StatusCode::kFailedPrecondition);
  store::PostgresOptions options;
  options.url = (*server)->SocketUrl("loom");
  auto opened = Store::OpenPostgres(options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  Store& st = **opened;
  ASSERT_TRUE(st.PutJob(MakeJob("before-1", loom::v1::PENDING, 1000), 1).ok());
  ASSERT_TRUE((*server)->Kill().ok());
  absl::Status down = st.PutJob(MakeJob("during-2", loom::v1::PENDING, 2000), 1);
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  ASSERT_TRUE((*server)->Restart().ok());
  ASSERT_TRUE(st.PutJob(MakeJob("after-3", loom::v1::PENDING, 3000), 1).ok());
  auto jobs = st.LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::vector<std::string> ids;
  for (const auto& j : *jobs) ids.push_back(j.id());
  EXPECT_THAT(ids, ::testing::ElementsAre("before-1", "after-3"));
}

TEST(StorePostgresTest, PasswordsInUrlsAreRecognised) {
  EXPECT_TRUE(store::PostgresUrlHasPassword("postgresql://loom:secret@db:5432/loom"));
  EXPECT_TRUE(store::PostgresUrlHasPassword("postgres://db/loom?user=loom&password=secret"));
  EXPECT_FALSE(store::PostgresUrlHasPassword("postgresql://loom@db:5432/loom"));
  EXPECT_FALSE(store::PostgresUrlHasPassword("postgresql://db:5432/loom?sslmode=require"));
  EXPECT_FALSE(store::PostgresUrlHasPassword("postgresql:///loom?host=/run/pg"));
  EXPECT_TRUE(store::IsPostgresUrl("postgres://db/loom"));
  EXPECT_FALSE(store::IsPostgresUrl("/var/lib/loom"));
}

}  // namespace
}  // namespace loom::controller
