#include "controller/checkpoint_verifier.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace loom::controller {

absl::StatusOr<CheckpointVerifier::Outcome> ParseVerifyLine(const std::string& line,
                                                            const std::string& checkpoint_path) {
  const std::vector<std::string> fields =
      absl::StrSplit(absl::StripSuffix(line, "\n"), absl::MaxSplits('\t', 4));
  CheckpointVerifier::Outcome outcome;
  if (fields.size() == 2 && fields[0] == "ok" && fields[1] == checkpoint_path) {
    outcome.ok = true;
    return outcome;
  }
  if (fields.size() == 5 && fields[0] == "corrupt" && fields[1] == checkpoint_path &&
      !fields[3].empty()) {
    outcome.file = fields[2];
    outcome.check = fields[3];
    outcome.message = fields[4];
    return outcome;
  }
  return absl::InternalError(absl::StrCat("loom-ckpt verify said \"", line, "\" about ",
                                          checkpoint_path));
}

absl::StatusOr<CheckpointVerifier::Outcome> ToolCheckpointVerifier::Verify(
    const std::string& checkpoint_path) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::vector<char*> argv = {const_cast<char*>(tool_.c_str()), const_cast<char*>("verify"),
                             const_cast<char*>(checkpoint_path.c_str()), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, tool_.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    return absl::InternalError(absl::StrCat("cannot run ", tool_, ": ", std::strerror(spawned)));
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < (1 << 20)) text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wstatus) || (WEXITSTATUS(wstatus) != 0 && WEXITSTATUS(wstatus) != 1)) {
    return absl::InternalError(absl::StrCat(
        tool_, " verify ", checkpoint_path, " ",
        WIFEXITED(wstatus) ? absl::StrCat("exited with code ", WEXITSTATUS(wstatus))
                           : absl::StrCat("was killed by signal ", WTERMSIG(wstatus))));
  }
  return ParseVerifyLine(text, checkpoint_path);
}

}  // namespace loom::controller
