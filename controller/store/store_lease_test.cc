// The leader lease on PostgreSQL with several controllers: fencing under
// writes, a leader paused inside a transaction, and renewals and standby
// polls that do not wait for a write in progress (store_lease.cc).
#include <atomic>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "controller/store/postgres_connection.h"
#include "controller/store/postgres_test_server.h"
#include "controller/store/store.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

// Fencing under load (PostgreSQL, two controllers): while the old leader
// keeps writing, the new one takes the lease. Every write the old one had
// acknowledged is in the database, and none it wrote after the takeover.
TEST(StorePostgresTest, TakeoverDuringWritesLosesNoAcknowledgedWrite) {
  auto server = store::PostgresTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  store::PostgresOptions options;
  options.url = (*server)->SocketUrl("loom");
  auto old_leader = Store::OpenPostgres(options);
  ASSERT_TRUE(old_leader.ok()) << old_leader.status();
  auto new_leader = Store::OpenPostgres(options);
  ASSERT_TRUE(new_leader.ok()) << new_leader.status();
  auto lease = (*old_leader)->AcquireLease("old", "a", absl::Milliseconds(200));
  ASSERT_TRUE(lease.ok() && lease->held_by("old"));
  (*old_leader)->SetFencingEpoch(lease->epoch);

  std::atomic<bool> taken{false};
  std::atomic<int> acked_after_takeover{0};
  std::vector<int64_t> acked;  // steps whose write returned OK
  std::thread writer([&] {
    // Bounded: 5,000 writes at most, or until refused 20 times.
    int refused = 0;
    for (int i = 1; i <= 5000 && refused < 20; ++i) {
      loom::v1::StepMetrics m;
      m.set_step(i);
      const bool after = taken.load();
      absl::Status s = (*old_leader)->AppendStepMetrics("job-1", {m});
      if (s.ok()) {
        acked.push_back(i);
        if (after) acked_after_takeover++;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        ++refused;
      }
    }
  });
  Store::Lease now;
  for (int i = 0; i < 200 && !now.held_by("new"); ++i) {
    auto tried = (*new_leader)->AcquireLease("new", "b", absl::Seconds(5));
    ASSERT_TRUE(tried.ok()) << tried.status();
    now = *tried;
    if (!now.held_by("new")) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(now.held_by("new"));
  taken = true;
  writer.join();
  EXPECT_EQ(acked_after_takeover.load(), 0);
  auto stored = (*new_leader)->LoadStepMetrics("job-1", 0);
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::vector<int64_t> steps;
  for (const auto& m : *stored) steps.push_back(m.step());
  EXPECT_EQ(steps, acked);
  std::cout << "[ fencing ] " << acked.size() << " writes acknowledged before the takeover, "
            << "all stored; 0 after" << std::endl;
}

// A leader paused (or cut off) in the middle of a write transaction holds
// the lease row's lock. The server ends its idle transaction, so a standby
// still takes the lease after it runs out, and the paused transaction
// commits nothing.
TEST(StorePostgresTest, LeaderPausedInsideATransactionDoesNotBlockTheTakeover) {
  auto server = store::PostgresTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  store::PostgresOptions options;
  options.url = (*server)->SocketUrl("loom");
  auto standby = Store::OpenPostgres(options);
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto lease = (*standby)->AcquireLease("paused", "a", absl::Milliseconds(300));
  ASSERT_TRUE(lease.ok() && lease->held_by("paused"));
  // What the paused leader's fenced write had done when it stopped.
  auto paused = store::PostgresConnection::Open(options);
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_TRUE((*paused)->Exec("BEGIN;").ok());
  ASSERT_TRUE((*paused)->Run("SELECT epoch FROM leader WHERE id = 1 FOR KEY SHARE;", {}).ok());
  ASSERT_TRUE(
      (*paused)
          ->Run("INSERT INTO cordons (node, until_unix_ms, reason) VALUES ('n', 1, 'r');", {})
          .ok());
  // Bounded: 100 tries over at least 5 s (a try may wait out lock_timeout).
  Store::Lease now;
  for (int i = 0; i < 100 && !now.held_by("standby"); ++i) {
    auto tried = (*standby)->AcquireLease("standby", "b", absl::Seconds(5));
    if (tried.ok()) now = *tried;
    if (!now.held_by("standby")) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(now.held_by("standby"));
  EXPECT_EQ(now.epoch, 2);
  // The paused one wakes: its transaction is gone, and nothing of it stays.
  EXPECT_FALSE((*paused)->Exec("COMMIT;").ok());
  EXPECT_TRUE((*standby)->LoadCordons(0)->empty());
}

// A leader's write held up inside the database (here another session holds
// the rank log row it appends to) holds the store's connection and its
// fenced share of the lease row. The leader still renews its lease, and a
// standby still reads who leads, while that write waits: neither queues
// behind it. (Once, on a loaded machine, a 2.2 s append made the leader
// miss its renewals and lose a lease it was alive to keep.)
TEST(StorePostgresTest, RenewalAndStandbyPollsDoNotWaitForAWriteInProgress) {
  auto server = store::PostgresTestServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  store::PostgresOptions options;
  options.url = (*server)->SocketUrl("loom");
  options.lock_timeout_ms = 20000;  // the held-up append waits, within bounds
  auto leader = Store::OpenPostgres(options);
  ASSERT_TRUE(leader.ok()) << leader.status();
  auto standby = Store::OpenPostgres(options);
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto lease = (*leader)->AcquireLease("leader", "a", absl::Seconds(30));
  ASSERT_TRUE(lease.ok() && lease->held_by("leader"));
  (*leader)->SetFencingEpoch(lease->epoch);
  ASSERT_TRUE((*leader)->AppendLog("job-1", 0, 1, 0, "one\n", false, 1 << 20, false).ok());

  store::PostgresOptions raw = options;
  raw.idle_in_transaction_timeout_ms = 0;  // the blocker stays until told
  auto blocker = store::PostgresConnection::Open(raw);
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  ASSERT_TRUE((*blocker)->Exec("BEGIN;").ok());
  ASSERT_TRUE((*blocker)->Run("SELECT end_offset FROM rank_logs FOR UPDATE;", {}).ok());
  std::atomic<bool> appended{false};
  absl::Status append_status;
  std::thread append([&] {
    append_status = (*leader)->AppendLog("job-1", 0, 1, 4, "two\n", false, 1 << 20, false).status();
    appended = true;
  });
  // Bounded: until the append waits on the row lock, 400 looks at most.
  auto watcher = store::PostgresConnection::Open(options);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  bool waiting = false;
  for (int i = 0; i < 400 && !waiting; ++i) {
    auto r = (*watcher)->Run(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock';", {});
    ASSERT_TRUE(r.ok()) << r.status();
    waiting = r->rows[0][0].i > 0;
    if (!waiting) absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_TRUE(waiting);

  auto renewed = (*leader)->AcquireLease("leader", "a", absl::Seconds(30));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_TRUE(renewed->held_by("leader"));
  EXPECT_EQ(renewed->epoch, lease->epoch);
  EXPECT_GE(renewed->expires_unix_ms, lease->expires_unix_ms);
  auto polled = (*standby)->AcquireLease("standby", "b", absl::Seconds(30));
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_TRUE(polled->held_by("leader"));
  EXPECT_FALSE(appended.load()) << "the append should still wait: " << append_status;

  ASSERT_TRUE((*blocker)->Exec("COMMIT;").ok());
  append.join();
  EXPECT_TRUE(append_status.ok()) << append_status;
  auto log = (*leader)->GetLog("job-1", 0, 1);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->end, 8);
}

}  // namespace
}  // namespace loom::controller
