#include "controller/logs/log_store.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "controller/store/postgres_test_server.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

// The same tests on both stores: the embedded SQLite file, and a
// PostgreSQL database on a server the binary starts (one database a test).
class LogStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (server_ != nullptr) return;
    auto started = store::PostgresTestServer::Start();
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    char pattern[] = "/tmp/loom_log_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    if (GetParam() == "postgres") {
      static int databases = 0;
      database_ = "logs_" + std::to_string(++databases);
      ASSERT_TRUE(server_->CreateDatabase(database_).ok());
    }
    store_ = Open(4096);
  }
  void TearDown() override {
    store_.reset();
    db_.reset();
    std::filesystem::remove_all(dir_);
  }
  // The log store over the test's database (opened again: a controller
  // restart, or another controller of the same installation).
  std::unique_ptr<LogStore> Open(int64_t max_bytes) {
    db_.reset();
    absl::StatusOr<std::unique_ptr<Store>> db;
    if (GetParam() == "postgres") {
      store::PostgresOptions options;
      options.url = server_->SocketUrl(database_);
      db = Store::OpenPostgres(options);
    } else {
      db = Store::Open(dir_);
    }
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return nullptr;
    db_ = *std::move(db);
    auto store = LogStore::Open(db_.get(), {max_bytes});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::string ReadAll(LogStore& store, const LogKey& key) {
    auto slice = store.Read(key, 0, 1 << 20);
    EXPECT_TRUE(slice.ok()) << slice.status();
    return slice.ok() ? slice->data : "";
  }

  static store::PostgresTestServer* server_;
  std::string dir_, database_;
  std::unique_ptr<Store> db_;
  std::unique_ptr<LogStore> store_;
  const LogKey key_{"tiny-1", 1, 2};
};
store::PostgresTestServer* LogStoreTest::server_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Backends, LogStoreTest, ::testing::Values("sqlite", "postgres"),
                         [](const auto& info) { return info.param; });

TEST_P(LogStoreTest, AppendsAreIdempotentByOffsetAndRefusePastTheEnd) {
  EXPECT_EQ(*store_->Append(key_, 0, "hello ", false), 6);
  // Sent again (the answer was lost): nothing doubled.
  EXPECT_EQ(*store_->Append(key_, 0, "hello ", false), 6);
  // Overlapping: only the new bytes are taken.
  EXPECT_EQ(*store_->Append(key_, 3, "lo world\n", false), 12);
  // Past the end: not taken; the answer says where to send from.
  EXPECT_EQ(*store_->Append(key_, 20, "lost?", false), 12);
  EXPECT_EQ(ReadAll(*store_, key_), "hello world\n");

  auto slice = store_->Read(key_, 6, 3);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice->offset, 6);
  EXPECT_EQ(slice->data, "wor");
  EXPECT_EQ(slice->info.end, 12);
}

TEST_P(LogStoreTest, CompleteLogsTakeNoMoreAndSurviveARestart) {
  ASSERT_TRUE(store_->Append(key_, 0, "step 1\n", false).ok());
  ASSERT_TRUE(store_->Append(key_, 7, "exit 0\n", true).ok());
  EXPECT_EQ(*store_->Append(key_, 14, "more\n", false), 14);
  auto reopened = Open(4096);
  auto slice = reopened->Read(key_, 0, 100);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->data, "step 1\nexit 0\n");
  EXPECT_TRUE(slice->info.complete);
  EXPECT_EQ(slice->info.end, 14);
}

TEST_P(LogStoreTest, KeepsTheNewestBytesInWholeAppends) {
  // 4096 bytes kept, whole appends dropped from the start.
  std::string all;
  for (int i = 0; i < 1000; ++i) {
    std::string line = absl::StrCat("line ", i, "\n");
    ASSERT_TRUE(store_->Append(key_, static_cast<int64_t>(all.size()), line, false).ok());
    all += line;
  }
  auto slice = store_->Read(key_, 0, 1 << 20);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice->info.end, static_cast<int64_t>(all.size()));
  EXPECT_GT(slice->info.first_kept, 0);
  EXPECT_EQ(slice->offset, slice->info.first_kept) << "a read before first_kept starts there";
  EXPECT_LE(slice->data.size(), 4096u);
  EXPECT_GE(slice->data.size(), 4080u);
  EXPECT_EQ(slice->data, all.substr(static_cast<size_t>(slice->info.first_kept)));
  // And the same after a restart.
  auto reopened = Open(4096);
  auto again = reopened->Read(key_, 0, 1 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data, slice->data);
  EXPECT_EQ(again->info.first_kept, slice->info.first_kept);
  // Appends continue where it was.
  EXPECT_EQ(*reopened->Append(key_, again->info.end, "last\n", false), again->info.end + 5);
}

