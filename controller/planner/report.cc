#include "controller/planner/report.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::planner {

namespace {

constexpr double kGB = 1e9;

// 1234567 -> "1,234,567".
std::string Thousands(double value) {
  std::string digits = absl::StrFormat("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return value < 0 ? "-" + out : out;
}

std::string Seconds(double s) {
  if (s >= 86400 * 2) return absl::StrFormat("%.1f days", s / 86400);
  if (s >= 7200) return absl::StrFormat("%.1f h", s / 3600);
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.1f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

std::string Gb(double bytes) { return absl::StrFormat("%.1f", bytes / kGB); }
std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", fraction * 100); }

std::string ParamsShort(double params) {
  if (params >= 1e12) return absl::StrFormat("%.2fT", params / 1e12);
  if (params >= 1e9) return absl::StrFormat("%.1fB", params / 1e9);
  return absl::StrFormat("%.1fM", params / 1e6);
}

// Numbers, percentages, money and "-" read best right-aligned.
bool LooksNumeric(const std::string& cell) {
  if (cell.empty() || cell == "-") return true;
  const char c = cell[0];
  return (c >= '0' && c <= '9') || c == '+' || c == '$' || (c == '-' && cell.size() > 1);
}

// Plain-text table. A column is right-aligned when every body cell in it
// looks numeric, left-aligned otherwise.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render(const std::string& indent = "  ") const {
    std::vector<size_t> width;
    std::vector<bool> right;
    for (size_t r = 0; r < rows_.size(); ++r) {
      const auto& row = rows_[r];
      width.resize(std::max(width.size(), row.size()), 0);
      right.resize(width.size(), true);
      for (size_t c = 0; c < row.size(); ++c) {
        width[c] = std::max(width[c], row[c].size());
        if (r > 0 && !LooksNumeric(row[c])) right[c] = false;
      }
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < row.size(); ++c) {
        const std::string pad(width[c] - row[c].size(), ' ');
        if (c > 0) line += "  ";
        line += right[c] ? pad + row[c] : row[c] + pad;
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// The step-time component that grew most from `a` to `b`.
std::string LargestIncrease(const TimeBreakdown& a, const TimeBreakdown& b) {
  const std::pair<const char*, double> deltas[] = {
      {"compute", (b.compute - b.recompute) - (a.compute - a.recompute)},
      {"recompute", b.recompute - a.recompute},
      {"tensor-parallel all-reduces", b.tensor_parallel_comm - a.tensor_parallel_comm},
      {"pipeline sends", b.pipeline_p2p - a.pipeline_p2p},
      {"pipeline bubble", b.pipeline_bubble - a.pipeline_bubble},
      {"data-parallel communication", b.data_parallel_exposed - a.data_parallel_exposed},
      {"optimizer step", b.optimizer - a.optimizer},
  };
  const auto* best = std::max_element(std::begin(deltas), std::end(deltas),
                                      [](const auto& x, const auto& y) { return x.second < y.second; });
  return best->second > 0 ? best->first : "nothing in particular";
}

std::string Slower(const LayoutEvaluation& best, const LayoutEvaluation& other) {
  const double ratio = other.step.step_seconds / best.step.step_seconds - 1.0;
  return absl::StrFormat("%.1f%% slower (mostly %s)", ratio * 100,
                         LargestIncrease(best.time, other.time));
}

std::string Shape(const Layout& l) { return absl::StrCat("tp ", l.tp, " x pp ", l.pp, " x dp ", l.dp); }

void AppendHeader(const PlanRequest& r, std::string* out) {
  const ParameterCount params = CountParameters(r.model);
  const ClusterTopology& t = r.topology;
  const TrainingSpec& tr = r.training;
  absl::StrAppend(out, "Model     ", r.model.name.empty() ? "" : r.model.name + ", ",
                  ParamsShort(static_cast<double>(params.total)), " parameters: ",
                  r.model.n_layer, " layers, d_model ", r.model.d_model, ", ", r.model.n_head,
                  " heads");
  if (KvHeads(r.model) != r.model.n_head) absl::StrAppend(out, " (", KvHeads(r.model), " KV)");
  absl::StrAppend(out, ", MLP ", FfnHidden(r.model), ", vocab ", r.model.vocab_size, ", seq ",
                  r.model.seq_len, "\n");
  absl::StrAppend(out, "Training  global batch ", tr.global_batch_sequences, " sequences (",
                  Thousands(static_cast<double>(tr.global_batch_sequences * r.model.seq_len)),
                  " tokens), ", PrecisionName(tr.precision), ", ", OptimizerName(tr.optimizer),
                  ", ", Thousands(BytesPerParam(tr).total()), " bytes/param of state\n");
  absl::StrAppend(out, "Cluster   ", t.nodes, " nodes x ", t.devices_per_node, " ", t.device.name,
                  " (", t.total_devices(), " devices, ", absl::StrFormat("%g", t.device.memory_bytes / kGB),
                  " GB each); intra-node ",
                  absl::StrFormat("%g", t.intra_node_bandwidth_bytes_per_second / kGB),
                  " GB/s, network ",
                  absl::StrFormat("%g", t.inter_node_bandwidth_bytes_per_second * 8 / kGB),
                  " Gb/s per device");
  if (t.nodes_per_rack > 0) absl::StrAppend(out, ", ", t.racks(), " racks");
  absl::StrAppend(out, "\n");
}

// A layout that does not fit cannot run: it gets its reason, and no step
// time, throughput, MFU or time to train.
void AppendEstimates(const PlanRequest& r, const LayoutEvaluation& e, std::string* out) {
  if (!e.fits) {
    absl::StrAppend(out, "  No estimate: the layout does not fit (", e.infeasible_reason,
                    "), so it has no step time, throughput or MFU.\n");
    return;
  }
  Table table({"Estimate", "value"});
  table.Add({"step time", Seconds(e.step.step_seconds)});
  table.Add({"tokens/s", Thousands(e.step.tokens_per_second)});
  table.Add({"MFU (HFU incl. recompute)",
             absl::StrCat(Percent(e.step.mfu), " (", Percent(e.step.hfu), ")")});
  table.Add({"model TFLOP/s per device",
             absl::StrFormat("%.1f", e.step.model_flops_per_step /
                                         (e.step.step_seconds * r.topology.total_devices()) /
                                         1e12)});
  if (r.training.token_budget > 0) {
    table.Add({absl::StrCat("time to train ", ParamsShort(r.training.token_budget), " tokens"),
               Seconds(e.run.train_seconds)});
    table.Add({"device-hours", Thousands(e.run.device_hours)});
    if (r.topology.price_per_device_hour_usd > 0) {
      table.Add({absl::StrFormat("cost at $%g/device-hour", r.topology.price_per_device_hour_usd),
                 absl::StrCat("$", Thousands(e.run.cost_usd))});
    }
    if (e.run.fleet_power_watts > 0) {
      table.Add({absl::StrFormat("energy at %s kW fleet power", Thousands(e.run.fleet_power_watts / 1e3)),
                 absl::StrCat(Thousands(e.run.energy_kwh), " kWh")});
    }
  }
  absl::StrAppend(out, table.Render());
}

void AppendMemory(const LayoutEvaluation& e, std::string* out) {
  const MemoryBreakdown& m = e.memory;
  Table table({absl::StrCat("Memory per device, stage ", m.stage, " of ", e.layout.pp, " (",
                            m.layers, m.layers == 1 ? " layer)" : " layers)"),
               "GB"});
  table.Add({"weights", Gb(m.weights)});
  table.Add({"gradients", Gb(m.gradients)});
  table.Add({"fp32 master weights", Gb(m.master_weights)});
  table.Add({"optimizer states", Gb(m.optimizer_states)});
  table.Add({"activations", Gb(m.activations)});
  table.Add({"recompute workspace", Gb(m.recompute_workspace)});
  table.Add({"logits", Gb(m.logits)});
  if (e.layout.zero_stage >= 3) table.Add({"ZeRO-3 gathered layer", Gb(m.gathered_parameters)});
  if (m.checkpoint_staging > 0) table.Add({"checkpoint staging (host)", Gb(m.checkpoint_staging)});
  table.Add({"reserve (workspace, fragmentation)", Gb(m.reserve)});
  table.Add({absl::StrCat("total (device has ", absl::StrFormat("%g", m.capacity / kGB), ")"),
             Gb(m.total())});
  absl::StrAppend(out, table.Render());
}

void AppendTime(const LayoutEvaluation& e, std::string* out) {
  const TimeBreakdown& t = e.time;
  const double step = t.step();
  Table table({absl::StrCat("Step time, ", t.micro_batches, " micro-batches"), "seconds", "share"});
  auto row = [&](const std::string& name, double s) {
    table.Add({name, absl::StrFormat("%.4f", s), Percent(step > 0 ? s / step : 0)});
  };
  row(absl::StrFormat("compute at %.0f%% of peak (recompute %.4f s)", t.gemm_efficiency * 100,
                      t.recompute),
      t.compute);
  row("tensor-parallel all-reduces", t.tensor_parallel_comm);
  row("pipeline sends", t.pipeline_p2p);
  row("pipeline bubble", t.pipeline_bubble);
  row(absl::StrFormat("data-parallel comm, exposed (of %.4f s)", t.data_parallel_comm),
      t.data_parallel_exposed);
  row("optimizer step", t.optimizer);
  row("total", step);
  absl::StrAppend(out, table.Render());
}

std::vector<std::string> LayoutCells(const Layout& l) {
  return {absl::StrCat(l.tp), absl::StrCat(l.pp), absl::StrCat(l.dp), absl::StrCat(l.micro_batch),
          absl::StrCat(l.virtual_stages), std::string(RecomputeName(l.recompute)),
          absl::StrCat(l.zero_stage), l.sequence_parallel ? "yes" : "no"};
}

void AppendPlacement(const Plan& plan, bool racks, const ReportOptions& options,
                     std::string* out) {
  const Placement& p = plan.placement;
  const Layout& l = plan.best.layout;
  absl::StrAppend(out, "Placement (rank = dp_rank x ", l.pp * l.tp, " + pp_rank x ", l.tp,
                  " + tp_rank)\n");
  absl::StrAppend(out, "  ", p.ranks.size(), " ranks; TP groups within one node: ",
                  p.tp_groups_within_one_node, "/", p.tp_groups,
                  "; pipelines within one node: ", p.pp_groups_within_one_node, "/", p.pp_groups,
                  racks ? absl::StrCat(", within one rack: ", p.pp_groups_within_one_rack, "/",
                                       p.pp_groups)
                        : "",
                  "; DP groups span up to ", p.max_nodes_per_dp_group, " nodes\n");
  if (options.placement_rows <= 0) return;
  Table table({"rank", "node", "device", "rack", "tp", "pp", "dp"});
  const int rows = std::min<int>(options.placement_rows, static_cast<int>(p.ranks.size()));
  for (int i = 0; i < rows; ++i) {
    const RankPlacement& r = p.ranks[i];
    table.Add({absl::StrCat(r.rank), absl::StrCat(r.node), absl::StrCat(r.device),
               absl::StrCat(r.rack), absl::StrCat(r.tp_rank), absl::StrCat(r.pp_rank),
               absl::StrCat(r.dp_rank)});
  }
  absl::StrAppend(out, table.Render());
  if (rows < static_cast<int>(p.ranks.size())) {
    absl::StrAppend(out, "  ... ", p.ranks.size() - rows, " more ranks (full table: -o json)\n");
  }
}

// Devices that don't pay (device_sweep.h): one row per device count.
void AppendDeviceSweep(const PlanRequest& r, const DeviceSweep& sweep, std::string* out) {
  const bool budget = r.training.token_budget > 0;
  const bool price = budget && r.topology.price_per_device_hour_usd > 0;
  absl::StrAppend(out, "\nDevice counts (the same request on fewer devices)\n");
  std::vector<std::string> header = {"devices", "layout", "step s", "tokens/s", "MFU"};
  if (budget) {
    header.push_back(absl::StrCat("time to train ", ParamsShort(r.training.token_budget), " tok"));
    header.push_back("device-hours");
  }
  if (price) header.push_back("cost");
  header.push_back("");
  Table table(std::move(header));
  for (int i = 0; i < static_cast<int>(sweep.counts.size()); ++i) {
    const DeviceCountResult& c = sweep.counts[i];
    std::vector<std::string> row = {Thousands(c.devices)};
    if (!c.fits) {
      row.push_back(absl::StrCat("nothing fits: ", c.reason));
      table.Add(std::move(row));
      continue;
    }
    const LayoutEvaluation& e = c.best;
    row.push_back(LayoutToString(e.layout));
    row.push_back(absl::StrFormat("%.3f", e.step.step_seconds));
    row.push_back(Thousands(e.step.tokens_per_second));
    row.push_back(Percent(e.step.mfu));
    if (budget) {
      row.push_back(Seconds(e.run.train_seconds));
      row.push_back(Thousands(e.run.device_hours));
    }
    if (price) row.push_back(absl::StrCat("$", Thousands(e.run.cost_usd)));
    std::string mark = i == sweep.recommended ? "<- recommended" : "";
    if (i == sweep.fastest && i != sweep.recommended) mark = "fastest";
    if (i == sweep.cheapest && i != sweep.recommended) mark = "fewest device-hours";
    row.push_back(mark);
    table.Add(std::move(row));
  }
  absl::StrAppend(out, table.Render());
  absl::StrAppend(out, "  Recommended: ", sweep.summary, ".\n  Rule: ", sweep.rule, ".\n");
}

}  // namespace

std::vector<std::string> ExplainPlan(const PlanRequest& request, const Plan& plan) {
  std::vector<std::string> why;
  const LayoutEvaluation& best = plan.best;
  const MemoryBreakdown& m = best.memory;
  why.push_back(absl::StrCat(
      "Fits: ", Gb(m.total()), " of ", absl::StrFormat("%g", m.capacity / kGB),
      " GB per device (", Gb(m.state()), " GB training state, ",
      Gb(m.activations + m.recompute_workspace + m.logits), " GB activations, ",
      m.gathered_parameters > 0 ? absl::StrCat(Gb(m.gathered_parameters), " GB ZeRO-3 gathered layer, ")
                                : "",
      Gb(m.reserve), " GB reserve)."));
  std::string rank_line = absl::StrCat("Fastest of ", Thousands(static_cast<double>(plan.stats.feasible)),
                                       " layouts that fit (", Thousands(static_cast<double>(plan.stats.candidates)),
                                       " in the search space)");
  if (plan.top.size() > 1) {
    absl::StrAppend(&rank_line, "; the runner-up (", LayoutToString(plan.top[1].layout), ") is ",
                    Slower(best, plan.top[1]));
  }
  why.push_back(rank_line + ".");
  // Pure data parallelism is the baseline every other shape must beat.
  const int n = request.topology.total_devices();
  for (const ShapeResult& shape : plan.shapes) {
    const Layout& l = shape.best.layout;
    if (l.tp != 1 || l.pp != 1 || l == best.layout) continue;
    why.push_back(shape.fits
                      ? absl::StrCat("Pure data parallelism (dp ", n, ") fits but is ",
                                     Slower(best, shape.best), ".")
                      : absl::StrCat("Pure data parallelism (dp ", n, ") does not fit: ",
                                     shape.best.infeasible_reason, "."));
  }
  int others = 0;
  for (const ShapeResult& shape : plan.shapes) {
    const Layout& l = shape.best.layout;
    if (!shape.fits || (l.tp == best.layout.tp && l.pp == best.layout.pp)) continue;
    if (l.tp == 1 && l.pp == 1) continue;
    why.push_back(absl::StrCat("Next best shape ", Shape(l), " is ", Slower(best, shape.best), "."));
    if (++others == 2) break;
  }
  for (const WhatIf& w : plan.what_if) {
    if (w.change.rfind("recompute", 0) != 0 || !w.valid) continue;
    why.push_back(w.evaluation.fits
                      ? absl::StrCat("With ", w.change, ": ", Slower(best, w.evaluation), ".")
                      : absl::StrCat("With ", w.change, ": does not fit, ",
                                     w.evaluation.infeasible_reason, "."));
  }
  return why;
}

std::string FormatPlanText(const PlanRequest& request, const Plan& plan,
                           const ReportOptions& options) {
  std::string out;
  const LayoutEvaluation& best = plan.best;
  AppendHeader(request, &out);
  absl::StrAppend(&out, "\nChosen layout\n  ", LayoutToString(best.layout), "\n\nWhy\n");
  for (const std::string& line : ExplainPlan(request, plan)) absl::StrAppend(&out, "  - ", line, "\n");
  absl::StrAppend(&out, "\n");
  AppendEstimates(request, best, &out);
  absl::StrAppend(&out, "\n");
  AppendMemory(best, &out);
  absl::StrAppend(&out, "\n");
  AppendTime(best, &out);

  absl::StrAppend(&out, "\nTop ", plan.top.size(), " layouts\n");
  Table top({"#", "tp", "pp", "dp", "mb", "v", "recompute", "ZeRO", "SP", "GB/dev", "step s",
             "tokens/s", "MFU", "vs best"});
  for (size_t i = 0; i < plan.top.size(); ++i) {
    const LayoutEvaluation& e = plan.top[i];
    std::vector<std::string> row = {absl::StrCat(i + 1)};
    for (std::string& cell : LayoutCells(e.layout)) row.push_back(std::move(cell));
    row.push_back(Gb(e.memory.total()));
    row.push_back(absl::StrFormat("%.3f", e.step.step_seconds));
    row.push_back(Thousands(e.step.tokens_per_second));
    row.push_back(Percent(e.step.mfu));
    row.push_back(absl::StrFormat("%+.1f%%", (e.step.step_seconds / best.step.step_seconds - 1) * 100));
    top.Add(std::move(row));
  }
  absl::StrAppend(&out, top.Render());
  if (!plan.device_sweep.counts.empty()) AppendDeviceSweep(request, plan.device_sweep, &out);

  absl::StrAppend(&out, "\nBest layout per shape\n");
  Table shapes({"tp x pp x dp", "fits", "step s", "MFU", "layout or reason"});
  for (const ShapeResult& s : plan.shapes) {
    const Layout& l = s.best.layout;
    shapes.Add({absl::StrCat(l.tp, " x ", l.pp, " x ", l.dp), s.fits ? "yes" : "no",
                s.fits ? absl::StrFormat("%.3f", s.best.step.step_seconds) : "-",
                s.fits ? Percent(s.best.step.mfu) : "-",
                s.fits ? absl::StrCat("mb ", l.micro_batch, ", v ", l.virtual_stages, ", recompute ",
                                      RecomputeName(l.recompute), ", ZeRO-", l.zero_stage)
                       : s.best.infeasible_reason});
  }
  absl::StrAppend(&out, shapes.Render());

  absl::StrAppend(&out, "\nWhat if (one change to the chosen layout)\n");
  Table what({"change", "result"});
  for (const WhatIf& w : plan.what_if) {
    std::string result;
    if (!w.valid) {
      result = absl::StrCat("not allowed: ", w.invalid_reason);
    } else if (!w.evaluation.fits) {
      result = absl::StrCat("does not fit: ", w.evaluation.infeasible_reason);
    } else {
      result = absl::StrFormat("%+.1f%% step time, %s GB/device",
                               (w.evaluation.step.step_seconds / best.step.step_seconds - 1) * 100,
                               Gb(w.evaluation.memory.total()));
    }
    what.Add({w.change, result});
  }
  absl::StrAppend(&out, what.Render(), "\n");
  AppendPlacement(plan, request.topology.nodes_per_rack > 0, options, &out);
  return out;
}

std::string FormatEvaluationText(const PlanRequest& request, const LayoutEvaluation& eval) {
  std::string out;
  AppendHeader(request, &out);
  absl::StrAppend(&out, "\nLayout\n  ", LayoutToString(eval.layout), "\n  ",
                  eval.fits ? "fits" : absl::StrCat("does not fit: ", eval.infeasible_reason),
                  "\n\n");
  AppendEstimates(request, eval, &out);
  absl::StrAppend(&out, "\n");
  AppendMemory(eval, &out);
  if (eval.fits) {
    absl::StrAppend(&out, "\n");
    AppendTime(eval, &out);
  }
  return out;
}

}  // namespace loom::planner
