#include "controller/log_store.h"

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

class LogStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_log_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    store_ = Open(4096);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<LogStore> Open(int64_t max_bytes) {
    auto store = LogStore::Open({dir_ + "/logs", max_bytes});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::string ReadAll(LogStore& store, const LogKey& key) {
    auto slice = store.Read(key, 0, 1 << 20);
    EXPECT_TRUE(slice.ok()) << slice.status();
    return slice.ok() ? slice->data : "";
  }

  std::string dir_;
  std::unique_ptr<LogStore> store_;
  const LogKey key_{"tiny-1", 1, 2};
};

TEST_F(LogStoreTest, AppendsAreIdempotentByOffsetAndRefusePastTheEnd) {
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

TEST_F(LogStoreTest, CompleteLogsTakeNoMoreAndSurviveARestart) {
  ASSERT_TRUE(store_->Append(key_, 0, "step 1\n", false).ok());
  ASSERT_TRUE(store_->Append(key_, 7, "exit 0\n", true).ok());
  EXPECT_EQ(*store_->Append(key_, 14, "more\n", false), 14);
  store_.reset();
  auto reopened = Open(4096);
  auto slice = reopened->Read(key_, 0, 100);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->data, "step 1\nexit 0\n");
  EXPECT_TRUE(slice->info.complete);
  EXPECT_EQ(slice->info.end, 14);
}

TEST_F(LogStoreTest, KeepsTheNewestBytesInWholeSegments) {
  // 4096 bytes kept, in segments of 1024.
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
  EXPECT_GE(slice->data.size(), 3072u);
  EXPECT_EQ(slice->data, all.substr(static_cast<size_t>(slice->info.first_kept)));
  // And the same after a restart.
  store_.reset();
  auto reopened = Open(4096);
  auto again = reopened->Read(key_, 0, 1 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data, slice->data);
  EXPECT_EQ(again->info.first_kept, slice->info.first_kept);
  // Appends continue where it was.
  EXPECT_EQ(*reopened->Append(key_, again->info.end, "last\n", false), again->info.end + 5);
}

TEST_F(LogStoreTest, TailReturnsTheLastLines) {
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

TEST_F(LogStoreTest, ListsRemovesAndRejectsBadNames) {
  ASSERT_TRUE(store_->Append({"job-a", 0, 0}, 0, "x", false).ok());
  ASSERT_TRUE(store_->Append({"job-a", 1, 0}, 0, "yy", true).ok());
  ASSERT_TRUE(store_->Append({"job-a", 0, 1}, 0, "zzz", false).ok());
  ASSERT_TRUE(store_->Append({"job-b", 0, 0}, 0, "w", false).ok());
  auto logs = store_->List("job-a");
  ASSERT_EQ(logs.size(), 3u);
  EXPECT_EQ(logs[0].key.rank, 0);
  EXPECT_EQ(logs[0].key.generation, 0);
  EXPECT_EQ(logs[1].key.rank, 0);
  EXPECT_EQ(logs[1].key.generation, 1);
  EXPECT_EQ(logs[1].end, 3);
  EXPECT_EQ(logs[2].key.rank, 1);
  EXPECT_TRUE(logs[2].complete);
  EXPECT_THAT(store_->Jobs(), ::testing::ElementsAre("job-a", "job-b"));
  ASSERT_TRUE(store_->Remove("job-a").ok());
  EXPECT_TRUE(store_->List("job-a").empty());
  EXPECT_THAT(store_->Jobs(), ::testing::ElementsAre("job-b"));
  EXPECT_TRUE(absl::IsNotFound(store_->Read({"job-a", 0, 0}, 0, 10).status()));

  for (const char* bad : {"", "../etc", "a/b", ".hidden"}) {
    auto s = store_->Append({bad, 0, 0}, 0, "x", false);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("job_id"));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Append({"ok", -1, 0}, 0, "x", false).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Append({"ok", 0, 0}, -5, "x", false).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LogStore::Open({dir_ + "/small", 100}).status()));
}

}  // namespace
}  // namespace loom::controller
