#include "worker/controller_link.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

// A controller as a worker sees it: it either leads (answers heartbeats
// under `epoch`) or stands by (UNAVAILABLE naming `leader`).
class FakeController final : public loom::v1::WorkerService::Service {
 public:
  FakeController(int64_t epoch, std::string leader) : epoch_(epoch), leader_(std::move(leader)) {}
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const loom::v1::HeartbeatRequest*,
                         loom::v1::HeartbeatResponse* resp) override {
    calls_++;
    if (!leader_.empty()) {
      ctx->AddTrailingMetadata("loom-leader", leader_);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "standby: the leader is at " + leader_);
    }
    resp->set_controller_epoch(epoch_);
    return grpc::Status::OK;
  }
  int calls() const { return calls_; }

 private:
  const int64_t epoch_;
  const std::string leader_;
  std::atomic<int> calls_{0};
};

struct Running {
  std::unique_ptr<FakeController> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

Running Serve(int64_t epoch, const std::string& leader) {
  Running r;
  r.service = std::make_unique<FakeController>(epoch, leader);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(r.service.get());
  r.server = builder.BuildAndStart();
  r.address = "127.0.0.1:" + std::to_string(port);
  return r;
}

grpc::Status Beat(ControllerLink& link, int64_t* epoch, ControllerLink::Target* used) {
  *used = link.Current();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  loom::v1::HeartbeatResponse resp;
  grpc::Status s = used->stub->Heartbeat(&ctx, loom::v1::HeartbeatRequest(), &resp);
  link.After(*used, s, ctx);
  *epoch = resp.controller_epoch();
  return s;
}

// A worker given [dead, standby, leader] in that order reaches the leader:
// the dead one sends it on in turn, the standby by naming the leader.
TEST(ControllerLinkTest, FollowsTheLeaderTheStandbyNames) {
  Running leader = Serve(3, "");
  Running standby = Serve(0, leader.address);
  // A third, live address that never answers the leader's calls: it must not
  // be tried once the standby named the leader.
  Running other = Serve(0, leader.address);
  const std::string dead = "127.0.0.1:1";  // nothing listens on port 1
  std::vector<std::string> addresses = {dead, standby.address, other.address, leader.address};
  std::vector<std::shared_ptr<ControllerLink::Stub>> stubs;
  for (const std::string& a : addresses) {
    stubs.push_back(loom::v1::WorkerService::NewStub(
        grpc::CreateChannel(a, grpc::InsecureChannelCredentials())));
  }
  ControllerLink link(addresses, std::move(stubs));
  int64_t epoch = 0;
  ControllerLink::Target used{};
  EXPECT_EQ(Beat(link, &epoch, &used).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(used.index, 0);
  EXPECT_EQ(Beat(link, &epoch, &used).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(used.index, 1);  // the standby, which names the leader
  ASSERT_TRUE(Beat(link, &epoch, &used).ok());
  EXPECT_EQ(used.index, 3);
  EXPECT_EQ(epoch, 3);
  EXPECT_TRUE(link.Accept(used, epoch));
  EXPECT_EQ(other.service->calls(), 0);
  EXPECT_EQ(link.Current().index, 3);  // stays with the leader
}

// Answers from an older epoch than the newest seen are refused, and the
// link moves away from whoever gave them; equal and newer ones are taken.
TEST(ControllerLinkTest, RefusesOlderEpochs) {
  std::vector<std::string> addresses = {"a:1", "b:1"};
  std::vector<std::shared_ptr<ControllerLink::Stub>> stubs = {nullptr, nullptr};
  ControllerLink link(addresses, stubs);
  ControllerLink::Target a{nullptr, 0}, b{nullptr, 1};
  EXPECT_TRUE(link.Accept(a, 1));
  EXPECT_TRUE(link.Accept(a, 1));
  EXPECT_EQ(link.Current().index, 0);
  EXPECT_TRUE(link.Accept(a, 2));
  EXPECT_FALSE(link.Accept(a, 1));  // a paused old leader, say
  EXPECT_EQ(link.Current().index, 1);
  EXPECT_TRUE(link.Accept(b, 4));
  EXPECT_FALSE(link.Accept(b, 2));
  EXPECT_EQ(link.newest_epoch(), 4);
}

}  // namespace
}  // namespace loom::worker
