#include "controller/console/api_gateway.h"

#include <gtest/gtest.h>

#include "loom/v1/service.pb.h"

namespace loom::controller::console {
namespace {

// A gateway whose channel leads nowhere: every case here is answered before
// any RPC (tests/console_api_test.cc calls a real controller).
ApiGateway Unconnected() {
  return ApiGateway(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
                    absl::Seconds(1));
}

ApiReply Ask(const std::string& method, const std::string& path, const std::string& query = "") {
  ApiRequest request;
  request.method = method;
  request.path = path;
  request.query = query;
  return Unconnected().Handle(request);
}

TEST(ApiGatewayTest, UnknownRoutesAre404AndWrongMethods405WithAllow) {
  ApiReply outside = Ask("GET", "/metrics");
  EXPECT_EQ(outside.status, 404);
  ApiReply unknown = Ask("GET", "/api/v1/nothing");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("\"code\":\"NOT_FOUND\""), std::string::npos) << unknown.body;
  ApiReply verb = Ask("POST", "/api/v1/jobs/a:explode");
  EXPECT_EQ(verb.status, 404);

  ApiReply remove = Ask("DELETE", "/api/v1/jobs");
  EXPECT_EQ(remove.status, 405);
  ASSERT_EQ(remove.headers.size(), 1u);
  EXPECT_EQ(remove.headers[0].first, "Allow");
  EXPECT_EQ(remove.headers[0].second, "GET, POST");
  ApiReply get_cancel = Ask("GET", "/api/v1/jobs/a:cancel");
  EXPECT_EQ(get_cancel.status, 405);
  ApiReply post_workers = Ask("POST", "/api/v1/workers");
  EXPECT_EQ(post_workers.status, 405);
}

TEST(ApiGatewayTest, BadQueriesAndBodiesAre400BeforeAnyCall) {
  ApiReply query = Ask("GET", "/api/v1/jobs/a/events", "after_seq=-x");
  EXPECT_EQ(query.status, 400);
  EXPECT_NE(query.body.find("after_seq"), std::string::npos) << query.body;

  ApiRequest body;
  body.method = "POST";
  body.path = "/api/v1/jobs/a:cancel";
  body.body = "{not json";
  ApiReply bad = Unconnected().Handle(body);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("not a CancelJobRequest in JSON"), std::string::npos) << bad.body;

  body.body = std::string(ApiGateway::kMaxBodyBytes + 1, ' ') + "{}";
  EXPECT_EQ(Unconnected().Handle(body).status, 413);
}

TEST(ApiGatewayTest, StatusCodesMapOneWay) {
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::OK), 200);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::UNAUTHENTICATED), 401);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::PERMISSION_DENIED), 403);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::NOT_FOUND), 404);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::FAILED_PRECONDITION), 409);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(ApiGateway::HttpStatusOf(grpc::StatusCode::INTERNAL), 500);
}

}  // namespace
}  // namespace loom::controller::console
