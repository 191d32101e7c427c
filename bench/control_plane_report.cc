#include "bench/control_plane_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::bench {

double Percentile(std::vector<double>& sorted_values, double q) {
  if (sorted_values.empty()) return 0;
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted_values.size())));
  return sorted_values[std::min(sorted_values.size() - 1, i == 0 ? 0 : i - 1)];
}

void PrintTailBySecond(const RpcStats& a, const RpcStats& b) {
  std::map<int64_t, std::vector<double>> bins, heartbeat_bins;
  double first = std::numeric_limits<double>::infinity();
  for (const RpcStats* s : {&a, &b}) {
    for (double due : s->due_s) first = std::min(first, due);
  }
  for (const RpcStats* s : {&a, &b}) {
    for (size_t i = 0; i < s->latency_ms.size() && i < s->due_s.size(); ++i) {
      bins[static_cast<int64_t>(s->due_s[i] - first)].push_back(s->latency_ms[i]);
      if (s == &a)
        heartbeat_bins[static_cast<int64_t>(s->due_s[i] - first)].push_back(s->latency_ms[i]);
    }
  }
  if (bins.empty()) return;
  std::vector<std::pair<double, int64_t>> p99s;  // (p99, second)
  for (auto& [second, v] : bins) {
    std::sort(v.begin(), v.end());
    p99s.push_back({Percentile(v, 0.99), second});
  }
  std::vector<double> sorted;
  for (const auto& [p, second] : p99s) sorted.push_back(p);
  std::sort(sorted.begin(), sorted.end());
  const int64_t over = std::count_if(sorted.begin(), sorted.end(), [](double p) { return p > 50; });
  std::sort(p99s.rbegin(), p99s.rend());
  std::vector<std::string> worst;
  for (size_t i = 0; i < p99s.size() && i < 3; ++i) {
    std::vector<double>& h = heartbeat_bins[p99s[i].second];
    std::sort(h.begin(), h.end());
    worst.push_back(absl::StrFormat("%.1f ms at +%d s (heartbeats %.1f)", p99s[i].first,
                                    p99s[i].second, Percentile(h, 0.99)));
  }
  std::cout << absl::StrFormat(
      "tail by second: %d of %d seconds had a p99 over 50 ms; per-second p99 median %.1f ms; "
      "worst %s\n",
      over, sorted.size(), Percentile(sorted, 0.5), absl::StrJoin(worst, ", "));
}

}  // namespace loom::bench
