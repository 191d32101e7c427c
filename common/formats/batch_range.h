// Data batch ranges: what a checkpoint's manifest records as skipped
// (checkpoint_files.h) and what the engine skips (worker/engine/config.h).
#ifndef LOOM_COMMON_FORMATS_BATCH_RANGE_H_
#define LOOM_COMMON_FORMATS_BATCH_RANGE_H_

#include <cstdint>

namespace loom::engine {

// A half-open range [begin, end) of data batch indices. Data batch d is the
// global batch whose samples start at data cursor d * global_batch (see
// TokenDataset: the cursor is a global sample index in data order).
struct BatchRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const BatchRange& other) const {
    return begin == other.begin && end == other.end;
  }
  bool operator!=(const BatchRange& other) const { return !(*this == other); }
};

}  // namespace loom::engine

#endif  // LOOM_COMMON_FORMATS_BATCH_RANGE_H_
