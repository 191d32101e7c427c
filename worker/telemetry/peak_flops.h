// The peak FLOP/s a job's MFU is measured against, and each step's MFU.
//
// MFU (model FLOPs utilisation) is achieved model FLOP/s over the peak. On
// a GPU the peak is the board's datasheet figure for the training
// precision; on a CPU it is measured at start-up by a short GEMM
// calibration (gemm_calibration.h), which is a lower bound of what the
// cores can do: another process starting beside it, a clock still ramping
// or a cold cache can make it low, and a step may then run faster than its
// own denominator (a 1-thread rank once measured 68.8 GFLOP/s and then
// trained at an MFU of 115%).
//
// Contract: Observe() never returns more than 1. A calibrated peak that a
// step exceeds is raised to what that step achieved (the step proves the
// hardware does that much), so that step reports 1.0 and later steps are
// measured against the higher peak; each raise is counted. A datasheet
// peak is never raised: a step above it means the FLOP count or the board
// name is wrong, so the MFU is reported as 1.0 and the step counted as
// over the datasheet, which Describe() says.
//
// Not thread-safe: one per rank, called from the training thread.
#ifndef LOOM_WORKER_TELEMETRY_PEAK_FLOPS_H_
#define LOOM_WORKER_TELEMETRY_PEAK_FLOPS_H_

#include <cstdint>
#include <string>

namespace loom::telemetry {

class PeakFlops {
 public:
  enum class Source { kCalibrated, kDatasheet };

  // peak: the job's peak FLOP/s (a rank's times the ranks), > 0; `what`
  // says what it is, e.g. "calibrated fp32 GEMM, 1 thread x 2 ranks" or
  // "datasheet bf16 peak of H100-SXM x 8 ranks".
  PeakFlops(double peak, Source source, std::string what);

  // MFU of a step that achieved `achieved` model FLOP/s (whole job), in
  // [0, 1]; raises a calibrated peak first when `achieved` exceeds it.
  double Observe(double achieved);

  double peak() const { return peak_; }
  double initial_peak() const { return initial_; }
  Source source() const { return source_; }
  // Steps that raised a calibrated peak, or exceeded a datasheet one.
  int64_t exceeded() const { return exceeded_; }
  // What the figure is measured against, for StepMetrics.peak_flops_source
  // and `loomctl watch`: `what`, and when a step exceeded it, by how much
  // and how often.
  std::string Describe() const;

 private:
  double peak_;
  double initial_;
  Source source_;
  std::string what_;
  int64_t exceeded_ = 0;
};

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_PEAK_FLOPS_H_
