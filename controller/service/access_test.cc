#include "controller/service/access.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";

std::string Users() {
  return absl::StrCat("# the cluster's people\n",
                      UsersFileLine("alice", Role::kAdmin, kAliceToken),
                      UsersFileLine("bob", Role::kUser, kBobToken),
                      "  carol   reader  # certificate only\n", "\n");
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(AccessTest, TokensAndCertificatesNameTheirHolders) {
  absl::StatusOr<Credentials> creds = Credentials::Parse(Users(), "users", kWorkerToken);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_EQ(creds->users(), 3u);

  absl::StatusOr<Principal> alice = creds->Authenticate(kAliceToken, "");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kAdmin);
  EXPECT_FALSE(alice->certificate);
  EXPECT_EQ(creds->Authenticate(kBobToken, "")->role, Role::kUser);

  absl::StatusOr<Principal> worker = creds->Authenticate(kWorkerToken, "");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->name, "");
  EXPECT_EQ(worker->Describe(), "a worker (worker token)");

  // A certificate names a node or a listed user, and wins over a token.
  absl::StatusOr<Principal> node = creds->Authenticate(kAliceToken, "worker:node-3");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->role, Role::kWorker);
  EXPECT_EQ(node->name, "node-3");
  EXPECT_TRUE(node->certificate);
  absl::StatusOr<Principal> carol = creds->Authenticate("", "user:carol");
  ASSERT_TRUE(carol.ok());
  EXPECT_EQ(carol->role, Role::kReader);
  EXPECT_EQ(carol->Describe(), "user 'carol'");
}

TEST(AccessTest, UnknownCallersAreUnauthenticatedWithAReason) {
  absl::StatusOr<Credentials> creds = Credentials::Parse(Users(), "users", kWorkerToken);
  ASSERT_TRUE(creds.ok());
  for (const auto& [token, cn, reason] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"", "", "no credential"},
           {"wrong", "", "unknown token"},
           {std::string(kAliceToken) + "x", "", "unknown token"},
           {"", "user:dave", "not in the controller's users file"},
           {"", "admin", "neither 'worker:<node>' nor 'user:<name>'"},
           {"", "worker:../etc", "neither"},
       }) {
    absl::StatusOr<Principal> who = creds->Authenticate(token, cn);
    EXPECT_TRUE(absl::IsUnauthenticated(who.status())) << token << " " << cn;
    EXPECT_THAT(Message(who.status()), HasSubstr(reason));
  }
  // Without a worker token, no bearer token makes a worker.
  absl::StatusOr<Credentials> no_workers = Credentials::Parse(Users(), "users", "");
  ASSERT_TRUE(no_workers.ok());
  EXPECT_FALSE(no_workers->has_worker_token());
  EXPECT_TRUE(absl::IsUnauthenticated(no_workers->Authenticate(kWorkerToken, "").status()));
}

TEST(AccessTest, BadUsersFilesNameTheLine) {
  const std::string hash = UsersFileLine("x", Role::kUser, kBobToken).substr(7);  // "sha256:..\n"
  for (const auto& [text, reason] : std::vector<std::pair<std::string, std::string>>{
           {"alice\n", "users:1: expected '<name> <role> [sha256:<hex>]', got 1 field(s)"},
           {"# c\nalice root\n", "users:2: role 'root' is not one of reader, user, admin"},
           {"al/ice admin\n", "users:1: user name 'al/ice' must be"},
           {"alice admin sha256:12\n", "users:1: token hash must be"},
           {"alice admin md5:" + std::string(64, 'a') + "\n", "token hash must be"},
           {"alice admin\nalice reader\n", "users:2: user 'alice' is listed twice"},
           {"alice user " + hash + "bob user " + hash, "users:2: user 'bob' has the same token as user 'alice'"},
       }) {
    absl::StatusOr<Credentials> creds = Credentials::Parse(text, "users", "");
    EXPECT_TRUE(absl::IsInvalidArgument(creds.status())) << text;
    EXPECT_THAT(Message(creds.status()), HasSubstr(reason)) << text;
  }
  // A person may not hold the workers' token.
  absl::StatusOr<Credentials> shared =
      Credentials::Parse(UsersFileLine("eve", Role::kAdmin, kWorkerToken), "users", kWorkerToken);
  EXPECT_THAT(Message(shared.status()), HasSubstr("has the same token as the workers"));
}

