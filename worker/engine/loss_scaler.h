// Dynamic loss scaling for fp16 training (mixed precision;
// Micikevicius et al. 2018, "Mixed Precision Training", sec. 3.2; the same
// policy as torch.cuda.amp.GradScaler).
//
// fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. Multiplying
// the loss by a large scale S before backward shifts the gradients into
// range; the optimizer divides them by S again (AdamWStepOptions::inv_scale).
// Too large an S overflows to inf: the step is then skipped (no parameter
// changes) and S is halved. After growth_interval consecutive clean steps S
// is doubled, so it tracks the largest scale that does not overflow.
//
// Pure arithmetic, no LibTorch. Thread-compatible.
#ifndef LOOM_WORKER_ENGINE_LOSS_SCALER_H_
#define LOOM_WORKER_ENGINE_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace loom::engine {

struct LossScalerOptions {
  double initial_scale = 65536;  // 2^16, GradScaler's default
  double backoff_factor = 0.5;   // S *= this on a step with inf/NaN gradients
  double growth_factor = 2;      // S *= this after growth_interval clean steps
  int64_t growth_interval = 2000;
  // S never falls below min_scale (a scale that keeps shrinking means the
  // model diverged, not that the gradients are too large) nor rises above
  // max_scale (2^24: beyond that every fp16 gradient of a sane loss would
  // overflow anyway).
  double min_scale = 1;
  double max_scale = 16777216;
};

// OK, or INVALID_ARGUMENT naming the option: scales must be finite with
// 0 < min_scale <= initial_scale <= max_scale, 0 < backoff_factor < 1,
// growth_factor > 1, growth_interval >= 1.
absl::Status ValidateLossScalerOptions(const LossScalerOptions& options);

class DynamicLossScaler {
 public:
  // `options` must pass ValidateLossScalerOptions (CHECK-fails otherwise).
  explicit DynamicLossScaler(const LossScalerOptions& options = {});

  // Multiply the loss by scale() before backward; pass inv_scale() to the
  // optimizer step.
  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }

  // Call once per optimizer step, after it, with whether every gradient was
  // finite (AdamWStepResult::applied: the fused step skips a non-finite
  // one itself). Returns `grads_finite`: whether the step counted.
  bool Update(bool grads_finite);

  // Consecutive clean steps since the last change of scale.
  int64_t clean_steps() const { return clean_steps_; }
  // Steps skipped for inf/NaN gradients, in total.
  int64_t overflow_steps() const { return overflow_steps_; }

  // Continues from a state saved with a checkpoint (scale(), clean_steps(),
  // overflow_steps()). InvalidArgument, and no change, when the scale is
  // outside [min_scale, max_scale] or a count is negative or clean_steps is
  // not below growth_interval.
  absl::Status Restore(double scale, int64_t clean_steps, int64_t overflow_steps);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;
  int64_t overflow_steps_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_LOSS_SCALER_H_
