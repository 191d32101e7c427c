#include "controller/console/sessions.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller::console {
namespace {

using ::testing::HasSubstr;

class ConsoleSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_sessions_testXXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

// A session stands for its token until it expires or is ended; what the
// store keeps is hashes only.
TEST_F(ConsoleSessionsTest, OpensResolvesExpiresAndEnds) {
  ConsoleSessions sessions(store_.get(), absl::Hours(1), [this] { return now_; });
  auto opened = sessions.Open("alice", "alice-token");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(ConsoleSessions::WellFormed(opened->id));
  EXPECT_EQ(opened->csrf, ConsoleSessions::CsrfTokenOf(opened->id));
  EXPECT_NE(opened->csrf, opened->id);
  EXPECT_EQ(opened->expires, now_ + absl::Hours(1));
  auto hash = sessions.TokenHashOf(opened->id);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, Sha256Hex("alice-token"));
  // The store holds neither secret.
  auto row = store_->GetSession(Sha256Hex(opened->id));
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->user, "alice");
  EXPECT_NE(row->id_sha256, opened->id);
  EXPECT_NE(row->token_sha256, "alice-token");

  // Two sessions of one token are two ids.
  auto second = sessions.Open("alice", "alice-token");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->id, opened->id);

  now_ += absl::Minutes(61);
  auto expired = sessions.TokenHashOf(opened->id);
  EXPECT_TRUE(absl::IsUnauthenticated(expired.status()));
  EXPECT_THAT(expired.status().message(), HasSubstr("expired"));

  ASSERT_TRUE(sessions.End(second->id).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(sessions.TokenHashOf(second->id).status()));
  EXPECT_TRUE(sessions.End(second->id).ok());  // again: nothing to do
}

TEST_F(ConsoleSessionsTest, RefusesMalformedAndUnknownIds) {
  ConsoleSessions sessions(store_.get(), absl::Hours(1), [this] { return now_; });
  for (const std::string id : {std::string(), std::string("abc"), std::string(64, 'z'),
                               std::string(64, 'A'), std::string(65, 'a')}) {
    EXPECT_TRUE(absl::IsUnauthenticated(sessions.TokenHashOf(id).status())) << id;
  }
  auto unknown = sessions.TokenHashOf(std::string(64, 'a'));
  EXPECT_TRUE(absl::IsUnauthenticated(unknown.status()));
  EXPECT_THAT(unknown.status().message(), HasSubstr("log in again"));
}

// Two controllers over one store (here: two ConsoleSessions): a session
// opened at one is known at the other; a logout at one reaches the other
// once its cached copy is older than the cache's few seconds.
TEST_F(ConsoleSessionsTest, AnotherControllerSeesSessionsAndLogouts) {
  ConsoleSessions here(store_.get(), absl::Hours(1), [this] { return now_; });
  ConsoleSessions there(store_.get(), absl::Hours(1), [this] { return now_; });
  auto opened = here.Open("bob", "bob-token");
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(there.TokenHashOf(opened->id).ok());
  ASSERT_TRUE(here.End(opened->id).ok());
  EXPECT_FALSE(here.TokenHashOf(opened->id).ok());
  now_ += absl::Seconds(6);
  EXPECT_TRUE(absl::IsUnauthenticated(there.TokenHashOf(opened->id).status()));
}

}  // namespace
}  // namespace loom::controller::console