TEST(AccessTest, EachRoleCallsOnlyItsMethods) {
  const Principal worker{Role::kWorker, "node-1", true};
  const Principal reader{Role::kReader, "carol", false};
  const Principal user{Role::kUser, "bob", false};
  const Principal admin{Role::kAdmin, "alice", false};
  EXPECT_TRUE(Authorize(worker, "WorkerService.Heartbeat").ok());
  EXPECT_TRUE(Authorize(reader, "JobService.GetJob").ok());
  EXPECT_TRUE(Authorize(reader, "JobService.Plan").ok());
  EXPECT_TRUE(Authorize(user, "JobService.SubmitJob").ok());
  EXPECT_TRUE(Authorize(admin, "JobService.RollbackJob").ok());

  absl::Status s = Authorize(worker, "JobService.GetJob");
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(Message(s), HasSubstr("worker 'node-1' has role worker and may not call "
                                    "JobService.GetJob (allowed: reader, user, admin)"));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(reader, "JobService.SubmitJob")));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(reader, "JobService.CancelJob")));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(admin, "WorkerService.ReportRankExit")));
  EXPECT_TRUE(absl::IsPermissionDenied(Authorize(user, "WorkerService.RegisterWorker")));
  // A method without a rule is no one's.
  absl::Status unknown = Authorize(admin, "JobService.DeleteEverything");
  EXPECT_TRUE(absl::IsPermissionDenied(unknown));
  EXPECT_THAT(Message(unknown), HasSubstr("no access rule"));
}

TEST(AccessTest, OnlyTheSubmitterOrAnAdminChangesAJob) {
  const Principal bob{Role::kUser, "bob", false};
  const Principal dave{Role::kUser, "dave", false};
  const Principal alice{Role::kAdmin, "alice", false};
  const Principal carol{Role::kReader, "carol", false};
  EXPECT_TRUE(AuthorizeJobChange(bob, "cancel", "j-1", "bob").ok());
  EXPECT_TRUE(AuthorizeJobChange(alice, "cancel", "j-1", "bob").ok());
  EXPECT_TRUE(AuthorizeJobChange(alice, "roll back", "j-0", "").ok());
  absl::Status s = AuthorizeJobChange(dave, "roll back", "j-1", "bob");
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(Message(s), HasSubstr("user 'dave' may not roll back job 'j-1': it was submitted "
                                    "by 'bob', and only its submitter or an admin may"));
  EXPECT_TRUE(absl::IsPermissionDenied(AuthorizeJobChange(carol, "cancel", "j-2", "carol")));
  EXPECT_TRUE(absl::IsPermissionDenied(AuthorizeJobChange(bob, "cancel", "j-0", "")));
}

class AccessControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/loom_access_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// Removing a user's line revokes them without a restart; a broken edit
// keeps the users in force.
TEST_F(AccessControlTest, AnEditedUsersFileTakesEffectAndABrokenOneDoesNot) {
  const std::string users = dir_ + "/users";
  const std::string worker_token = dir_ + "/worker-token";
  ASSERT_TRUE(WritePrivateFile(users, Users()).ok());
  ASSERT_TRUE(WritePrivateFile(worker_token, std::string(kWorkerToken) + "\n").ok());
  absl::StatusOr<std::unique_ptr<AccessControl>> access = AccessControl::Load(users, worker_token);
  ASSERT_TRUE(access.ok()) << access.status();
  AccessControl& ac = **access;
  EXPECT_TRUE(ac.Authenticate(kBobToken, "").ok());
  EXPECT_TRUE(ac.ReloadIfChanged().ok());

  ASSERT_TRUE(WritePrivateFile(users, UsersFileLine("alice", Role::kAdmin, kAliceToken)).ok());
  ASSERT_TRUE(ac.ReloadIfChanged().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(ac.Authenticate(kBobToken, "").status()));
  EXPECT_TRUE(ac.Authenticate(kAliceToken, "").ok());
  EXPECT_EQ(ac.Authenticate(kWorkerToken, "")->role, Role::kWorker);

  ASSERT_TRUE(WritePrivateFile(users, "alice superuser\n").ok());
  absl::Status broken = ac.ReloadIfChanged();
  EXPECT_TRUE(absl::IsInvalidArgument(broken));
  EXPECT_THAT(Message(broken), HasSubstr("stay in force"));
  EXPECT_TRUE(ac.Authenticate(kAliceToken, "").ok());
}

TEST_F(AccessControlTest, LoadRefusesMissingAndWritableFiles) {
  EXPECT_TRUE(absl::IsNotFound(AccessControl::Load(dir_ + "/none", "").status()));
  const std::string users = dir_ + "/users";
  ASSERT_TRUE(WritePrivateFile(users, Users()).ok());
  ASSERT_EQ(chmod(users.c_str(), 0666), 0);
  absl::StatusOr<std::unique_ptr<AccessControl>> open = AccessControl::Load(users, "");
  EXPECT_TRUE(absl::IsPermissionDenied(open.status()));
  EXPECT_THAT(Message(open.status()), HasSubstr("chmod 600"));
  // No users file: workers only.
  const std::string token = dir_ + "/worker-token";
  ASSERT_TRUE(WritePrivateFile(token, kWorkerToken).ok());
  absl::StatusOr<std::unique_ptr<AccessControl>> workers = AccessControl::Load("", token);
  ASSERT_TRUE(workers.ok());
  EXPECT_TRUE((*workers)->Authenticate(kWorkerToken, "").ok());
  EXPECT_TRUE(absl::IsUnauthenticated((*workers)->Authenticate(kAliceToken, "").status()));
}

}  // namespace
}  // namespace loom::controller