TEST_P(LogStoreTest, TailReturnsTheLastLines) {
  ASSERT_TRUE(store_->Append(key_, 0, "a\nb\nc\nd\n", false).ok());
  auto two = store_->Tail(key_, 2, 1024);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->data, "c\nd\n");
  EXPECT_EQ(two->offset, 4);
  auto many = store_->Tail(key_, 10, 1024);
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many->data, "a\nb\nc\nd\n");
  auto none = store_->Tail(key_, 0, 1024);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->data, "");
  EXPECT_EQ(none->offset, 8);
  // A last line without its line break counts as a line.
  ASSERT_TRUE(store_->Append(key_, 8, "partial", false).ok());
  auto one = store_->Tail(key_, 1, 1024);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->data, "partial");
}

TEST_P(LogStoreTest, ListsRemovesAndRejectsBadNames) {
  ASSERT_TRUE(store_->Append({"job-a", 0, 0}, 0, "x", false).ok());
  ASSERT_TRUE(store_->Append({"job-a", 1, 0}, 0, "yy", true).ok());
  ASSERT_TRUE(store_->Append({"job-a", 0, 1}, 0, "zzz", false).ok());
  ASSERT_TRUE(store_->Append({"job-b", 0, 0}, 0, "w", false).ok());
  auto listed = store_->List("job-a");
  ASSERT_TRUE(listed.ok()) << listed.status();
  const std::vector<LogInfo>& logs = *listed;
  ASSERT_EQ(logs.size(), 3u);
  EXPECT_EQ(logs[0].key.rank, 0);
  EXPECT_EQ(logs[0].key.generation, 0);
  EXPECT_EQ(logs[1].key.rank, 0);
  EXPECT_EQ(logs[1].key.generation, 1);
  EXPECT_EQ(logs[1].end, 3);
  EXPECT_EQ(logs[2].key.rank, 1);
  EXPECT_TRUE(logs[2].complete);
  EXPECT_THAT(*store_->Jobs(), ::testing::ElementsAre("job-a", "job-b"));
  ASSERT_TRUE(store_->Remove("job-a").ok());
  EXPECT_TRUE(store_->List("job-a")->empty());
  EXPECT_THAT(*store_->Jobs(), ::testing::ElementsAre("job-b"));
  EXPECT_TRUE(absl::IsNotFound(store_->Read({"job-a", 0, 0}, 0, 10).status()));

  for (const char* bad : {"", "../etc", "a/b", ".hidden"}) {
    auto s = store_->Append({bad, 0, 0}, 0, "x", false);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("job_id"));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Append({"ok", -1, 0}, 0, "x", false).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Append({"ok", 0, 0}, -5, "x", false).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LogStore::Open(db_.get(), {100}).status()));
}

