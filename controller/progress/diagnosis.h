// Bottleneck verdict for a running job from its measured step-time split,
// following the decision tree of the textbook's "Training"
// chapter: first ask whether the accelerator waits for input (data-bound),
// then whether memory capacity is the limit, then whether exposed
// communication dominates, and only then tell compute-bound from
// memory-bandwidth-bound by how close the achieved model FLOP/s come to the
// calibrated peak.
//
// Pure function of the reported steps; no clock, no I/O. Thread-compatible.
#ifndef LOOM_CONTROLLER_PROGRESS_DIAGNOSIS_H_
#define LOOM_CONTROLLER_PROGRESS_DIAGNOSIS_H_

#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::controller {

// Thresholds of the decision tree. Fractions are of the mean step time over
// the window; they are tuned to flag a bottleneck an engineer should act
// on, not to split hairs.
struct DiagnosisOptions {
  // Steps considered: the newest `window` training steps (step > 0) that
  // carry a split (compute_seconds > 0). Fewer than `min_steps`: no verdict.
  int window = 32;
  int min_steps = 3;
  // Data-bound when the step waits for its batch longer than this fraction.
  double data_wait_fraction = 0.10;
  // Memory-capacity-bound when the peak resident set of the rank is above
  // this fraction of the memory it may use (StepMetrics.memory_limit_bytes).
  double memory_fraction = 0.90;
  // Communication-bound when exposed (non-overlapped) collectives take more
  // than this fraction.
  double comm_fraction = 0.30;
  // Compute-bound when MFU reaches this; below it, with compute dominating,
  // the step is limited by memory-bandwidth-bound kernels (elementwise ops,
  // softmax, normalisation, the optimizer) and small matrix products.
  double compute_bound_mfu = 0.45;
};

// The verdict over `steps` (any order; only the newest options.window with
// a split are used). VERDICT_UNSPECIFIED with a summary saying why when
// there are too few. Evidence lists the figures the verdict rests on, one
// per line, as a person would quote them.
loom::v1::Diagnosis Diagnose(const std::vector<loom::v1::StepMetrics>& steps,
                             const DiagnosisOptions& options = {});
// The same over steps held elsewhere (none null), so that a caller with a
// window of steps in another container need not copy them for every verdict.
loom::v1::Diagnosis Diagnose(std::vector<const loom::v1::StepMetrics*> steps,
                             const DiagnosisOptions& options = {});

// Human-readable name of a verdict ("data-bound", ...).
const char* VerdictName(loom::v1::Diagnosis::Verdict verdict);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_DIAGNOSIS_H_
