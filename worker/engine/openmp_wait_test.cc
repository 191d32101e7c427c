#include "worker/engine/openmp_wait.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace loom::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs the helper with exactly `env` (plus OMP_DISPLAY_ENV=VERBOSE and two
// threads), returns its stdout and stderr together.
std::string RunHelper(std::vector<std::string> env) {
  env.push_back("OMP_DISPLAY_ENV=VERBOSE");
  env.push_back("OMP_NUM_THREADS=2");
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string helper = LOOM_OPENMP_WAIT_HELPER;
  char* argv[] = {helper.data(), const_cast<char*>("an-argument"), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv, envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  return text;
}

std::vector<std::string> Lines(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix)) out.emplace_back(line);
  }
  return out;
}

TEST(OpenMpWaitTest, UnsetPolicyReexecutesTheSameProcessWithAShortSpin) {
  const std::string text = RunHelper({});
  // Two images, one pid: the first with no policy, the second with the
  // training spin count.
  const std::vector<std::string> starts = Lines(text, "start ");
  ASSERT_EQ(starts.size(), 2u) << text;
  EXPECT_THAT(starts[0], HasSubstr("policy=(unset)"));
  EXPECT_THAT(starts[1], HasSubstr("spin=30000"));
  EXPECT_EQ(starts[0].substr(0, starts[0].find(' ', 6)),
            starts[1].substr(0, starts[1].find(' ', 6)))
      << "exec keeps the pid";
  EXPECT_THAT(text, HasSubstr("status=OK"));
  EXPECT_THAT(text, HasSubstr("described=GOMP_SPINCOUNT=30000 (set by Loom)"));
  // What the OpenMP runtime itself uses. It reports when it is loaded, so
  // once per image: the default spin count before the exec, Loom's after.
  const size_t first_start = text.find("start ");
  ASSERT_NE(first_start, std::string::npos);
  const std::string before = text.substr(0, first_start), after = text.substr(first_start);
  EXPECT_THAT(before, HasSubstr("GOMP_SPINCOUNT = '300000'"));
  EXPECT_THAT(after, HasSubstr("GOMP_SPINCOUNT = '30000'"));
  EXPECT_THAT(after, Not(HasSubstr("GOMP_SPINCOUNT = '300000'")));
  EXPECT_THAT(text, HasSubstr("threads=2"));
}

TEST(OpenMpWaitTest, ThePolicyTheUserChoseIsKept) {
  const std::string active = RunHelper({"OMP_WAIT_POLICY=ACTIVE"});
  EXPECT_EQ(Lines(active, "start ").size(), 1u) << active;
  EXPECT_THAT(active, HasSubstr("described=OMP_WAIT_POLICY=ACTIVE (from the environment)"));
  EXPECT_THAT(active, Not(HasSubstr("GOMP_SPINCOUNT = '0'")));

  const std::string spin = RunHelper({"GOMP_SPINCOUNT=1000"});
  EXPECT_EQ(Lines(spin, "start ").size(), 1u) << spin;
  EXPECT_THAT(spin, HasSubstr("described=GOMP_SPINCOUNT=1000 (from the environment)"));
  EXPECT_THAT(spin, HasSubstr("GOMP_SPINCOUNT = '1000'"));
}

TEST(OpenMpWaitTest, AnySpellingOfAPolicyCountsAsChosen) {
  const std::string text = RunHelper({"OMP_WAIT_POLICY=passive"});
  EXPECT_EQ(Lines(text, "start ").size(), 1u) << text;
  EXPECT_THAT(text, HasSubstr("described=OMP_WAIT_POLICY=passive (from the environment)"));
  EXPECT_THAT(text, HasSubstr("GOMP_SPINCOUNT = '0'"));
}

}  // namespace
}  // namespace loom::engine
