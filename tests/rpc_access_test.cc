// The role test: a real loom-controller (TLS, cluster CA for client
// certificates, a users file, a workers' token) on 127.0.0.1:0, and every
// RPC of every service in the proto's descriptors called by every kind of
// caller: none, a wrong token, a certificate from another CA, and each role
// by token and by certificate. Callers without a credential are
// UNAUTHENTICATED, callers in the wrong role PERMISSION_DENIED; the right
// role gets past the check (to the request's own validation). The expected
// roles are this file's table, not the controller's: an RPC added to the
// proto without a line here, or served without a check, fails the test.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/cluster_ca.h"
#include "cli/local_cluster.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "controller/service/access.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"
#include "tests/tls_controller.h"

namespace loom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kBin[] = LOOM_BIN_DIR;

// Who may call what: the specification this test holds the controller to.
enum Caller { kReader, kUser, kAdmin, kWorker };
const std::map<std::string, std::set<Caller>>& Expected() {
  static const auto* table = new std::map<std::string, std::set<Caller>>{
      {"loom.v1.JobService.SubmitJob", {kUser, kAdmin}},
      {"loom.v1.JobService.GetJob", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.ListJobs", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.CancelJob", {kUser, kAdmin}},
      {"loom.v1.JobService.WatchJob", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.WatchEvents", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.ListEvents", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.ListWorkers", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.GetStepMetrics", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.ListCheckpoints", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.PlanCheckpointRetention", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.Plan", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.RollbackJob", {kUser, kAdmin}},
      {"loom.v1.JobService.GetRankLog", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.SearchRankLogs", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.ListQueues", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.WhoAmI", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.GetStepSeries", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.GetGoodput", {kReader, kUser, kAdmin}},
      {"loom.v1.JobService.CordonNode", {kAdmin}},
      {"loom.v1.JobService.UncordonNode", {kAdmin}},
      {"loom.v1.JobService.DrainNode", {kAdmin}},
      {"loom.v1.WorkerService.RegisterWorker", {kWorker}},
      {"loom.v1.WorkerService.Heartbeat", {kWorker}},
      {"loom.v1.WorkerService.ReportStepMetrics", {kWorker}},
      {"loom.v1.WorkerService.ReportRankExit", {kWorker}},
      {"loom.v1.WorkerService.AppendRankLogs", {kWorker}},
  };
  return *table;
}

// How a caller connects: its channel's certificate and its bearer token.
struct Identity {
  std::string label;
  std::string token;
  std::string cert;  // PEM file paths; empty = none
  std::string key;
  Caller role = kReader;
  bool valid = true;  // false: expect UNAUTHENTICATED (or a refused handshake)
};

class RpcAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("loom_rpc_access_test");
    ASSERT_TRUE(
        controller_
            .Start(kBin, dir_,
                   absl::StrCat(
                       controller::UsersFileLine("rita", controller::Role::kReader, "rita-token"),
                       controller::UsersFileLine("uma", controller::Role::kUser, "uma-token"),
                       controller::UsersFileLine("ada", controller::Role::kAdmin, "ada-token"),
                       "cleo reader\ncora user\ncarl admin\n"))
            .ok());
    tls_ = controller_.tls_dir();
    address_ = controller_.grpc_address();
  }

  // A client certificate from the cluster CA (or, with `foreign`, from
  // another CA the controller does not trust).
  Identity WithCertificate(const std::string& label, const std::string& cn, Caller role,
                           bool foreign = false) {
    const std::string ca_dir = foreign ? dir_ + "/other-ca" : tls_;
    EXPECT_TRUE(cli::EnsureClusterCa(ca_dir).ok());
    auto issued = cli::IssueCertificate(ca_dir, label, cn, false);
    EXPECT_TRUE(issued.ok()) << issued.status();
    return Identity{label, "", issued->cert_path, issued->key_path, role, !foreign};
  }

  // A stream that is let in runs until its deadline (WatchEvents from now
  // on): `deadline` bounds it.
  grpc::Status Call(const Identity& who, const std::string& full_method,
                    std::chrono::seconds deadline = std::chrono::seconds(10)) {
    auto creds = MakeChannelCredentials(true, tls_ + "/ca.pem", who.cert, who.key);
    EXPECT_TRUE(creds.ok());
    grpc::GenericStub stub(grpc::CreateChannel(address_, *creds));
    const size_t dot = full_method.rfind('.');
    const std::string path =
        absl::StrCat("/", full_method.substr(0, dot), "/", full_method.substr(dot + 1));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    AttachToken(&ctx, who.token);
    grpc::Slice empty_message("", 0);  // an empty message of any type
    grpc::ByteBuffer request(&empty_message, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, path, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  }

  testing::TlsController controller_;
  std::string dir_, tls_, address_;
};

