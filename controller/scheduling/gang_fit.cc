#include "controller/scheduling/gang_fit.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace loom::scheduling {

std::optional<std::vector<int>> FitGang(const GangDemand& gang,
                                        const std::vector<Resources>& free) {
  const int n = static_cast<int>(gang.per_worker.size());
  if (n == 0 || n > static_cast<int>(free.size())) return std::nullopt;
  // Quick refusal on the totals: most calls in a full cluster end here.
  Resources total_free;
  for (const Resources& f : free) total_free += Max(f, Resources{});
  if (!gang.Total().FitsIn(total_free)) return std::nullopt;

  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Resources& x = gang.per_worker[a];
    const Resources& y = gang.per_worker[b];
    return x.slots != y.slots ? x.slots > y.slots : x.gpus > y.gpus;
  });
  std::vector<bool> used(free.size(), false);
  std::vector<int> at(n, -1);
  for (int i : order) {
    const Resources& need = gang.per_worker[i];
    int best = -1;
    for (int w = 0; w < static_cast<int>(free.size()); ++w) {
      if (used[w] || !need.FitsIn(free[w])) continue;
      if (best < 0) {
        best = w;
        continue;
      }
      const Resources left = free[w] - need, best_left = free[best] - need;
      if (left.slots != best_left.slots ? left.slots < best_left.slots
                                        : left.gpus < best_left.gpus) {
        best = w;
      }
    }
    if (best < 0) return std::nullopt;
    used[best] = true;
    at[i] = best;
  }
  return at;
}

std::string DescribeShortage(const GangDemand& gang, const std::vector<Resources>& free) {
  Resources largest;
  bool even = true;
  for (const Resources& r : gang.per_worker) {
    if (r != gang.per_worker.front()) even = false;
    largest = Max(largest, r);
  }
  int with_room = 0;
  Resources total_free;
  for (const Resources& f : free) {
    if (largest.FitsIn(f)) ++with_room;
    total_free += Max(f, Resources{});
  }
  return absl::StrCat("needs ", gang.per_worker.size(), " worker(s) with ", ToString(largest),
                      even ? " each" : " on the largest share", "; ", with_room, " of ",
                      free.size(), " worker(s) have room (", ToString(total_free), " free in all)");
}

}  // namespace loom::scheduling
