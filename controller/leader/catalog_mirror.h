// A standby's warm copy of the job catalog: every stored job,
// parsed, kept up to date by reading only the jobs written since the last
// look (Store::LoadJobsChangedSince), so that taking over reads what the
// leader wrote in the last second or so instead of the whole catalog.
//
// Refresh after taking the lease, before TakeAll(): the old leader can commit
// nothing after that (its writes are fenced), so the copy is then complete.
// Thread-safe (one mutex): the controller's ticker refreshes it while
// standing by, and the elector's thread refreshes it and takes it over.
#ifndef LOOM_CONTROLLER_LEADER_CATALOG_MIRROR_H_
#define LOOM_CONTROLLER_LEADER_CATALOG_MIRROR_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/store/store.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

class CatalogMirror {
 public:
  // `store` must outlive this.
  explicit CatalogMirror(Store* store) : store_(store) {}

  // Reads the jobs written since the last Refresh (every job the first
  // time). Returns how many it read.
  absl::StatusOr<size_t> Refresh();
  // Every job, oldest first (as Store::LoadJobs orders them), moved out:
  // the mirror is empty afterwards.
  std::vector<loom::v1::Job> TakeAll();
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.size();
  }

 private:
  Store* const store_;
  mutable std::mutex mu_;
  int64_t cursor_ = -1;                        // the newest change read; mu_
  std::map<std::string, loom::v1::Job> jobs_;  // by id; mu_
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_LEADER_CATALOG_MIRROR_H_