TEST_F(RpcAccessTest, EveryRpcChecksItsCaller) {
  std::vector<Identity> callers = {
      {"no credential", "", "", "", kReader, false},
      {"a wrong token", "not-a-token", "", "", kReader, false},
      {"reader token", "rita-token", "", "", kReader},
      {"user token", "uma-token", "", "", kUser},
      {"admin token", "ada-token", "", "", kAdmin},
      {"workers' token", "the-workers-token", "", "", kWorker},
  };
  callers.push_back(WithCertificate("reader-cert", "user:cleo", kReader));
  callers.push_back(WithCertificate("user-cert", "user:cora", kUser));
  callers.push_back(WithCertificate("admin-cert", "user:carl", kAdmin));
  callers.push_back(WithCertificate("worker-cert", "worker:node-a", kWorker));
  callers.push_back(WithCertificate("unlisted-user-cert", "user:mallory", kAdmin, false));
  callers.back().valid = false;
  callers.push_back(WithCertificate("nameless-cert", "root", kAdmin));
  callers.back().valid = false;
  callers.push_back(WithCertificate("foreign-cert", "user:ada", kAdmin, /*foreign=*/true));

  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  int methods = 0;
  for (const char* service_name : {"loom.v1.JobService", "loom.v1.WorkerService"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(service_name);
    ASSERT_NE(service, nullptr) << service_name;
    for (int m = 0; m < service->method_count(); ++m) {
      const std::string method = service->method(m)->full_name();
      ++methods;
      auto expected = Expected().find(method);
      ASSERT_NE(expected, Expected().end())
          << method << " is in the proto but not in this test's table: say who may call it";
      for (const Identity& who : callers) {
        grpc::Status s = Call(who, method,
                              std::chrono::seconds(service->method(m)->server_streaming() ? 2 : 10));
        const std::string what = absl::StrCat(method, " by ", who.label, ": ", s.error_code(),
                                              " ", s.error_message());
        if (!who.valid) {
          // A foreign certificate fails the handshake; the rest reach the
          // controller, which refuses them.
          if (who.label == "foreign-cert") {
            EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << what;
          } else {
            EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << what;
          }
        } else if (expected->second.count(who.role) == 0) {
          EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << what;
          EXPECT_THAT(s.error_message(), HasSubstr("may not call")) << what;
        } else {
          // Past the role check (an empty request then fails its own
          // validation, or a worker certificate's node binding).
          EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << what;
          EXPECT_THAT(s.error_message(), Not(HasSubstr("may not call"))) << what;
        }
      }
    }
  }
  EXPECT_EQ(methods, static_cast<int>(Expected().size()))
      << "the table names an RPC the proto no longer has";
}

// A worker certificate binds the worker to its node: it registers only as
// that node and acts only for the worker that node registered.
TEST_F(RpcAccessTest, AWorkerCertificateActsOnlyForItsNode) {
  const Identity a = WithCertificate("worker-a", "worker:node-a", kWorker);
  const Identity b = WithCertificate("worker-b", "worker:node-b", kWorker);
  auto stub_for = [&](const Identity& who) {
    auto creds = MakeChannelCredentials(true, tls_ + "/ca.pem", who.cert, who.key);
    EXPECT_TRUE(creds.ok());
    return v1::WorkerService::NewStub(grpc::CreateChannel(address_, *creds));
  };
  auto stub_a = stub_for(a);
  auto stub_b = stub_for(b);
  v1::RegisterWorkerRequest reg;
  reg.set_node("node-b");
  reg.set_address("127.0.0.1");
  reg.set_slots(1);
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_a->RegisterWorker(&ctx, reg, &registered);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("may register only as node 'node-a'"));
  }
  reg.set_node("node-a");
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_a->RegisterWorker(&ctx, reg, &registered);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  v1::HeartbeatRequest beat;
  beat.set_worker_id(registered.worker_id());
  v1::HeartbeatResponse answer;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_b->Heartbeat(&ctx, beat, &answer);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("worker 'node-b' may not act for worker"));
  }
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_a->Heartbeat(&ctx, beat, &answer);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Rank logs: only as itself, and only of ranks placed on its node (no
  // job here placed anything on node-a: every chunk is refused, -1).
  v1::AppendRankLogsRequest logs;
  logs.set_worker_id(registered.worker_id());
  auto* chunk = logs.add_chunks();
  chunk->set_job_id("someone-elses-1");
  chunk->set_data("forged line\n");
  v1::AppendRankLogsResponse shipped;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_b->AppendRankLogs(&ctx, logs, &shipped);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_a->AppendRankLogs(&ctx, logs, &shipped);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(shipped.next_offset_size(), 1);
    EXPECT_EQ(shipped.next_offset(0), -1);
  }
  chunk->set_job_id("../../etc");
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_a->AppendRankLogs(&ctx, logs, &shipped);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("chunks[0].job_id"));
  }
}

}  // namespace
}  // namespace loom
