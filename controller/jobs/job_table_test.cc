#include "controller/jobs/job_table.h"

#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "controller/store/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::JobState;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_job_table_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    OpenStore();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void OpenStore() {
    store_.reset();
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Submits a job as JobManager does: a new record, its first transition,
  // stored.
  std::string Submit(JobTable& catalog, const std::string& name) {
    const std::string id = catalog.NewJobId(name);
    JobRecord& rec = catalog.Add(id);
    rec.job.set_id(id);
    rec.job.mutable_spec()->set_name(name);
    rec.job.set_created_unix_ms(clock_.NowUnixMillis());
    catalog.RecordTransition(rec, loom::v1::PENDING, "submitted");
    EXPECT_TRUE(catalog.StoreNew(rec).ok());
    return id;
  }
  void Move(JobTable& catalog, const std::string& id, JobState to) {
    JobRecord& rec = *catalog.Find(id);
    catalog.RecordTransition(rec, to, "test");
    catalog.Persist(rec, 1);
  }
  static std::vector<std::string> Ids(const std::vector<loom::v1::Job>& jobs) {
    std::vector<std::string> ids;
    for (const auto& j : jobs) ids.push_back(j.id());
    return ids;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
};

// A job's checkpoints that other jobs start from are held while those jobs
// are unfinished and have no checkpoint of their own: named by job or by a
// path in its directory; an ended job, or one with its own checkpoints,
// holds nothing.
TEST_F(JobTableTest, CheckpointsThatUnfinishedJobsStartFromAreHeld) {
  JobTable catalog(store_.get(), &clock_);
  const std::string source = Submit(catalog, "src");
  catalog.Find(source)->job.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt/src");
  const std::string by_job = Submit(catalog, "a");
  loom::v1::InitFrom* from = catalog.Find(by_job)->job.mutable_spec()->mutable_init_from();
  from->set_job(source);
  from->set_step(200);
  from->set_path("/ckpt/src/step-000000200");
  const std::string by_path = Submit(catalog, "b");
  catalog.Find(by_path)->job.mutable_spec()->mutable_init_from()->set_path(
      "/ckpt/src/step-000000300");
  const std::string saved = Submit(catalog, "c");
  catalog.Find(saved)->job.mutable_spec()->mutable_init_from()->set_job(source);
  catalog.Find(saved)->job.mutable_spec()->mutable_init_from()->set_step(100);
  catalog.Find(saved)->job.mutable_summary()->set_checkpoints_written(1);
  const std::string ended = Submit(catalog, "d");
  catalog.Find(ended)->job.mutable_spec()->mutable_init_from()->set_path(
      "/ckpt/src/step-000000400");
  Move(catalog, ended, loom::v1::CANCELLED);

  const std::map<int64_t, std::string> holds = catalog.CheckpointHolds(source);
  ASSERT_EQ(holds.size(), 2u);
  EXPECT_EQ(holds.at(200),
            "init_from of " + by_job + " (PENDING), which has no checkpoint of its own yet");
  EXPECT_THAT(holds.at(300), ::testing::HasSubstr("init_from of " + by_path));
  EXPECT_TRUE(catalog.CheckpointHolds(by_job).empty());
}

// The indexes follow every transition: the PENDING queue in submission
// order, the unfinished set, counts by state; ended jobs are handed out to
// be thinned once.
TEST_F(JobTableTest, IndexesFollowTransitions) {
  JobTable catalog(store_.get(), &clock_);
  const std::string a = Submit(catalog, "a"), b = Submit(catalog, "b"), c = Submit(catalog, "c");
  EXPECT_EQ(a, "a-1");
  EXPECT_EQ(c, "c-3");
  ASSERT_EQ(catalog.pending().size(), 3u);
  EXPECT_EQ(catalog.pending().begin()->second, a);
  Move(catalog, a, loom::v1::SCHEDULED);
  Move(catalog, b, loom::v1::SCHEDULED);
  Move(catalog, b, loom::v1::PENDING);  // requeued: keeps its place before c
  EXPECT_EQ(catalog.pending().begin()->second, b);
  EXPECT_EQ(catalog.state_counts().at(loom::v1::PENDING), 2);
  EXPECT_EQ(catalog.state_counts().at(loom::v1::SCHEDULED), 1);
  catalog.Find(a)->job.set_restarts(2);
  Move(catalog, a, loom::v1::SUCCEEDED);
  EXPECT_THAT(catalog.unfinished(), ::testing::UnorderedElementsAre(b, c));
  EXPECT_THAT(catalog.TakeEndedToThin(), ElementsAre(a));
  EXPECT_TRUE(catalog.TakeEndedToThin().empty());
  catalog.Find(c)->job.set_rollbacks(1);
  const RecoveryTotals totals = catalog.Totals();
  EXPECT_EQ(totals.restarts, 2);  // a, ended
  EXPECT_EQ(totals.rollbacks, 1);  // c, unfinished
  // Newest first; a page of one, then the next.
  EXPECT_THAT(Ids(catalog.List({}, 0)), ElementsAre(c, b, a));
  EXPECT_THAT(Ids(catalog.List({loom::v1::PENDING}, 0)), ElementsAre(c, b));
  int64_t next = 0;
  EXPECT_THAT(Ids(catalog.ListPage({}, 1, 0, false, &next)), ElementsAre(c));
  EXPECT_EQ(next, 3);
  EXPECT_THAT(Ids(catalog.ListPage({}, 5, next, false, &next)), ElementsAre(b, a));
  EXPECT_EQ(next, 0);
  EXPECT_EQ(catalog.Lookup("nope-9").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(catalog.Lookup("nope-9").status().message()), HasSubstr("nope-9"));
}

