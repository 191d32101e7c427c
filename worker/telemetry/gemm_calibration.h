// Peak FLOP/s of this process's CPU threads, measured with a short fp32
// GEMM (the "local CPU measured at run time" of issues 3 and 6). Uses
// LibTorch (and so whatever BLAS it resolves).
#ifndef LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_
#define LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_

namespace loom::telemetry {

// Best of `repeats` n×n×n sgemms after one warm-up, with the current
// torch::get_num_threads(); 2·n³ FLOPs each.
double MeasureGemmFlopsPerSecond(int n = 1024, int repeats = 5);

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_
