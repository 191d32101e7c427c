#include "controller/leader/catalog_mirror.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace loom::controller {

absl::StatusOr<size_t> CatalogMirror::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t newest = cursor_;
  absl::StatusOr<std::vector<loom::v1::Job>> changed =
      store_->LoadJobsChangedSince(cursor_, &newest);
  if (!changed.ok()) return changed.status();
  for (loom::v1::Job& job : *changed) {
    std::string id = job.id();
    jobs_[std::move(id)] = std::move(job);
  }
  cursor_ = newest;
  return changed->size();
}

std::vector<loom::v1::Job> CatalogMirror::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<loom::v1::Job> out;
  out.reserve(jobs_.size());
  for (auto& [id, job] : jobs_) out.push_back(std::move(job));
  jobs_.clear();
  std::sort(out.begin(), out.end(), [](const loom::v1::Job& a, const loom::v1::Job& b) {
    return std::make_tuple(a.created_unix_ms(), Store::JobSequence(a.id())) <
           std::make_tuple(b.created_unix_ms(), Store::JobSequence(b.id()));
  });
  return out;
}

}  // namespace loom::controller
