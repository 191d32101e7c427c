#include "common/prune_log.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/loom_prune_log_test_XXXXXX";
  return mkdtemp(tmpl);
}

TEST(PruneLogTest, AppendedNamesReadBackAndATornLineIsIgnored) {
  const std::string dir = TempDir();
  EXPECT_TRUE(ReadPruneLog(dir)->empty());  // no log yet
  ASSERT_TRUE(AppendPruneLog(dir, "step-000000025").ok());
  ASSERT_TRUE(AppendPruneLog(dir, "step-000000050").ok());
  {
    std::ofstream torn(dir + "/PRUNED", std::ios::app);
    torn << "step-0000";  // a crash mid-append
  }
  auto names = ReadPruneLog(dir);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ::testing::ElementsAre("step-000000025", "step-000000050"));
  EXPECT_EQ(AppendPruneLog(dir, "a/b").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AppendPruneLog(dir, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(AppendPruneLog(dir + "/no-such-dir", "step-1").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