// A listing filtered by queue (the default one taking jobs that name
// none), submitter and a piece of the name or id, page by page; the page
// keeps each job's queue.
TEST_F(JobTableTest, ListPageFiltersOnTheServer) {
  JobTable catalog(store_.get(), &clock_);
  struct Made {
    const char* name;
    const char* queue;
    const char* user;
  };
  std::vector<std::string> ids;
  for (const Made& m : {Made{"sweep-lr", "research", "uma"}, Made{"baseline", "", "ulf"},
                        Made{"sweep-wd", "research", "ulf"}, Made{"sweep-lr", "default", "uma"},
                        Made{"llama", "prod", "uma"}}) {
    ids.push_back(Submit(catalog, m.name));
    JobRecord& rec = *catalog.Find(ids.back());
    if (*m.queue) rec.job.mutable_spec()->mutable_scheduling()->set_queue(m.queue);
    rec.job.set_submitted_by(m.user);
  }
  auto list = [&](const JobFilter& f, int page = 100) {
    std::vector<std::string> all;
    int64_t next = 0;
    do {
      for (const auto& j : catalog.ListPage(f, page, next, false, &next)) all.push_back(j.id());
    } while (next > 0);
    return all;
  };
  EXPECT_THAT(list({{}, "research"}), ElementsAre(ids[2], ids[0]));
  EXPECT_THAT(list({{}, "default"}), ElementsAre(ids[3], ids[1]));
  EXPECT_THAT(list({{}, "", "uma"}, 1), ElementsAre(ids[4], ids[3], ids[0]));
  EXPECT_THAT(list({{}, "", "", "sweep"}, 2), ElementsAre(ids[3], ids[2], ids[0]));
  EXPECT_THAT(list({{}, "", "", "-2"}), ElementsAre(ids[1]));  // a piece of an id
  EXPECT_THAT(list({{}, "research", "uma", "sweep-lr"}), ElementsAre(ids[0]));
  EXPECT_THAT(list({{loom::v1::SUCCEEDED}, "research"}), ElementsAre());
  EXPECT_TRUE(list({{}, "nope"}).empty());
  int64_t next = 0;
  EXPECT_EQ(catalog.ListPage({{}, "prod"}, 10, 0, false, &next)[0].spec().scheduling().queue(),
            "prod");
}

// A new catalog over the same store finds every job, its history and
// state, continues the id sequence, and counts ended jobs without handing
// them out to be thinned again.
TEST_F(JobTableTest, LoadFindsWhatWasStored) {
  std::string a, b;
  {
    JobTable catalog(store_.get(), &clock_);
    a = Submit(catalog, "a");
    b = Submit(catalog, "b");
    catalog.Find(a)->job.set_restarts(1);
    Move(catalog, a, loom::v1::FAILED);
  }
  JobTable again(store_.get(), &clock_);
  ASSERT_TRUE(again.Load().ok());
  ASSERT_NE(again.Find(a), nullptr);
  EXPECT_EQ(again.Find(a)->job.state(), loom::v1::FAILED);
  EXPECT_EQ(again.Find(a)->job.history_size(), 2);
  EXPECT_THAT(again.unfinished(), ElementsAre(b));
  EXPECT_EQ(again.pending().begin()->second, b);
  EXPECT_TRUE(again.TakeEndedToThin().empty());
  EXPECT_EQ(again.Totals().restarts, 1);
  EXPECT_EQ(again.NewJobId("c"), "c-3");
}