// Search finds the lines that contain a string across every rank and
// attempt of a job, wherever the appends cut the lines, with the offset
// each line starts at; other jobs' lines are not found; bytes that are not
// UTF-8 and short patterns work too.
TEST_P(LogStoreTest, SearchFindsWholeLinesAcrossRanksAndAttempts) {
  auto big = Open(1 << 20);
  const std::string rank0 =
      "step 1 loss 2.5\nstep 2 loss 2.4\nwarning: NCCL timeout on link 3\nstep 3 loss 2.3\n";
  // Cut in the middle of the warning line, and byte by byte near it.
  ASSERT_TRUE(big->Append({"job-a", 0, 0}, 0, rank0.substr(0, 40), false).ok());
  for (size_t i = 40; i < 50; ++i) {
    ASSERT_TRUE(big->Append({"job-a", 0, 0}, static_cast<int64_t>(i), rank0.substr(i, 1), false).ok());
  }
  ASSERT_TRUE(big->Append({"job-a", 0, 0}, 50, rank0.substr(50), true).ok());
  ASSERT_TRUE(big->Append({"job-a", 1, 3}, 0, "\xff\xfe bad bytes\nwarning: NCCL timeout again", false).ok());
  ASSERT_TRUE(big->Append({"job-b", 0, 0}, 0, "warning: NCCL timeout elsewhere\n", false).ok());

  auto found = big->Search("job-a", "NCCL timeout", 100);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->truncated);
  std::vector<std::string> got;
  for (const auto& l : found->lines) {
    got.push_back(absl::StrCat(l.key.rank, "/", l.key.generation, "@", l.offset, " ", l.text));
  }
  EXPECT_THAT(got, ::testing::ElementsAre("0/0@32 warning: NCCL timeout on link 3",
                                          "1/3@13 warning: NCCL timeout again"));
  // The offset is where the line starts in its log.
  auto at = big->Read({"job-a", 0, 0}, 32, 7);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->data, "warning");
  // Short patterns (under a trigram), and text after bytes that are not UTF-8.
  auto short_one = big->Search("job-a", "2.4", 100);
  ASSERT_TRUE(short_one.ok());
  ASSERT_EQ(short_one->lines.size(), 1u);
  EXPECT_EQ(short_one->lines[0].text, "step 2 loss 2.4");
  auto bad = big->Search("job-a", "bad bytes", 100);
  ASSERT_TRUE(bad.ok());
  ASSERT_EQ(bad->lines.size(), 1u);
  EXPECT_EQ(bad->lines[0].text, "\xEF\xBF\xBD\xEF\xBF\xBD bad bytes");
  // Case matters; a string nowhere finds nothing; LIKE's signs are plain.
  EXPECT_TRUE(big->Search("job-a", "nccl", 100)->lines.empty());
  EXPECT_TRUE(big->Search("job-a", "100%_", 100)->lines.empty());
  // At most max_lines, and said so.
  auto one = big->Search("job-a", "loss", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->lines.size(), 1u);
  EXPECT_TRUE(one->truncated);
  EXPECT_TRUE(absl::IsInvalidArgument(big->Search("job-a", "", 10).status()));
  // Dropped bytes are not found: search follows the log's cap.
  ASSERT_TRUE(big->Remove("job-a").ok());
  EXPECT_TRUE(big->Search("job-a", "NCCL", 100)->lines.empty());
}

// Logs an earlier version kept as files come into the store once, with
// their bytes and completeness.
TEST_P(LogStoreTest, FilesOfAnEarlierVersionAreImportedOnce) {
  const std::string files = dir_ + "/old-logs";
  const std::string attempt = files + "/job-a/rank-1/attempt-0";
  std::filesystem::create_directories(attempt);
  std::ofstream(attempt + "/0000000000000000.log") << "first\n";
  std::ofstream(attempt + "/0000000000000006.log") << "second\n";
  std::ofstream(attempt + "/complete");
  // A log whose oldest segment the cap had dropped keeps its offsets.
  const std::string capped = files + "/job-a/rank-0/attempt-2";
  std::filesystem::create_directories(capped);
  std::ofstream(capped + "/0000000000001024.log") << "kept\n";
  auto imported = store_->ImportFiles(files);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(*imported, 2);
  auto kept = store_->Read({"job-a", 0, 2}, 0, 100);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->offset, 1024);
  EXPECT_EQ(kept->info.first_kept, 1024);
  EXPECT_EQ(kept->data, "kept\n");
  EXPECT_EQ(*store_->Append({"job-a", 0, 2}, 1029, "more\n", false), 1034);
  auto slice = store_->Read({"job-a", 1, 0}, 0, 100);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->data, "first\nsecond\n");
  EXPECT_TRUE(slice->info.complete);
  EXPECT_FALSE(std::filesystem::exists(files));
  EXPECT_TRUE(std::filesystem::exists(files + ".imported"));
  EXPECT_EQ(*store_->ImportFiles(files), 0);
}

}  // namespace
}  // namespace loom::controller
