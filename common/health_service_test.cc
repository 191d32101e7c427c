#include "common/health_service.h"

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "gtest/gtest.h"

namespace loom {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A real server on an OS-chosen loopback port with only the health service,
// as loom-worker runs it.
class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_NE(port, 0);
    stub_ = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  grpc::Status Check(const std::string& service, HealthCheckResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    HealthCheckRequest req;
    req.set_service(service);
    return stub_->Check(&ctx, req, resp);
  }

  HealthService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

TEST_F(HealthServiceTest, NotServingUntilRegisteredThenServingThenNotAgain) {
  HealthCheckResponse resp;
  ASSERT_TRUE(Check("", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  service_.SetServing(true);
  ASSERT_TRUE(Check("", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  service_.SetServing(false);  // the controller forgot the worker
  ASSERT_TRUE(Check("", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, UnknownServiceIsNotFound) {
  service_.SetServing(true);
  HealthCheckResponse resp;
  EXPECT_EQ(Check("loom.v1.JobService", &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A named service (the controller's "loom.leader") answers its own status,
// and never SERVING while the whole server is not.
TEST_F(HealthServiceTest, NamedServiceHasItsOwnStatus) {
  service_.SetServing(true);
  service_.SetServing("loom.leader", false);
  HealthCheckResponse resp;
  ASSERT_TRUE(Check("loom.leader", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(Check("", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  service_.SetServing("loom.leader", true);
  ASSERT_TRUE(Check("loom.leader", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);
  service_.SetServing(false);
  ASSERT_TRUE(Check("loom.leader", &resp).ok());
  EXPECT_EQ(resp.status(), HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace loom
