#include "worker/snapshot_dirs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

namespace fs = std::filesystem;

class SnapshotDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_snapshot_dirs_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(SnapshotDirsTest, OneRankOfAnAttemptWritesAndANewAttemptElectsItsOwn) {
  const std::string job = root_ + "/job-1";
  EXPECT_TRUE(ClaimSnapshotWriter(job, 4));
  // Another rank of attempt 4 on this node: a child process (locks belong
  // to open files; this process holds its own).
  auto claim_in_child = [&](int64_t attempt) {
    const pid_t pid = fork();
    if (pid == 0) _exit(ClaimSnapshotWriter(job, attempt) ? 0 : 1);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  EXPECT_FALSE(claim_in_child(4));
  // The next attempt elects its own writer, whatever the old one's ranks do.
  EXPECT_TRUE(claim_in_child(5));
}

TEST_F(SnapshotDirsTest, IdleDirectoriesWithoutALiveWriterAreRemoved) {
  const absl::Time now = absl::Now();
  fs::create_directories(root_ + "/idle/step-000000007");
  std::ofstream(root_ + "/idle/step-000000007/shard-00000.bin") << "x";
  fs::create_directories(root_ + "/written");
  // A live writer (this process holds attempt 2's lock) keeps its job's
  // directory however long nothing was written.
  ASSERT_TRUE(ClaimSnapshotWriter(root_ + "/held", 2));
  // Nothing changed for 10 minutes: `now` is 11 minutes on.
  const std::vector<std::string> removed =
      RemoveIdleSnapshotDirs(root_, absl::Minutes(10), now + absl::Minutes(11));
  EXPECT_THAT(removed, ::testing::UnorderedElementsAre("idle", "written"));
  EXPECT_FALSE(fs::exists(root_ + "/idle"));
  EXPECT_TRUE(fs::exists(root_ + "/held"));
  // Recently written: kept.
  fs::create_directories(root_ + "/fresh");
  EXPECT_TRUE(RemoveIdleSnapshotDirs(root_, absl::Minutes(10), now + absl::Minutes(1)).empty());
  EXPECT_TRUE(fs::exists(root_ + "/fresh"));
}

TEST_F(SnapshotDirsTest, TheDefaultRootIsInSharedMemory) {
  const std::string root = DefaultSnapshotRoot();
  if (fs::is_directory("/dev/shm")) {
    EXPECT_EQ(root, "/dev/shm/loom-snapshots-" + std::to_string(getuid()));
  } else {
    EXPECT_EQ(root, "");
  }
}

}  // namespace
}  // namespace loom::worker
