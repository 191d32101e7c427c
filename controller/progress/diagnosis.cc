#include "controller/progress/diagnosis.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace loom::controller {
namespace {

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

std::string Gigabytes(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

}  // namespace

const char* VerdictName(loom::v1::Diagnosis::Verdict verdict) {
  switch (verdict) {
    case loom::v1::Diagnosis::DATA_BOUND:
      return "data-bound";
    case loom::v1::Diagnosis::MEMORY_CAPACITY_BOUND:
      return "memory-capacity-bound";
    case loom::v1::Diagnosis::MEMORY_BANDWIDTH_BOUND:
      return "memory-bandwidth-bound";
    case loom::v1::Diagnosis::COMPUTE_BOUND:
      return "compute-bound";
    case loom::v1::Diagnosis::COMMUNICATION_BOUND:
      return "communication-bound";
    default:
      return "undetermined";
  }
}

loom::v1::Diagnosis Diagnose(const std::vector<loom::v1::StepMetrics>& steps,
                             const DiagnosisOptions& options) {
  std::vector<const loom::v1::StepMetrics*> all;
  all.reserve(steps.size());
  for (const auto& m : steps) all.push_back(&m);
  return Diagnose(std::move(all), options);
}

loom::v1::Diagnosis Diagnose(std::vector<const loom::v1::StepMetrics*> steps,
                             const DiagnosisOptions& options) {
  std::vector<const loom::v1::StepMetrics*>& usable = steps;
  usable.erase(std::remove_if(usable.begin(), usable.end(),
                              [](const loom::v1::StepMetrics* m) {
                                return !(m->step() > 0 && m->compute_seconds() > 0 &&
                                         m->step_time_seconds() > 0);
                              }),
               usable.end());
  std::sort(usable.begin(), usable.end(),
            [](const auto* a, const auto* b) { return a->step() > b->step(); });
  if (static_cast<int>(usable.size()) > options.window) usable.resize(options.window);

  loom::v1::Diagnosis d;
  d.set_steps_considered(static_cast<int>(usable.size()));
  if (!usable.empty()) d.set_step(usable.front()->step());
  if (static_cast<int>(usable.size()) < std::max(1, options.min_steps)) {
    d.set_verdict(loom::v1::Diagnosis::VERDICT_UNSPECIFIED);
    d.set_summary(absl::StrFormat("not enough steps with a time split yet (%d of %d)",
                                  usable.size(), options.min_steps));
    return d;
  }

  double step = 0, data = 0, compute = 0, comm = 0, optimizer = 0, stall = 0, control = 0, mfu = 0;
  double peak_rss = 0, limit = 0;
  int with_mfu = 0;
  bool datasheet_peak = false;  // GPU ranks: the board's figure, not a calibration
  for (const auto* m : usable) {
    step += m->step_time_seconds();
    data += m->data_wait_seconds();
    compute += m->compute_seconds();
    comm += m->comm_seconds();
    optimizer += m->optimizer_seconds();
    stall += m->checkpoint_stall_seconds();
    control += m->control_seconds();
    if (m->peak_flops_per_second() > 0) {
      mfu += m->mfu();
      ++with_mfu;
      datasheet_peak = absl::StartsWith(m->peak_flops_source(), "datasheet");
    }
    peak_rss = std::max(peak_rss, static_cast<double>(m->peak_rss_bytes()));
    if (m->memory_limit_bytes() > 0) {
      limit = limit == 0 ? m->memory_limit_bytes() : std::min(limit, m->memory_limit_bytes());
    }
  }
  const double n = static_cast<double>(usable.size());
  const double mean_step = step / n;
  const double f_data = data / step, f_compute = compute / step, f_comm = comm / step,
               f_opt = optimizer / step, f_stall = stall / step, f_control = control / step;
  const double mean_mfu = with_mfu > 0 ? mfu / with_mfu : 0;
  const double f_memory = limit > 0 ? peak_rss / limit : 0;

  d.add_evidence(absl::StrFormat("mean step %.3f s over steps %d-%d (%d steps)", mean_step,
                                 usable.back()->step(), usable.front()->step(), usable.size()));
  d.add_evidence(
      absl::StrFormat("split: data wait %s, compute (fwd+bwd) %s, exposed comm %s, optimizer %s, "
                      "checkpoint stall %s, step loop %s",
                      Percent(f_data), Percent(f_compute), Percent(f_comm), Percent(f_opt),
                      Percent(f_stall), Percent(f_control)));
  if (with_mfu > 0) {
    d.add_evidence(absl::StrFormat("MFU %s of the %s peak", Percent(mean_mfu),
                                   datasheet_peak ? "datasheet" : "calibrated"));
  }
  if (limit > 0) {
    d.add_evidence(absl::StrFormat("peak resident memory %s of %s available to the rank (%s)",
                                   Gigabytes(peak_rss), Gigabytes(limit), Percent(f_memory)));
  }

  using V = loom::v1::Diagnosis;
  if (f_data > options.data_wait_fraction) {
    d.set_verdict(V::DATA_BOUND);
    d.set_summary(absl::StrFormat("data-bound: the step waits for its batch %s of the time",
                                  Percent(f_data)));
    d.set_intervention(
        "feed the step faster: raise the loader's prefetch depth, keep shards on local or "
        "page-cached storage, pre-tokenize; more compute will not help until the wait is gone");
  } else if (limit > 0 && f_memory > options.memory_fraction) {
    d.set_verdict(V::MEMORY_CAPACITY_BOUND);
    d.set_summary(absl::StrFormat("memory-capacity-bound: peak memory at %s of the limit",
                                  Percent(f_memory)));
    d.set_intervention(
        "cut memory per rank: bf16 mixed precision, activation checkpointing, a smaller "
        "micro-batch with gradient accumulation, or a ZeRO stage / more ranks (loomctl plan)");
  } else if (f_comm > options.comm_fraction) {
    d.set_verdict(V::COMMUNICATION_BOUND);
    d.set_summary(absl::StrFormat("communication-bound: exposed all-reduce takes %s of the step",
                                  Percent(f_comm)));
    d.set_intervention(
        "hide or shrink communication: larger buckets overlapped with backward, gradient "
        "accumulation (one all-reduce per several micro-batches), fewer data-parallel ranks "
        "across slow links, or a layout with less traffic (loomctl plan)");
  } else if (with_mfu > 0 && mean_mfu >= options.compute_bound_mfu) {
    d.set_verdict(V::COMPUTE_BOUND);
    d.set_summary(absl::StrFormat("compute-bound: matrix products run at %s MFU",
                                  Percent(mean_mfu)));
    d.set_intervention(
        "the step is where it should be: only fewer FLOPs (a smaller model or sequence), "
        "lower-precision matrix products (bf16) or faster devices raise throughput");
  } else {
    d.set_verdict(V::MEMORY_BANDWIDTH_BOUND);
    d.set_summary(absl::StrFormat(
        "memory-bandwidth-bound: compute dominates the step (%s) but reaches only %s MFU",
        Percent(f_compute + f_opt), Percent(mean_mfu)));
    d.set_intervention(
        "the time goes to memory-bound kernels (elementwise, softmax, normalisation, optimizer) "
        "and small matrix products: raise the micro-batch for bigger matrix products, fuse "
        "elementwise work, and use bf16 where the device multiplies it faster than fp32");
  }
  return d;
}

}  // namespace loom::controller
