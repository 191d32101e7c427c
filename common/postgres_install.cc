#include "common/postgres_install.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace loom {

std::string PostgresBinDir() {
  if (const char* env = std::getenv("LOOM_PG_BINDIR"); env != nullptr && *env != '\0') return env;
  std::string best;
  int best_version = -1;
  if (DIR* d = opendir("/usr/lib/postgresql")) {
    while (dirent* e = readdir(d)) {
      const int v = std::atoi(e->d_name);
      const std::string bin = absl::StrCat("/usr/lib/postgresql/", e->d_name, "/bin");
      if (v > best_version && access((bin + "/postgres").c_str(), X_OK) == 0) {
        best_version = v;
        best = bin;
      }
    }
    closedir(d);
  }
  return best;
}

}  // namespace loom
