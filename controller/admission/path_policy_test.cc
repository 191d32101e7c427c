#include "controller/admission/path_policy.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_path_policy_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    // Resolved, so that expectations compare with resolved paths.
    tmp_ = fs::canonical(pattern).string();
    fs::create_directories(tmp_ + "/data/corpus");
    fs::create_directories(tmp_ + "/ckpt");
    fs::create_directories(tmp_ + "/data2");
    fs::create_directories(tmp_ + "/outside");
    roots_.data = {tmp_ + "/data"};
    roots_.checkpoint = {tmp_ + "/ckpt", tmp_ + "/more-ckpt/"};
  }
  void TearDown() override { fs::remove_all(tmp_); }

  absl::Status Confine(const std::string& train, const std::string& checkpoint = "") {
    spec_.Clear();
    spec_.mutable_data()->add_train(train);
    if (!checkpoint.empty()) spec_.mutable_checkpoint()->set_dir(checkpoint);
    return ConfineJobPaths(roots_, &spec_);
  }

  std::string tmp_;
  PathRoots roots_;
  loom::v1::JobSpec spec_;
};

TEST_F(PathPolicyTest, PathsUnderARootAreAcceptedAndResolved) {
  ASSERT_TRUE(Confine(tmp_ + "/data/corpus/train_*.bin", tmp_ + "/ckpt/job-1").ok());
  EXPECT_EQ(spec_.data().train(0), tmp_ + "/data/corpus/train_*.bin");
  EXPECT_EQ(spec_.checkpoint().dir(), tmp_ + "/ckpt/job-1");
  // Dots that stay inside are resolved away; a root given with a trailing
  // slash, or not yet created, still counts.
  ASSERT_TRUE(Confine(tmp_ + "/data/corpus/../corpus/./x.bin", tmp_ + "/more-ckpt/a/b").ok());
  EXPECT_EQ(spec_.data().train(0), tmp_ + "/data/corpus/x.bin");
  EXPECT_EQ(spec_.checkpoint().dir(), tmp_ + "/more-ckpt/a/b");
  // The root itself holds data.
  EXPECT_TRUE(Confine(tmp_ + "/data/x.bin").ok());
}

// What a reviewer tried: /etc, a climb out with "..", /etc/shadow.
TEST_F(PathPolicyTest, PathsOutsideEveryRootAreRefusedNamingTheField) {
  absl::Status s = Confine(tmp_ + "/data/x.bin", "/etc");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("checkpoint.dir: /etc is outside"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(tmp_ + "/ckpt"));

  s = Confine(tmp_ + "/data/x.bin", tmp_ + "/ckpt/../../../../etc");
  EXPECT_THAT(std::string(s.message()), StartsWith("checkpoint.dir: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(/etc) is outside"));

  s = Confine("/etc/shadow");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("data.train[0]: /etc/shadow is outside"));

  // A sibling that shares the root's prefix is not beneath it.
  s = Confine(tmp_ + "/data2/x.bin");
  EXPECT_THAT(std::string(s.message()), StartsWith("data.train[0]: "));
  // Relative paths are refused (loomctl makes them absolute).
  s = Confine("data/x.bin");
  EXPECT_THAT(std::string(s.message()), StartsWith("data.train[0]: \"data/x.bin\" must be an absolute path"));
  // A wildcard cannot climb.
  s = Confine(tmp_ + "/data/*/../../outside/x.bin");
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"..\" after a wildcard"));
  // The checkpoint root itself is not a job's directory.
  s = Confine(tmp_ + "/data/x.bin", tmp_ + "/ckpt");
  EXPECT_THAT(std::string(s.message()), StartsWith("checkpoint.dir: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a checkpoint root itself"));
  // Validation data too.
  spec_.Clear();
  spec_.mutable_data()->add_train(tmp_ + "/data/x.bin");
  spec_.mutable_data()->add_validation(tmp_ + "/data/v.bin");
  spec_.mutable_data()->add_validation("/etc/passwd");
  s = ConfineJobPaths(roots_, &spec_);
  EXPECT_THAT(std::string(s.message()), StartsWith("data.validation[1]: /etc/passwd"));
  // init_from reads a checkpoint: it must lie under a checkpoint root too.
  spec_.Clear();
  spec_.mutable_data()->add_train(tmp_ + "/data/x.bin");
  spec_.mutable_init_from()->set_path(tmp_ + "/ckpt/../outside/step-000000010");
  s = ConfineJobPaths(roots_, &spec_);
  EXPECT_THAT(std::string(s.message()), StartsWith("init_from.path: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("is outside"));
  spec_.mutable_init_from()->set_path(tmp_ + "/ckpt/other-2/./step-000000010");
  ASSERT_TRUE(ConfineJobPaths(roots_, &spec_).ok());
  EXPECT_EQ(spec_.init_from().path(), tmp_ + "/ckpt/other-2/step-000000010");
}

// A symlink inside a root that points out of it is followed: what counts is
// where the ranks would really read and write.
TEST_F(PathPolicyTest, SymlinksAreResolvedBeforeTheCheck) {
  fs::create_directory_symlink(tmp_ + "/outside", tmp_ + "/data/escape");
  fs::create_directory_symlink("/etc", tmp_ + "/ckpt/etc");
  absl::Status s = Confine(tmp_ + "/data/escape/x.bin");
  EXPECT_THAT(std::string(s.message()),
              StartsWith("data.train[0]: " + tmp_ + "/data/escape/x.bin (" + tmp_ +
                         "/outside/x.bin) is outside"));
  s = Confine(tmp_ + "/data/x.bin", tmp_ + "/ckpt/etc/cron.d");
  EXPECT_THAT(std::string(s.message()), HasSubstr("(/etc/cron.d) is outside"));
  // A symlink that stays inside is fine, and the spec gets the target.
  fs::create_directory_symlink(tmp_ + "/data/corpus", tmp_ + "/data/latest");
  ASSERT_TRUE(Confine(tmp_ + "/data/latest/train_*.bin").ok());
  EXPECT_EQ(spec_.data().train(0), tmp_ + "/data/corpus/train_*.bin");
}

TEST_F(PathPolicyTest, NoDataRootsLeaveDataUnconfined) {
  roots_.data.clear();
  EXPECT_TRUE(Confine("/usr/share/games/fortunes/*").ok());
  EXPECT_EQ(spec_.data().train(0), "/usr/share/games/fortunes/*");
}

TEST(PathIsUnderTest, ComparesWholeComponents) {
  EXPECT_TRUE(PathIsUnder("/a/b/c", "/a/b"));
  EXPECT_TRUE(PathIsUnder("/a/b", "/a/b"));
  EXPECT_FALSE(PathIsUnder("/a/bc", "/a/b"));
  EXPECT_FALSE(PathIsUnder("/a", "/a/b"));
  EXPECT_TRUE(PathIsUnder("/a/b/c", "/"));
  EXPECT_EQ(SplitRoots(" /a, ,/b,"), (std::vector<std::string>{"/a", "/b"}));
}

}  // namespace
}  // namespace loom::controller
