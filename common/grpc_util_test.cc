#include "common/grpc_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

class ReadTokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/loom_token_test_", getpid());
    ASSERT_TRUE(MakeDirs(dir_, 0700).ok());
    path_ = dir_ + "/token";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  // Writes `contents` to the token file and sets `mode` exactly.
  void Write(const std::string& contents, mode_t mode) {
    ASSERT_TRUE(WriteFileAtomically(path_, contents, 0600).ok());
    ASSERT_EQ(chmod(path_.c_str(), mode), 0);
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ReadTokenFileTest, OwnerOnlyModesAreAccepted) {
  for (mode_t mode : {0600, 0400}) {
    Write("s3cret\n", mode);
    auto token = ReadTokenFile(path_);
    ASSERT_TRUE(token.ok()) << std::oct << mode << ": " << token.status();
    EXPECT_EQ(*token, "s3cret");
  }
}

// What Kubernetes gives a Secret volume with fsGroup and defaultMode 0440
// (or 0640): readable by the pod's group, not by others.
TEST_F(ReadTokenFileTest, GroupReadableIsAccepted) {
  for (mode_t mode : {0640, 0440}) {
    Write("  s3cret  \n", mode);
    auto token = ReadTokenFile(path_);
    ASSERT_TRUE(token.ok()) << std::oct << mode << ": " << token.status();
    EXPECT_EQ(*token, "s3cret");
  }
}

TEST_F(ReadTokenFileTest, WorldAccessIsRefused) {
  for (mode_t mode : {0644, 0604, 0444, 0602, 0601, 0666}) {
    Write("s3cret\n", mode);
    auto token = ReadTokenFile(path_);
    EXPECT_EQ(token.status().code(), absl::StatusCode::kPermissionDenied) << std::oct << mode;
    EXPECT_NE(token.status().message().find("chmod 600"), std::string::npos)
        << token.status();
  }
}

TEST_F(ReadTokenFileTest, GroupWriteOrExecuteIsRefused) {
  for (mode_t mode : {0660, 0620, 0650, 0470}) {
    Write("s3cret\n", mode);
    auto token = ReadTokenFile(path_);
    EXPECT_EQ(token.status().code(), absl::StatusCode::kPermissionDenied) << std::oct << mode;
  }
}

TEST_F(ReadTokenFileTest, RefusalNamesTheMode) {
  Write("s3cret\n", 0644);
  auto token = ReadTokenFile(path_);
  ASSERT_EQ(token.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(token.status().message().find("mode 0644"), std::string::npos) << token.status();
}

TEST_F(ReadTokenFileTest, MissingIsNotFound) {
  EXPECT_EQ(ReadTokenFile(dir_ + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ReadTokenFileTest, EmptyIsInvalidArgument) {
  Write(" \n", 0600);
  EXPECT_EQ(ReadTokenFile(path_).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