// A rank that finished training is stored before the controller may
// acknowledge its exit: a write that fails leaves the job Unpersisted (the
// exit is answered UNAVAILABLE and sent again) until a retry lands, and a
// controller that loads the store then knows the rank finished.
TEST_F(JobTableTest, AFinishedRankIsStoredBeforeItIsAcknowledged) {
  JobTable catalog(store_.get(), &clock_);
  const std::string a = Submit(catalog, "a");
  JobRecord& rec = *catalog.Find(a);
  for (int r = 0; r < 3; ++r) rec.job.add_ranks()->set_rank(r);
  Move(catalog, a, loom::v1::SCHEDULED);
  Move(catalog, a, loom::v1::RUNNING);
  EXPECT_TRUE(catalog.RankFinished(rec, 2));
  EXPECT_FALSE(catalog.RankFinished(rec, 2));  // a resent exit changes nothing
  EXPECT_FALSE(catalog.Unpersisted(a));
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/loom.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE;", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_TRUE(catalog.RankFinished(rec, 0));
  EXPECT_TRUE(catalog.Unpersisted(a));
  {
    JobTable takeover(store_.get(), &clock_);
    ASSERT_TRUE(takeover.Load().ok());
    EXPECT_THAT(takeover.Find(a)->exited_ok, ElementsAre(2));
  }
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  catalog.RetryUnpersisted();
  EXPECT_FALSE(catalog.Unpersisted(a));
  JobTable takeover(store_.get(), &clock_);
  ASSERT_TRUE(takeover.Load().ok());
  EXPECT_THAT(takeover.Find(a)->exited_ok, ElementsAre(0, 2));
  EXPECT_THAT(takeover.Find(a)->job.finished_ranks(), ElementsAre(2, 0));
  // A new attempt starts with none finished.
  takeover.Requeue(*takeover.Find(a), "restart");
  EXPECT_TRUE(takeover.Find(a)->exited_ok.empty());
  EXPECT_TRUE(takeover.Find(a)->job.finished_ranks().empty());
}

// A failed write keeps the change in memory, is counted once, and lands at
// the next RetryUnpersisted with the transitions it missed; a submission
// the store refuses is taken back whole.
TEST_F(JobTableTest, FailedWritesAreRetriedAndRefusedSubmissionsTakenBack) {
  JobTable catalog(store_.get(), &clock_);
  const std::string a = Submit(catalog, "a");
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ + "/loom.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE;", nullptr, nullptr, nullptr), SQLITE_OK);
  Move(catalog, a, loom::v1::CANCELLED);
  EXPECT_EQ(catalog.write_failures(), 1);
  EXPECT_EQ(catalog.Find(a)->job.state(), loom::v1::CANCELLED);  // in memory
  // A submission now is refused and leaves nothing behind.
  const std::string id = catalog.NewJobId("b");
  JobRecord& rec = catalog.Add(id);
  rec.job.set_id(id);
  catalog.RecordTransition(rec, loom::v1::PENDING, "submitted");
  const absl::Status refused = catalog.StoreNew(rec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(catalog.Find(id), nullptr);
  EXPECT_TRUE(catalog.pending().empty());
  EXPECT_THAT(Ids(catalog.List({}, 0)), ElementsAre(a));
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  catalog.RetryUnpersisted();
  EXPECT_EQ(catalog.write_failures(), 1);
  JobTable again(store_.get(), &clock_);
  ASSERT_TRUE(again.Load().ok());
  ASSERT_NE(again.Find(a), nullptr);
  EXPECT_EQ(again.Find(a)->job.state(), loom::v1::CANCELLED);
  EXPECT_EQ(again.Find(a)->job.history_size(), 2);  // the missed transition too
  // The event log has both transitions once, the retried one included.
  auto logged = store_->LoadEvents(a, 0, 0);
  ASSERT_TRUE(logged.ok()) << logged.status();
  ASSERT_EQ(logged->size(), 2u);
  EXPECT_EQ((*logged)[1].idx, 2);
  EXPECT_EQ((*logged)[1].kind, Store::kLoggedTransition);
  EXPECT_TRUE(catalog.Find(a)->unstored_events.empty());
}

loom::v1::JobEvent Parse(const Store::LoggedEvent& e) {
  loom::v1::JobEvent out;
  EXPECT_TRUE(out.ParseFromString(e.payload));
  return out;
}

