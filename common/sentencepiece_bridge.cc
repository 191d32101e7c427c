#include "common/sentencepiece_bridge.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

extern char** environ;

namespace loom::sp {
namespace {

std::string SelfDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// Spawns `argv`; its stdin/stdout are pipes when the fds are wanted, its
// stderr goes to `stderr_fd` (a pipe end, or -1 to inherit).
bool Spawn(const std::vector<std::string>& args, int* child_stdin, int* child_stdout,
           int stderr_fd, pid_t* pid, std::string* error) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if ((child_stdin && pipe2(in, O_CLOEXEC) != 0) || (child_stdout && pipe2(out, O_CLOEXEC) != 0)) {
    *error = std::string("pipe: ") + strerror(errno);
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (child_stdin) posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  if (child_stdout) posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (stderr_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stderr_fd, 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (child_stdin) close(in[0]);
  if (child_stdout) close(out[1]);
  if (rc != 0) {
    if (child_stdin) close(in[1]);
    if (child_stdout) close(out[0]);
    *error = "cannot run " + args[0] + ": " + strerror(rc) +
             " (loom-sentencepiece is built beside Loom's binaries; $LOOM_SENTENCEPIECE names "
             "another)";
    return false;
  }
  if (child_stdin) *child_stdin = in[1];
  if (child_stdout) *child_stdout = out[0];
  return true;
}

std::string ReadAllFd(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

std::string HelperPath() {
  const char* env = getenv("LOOM_SENTENCEPIECE");
  if (env != nullptr && *env != '\0') return env;
  return SelfDir() + "/loom-sentencepiece";
}

bool TrainBpe(const std::string& input, const std::string& model_prefix, int vocab_size,
              int threads, std::string* error) {
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + strerror(errno);
    return false;
  }
  pid_t pid = -1;
  const bool spawned = Spawn({HelperPath(), "train", input, model_prefix,
                              std::to_string(vocab_size), std::to_string(threads)},
                             nullptr, nullptr, err[1], &pid, error);
  close(err[1]);
  if (!spawned) {
    close(err[0]);
    return false;
  }
  const std::string messages = ReadAllFd(err[0]);
  close(err[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = messages.empty() ? "loom-sentencepiece train failed" : messages;
    while (!error->empty() && error->back() == '\n') error->pop_back();
    return false;
  }
  return true;
}

std::unique_ptr<Model> Model::Load(const std::string& path, std::string* error) {
  // A helper that died must be an error, not a SIGPIPE that kills us.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Model> m(new Model());
  if (!Spawn({HelperPath(), "serve", path}, &m->to_helper_, &m->from_helper_, -1, &m->pid_,
             error)) {
    return nullptr;
  }
  std::string line;
  if (!m->WriteAll("V\n") || !m->ReadLine(&line)) {
    *error = "loom-sentencepiece exited: " + path + " is not a SentencePiece model";
    return nullptr;
  }
  if (!line.empty() && line[0] == '!') {
    *error = line.substr(1);
    return nullptr;
  }
  m->vocab_size_ = std::atoi(line.c_str());
  if (m->vocab_size_ <= 0) {
    *error = "loom-sentencepiece: bad vocabulary size " + line;
    return nullptr;
  }
  return m;
}

Model::~Model() {
  if (to_helper_ >= 0) close(to_helper_);  // the helper exits at end of input
  if (from_helper_ >= 0) close(from_helper_);
  if (pid_ > 0) {
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

bool Model::WriteAll(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(to_helper_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool Model::ReadBytes(size_t n, std::string* out) {
  char buf[65536];
  while (buffered_.size() < n) {
    const ssize_t got = read(from_helper_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    buffered_.append(buf, static_cast<size_t>(got));
  }
  *out = buffered_.substr(0, n);
  buffered_.erase(0, n);
  return true;
}

bool Model::ReadLine(std::string* line) {
  char buf[65536];
  size_t at;
  while ((at = buffered_.find('\n')) == std::string::npos) {
    const ssize_t got = read(from_helper_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    buffered_.append(buf, static_cast<size_t>(got));
  }
  *line = buffered_.substr(0, at);
  buffered_.erase(0, at + 1);
  return true;
}

bool Model::Encode(const std::string& text, std::vector<int>* ids, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string line, body;
  if (!WriteAll("E " + std::to_string(text.size()) + "\n" + text) || !ReadLine(&line)) {
    *error = "loom-sentencepiece exited";
    return false;
  }
  if (!line.empty() && line[0] == '!') {
    *error = line.substr(1);
    return false;
  }
  const long count = std::atol(line.c_str());
  if (!ReadLine(&body)) {
    *error = "loom-sentencepiece exited";
    return false;
  }
  ids->clear();
  ids->reserve(static_cast<size_t>(count));
  std::istringstream in(body);
  int id;
  while (in >> id) ids->push_back(id);
  if (static_cast<long>(ids->size()) != count) {
    *error = "loom-sentencepiece: garbled answer";
    return false;
  }
  return true;
}

bool Model::Decode(const std::vector<int>& ids, std::string* text, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string request = "D " + std::to_string(ids.size()) + "\n";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) request += ' ';
    request += std::to_string(ids[i]);
  }
  request += '\n';
  std::string line;
  if (!WriteAll(request) || !ReadLine(&line)) {
    *error = "loom-sentencepiece exited";
    return false;
  }
  if (!line.empty() && line[0] == '!') {
    *error = line.substr(1);
    return false;
  }
  return ReadBytes(static_cast<size_t>(std::atol(line.c_str())), text) ||
         (*error = "loom-sentencepiece exited", false);
}

}  // namespace loom::sp
