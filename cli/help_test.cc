#include "cli/help.h"

#include <cstdio>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(HelpTest, EveryCommandHasASynopsisASummaryAndDetails) {
  std::set<std::string> names;
  for (const CommandHelp& c : Commands()) {
    EXPECT_TRUE(names.insert(c.name).second) << c.name << " is listed twice";
    ASSERT_FALSE(c.synopsis.empty()) << c.name;
    for (const std::string& s : c.synopsis) EXPECT_THAT(s, StartsWith(c.name)) << c.name;
    EXPECT_FALSE(c.summary.empty()) << c.name;
    EXPECT_FALSE(c.details.empty()) << c.name;
    EXPECT_EQ(FindCommand(c.name), &c);
  }
  EXPECT_EQ(FindCommand("frobnicate"), nullptr);
}

// Every flag a synopsis shows is one completion offers, and the other way
// round every flag completion offers is documented in the synopsis or the
// details.
TEST(HelpTest, SynopsisFlagsAndCompletionFlagsAgree) {
  for (const CommandHelp& c : Commands()) {
    const std::set<std::string> flags(c.flags.begin(), c.flags.end());
    for (const std::string& s : c.synopsis) {
      for (absl::string_view word : absl::StrSplit(s, absl::ByAnyChar(" []|"), absl::SkipEmpty())) {
        if (!absl::StartsWith(word, "-")) continue;
        word = absl::StripSuffix(word, "...");
        EXPECT_EQ(flags.count(std::string(word)), 1u) << c.name << ": " << word << " of " << s;
      }
    }
    for (const std::string& f : c.flags) {
      bool documented = absl::StrContains(c.details, f);
      for (const std::string& s : c.synopsis) documented = documented || absl::StrContains(s, f);
      EXPECT_TRUE(documented) << c.name << ": " << f << " is offered but not documented";
    }
  }
}

TEST(HelpTest, MainUsageListsEveryCommandAndTheGlobalFlags) {
  const std::string usage = MainUsage();
  EXPECT_THAT(usage, StartsWith("usage: loomctl [global flags] COMMAND [args]"));
  for (const CommandHelp& c : Commands()) EXPECT_THAT(usage, HasSubstr("  " + c.name + " "));
  for (const std::string& f : GlobalFlags()) {
    if (f != "--help") EXPECT_THAT(usage, HasSubstr(f));
  }
}

TEST(HelpTest, CommandUsageStartsWithItsSynopsis) {
  const CommandHelp* users = FindCommand("users");
  ASSERT_NE(users, nullptr);
  const std::string text = CommandUsage(*users);
  EXPECT_THAT(text, StartsWith("usage: loomctl users add NAME"));
  EXPECT_THAT(text, HasSubstr("\n       loomctl users remove NAME"));
  EXPECT_THAT(text, HasSubstr(users->details));
}

TEST(HelpTest, WantsHelp) {
  EXPECT_TRUE(WantsHelp({"--help"}));
  EXPECT_TRUE(WantsHelp({"up", "-h"}));
  EXPECT_TRUE(WantsHelp({"help"}));
  EXPECT_FALSE(WantsHelp({}));
  EXPECT_FALSE(WantsHelp({"job-1", "--reason", "helpful"}));
}

TEST(HelpTest, CompletionScriptIsValidBash) {
  const std::string path = ::testing::TempDir() + "/loomctl_completion.bash";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  const std::string script = BashCompletion();
  fwrite(script.data(), 1, script.size(), f);
  fclose(f);
  EXPECT_EQ(system(("bash -n " + path).c_str()), 0) << script;
  for (const CommandHelp& c : Commands()) EXPECT_THAT(script, HasSubstr(c.name));
  for (const char* hole : {"@COMMANDS@", "@GLOBALS@", "@SUBS@", "@FLAGS@", "@POSITIONAL@"}) {
    EXPECT_THAT(script, Not(HasSubstr(hole)));
  }
}

}  // namespace
}  // namespace loom::cli
