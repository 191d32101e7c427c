#include "common/object_store/s3_config.h"

#include <cstdlib>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::object_store {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

class S3ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = absl::StrCat(::testing::TempDir(), "/s3config-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(home_);
    std::filesystem::create_directories(home_ + "/.aws");
  }
  void TearDown() override { std::filesystem::remove_all(home_); }
  std::string home_;
};

TEST(S3LocationTest, ParsesBucketAndPrefix) {
  auto loc = ParseS3Url("s3://my-bucket/runs/job-1/");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->prefix, "runs/job-1/");
  EXPECT_EQ(loc->Url(), "s3://my-bucket/runs/job-1");
  EXPECT_EQ(loc->Child("step-000000010").prefix, "runs/job-1/step-000000010/");
  auto bare = ParseS3Url("s3://bucket.example");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->prefix, "");
  EXPECT_EQ(bare->Url(), "s3://bucket.example");
}

TEST(S3LocationTest, RefusesWhatS3WouldRefuse) {
  for (const char* bad :
       {"http://b/x", "s3://", "s3://ab", "s3://Upper/x", "s3://-lead/x", "s3://a..b/x",
        "s3://bucket//x", "s3://bucket/a/../b", "s3://bucket/a\\b"}) {
    auto loc = ParseS3Url(bad);
    EXPECT_EQ(loc.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseS3Url("s3://Upper/x").status().message(), HasSubstr("bucket \"Upper\""));
}

TEST_F(S3ConfigTest, EnvironmentWins) {
  ASSERT_TRUE(WriteFileAtomically(home_ + "/.aws/credentials",
                                  "[default]\naws_access_key_id = FILEKEY\n"
                                  "aws_secret_access_key = FILESECRET\n")
                  .ok());
  auto c = S3ConfigFromEnvironment(Env({{"HOME", home_},
                                        {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
                                        {"AWS_REGION", "eu-west-3"},
                                        {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                                        {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"},
                                        {"AWS_SESSION_TOKEN", "TOKEN"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(c->region, "eu-west-3");
  EXPECT_TRUE(c->path_style);  // an explicit endpoint
  EXPECT_EQ(c->access_key_id, "ENVKEY");
  EXPECT_EQ(c->secret_access_key, "ENVSECRET");
  EXPECT_EQ(c->session_token, "TOKEN");
  EXPECT_THAT(c->credentials_source, HasSubstr("environment"));
}

TEST_F(S3ConfigTest, ProfileFilesInAwscliFormat) {
  ASSERT_TRUE(WriteFileAtomically(home_ + "/.aws/credentials",
                                  "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
                                  "[ci]\naws_access_key_id = CIKEY\n"
                                  "aws_secret_access_key = CISECRET\n")
                  .ok());
  ASSERT_TRUE(WriteFileAtomically(home_ + "/.aws/config",
                                  "[default]\nregion = us-west-1\n"
                                  "[profile ci]\nregion = ap-south-1\n"
                                  "s3 =\n  addressing_style = virtual\n"
                                  "endpoint_url = https://objects.example.net\n")
                  .ok());
  auto c = S3ConfigFromEnvironment(Env({{"HOME", home_}, {"AWS_PROFILE", "ci"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "CIKEY");
  EXPECT_EQ(c->secret_access_key, "CISECRET");
  EXPECT_EQ(c->region, "ap-south-1");
  EXPECT_EQ(c->endpoint, "https://objects.example.net");
  EXPECT_FALSE(c->path_style);
  EXPECT_EQ(c->credentials_source, home_ + "/.aws/credentials [ci]");

  auto d = S3ConfigFromEnvironment(Env({{"HOME", home_}}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->access_key_id, "D");
  EXPECT_EQ(d->region, "us-west-1");
  EXPECT_EQ(d->endpoint, "https://s3.us-west-1.amazonaws.com");
  EXPECT_FALSE(d->path_style);  // AWS's own endpoint: virtual hosts
}

TEST_F(S3ConfigTest, MissingCredentialsSayWhereTheyWereLookedFor) {
  auto c = S3ConfigFromEnvironment(Env({{"HOME", home_}, {"AWS_ACCESS_KEY_ID", "K"}}));
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("AWS_SECRET_ACCESS_KEY"));
  EXPECT_THAT(c.status().message(), HasSubstr(home_ + "/.aws/credentials"));
  EXPECT_THAT(c.status().message(), HasSubstr("without AWS_SECRET_ACCESS_KEY"));
}

TEST_F(S3ConfigTest, NamedFileThatCannotBeReadIsAnError) {
  auto c = S3ConfigFromEnvironment(
      Env({{"HOME", home_}, {"AWS_SHARED_CREDENTIALS_FILE", home_ + "/nope"}}));
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("AWS_SHARED_CREDENTIALS_FILE names"));
}

TEST_F(S3ConfigTest, BadEndpointOrStyle) {
  auto base = std::map<std::string, std::string>{
      {"HOME", home_}, {"AWS_ACCESS_KEY_ID", "K"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  auto vars = base;
  vars["AWS_ENDPOINT_URL"] = "ftp://x";
  EXPECT_EQ(S3ConfigFromEnvironment(Env(vars)).status().code(), absl::StatusCode::kInvalidArgument);
  vars["AWS_ENDPOINT_URL"] = "http://host/path";
  EXPECT_EQ(S3ConfigFromEnvironment(Env(vars)).status().code(), absl::StatusCode::kInvalidArgument);
  vars = base;
  vars["AWS_S3_ADDRESSING_STYLE"] = "sideways";
  EXPECT_EQ(S3ConfigFromEnvironment(Env(vars)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::object_store
