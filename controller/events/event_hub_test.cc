#include "controller/events/event_hub.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/events/job_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A logged entry as the controller writes one: a transition of `job`.
Store::LoggedEvent Entry(const std::string& job, int64_t idx,
                         loom::v1::JobState to = loom::v1::RUNNING) {
  loom::v1::JobEvent e;
  e.set_time_unix_ms(1000 + idx);
  e.mutable_transition()->set_to(to);
  e.mutable_transition()->set_reason(absl::StrCat(job, "#", idx));
  Store::LoggedEvent out;
  out.job_id = job;
  out.idx = idx;
  out.kind = Store::kLoggedTransition;
  out.time_unix_ms = e.time_unix_ms();
  out.payload = e.SerializeAsString();
  return out;
}

class EventHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_event_hub_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Appends entries idx first..last of `job`, one transaction each.
  void Append(const std::string& job, int64_t first, int64_t last) {
    for (int64_t i = first; i <= last; ++i) ASSERT_TRUE(store_->AppendEvents({Entry(job, i)}).ok());
  }
  // Reads `cursor` until it has delivered `want` logged events (bounded).
  static std::vector<loom::v1::JobEvent> ReadLogged(EventHub::Cursor& cursor, size_t want) {
    std::vector<loom::v1::JobEvent> got;
    for (int i = 0; i < 500 && got.size() < want; ++i) {
      auto batch = cursor.Next(absl::Milliseconds(50), 7);
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok()) break;
      for (auto& e : *batch) {
        if (e.seq() > 0) got.push_back(std::move(e));
      }
    }
    return got;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
};

// A cursor that starts before the hub's memory reads the store, then the
// newest entries in memory, while a writer goes on appending: it gets every
// entry after its start once, in order, with no gap at the seam; a cursor
// over one job gets that job's entries only.
TEST_F(EventHubTest, ACursorReadsTheStoreThenMemoryWithoutGapOrDuplicate) {
  Append("a", 1, 30);  // before the hub: only in the store
  EventHub::Options options;
  options.ring_entries = 16;
  EventHub hub(store_.get(), options);
  auto all = hub.Subscribe("", 0);
  ASSERT_TRUE(all.ok()) << all.status();
  auto of_b = hub.Subscribe("b", 0);
  ASSERT_TRUE(of_b.ok());
  std::thread writer([this] {
    for (int64_t i = 31; i <= 130; ++i) {
      ASSERT_TRUE(store_->AppendEvents({Entry(i % 3 == 0 ? "b" : "a", i)}).ok());
    }
  });
  const std::vector<loom::v1::JobEvent> got = ReadLogged(**all, 130);
  writer.join();
  ASSERT_EQ(got.size(), 130u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].seq(), static_cast<int64_t>(i) + 1);
    EXPECT_EQ(got[i].transition().reason(), absl::StrCat(got[i].job_id(), "#", i + 1));
  }
  const std::vector<loom::v1::JobEvent> bs = ReadLogged(**of_b, 33);
  ASSERT_EQ(bs.size(), 33u);
  int64_t last = 0;
  for (const auto& e : bs) {
    EXPECT_EQ(e.job_id(), "b");
    EXPECT_EQ(e.seq() % 3, 0);
    EXPECT_GT(e.seq(), last);
    last = e.seq();
  }
  EXPECT_TRUE((*of_b)->Next(absl::ZeroDuration()).value().empty());
  EXPECT_TRUE((*of_b)->caught_up());
  EXPECT_EQ((*of_b)->position(), 130);
}

// A cursor the memory has moved past (more entries came than it keeps)
// reads the rest from the store.
TEST_F(EventHubTest, ASlowCursorLeftBehindByMemoryReadsTheStore) {
  EventHub::Options options;
  options.ring_entries = 4;
  EventHub hub(store_.get(), options);
  auto cursor = hub.Subscribe("a", 0);
  ASSERT_TRUE(cursor.ok());
  Append("a", 1, 25);
  const std::vector<loom::v1::JobEvent> got = ReadLogged(**cursor, 25);
  ASSERT_EQ(got.size(), 25u);
  EXPECT_EQ(got.front().seq(), 1);
  EXPECT_EQ(got.back().seq(), 25);
}

