#include "controller/admission/path_policy.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace loom::controller {
namespace {

namespace fs = std::filesystem;

bool HasWildcard(const std::string& component) {
  return component.find_first_of("*?[") != std::string::npos;
}

// Symlinks of the existing prefix resolved, the rest normalised.
fs::path Resolve(const fs::path& p) {
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) resolved = p.lexically_normal();
  // weakly_canonical keeps a trailing separator of "dir/"; drop it.
  if (!resolved.has_filename() && resolved.has_parent_path() && resolved != resolved.root_path()) {
    resolved = resolved.parent_path();
  }
  return resolved;
}

}  // namespace

bool PathIsUnder(const std::string& path_text, const std::string& root_text) {
  const fs::path path(path_text), root(root_text);
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) break;  // a trailing separator ends the root
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

std::vector<std::string> SplitRoots(absl::string_view flag) {
  std::vector<std::string> roots;
  for (absl::string_view item : absl::StrSplit(flag, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (!item.empty()) roots.emplace_back(item);
  }
  return roots;
}

absl::StatusOr<std::string> ConfinePath(absl::string_view field, const std::string& path,
                                        const std::vector<std::string>& roots) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", path, "\" must be an absolute path (loomctl makes a spec file's "
        "relative paths absolute against the file's directory)"));
  }
  // The part without wildcards decides where the path is.
  fs::path fixed;
  fs::path rest;
  bool wild = false;
  for (const fs::path& component : fs::path(path)) {
    const std::string c = component.string();
    if (!wild && HasWildcard(c)) wild = true;
    if (wild) {
      if (c == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": \"", path, "\" has \"..\" after a wildcard"));
      }
      rest /= component;
    } else {
      fixed /= component;
    }
  }
  const fs::path resolved = Resolve(fixed);
  for (const std::string& root : roots) {
    if (PathIsUnder(resolved.string(), Resolve(root).string())) {
      return (rest.empty() ? resolved : resolved / rest).string();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", path,
      resolved.string() == path ? "" : absl::StrCat(" (", resolved.string(), ")"),
      " is outside the controller's allowed roots (", absl::StrJoin(roots, ", "),
      "); put it under one, or start the controller with that root"));
}

absl::Status ConfineJobPaths(const PathRoots& roots, loom::v1::JobSpec* spec) {
  if (!roots.data.empty()) {
    auto* data = spec->mutable_data();
    for (int i = 0; i < data->train_size(); ++i) {
      absl::StatusOr<std::string> p =
          ConfinePath(absl::StrCat("data.train[", i, "]"), data->train(i), roots.data);
      if (!p.ok()) return p.status();
      data->set_train(i, *p);
    }
    for (int i = 0; i < data->validation_size(); ++i) {
      absl::StatusOr<std::string> p = ConfinePath(absl::StrCat("data.validation[", i, "]"),
                                                  data->validation(i), roots.data);
      if (!p.ok()) return p.status();
      data->set_validation(i, *p);
    }
  }
  if (!spec->checkpoint().dir().empty() && !roots.checkpoint.empty()) {
    absl::StatusOr<std::string> p =
        ConfinePath("checkpoint.dir", spec->checkpoint().dir(), roots.checkpoint);
    if (!p.ok()) return p.status();
    for (const std::string& root : roots.checkpoint) {
      if (fs::path(*p) == Resolve(root)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint.dir: ", spec->checkpoint().dir(),
            " is a checkpoint root itself; name a directory beneath it (or leave checkpoint.dir "
            "out: the job then gets ", root, "/<job id>)"));
      }
    }
    spec->mutable_checkpoint()->set_dir(*p);
  }
  // A checkpoint in an object store is no path of this machine's.
  if (!spec->init_from().path().empty() && !roots.checkpoint.empty() &&
      !absl::StartsWith(spec->init_from().path(), "s3://")) {
    absl::StatusOr<std::string> p =
        ConfinePath("init_from.path", spec->init_from().path(), roots.checkpoint);
    if (!p.ok()) return p.status();
    spec->mutable_init_from()->set_path(*p);
  }
  return absl::OkStatus();
}

}  // namespace loom::controller
