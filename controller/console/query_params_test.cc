#include "controller/console/query_params.h"

#include <gtest/gtest.h>

#include "loom/v1/service.pb.h"

namespace loom::controller::console {
namespace {

TEST(QueryParamsTest, QueryParametersSetScalarFieldsByProtoOrJsonName) {
  loom::v1::ListEventsRequest events;
  ASSERT_TRUE(ParseQueryParams("job_id=a%20b%2Bc&afterSeq=42&page_size=7", &events).ok());
  EXPECT_EQ(events.job_id(), "a b+c");
  EXPECT_EQ(events.after_seq(), 42);
  EXPECT_EQ(events.page_size(), 7);

  loom::v1::GetRankLogRequest log;
  ASSERT_TRUE(ParseQueryParams("rank=3&tail_lines=20&job_id=x+y", &log).ok());
  EXPECT_EQ(log.rank(), 3);
  EXPECT_EQ(log.tail_lines(), 20);
  EXPECT_EQ(log.job_id(), "x y");
}

TEST(QueryParamsTest, QueryErrorsNameTheParameter) {
  loom::v1::ListEventsRequest events;
  absl::Status unknown = ParseQueryParams("page_size=1&bogus=2", &events);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("\"bogus\""), std::string::npos) << unknown;
  absl::Status not_int = ParseQueryParams("page_size=ten", &events);
  EXPECT_EQ(not_int.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_int.message().find("page_size: \"ten\" is not an integer"), std::string::npos)
      << not_int;
  absl::Status escape = ParseQueryParams("job_id=%zz", &events);
  EXPECT_EQ(escape.code(), absl::StatusCode::kInvalidArgument);
  absl::Status cut = ParseQueryParams("job_id=%4", &events);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument);
}

TEST(QueryParamsTest, EnumsByNameOrNumberAndMessagesRefused) {
  loom::v1::ListJobsRequest jobs;
  ASSERT_TRUE(ParseQueryParams("states=RUNNING&states=3&full=true", &jobs).ok());
  ASSERT_EQ(jobs.states_size(), 2);
  EXPECT_EQ(jobs.states(0), loom::v1::RUNNING);
  EXPECT_EQ(static_cast<int>(jobs.states(1)), 3);
  EXPECT_TRUE(jobs.full());
  EXPECT_FALSE(ParseQueryParams("states=NOT_A_STATE", &jobs).ok());
  EXPECT_FALSE(ParseQueryParams("full=maybe", &jobs).ok());
  loom::v1::SubmitJobRequest submit;
  absl::Status nested = ParseQueryParams("spec=x", &submit);
  EXPECT_EQ(nested.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nested.message().find("POST body"), std::string::npos) << nested;
}

}  // namespace
}  // namespace loom::controller::console
