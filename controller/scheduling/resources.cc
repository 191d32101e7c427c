#include "controller/scheduling/resources.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::scheduling {
namespace {

std::string Amount(int64_t n) { return n >= kUnlimited ? "unlimited" : absl::StrCat(n); }

}  // namespace

Resources Saturate(const Resources& r) {
  return {std::clamp<int64_t>(r.slots, 0, kUnlimited), std::clamp<int64_t>(r.gpus, 0, kUnlimited)};
}

std::string ToString(const Resources& r, bool always_gpus) {
  std::string out = absl::StrCat(Amount(r.slots), " slot(s)");
  if (always_gpus || (r.gpus != 0 && r.gpus < kUnlimited))
    absl::StrAppend(&out, ", ", Amount(r.gpus), " GPU(s)");
  return out;
}

}  // namespace loom::scheduling
