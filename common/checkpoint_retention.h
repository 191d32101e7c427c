// The retention a job spec states, as the pruning code takes it
// (common/formats/retention.h): the rank that prunes its checkpoint
// directory, the worker that prunes the object store and the controller's
// `checkpoints gc` all read a spec through these, so they agree.
#ifndef LOOM_COMMON_CHECKPOINT_RETENTION_H_
#define LOOM_COMMON_CHECKPOINT_RETENTION_H_

#include <cstdint>

#include "common/formats/retention.h"
#include "loom/v1/job.pb.h"

namespace loom {

inline engine::RetentionPolicy ToRetentionPolicy(const loom::v1::RetentionPolicy& p,
                                                 int default_newest) {
  engine::RetentionPolicy out;
  out.all = p.all();
  out.newest = p.newest() > 0 ? p.newest() : default_newest;
  out.every = p.every();
  out.best = p.best();
  return out;
}

// The checkpoint directory's. A spec stored before retention existed has
// only checkpoint.keep (its newest N).
inline engine::RetentionPolicy LocalRetentionPolicy(const loom::v1::CheckpointSpec& c) {
  return ToRetentionPolicy(c.retention().local(), c.keep() > 0 ? c.keep() : 3);
}

// The object store's: everything unless the spec says otherwise.
inline engine::RetentionPolicy RemoteRetentionPolicy(const loom::v1::CheckpointSpec& c) {
  if (!c.retention().has_remote() || c.retention().remote().ByteSizeLong() == 0) {
    engine::RetentionPolicy all;
    all.all = true;
    return all;
  }
  return ToRetentionPolicy(c.retention().remote(), 3);
}

// The spike-rollback window retention keeps, in steps (0: no spike
// detection, no window): twice the rollback distance, because ranks run on
// for a few steps after a spike before the stop reaches them, and the
// rollback's target must survive that.
inline int64_t RollbackWindowSteps(const loom::v1::RecoverySpec& r) {
  if (r.disable_spike_detection()) return 0;
  return 2 * (r.rollback_distance() > 0 ? r.rollback_distance() : 100);
}

}  // namespace loom

#endif  // LOOM_COMMON_CHECKPOINT_RETENTION_H_
