#include "worker/log_shipper.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

// The controller's side of AppendRankLogs, as its contract states it: bytes
// it has are skipped, a chunk past the end is not taken, -1 for refused
// logs. Can be told to fail the next calls.
struct FakeController {
  std::map<std::tuple<std::string, int, int64_t>, std::string> logs;
  std::map<std::tuple<std::string, int, int64_t>, bool> complete;
  std::string refuse_job;
  int fail_next = 0;
  int calls = 0;

  grpc::Status Append(loom::v1::AppendRankLogsRequest* req,
                      loom::v1::AppendRankLogsResponse* resp) {
    ++calls;
    if (fail_next > 0) {
      --fail_next;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "controller away");
    }
    for (const auto& c : req->chunks()) {
      if (c.job_id() == refuse_job) {
        resp->add_next_offset(-1);
        continue;
      }
      auto key = std::make_tuple(c.job_id(), c.rank(), c.generation());
      std::string& have = logs[key];
      const int64_t end = static_cast<int64_t>(have.size());
      if (c.offset() <= end) {
        const size_t skip = static_cast<size_t>(end - c.offset());
        if (skip < c.data().size()) have += c.data().substr(skip);
        if (c.complete()) complete[key] = true;
      }
      resp->add_next_offset(static_cast<int64_t>(have.size()));
    }
    return grpc::Status::OK;
  }
};

class LogShipperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_log_shipper_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/rank-0.log";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) {
    std::ofstream out(path_, std::ios::app);
    out << text;
  }
  int64_t Size() { return static_cast<int64_t>(std::filesystem::file_size(path_)); }
  LogShipper::SendFn Send() {
    return [this](loom::v1::AppendRankLogsRequest* req, loom::v1::AppendRankLogsResponse* resp) {
      return controller_.Append(req, resp);
    };
  }

  std::string Shipped(const std::string& job, int rank, int64_t generation) {
    return controller_.logs[std::make_tuple(job, rank, generation)];
  }
  bool Complete(const std::string& job, int rank, int64_t generation) {
    return controller_.complete[std::make_tuple(job, rank, generation)];
  }

  std::string dir_, path_;
  FakeController controller_;
};

TEST_F(LogShipperTest, ShipsNewBytesThenTheEndAndForgetsTheLog) {
  LogShipper shipper(Send());
  Write("");
  shipper.Started("job-1", 0, 0, path_, 0);
  Write("step 1\n");
  ASSERT_TRUE(shipper.ShipOnce().ok());
  Write("step 2\n");
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0), "step 1\nstep 2\n");
  // Nothing new: no request at all.
  const int calls = controller_.calls;
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(controller_.calls, calls);
  Write("done\n");
  shipper.Exited("job-1", 0, 0, Size());
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0), "step 1\nstep 2\ndone\n");
  EXPECT_TRUE(Complete("job-1", 0, 0));
  EXPECT_EQ(shipper.tracked(), 0u);
}

TEST_F(LogShipperTest, AFailedRoundIsSentAgainWithoutLossOrDoubling) {
  LogShipper shipper(Send());
  Write("");
  shipper.Started("job-1", 0, 0, path_, 0);
  Write("a\n");
  controller_.fail_next = 2;
  EXPECT_FALSE(shipper.ShipOnce().ok());
  Write("b\n");
  EXPECT_FALSE(shipper.ShipOnce().ok());
  EXPECT_EQ(shipper.tracked(), 1u);
  ASSERT_TRUE(shipper.ShipOnce().ok());
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0), "a\nb\n");
}

TEST_F(LogShipperTest, AttemptsSharingAFileShipOnlyTheirOwnBytes) {
  LogShipper shipper(Send());
  Write("");
  shipper.Started("job-1", 0, 0, path_, 0);
  Write("attempt 0\n");
  shipper.Exited("job-1", 0, 0, Size());
  shipper.Started("job-1", 0, 1, path_, Size());
  Write("attempt 1\n");
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0), "attempt 0\n");
  EXPECT_EQ(Shipped("job-1", 0, 1), "attempt 1\n");
  EXPECT_EQ(shipper.tracked(), 1u) << "attempt 1 still runs";
}

TEST_F(LogShipperTest, RefusedLogsAreDroppedAndBigOutputGoesInChunks) {
  LogShipperOptions options;
  options.max_chunk_bytes = 1000;
  LogShipper shipper(Send(), options);
  Write(std::string(2500, 'x'));
  shipper.Started("job-1", 0, 0, path_, 0);
  shipper.Started("other", 3, 0, path_, 0);
  controller_.refuse_job = "other";
  shipper.Exited("job-1", 0, 0, Size());
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0).size(), 1000u);
  EXPECT_EQ(shipper.tracked(), 1u) << "the refused log is forgotten, the other continues";
  ASSERT_TRUE(shipper.ShipOnce().ok());
  ASSERT_TRUE(shipper.ShipOnce().ok());
  EXPECT_EQ(Shipped("job-1", 0, 0), std::string(2500, 'x'));
  EXPECT_TRUE(Complete("job-1", 0, 0));
  EXPECT_EQ(shipper.tracked(), 0u);
}

}  // namespace
}  // namespace loom::worker
