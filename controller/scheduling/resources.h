// What a job asks for and a queue is allowed: slots and GPUs, as whole
// numbers. One type for quotas, usage, free capacity and demands, so the
// scheduling code never adds slots to GPUs by mistake.
//
// kUnlimited stands for "no limit" (a queue without a nominal quota, a
// borrowing limit not given). It is far below INT64_MAX so that sums of a
// few thousand unlimited values do not overflow; Saturate() clamps back.
#ifndef LOOM_CONTROLLER_SCHEDULING_RESOURCES_H_
#define LOOM_CONTROLLER_SCHEDULING_RESOURCES_H_

#include <cstdint>
#include <string>

namespace loom::scheduling {

inline constexpr int64_t kUnlimited = int64_t{1} << 50;

struct Resources {
  int64_t slots = 0;  // rank slots (one rank runs in one slot)
  int64_t gpus = 0;   // GPUs (a GPU rank holds one slot and one GPU)

  static Resources Unlimited() { return {kUnlimited, kUnlimited}; }

  Resources& operator+=(const Resources& o) {
    slots += o.slots;
    gpus += o.gpus;
    return *this;
  }
  Resources& operator-=(const Resources& o) {
    slots -= o.slots;
    gpus -= o.gpus;
    return *this;
  }
  friend Resources operator+(Resources a, const Resources& b) { return a += b; }
  friend Resources operator-(Resources a, const Resources& b) { return a -= b; }
  friend bool operator==(const Resources& a, const Resources& b) {
    return a.slots == b.slots && a.gpus == b.gpus;
  }
  friend bool operator!=(const Resources& a, const Resources& b) { return !(a == b); }

  // Every component <= the limit's.
  bool FitsIn(const Resources& limit) const { return slots <= limit.slots && gpus <= limit.gpus; }
  bool IsZero() const { return slots == 0 && gpus == 0; }
  bool AnyNegative() const { return slots < 0 || gpus < 0; }
};

// Componentwise min / max. Inline: the scheduling cycle calls them per
// worker, many times a cycle.
inline Resources Min(const Resources& a, const Resources& b) {
  return {a.slots < b.slots ? a.slots : b.slots, a.gpus < b.gpus ? a.gpus : b.gpus};
}
inline Resources Max(const Resources& a, const Resources& b) {
  return {a.slots < b.slots ? b.slots : a.slots, a.gpus < b.gpus ? b.gpus : a.gpus};
}
// Each component clamped to [0, kUnlimited].
Resources Saturate(const Resources& r);

// "4 slot(s)", "4 slot(s), 2 GPU(s)", "unlimited slot(s)". GPUs are named
// only when non-zero and limited (or when `always_gpus`).
std::string ToString(const Resources& r, bool always_gpus = false);

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_RESOURCES_H_