// From now on: what is logged after the subscription, and the job's live
// events (not another job's), each with its job's id.
TEST_F(EventHubTest, FromNowOnWithLiveEventsOfItsJobOnly) {
  Append("a", 1, 5);
  EventHub hub(store_.get(), {});
  auto cursor = hub.Subscribe("a", -1);
  ASSERT_TRUE(cursor.ok());
  EXPECT_TRUE((*cursor)->Next(absl::Milliseconds(10)).value().empty());
  EXPECT_EQ((*cursor)->position(), 5);
  EXPECT_TRUE(hub.Watched("a"));
  EXPECT_FALSE(hub.Watched("b"));
  loom::v1::JobEvent step;
  step.mutable_step()->set_step(7);
  hub.PublishLive("b", step);
  hub.PublishLive("a", step);
  Append("a", 6, 6);
  auto got = (*cursor)->Next(absl::Seconds(5));
  ASSERT_TRUE(got.ok());
  std::vector<std::string> seen;
  for (const auto& e : *got) seen.push_back(absl::StrCat(e.job_id(), " ", e.seq(), " ", e.has_step()));
  // Logged first, then live.
  EXPECT_THAT(seen, ElementsAre("a 6 0", "a 0 1"));
}

// Cursors are bounded; a closed one frees its place.
TEST_F(EventHubTest, CursorsAreBounded) {
  EventHub::Options options;
  options.max_cursors = 2;
  EventHub hub(store_.get(), options);
  auto one = hub.Subscribe("a", -1);
  auto two = hub.Subscribe("", -1);
  ASSERT_TRUE(one.ok() && two.ok());
  auto three = hub.Subscribe("a", -1);
  ASSERT_EQ(three.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(three.status().message()), HasSubstr("--max_watchers"));
  EXPECT_EQ(hub.open_cursors(), 2);
  one->reset();
  EXPECT_TRUE(hub.Subscribe("a", -1).ok());
}

// One job's watch: the history, the step replay before the last
// transition, and nothing after it; a stream that starts after the job
// ended gets one event saying how it ended (the transition again, or only
// the job for a client resuming after it).
TEST_F(EventHubTest, AJobWatchEndsAfterTheLastTransition) {
  EventHub hub(store_.get(), {});
  ASSERT_TRUE(store_->AppendEvents({Entry("a", 1, loom::v1::PENDING)}).ok());
  ASSERT_TRUE(store_->AppendEvents({Entry("a", 2, loom::v1::RUNNING)}).ok());
  ASSERT_TRUE(store_->AppendEvents({Entry("a", 3, loom::v1::SUCCEEDED)}).ok());
  ASSERT_TRUE(store_->AppendEvents({Entry("b", 1, loom::v1::PENDING)}).ok());  // another job's
  loom::v1::Job job;
  job.set_id("a");
  job.set_state(loom::v1::SUCCEEDED);
  job.add_history()->set_to(loom::v1::SUCCEEDED);
  auto lookup = [&job]() -> absl::StatusOr<loom::v1::Job> { return job; };
  auto watch_of = [&](int64_t after, JobWatch::Options o) {
    auto cursor = hub.Subscribe("a", after);
    EXPECT_TRUE(cursor.ok());
    return std::make_unique<JobWatch>(*std::move(cursor), lookup, std::move(o));
  };
  auto describe = [](JobWatch& w) {
    std::vector<std::string> out;
    for (int i = 0; i < 50 && !w.ended(); ++i) {
      auto batch = w.Next(absl::Milliseconds(20));
      EXPECT_TRUE(batch.ok());
      for (const auto& e : *batch) {
        EXPECT_EQ(e.job().id(), "a");
        out.push_back(e.has_step() ? absl::StrCat("step ", e.step().step())
                      : e.has_transition()
                          ? absl::StrCat(loom::v1::JobState_Name(e.transition().to()), " ", e.seq())
                          : "job only");
      }
    }
    EXPECT_TRUE(w.ended());
    return out;
  };
  JobWatch::Options history;
  history.replay_steps.resize(2);
  history.replay_steps[0].set_step(1);
  history.replay_steps[1].set_step(2);
  EXPECT_THAT(describe(*watch_of(0, history)),
              ElementsAre("PENDING 1", "RUNNING 2", "step 1", "step 2", "SUCCEEDED 3"));
  EXPECT_THAT(describe(*watch_of(2, {})), ElementsAre("SUCCEEDED 3"));
  EXPECT_THAT(describe(*watch_of(-1, {})), ElementsAre("SUCCEEDED 0"));
  JobWatch::Options resuming;
  resuming.repeat_last_transition = false;
  EXPECT_THAT(describe(*watch_of(3, resuming)), ElementsAre("job only"));
}

}  // namespace
}  // namespace loom::controller
