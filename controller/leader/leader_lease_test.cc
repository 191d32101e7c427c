#include "controller/leader/leader_lease.h"

#include <atomic>
#include <memory>
#include <string>

#include "controller/store/postgres_test_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

// Waits (bounded, 10 s) until `done` holds.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

struct Controller {
  std::unique_ptr<Store> store;
  Leadership leadership;
  std::atomic<int64_t> elected{0};
  std::atomic<int> lost{0};
  std::string lost_reason;  // written before `lost` is incremented
  std::unique_ptr<LeaderElector> elector;
};

class LeaderLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = store::PostgresTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::unique_ptr<Store> OpenStore() {
    store::PostgresOptions options;
    options.url = server_->SocketUrl("loom");
    auto opened = Store::OpenPostgres(options);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? *std::move(opened) : nullptr;
  }
  std::unique_ptr<Controller> StartController(const std::string& name) {
    auto c = std::make_unique<Controller>();
    c->store = OpenStore();
    LeaderElectorOptions options;
    options.holder = name;
    options.address = name + ":7070";
    options.lease = absl::Milliseconds(400);
    options.renew_interval = absl::Milliseconds(100);
    Controller* raw = c.get();
    c->elector = std::make_unique<LeaderElector>(
        c->store.get(), &c->leadership, options,
        [raw](int64_t epoch) {
          raw->elected = epoch;
          return absl::OkStatus();
        },
        [raw](const std::string& reason) {
          raw->lost_reason = reason;
          raw->lost++;
        });
    c->elector->Start();
    return c;
  }

  std::unique_ptr<store::PostgresTestServer> server_;
};

// The first controller leads; the second stands by and names it; a clean
// stop of the leader hands over at once with the next epoch, and the new
// leader's writes are fenced on it.
TEST_F(LeaderLeaseTest, StandbyNamesTheLeaderAndTakesOverOnItsStop) {
  auto a = StartController("ctl-a");
  ASSERT_TRUE(Eventually([&] { return a->leadership.LeadingNow(); }));
  EXPECT_EQ(a->elected.load(), 1);
  EXPECT_EQ(a->store->fencing_epoch(), 1);
  auto b = StartController("ctl-b");
  std::string leader;
  ASSERT_TRUE(Eventually(
      [&] { return absl::IsUnavailable(b->leadership.Admit(&leader)) && leader == "ctl-a:7070"; }));
  absl::Status standby = b->leadership.Admit(&leader);
  EXPECT_THAT(std::string(standby.message()),
              HasSubstr("standby: the leader is ctl-a at ctl-a:7070 (epoch 1)"));
  EXPECT_STREQ(b->leadership.role(), "standby");
  EXPECT_TRUE(a->leadership.Admit(&leader).ok());

  a->elector->Stop();
  EXPECT_FALSE(a->leadership.LeadingNow());
  ASSERT_TRUE(Eventually([&] { return b->leadership.LeadingNow(); }));
  EXPECT_EQ(b->leadership.epoch(), 2);
  EXPECT_EQ(b->store->fencing_epoch(), 2);
  EXPECT_EQ(a->lost.load(), 0);
  EXPECT_EQ(b->lost.load(), 0);
}

// A leader whose lease another holder took (as after a pause past its
// lease) finds out at its next renewal, stops leading and is told why,
// once; its store's writes are refused from then on.
TEST_F(LeaderLeaseTest, LeaderThatLostTheLeaseStepsDown) {
  auto a = StartController("ctl-a");
  ASSERT_TRUE(Eventually([&] { return a->leadership.LeadingNow(); }));
  std::unique_ptr<Store> usurper = OpenStore();
  auto taken = usurper->AcquireLease("usurper", "elsewhere:1", absl::Seconds(30), /*force=*/true);
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(Eventually([&] { return a->lost.load() > 0; }));
  EXPECT_EQ(a->lost.load(), 1);
  EXPECT_THAT(a->lost_reason, HasSubstr("taken by usurper at elsewhere:1 (epoch 2)"));
  EXPECT_FALSE(a->leadership.LeadingNow());
  loom::v1::Job job;
  job.set_id("late-1");
  EXPECT_EQ(a->store->PutJob(job, 0).code(), absl::StatusCode::kAborted);
}

// A leader cut off from its database (the server gone) stops leading by its
// own clock within the lease, before any standby could have taken over.
TEST_F(LeaderLeaseTest, LeaderCutOffFromTheDatabaseStopsWithinTheLease) {
  auto a = StartController("ctl-a");
  ASSERT_TRUE(Eventually([&] { return a->leadership.LeadingNow(); }));
  ASSERT_TRUE(server_->Kill().ok());
  ASSERT_TRUE(Eventually([&] { return !a->leadership.LeadingNow(); }));
  ASSERT_TRUE(Eventually([&] { return a->lost.load() > 0; }));
  EXPECT_THAT(a->lost_reason, HasSubstr("no renewal of the leader lease (epoch 1) reached"));
}

}  // namespace
}  // namespace loom::controller
