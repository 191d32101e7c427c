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

TEST(ApiGatewayTest, QueryParametersSetScalarFieldsByProtoOrJsonName) {
  loom::v1::ListEventsRequest events;
  ASSERT_TRUE(ApiGateway::ParseQuery("job_id=a%20b%2Bc&afterSeq=42&page_size=7", &events).ok());
  EXPECT_EQ(events.job_id(), "a b+c");
  EXPECT_EQ(events.after_seq(), 42);
  EXPECT_EQ(events.page_size(), 7);

  loom::v1::GetRankLogRequest log;
  ASSERT_TRUE(ApiGateway::ParseQuery("rank=3&tail_lines=20&job_id=x+y", &log).ok());
  EXPECT_EQ(log.rank(), 3);
  EXPECT_EQ(log.tail_lines(), 20);
  EXPECT_EQ(log.job_id(), "x y");
}

TEST(ApiGatewayTest, QueryErrorsNameTheParameter) {
  loom::v1::ListEventsRequest events;
  absl::Status unknown = ApiGateway::ParseQuery("page_size=1&bogus=2", &events);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("\"bogus\""), std::string::npos) << unknown;
  absl::Status not_int = ApiGateway::ParseQuery("page_size=ten", &events);
  EXPECT_EQ(not_int.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_int.message().find("page_size: \"ten\" is not an integer"), std::string::npos)
      << not_int;
  absl::Status escape = ApiGateway::ParseQuery("job_id=%zz", &events);
  EXPECT_EQ(escape.code(), absl::StatusCode::kInvalidArgument);
  absl::Status cut = ApiGateway::ParseQuery("job_id=%4", &events);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ApiGatewayTest, EnumsByNameOrNumberAndMessagesRefused) {
  loom::v1::ListJobsRequest jobs;
  ASSERT_TRUE(ApiGateway::ParseQuery("states=RUNNING&states=3&full=true", &jobs).ok());
  ASSERT_EQ(jobs.states_size(), 2);
  EXPECT_EQ(jobs.states(0), loom::v1::RUNNING);
  EXPECT_EQ(static_cast<int>(jobs.states(1)), 3);
  EXPECT_TRUE(jobs.full());
  EXPECT_FALSE(ApiGateway::ParseQuery("states=NOT_A_STATE", &jobs).ok());
  EXPECT_FALSE(ApiGateway::ParseQuery("full=maybe", &jobs).ok());
  loom::v1::SubmitJobRequest submit;
  absl::Status nested = ApiGateway::ParseQuery("spec=x", &submit);
  EXPECT_EQ(nested.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nested.message().find("POST body"), std::string::npos) << nested;
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
