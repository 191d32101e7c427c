// Test helper: sets an environment variable for one scope and restores the
// previous value (or its absence) on exit. Not thread-safe (setenv is not);
// for single-threaded tests only.
#ifndef LOOM_WORKER_TELEMETRY_SCOPED_ENV_H_
#define LOOM_WORKER_TELEMETRY_SCOPED_ENV_H_

#include <cstdlib>
#include <string>

namespace loom::telemetry {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_SCOPED_ENV_H_
