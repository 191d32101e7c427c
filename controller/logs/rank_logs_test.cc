#include "controller/logs/rank_logs.h"

#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

// A real LogStore over a SQLite store in a temporary directory; placements from a table the
// test fills (the job manager's, in the controller).
class RankLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_rank_logs_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    auto db = Store::Open(dir_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    auto store = LogStore::Open(db_.get(), {1 << 20});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    logs_ = std::make_unique<RankLogs>(store_.get(), [this](const std::string& job) {
      auto it = placements_.find(job);
      if (it == placements_.end()) {
        return absl::StatusOr<RankLogs::Placements>(
            absl::NotFoundError("no job with id " + job));
      }
      return absl::StatusOr<RankLogs::Placements>(it->second);
    });
  }
  void TearDown() override {
    logs_.reset();
    store_.reset();
    db_.reset();
    std::filesystem::remove_all(dir_);
  }

  loom::v1::AppendRankLogsRequest Chunk(const std::string& job, int rank, int64_t generation,
                                        int64_t offset, const std::string& data) {
    loom::v1::AppendRankLogsRequest req;
    req.set_worker_id("w");
    auto* c = req.add_chunks();
    c->set_job_id(job);
    c->set_rank(rank);
    c->set_generation(generation);
    c->set_offset(offset);
    c->set_data(data);
    return req;
  }

  std::string dir_;
  std::unique_ptr<Store> db_;
  std::unique_ptr<LogStore> store_;
  std::map<std::string, RankLogs::Placements> placements_;
  std::unique_ptr<RankLogs> logs_;
};

TEST_F(RankLogsTest, AWorkerAppendsOnlyItsOwnRanksLogs) {
  placements_["job-1"] = {{1, {{0, "node-a"}, {1, "node-b"}}}};
  auto mine = logs_->Append(Chunk("job-1", 0, 1, 0, "step 1\n"), "node-a");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_THAT(mine->next_offset(), ::testing::ElementsAre(7));
  // Rank 1 ran on node-b, and attempt 2 does not exist: both dropped (-1).
  auto other = logs_->Append(Chunk("job-1", 1, 1, 0, "forged\n"), "node-a");
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(other->next_offset(), ::testing::ElementsAre(-1));
  auto stale = logs_->Append(Chunk("job-1", 0, 2, 0, "x\n"), "node-a");
  EXPECT_THAT(stale->next_offset(), ::testing::ElementsAre(-1));
  auto unknown = logs_->Append(Chunk("job-9", 0, 1, 0, "x\n"), "node-a");
  EXPECT_THAT(unknown->next_offset(), ::testing::ElementsAre(-1));

  loom::v1::GetRankLogRequest get;
  get.set_job_id("job-1");
  get.set_offset(0);  // from the start (without: the last tail_lines lines)
  auto got = logs_->Get(get);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), "step 1\n");
  EXPECT_EQ(got->log().node(), "node-a");
  EXPECT_EQ(got->logs_size(), 1);
}

TEST_F(RankLogsTest, GetTakesTheNewestAttemptAndSaysWhichRanksHaveLogs) {
  placements_["job-1"] = {{1, {{0, "node-a"}}}, {2, {{0, "node-b"}}}};
  ASSERT_TRUE(logs_->Append(Chunk("job-1", 0, 1, 0, "first\n"), "node-a").ok());
  ASSERT_TRUE(logs_->Append(Chunk("job-1", 0, 2, 0, "second\n"), "node-b").ok());
  loom::v1::GetRankLogRequest get;
  get.set_job_id("job-1");
  get.set_offset(0);
  auto newest = logs_->Get(get);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->data(), "second\n");
  EXPECT_EQ(newest->log().generation(), 2);
  EXPECT_EQ(newest->logs_size(), 2);
  get.set_generation(1);
  EXPECT_EQ(logs_->Get(get)->data(), "first\n");
  get.clear_generation();
  get.set_rank(3);
  auto none = logs_->Get(get);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("no log of rank 3 of job job-1 yet (ranks with logs: 0)"));
  get.set_job_id("job-9");
  EXPECT_EQ(logs_->Get(get).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RankLogsTest, BadRequestsNameTheField) {
  auto code_and_message = [](const absl::Status& s) {
    return std::make_pair(s.code(), std::string(s.message()));
  };
  loom::v1::GetRankLogRequest get;
  EXPECT_EQ(code_and_message(logs_->Get(get).status()),
            std::make_pair(absl::StatusCode::kInvalidArgument,
                           std::string("job_id: must not be empty")));
  get.set_job_id("job-1");
  get.set_rank(-1);
  EXPECT_THAT(std::string(logs_->Get(get).status().message()), HasSubstr("rank: must be >= 0"));
  get.set_rank(0);
  get.set_max_bytes(RankLogs::kMaxBytes + 1);
  EXPECT_THAT(std::string(logs_->Get(get).status().message()), HasSubstr("max_bytes: must be in"));
  get.set_max_bytes(0);
  get.set_tail_lines(-2);
  EXPECT_THAT(std::string(logs_->Get(get).status().message()), HasSubstr("tail_lines"));

  EXPECT_THAT(std::string(RankLogs::ValidateAppend(Chunk("../etc", 0, 1, 0, "x"))
                              .message()),
              HasSubstr("chunks[0].job_id:"));
  EXPECT_THAT(std::string(RankLogs::ValidateAppend(Chunk("job-1", 0, 1, -5, "x")).message()),
              HasSubstr("chunks[0].offset: must be >= 0"));
  auto refused = logs_->Append(Chunk("job-1", -1, 1, 0, "x"), "node-a");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("chunks[0].rank: must be >= 0"));
}

}  // namespace
}  // namespace loom::controller