// Every transition and recorded event reaches the log with the write that
// stores the job, numbered 1, 2, 3, ... for the job, and in commit order
// across jobs; nothing is logged twice when a write carries an entry that
// an earlier write already stored.
TEST_F(JobTableTest, TheEventLogGetsEveryTransitionAndEventOnceInOrder) {
  JobTable catalog(store_.get(), &clock_);
  const std::string a = Submit(catalog, "a");
  const std::string b = Submit(catalog, "b");
  Move(catalog, a, loom::v1::SCHEDULED);
  JobRecord& rec = *catalog.Find(a);
  loom::v1::JobEvent ev;
  ev.set_time_unix_ms(clock_.NowUnixMillis());
  ev.mutable_recovery()->set_kind(loom::v1::RecoveryEvent::PREEMPTING);
  ev.mutable_recovery()->set_message("asked to save");
  *ev.mutable_job() = rec.job;  // not kept in the log
  catalog.RecordEvent(rec, ev);
  EXPECT_EQ(rec.job.events_logged(), 3);
  ASSERT_EQ(rec.unstored_events.size(), 1u);
  // A write put in line that carries it (as a step report's does) ...
  const int64_t through = JobTable::NewestUnstoredEvent(rec);
  Store::Ticket write = store_->Enqueue(&rec.job, 0, {}, a, rec.unstored_events);
  // ... and a Persist behind it that carries it again, with a transition.
  Move(catalog, a, loom::v1::RUNNING);
  ASSERT_TRUE(store_->Wait(write).ok());
  JobTable::EventsStored(rec, through);
  EXPECT_TRUE(rec.unstored_events.empty());
  Move(catalog, b, loom::v1::CANCELLED);

  auto all = store_->LoadEvents("", 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> seen;
  for (size_t i = 0; i < all->size(); ++i) {
    const Store::LoggedEvent& e = (*all)[i];
    EXPECT_EQ(e.seq, static_cast<int64_t>(i) + 1);
    const loom::v1::JobEvent parsed = Parse(e);
    EXPECT_FALSE(parsed.has_job());
    seen.push_back(absl::StrCat(e.job_id, "#", e.idx, " ",
                                parsed.has_transition()
                                    ? loom::v1::JobState_Name(parsed.transition().to())
                                    : parsed.recovery().message()));
  }
  EXPECT_THAT(seen, ElementsAre(absl::StrCat(a, "#1 PENDING"), absl::StrCat(b, "#1 PENDING"),
                                absl::StrCat(a, "#2 SCHEDULED"), absl::StrCat(a, "#3 asked to save"),
                                absl::StrCat(a, "#4 RUNNING"), absl::StrCat(b, "#2 CANCELLED")));
  EXPECT_EQ((*all)[3].kind, Store::kLoggedRecovery);
  // A new catalog continues each job's numbering.
  JobTable again(store_.get(), &clock_);
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.Find(a)->job.events_logged(), 4);
  Move(again, a, loom::v1::SUCCEEDED);
  auto of_a = store_->LoadEvents(a, 0, 0);
  ASSERT_TRUE(of_a.ok());
  ASSERT_EQ(of_a->size(), 5u);
  EXPECT_EQ(of_a->back().idx, 5);
  EXPECT_EQ(of_a->back().seq, 7);
}

// A job stored before the event log existed (events_logged 0) has its
// transitions and recovery events logged when a catalog loads it, merged
// by time, once: not again at the next load, and not counted as a failure.
TEST_F(JobTableTest, JobsFromBeforeTheLogAreBackfilledOnce) {
  loom::v1::Job old;
  old.set_id("old-1");
  old.set_state(loom::v1::FAILED);
  auto transition = [&](JobState to, int64_t at) {
    loom::v1::StateTransition* t = old.add_history();
    t->set_to(to);
    t->set_time_unix_ms(at);
  };
  transition(loom::v1::PENDING, 1000);
  transition(loom::v1::RUNNING, 2000);
  loom::v1::RecoveryEvent* gave_up = old.add_events();
  gave_up->set_kind(loom::v1::RecoveryEvent::GAVE_UP);
  gave_up->set_time_unix_ms(3000);
  transition(loom::v1::FAILED, 3000);
  ASSERT_TRUE(store_->PutJob(old, old.history_size()).ok());
  {
    JobTable catalog(store_.get(), &clock_);
    ASSERT_TRUE(catalog.Load().ok());
    catalog.RetryUnpersisted();
    EXPECT_EQ(catalog.write_failures(), 0);
  }
  auto logged = store_->LoadEvents("old-1", 0, 0);
  ASSERT_TRUE(logged.ok()) << logged.status();
  std::vector<std::string> kinds;
  for (const auto& e : *logged) {
    const loom::v1::JobEvent parsed = Parse(e);
    kinds.push_back(parsed.has_transition() ? loom::v1::JobState_Name(parsed.transition().to())
                                            : "event");
  }
  // (Within one millisecond the event comes before the transition it caused.)
  EXPECT_THAT(kinds, ElementsAre("PENDING", "RUNNING", "event", "FAILED"));
  JobTable again(store_.get(), &clock_);
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.Find("old-1")->job.events_logged(), 4);
  EXPECT_TRUE(again.Find("old-1")->unstored_events.empty());
  again.RetryUnpersisted();
  EXPECT_EQ(store_->LastEventSeq().value(), 4);
}

}  // namespace
}  // namespace loom::controller
