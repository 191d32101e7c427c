#include "worker/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace loom::engine {

absl::Status ValidateLossScalerOptions(const LossScalerOptions& o) {
  auto invalid = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  for (double v : {o.initial_scale, o.min_scale, o.max_scale, o.backoff_factor, o.growth_factor}) {
    if (!std::isfinite(v)) return invalid("loss scaler options must be finite");
  }
  if (!(o.min_scale > 0)) return invalid("min_scale must be > 0, got ", o.min_scale);
  if (!(o.min_scale <= o.initial_scale && o.initial_scale <= o.max_scale)) {
    return invalid("initial_scale ", o.initial_scale, " must lie in [min_scale ", o.min_scale,
                   ", max_scale ", o.max_scale, "]");
  }
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) {
    return invalid("backoff_factor must be in (0, 1), got ", o.backoff_factor);
  }
  if (!(o.growth_factor > 1)) return invalid("growth_factor must be > 1, got ", o.growth_factor);
  if (o.growth_interval < 1) {
    return invalid("growth_interval must be >= 1, got ", o.growth_interval);
  }
  return absl::OkStatus();
}

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale) {
  const absl::Status valid = ValidateLossScalerOptions(options);
  if (!valid.ok()) {
    std::cerr << "DynamicLossScaler: " << valid << std::endl;
    std::abort();
  }
}

absl::Status DynamicLossScaler::Restore(double scale, int64_t clean_steps,
                                        int64_t overflow_steps) {
  if (!(scale >= options_.min_scale && scale <= options_.max_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss scale ", scale, " outside [",
                                                   options_.min_scale, ", ",
                                                   options_.max_scale, "]"));
  }
  if (clean_steps < 0 || clean_steps >= options_.growth_interval || overflow_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler counts out of range: clean_steps ", clean_steps, " (growth interval ",
        options_.growth_interval, "), overflow_steps ", overflow_steps));
  }
  scale_ = scale;
  clean_steps_ = clean_steps;
  overflow_steps_ = overflow_steps;
  return absl::OkStatus();
}

bool DynamicLossScaler::Update(bool grads_finite) {
  if (!grads_finite) {
    overflow_steps_ += 1;
    clean_steps_ = 0;
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    return false;
  }
  clean_steps_ += 1;
  if (clean_steps_ == options_.growth_interval) {
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
    clean_steps_ = 0;
  }
  return true;
}

}  // namespace loom::engine
