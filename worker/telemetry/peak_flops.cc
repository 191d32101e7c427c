#include "worker/telemetry/peak_flops.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace loom::telemetry {

PeakFlops::PeakFlops(double peak, Source source, std::string what)
    : peak_(peak), initial_(peak), source_(source), what_(std::move(what)) {}

double PeakFlops::Observe(double achieved) {
  if (!(peak_ > 0) || !(achieved > 0)) return 0;
  if (achieved > peak_) {
    ++exceeded_;
    if (source_ == Source::kCalibrated) peak_ = achieved;
    return 1.0;
  }
  return achieved / peak_;
}

std::string PeakFlops::Describe() const {
  if (exceeded_ == 0) return what_;
  if (source_ == Source::kCalibrated) {
    return absl::StrFormat("%s, raised %.0f%% (to %.4g FLOP/s) by %d step(s) that ran faster",
                           what_, 100.0 * (peak_ / initial_ - 1.0), peak_, exceeded_);
  }
  return absl::StrFormat(
      "%s; %d step(s) exceeded it (reported as 100%%): check the board name and the model's "
      "FLOP count",
      what_, exceeded_);
}

}  // namespace loom::telemetry
