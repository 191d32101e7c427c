// Peak FLOP/s of this process's CPU threads, measured with a short fp32
// GEMM: the peak a CPU rank's MFU is measured against (peak_flops.h). Uses
// LibTorch (and so whatever BLAS it resolves).
#ifndef LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_
#define LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_

namespace loom::telemetry {

// n×n×n sgemms with the current torch::get_num_threads(), 2·n³ FLOPs each:
// warm-up products until at least 3 have run and 0.25 s has passed (thread
// pools started, caches and the clock up to speed), then the best of
// `repeats`. The best, not the median: anything that slows one product
// (another process starting beside it) only lowers the figure, and a low
// peak would overstate MFU; steps that still run faster raise it
// (PeakFlops).
double MeasureGemmFlopsPerSecond(int n = 1024, int repeats = 10);

}  // namespace loom::telemetry

#endif  // LOOM_WORKER_TELEMETRY_GEMM_CALIBRATION_H_
