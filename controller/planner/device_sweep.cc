#include "controller/planner/device_sweep.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/planner/planner.h"

namespace loom::planner {

namespace {

// 131072 -> "131,072".
std::string Thousands(int value) {
  std::string digits = absl::StrCat(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string Summary(const DeviceSweep& sweep) {
  const DeviceCountResult& pick = sweep.counts[sweep.recommended];
  const DeviceCountResult& all = sweep.counts.back();
  if (sweep.recommended + 1 == static_cast<int>(sweep.counts.size())) {
    return absl::StrCat("all ", Thousands(all.devices), " devices pay");
  }
  const double pick_tps = pick.best.step.tokens_per_second;
  std::string text = absl::StrCat(Thousands(pick.devices), " of ", Thousands(all.devices),
                                  " devices: ");
  if (!all.fits) {
    return absl::StrCat(text, absl::StrFormat("%.1f%% MFU; the full cluster is faster only "
                                              "where a layout fits on it",
                                              pick.best.step.mfu * 100));
  }
  const double all_tps = all.best.step.tokens_per_second;
  const double device_hours_ratio =
      (pick.devices / pick_tps) / (static_cast<double>(all.devices) / all_tps);
  absl::StrAppend(&text, absl::StrFormat("%.2fx the time to train at %.1f%% MFU instead of "
                                         "%.1f%%, %.0f%% fewer device-hours",
                                         all_tps / pick_tps, pick.best.step.mfu * 100,
                                         all.best.step.mfu * 100,
                                         (1 - device_hours_ratio) * 100));
  return text;
}

}  // namespace

std::vector<int> SweepDeviceCounts(const ClusterTopology& t) {
  std::vector<int> counts;
  for (int d = 1; d < t.devices_per_node; d *= 2) counts.push_back(d);
  for (int k = 1; k <= t.nodes; k *= 2) {
    // Above one rack only whole racks, so that ValidateTopology's rule
    // (racks of equal size) holds and the spine is modelled as it is.
    if (t.nodes_per_rack > 0 && k > t.nodes_per_rack && k % t.nodes_per_rack != 0) continue;
    counts.push_back(k * t.devices_per_node);
  }
  if (counts.empty() || counts.back() != t.total_devices()) counts.push_back(t.total_devices());
  return counts;
}

ClusterTopology SubTopology(const ClusterTopology& topology, int devices) {
  ClusterTopology sub = topology;
  if (devices < topology.devices_per_node) {
    sub.nodes = 1;
    sub.devices_per_node = devices;
  } else {
    sub.nodes = devices / topology.devices_per_node;
  }
  // Within one rack there is no spine to cross.
  if (sub.nodes_per_rack > 0 && sub.nodes <= sub.nodes_per_rack) sub.nodes_per_rack = 0;
  return sub;
}

absl::StatusOr<DeviceSweep> SweepDevices(const PlanRequest& request,
                                         const DeviceSweepOptions& options) {
  if (!(options.max_cost_ratio >= 1)) {
    return absl::InvalidArgumentError("options.sweep.max_cost_ratio: must be >= 1");
  }
  if (request.options.dp > 0) {
    return absl::InvalidArgumentError(
        "options.dp: a pinned data-parallel degree fixes the device count; nothing to sweep");
  }
  DeviceSweep sweep;
  for (int devices : SweepDeviceCounts(request.topology)) {
    PlanRequest sub = request;
    sub.topology = SubTopology(request.topology, devices);
    sub.options.top_k = 1;
    sub.options.sweep_devices = false;
    DeviceCountResult row;
    row.devices = devices;
    row.nodes = sub.topology.nodes;
    row.devices_per_node = sub.topology.devices_per_node;
    absl::StatusOr<Plan> plan = MakePlan(sub);
    if (plan.ok()) {
      row.fits = true;
      row.best = plan->best;
    } else if (plan.status().code() == absl::StatusCode::kFailedPrecondition) {
      row.reason = std::string(plan.status().message());
    } else {
      return plan.status();
    }
    // Counts below the smallest that fits say nothing the first row does not.
    if (!row.fits && sweep.counts.empty()) continue;
    sweep.counts.push_back(std::move(row));
  }
  if (sweep.counts.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no layout fits on any of up to ", request.topology.total_devices(), " devices"));
  }
  // Device-seconds per token: the same run's device-hours up to the token
  // budget, which every count shares.
  auto device_seconds_per_token = [](const DeviceCountResult& row) {
    return row.devices / row.best.step.tokens_per_second;
  };
  for (int i = 0; i < static_cast<int>(sweep.counts.size()); ++i) {
    const DeviceCountResult& row = sweep.counts[i];
    if (!row.fits) continue;
    if (sweep.fastest < 0 || row.best.step.tokens_per_second >
                                 sweep.counts[sweep.fastest].best.step.tokens_per_second) {
      sweep.fastest = i;
    }
    if (sweep.cheapest < 0 ||
        device_seconds_per_token(row) < device_seconds_per_token(sweep.counts[sweep.cheapest])) {
      sweep.cheapest = i;
    }
  }
  const double budget =
      options.max_cost_ratio * device_seconds_per_token(sweep.counts[sweep.cheapest]);
  for (int i = 0; i < static_cast<int>(sweep.counts.size()); ++i) {
    const DeviceCountResult& row = sweep.counts[i];
    if (!row.fits || device_seconds_per_token(row) > budget * (1 + 1e-12)) continue;
    // Ascending counts: only strictly faster replaces, so ties keep fewer devices.
    if (sweep.recommended < 0 || row.best.step.tokens_per_second >
                                     sweep.counts[sweep.recommended].best.step.tokens_per_second) {
      sweep.recommended = i;
    }
  }
  sweep.rule = absl::StrFormat(
      "the fastest device count whose device-hours are at most %gx the cheapest count's "
      "(its MFU at least 1/%g of the best)",
      options.max_cost_ratio, options.max_cost_ratio);
  sweep.summary = Summary(sweep);
  return sweep;
}

}  // namespace loom::planner
