// Checks FusedAdamWCuda against the CPU kernel (fused_adamw.h) and measures
// its bandwidth. A plain main, not a gtest binary, so that it builds with
// nvcc alone on a GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90 -I. -I<abseil include dir>
//     worker/engine/ops/fused_adamw_cuda_test.cu worker/engine/ops/fused_adamw_cuda.cu
//     worker/engine/ops/fused_adamw.cc -Xcompiler -fopenmp,-ffp-contract=off
//     -o fused_adamw_cuda_test
// (one command line; no trailing backslashes here: they would continue the
// // comment onto the next line)
//   ./fused_adamw_cuda_test [bandwidth params, default 100000000; 0 skips]
// Exit status: 0 all checks passed, 1 a check failed, 77 no CUDA device.
// Last line: adamw-cuda: <GB/s> GB/s ratio=<x> of same-pattern stream,
//            <y> of device copy   (28 bytes per parameter; copy counts
//            bytes read + written)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "worker/engine/ops/fused_adamw.h"
#include "worker/engine/ops/fused_adamw_cuda.h"

namespace loom::engine {
namespace {

int failures = 0;

#define CUDA_OK(expr)                                                    \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

void Expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

// Host arrays of several tensors and their device mirror. One tensor starts
// one element into its allocation, so the kernels' unaligned path runs too.
class Mirror {
 public:
  Mirror(const std::vector<int64_t>& sizes, uint32_t seed) : sizes_(sizes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> positive(0.0f, 0.01f);
    for (int64_t n : sizes) {
      for (int a = 0; a < 4; ++a) host_[a].emplace_back();
      for (int64_t i = 0; i < n; ++i) {
        host_[0].back().push_back(0.02f * normal(rng));
        host_[1].back().push_back(normal(rng));
        host_[2].back().push_back(0.1f * normal(rng));
        host_[3].back().push_back(positive(rng));
      }
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t shift = k == 2 ? 1 : 0;  // misaligns tensor 2
      for (int a = 0; a < 4; ++a) {
        float* base = nullptr;
        CUDA_OK(cudaMalloc(&base, (sizes[k] + shift + 1) * sizeof(float)));
        allocations_.push_back(base);
        device_[a].push_back(base + shift);
      }
    }
    Upload();
  }
  ~Mirror() {
    for (float* p : allocations_) cudaFree(p);
  }

  void Upload() {
    for (int a = 0; a < 4; ++a) {
      for (size_t k = 0; k < sizes_.size(); ++k) {
        CUDA_OK(cudaMemcpy(device_[a][k], host_[a][k].data(), sizes_[k] * sizeof(float),
                           cudaMemcpyHostToDevice));
      }
    }
  }

  // Copies the device arrays into `out` (same layout as the host arrays).
  std::vector<std::vector<float>> Download(int array) const {
    std::vector<std::vector<float>> out(sizes_.size());
    for (size_t k = 0; k < sizes_.size(); ++k) {
      out[k].resize(sizes_[k]);
      CUDA_OK(cudaMemcpy(out[k].data(), device_[array][k], sizes_[k] * sizeof(float),
                         cudaMemcpyDeviceToHost));
    }
    return out;
  }

  std::vector<AdamWGroup> Groups(bool device, int64_t step) {
    AdamWGroup group;
    group.hyperparams.lr = 3e-3;
    group.hyperparams.beta1 = 0.9;
    group.hyperparams.beta2 = 0.95;
    group.hyperparams.eps = 1e-8;
    for (size_t k = 0; k < sizes_.size(); ++k) {
      AdamWTensor t;
      t.param = device ? device_[0][k] : host_[0][k].data();
      t.grad = device ? device_[1][k] : host_[1][k].data();
      t.exp_avg = device ? device_[2][k] : host_[2][k].data();
      t.exp_avg_sq = device ? device_[3][k] : host_[3][k].data();
      t.size = sizes_[k];
      t.weight_decay = k % 2 ? 0.0 : 0.1;
      t.step = step;
      group.tensors.push_back(t);
    }
    return {group};
  }

  std::vector<std::vector<float>>& host(int array) { return host_[array]; }

  // Largest |device - host| / max|host| over param, exp_avg, exp_avg_sq
  // (0 means bit-identical up to signed zeros).
  double MaxRelativeDiff() const {
    double worst = 0;
    for (int a : {0, 2, 3}) {
      const std::vector<std::vector<float>> d = Download(a);
      for (size_t k = 0; k < sizes_.size(); ++k) {
        double scale = 0, diff = 0;
        for (size_t i = 0; i < d[k].size(); ++i) {
          scale = std::max(scale, std::fabs(static_cast<double>(host_[a][k][i])));
          diff = std::max(diff, std::fabs(static_cast<double>(d[k][i]) - host_[a][k][i]));
          if (std::isnan(d[k][i]) != std::isnan(host_[a][k][i])) diff = INFINITY;
        }
        worst = std::max(worst, scale > 0 ? diff / scale : diff);
      }
    }
    return worst;
  }

  bool DeviceBitEqualsHost() const {
    for (int a = 0; a < 4; ++a) {
      const std::vector<std::vector<float>> d = Download(a);
      for (size_t k = 0; k < sizes_.size(); ++k) {
        if (std::memcmp(d[k].data(), host_[a][k].data(), d[k].size() * sizeof(float)) != 0) {
          return false;
        }
      }
    }
    return true;
  }

 private:
  std::vector<int64_t> sizes_;
  std::vector<std::vector<float>> host_[4];  // param, grad, exp_avg, exp_avg_sq
  std::vector<float*> device_[4];
  std::vector<float*> allocations_;
};

void CheckAgainstCpu() {
  const std::vector<int64_t> sizes = {1, 7, 1000, 33, 70001, 65536, 150017, 3, 1 << 20};
  FusedAdamWCuda cuda;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  {  // No clipping: identical coefficients, so identical bits.
    Mirror mirror(sizes, 1);
    AdamWStepOptions options;
    options.max_grad_norm = 0;
    bool all_applied = true;
    for (int64_t step = 1; step <= 3; ++step) {
      FusedAdamWStep(mirror.Groups(false, step), options);
      CUDA_OK(cuda.Step(mirror.Groups(true, step), options, stream));
      AdamWStepResult r;
      CUDA_OK(cuda.LastResult(&r));
      all_applied = all_applied && r.applied;
    }
    Expect(all_applied, "unclipped steps applied");
    Expect(mirror.DeviceBitEqualsHost(), "unclipped: CUDA == CPU bit for bit after 3 steps");
  }
  {  // Clipping and unscale: the norms agree closely, the steps within 1e-6.
    Mirror mirror(sizes, 2);
    AdamWStepOptions options;
    options.max_grad_norm = 1.0;
    options.inv_scale = 0.5;
    double cpu_norm = 0, cuda_norm = 0, cpu_clip = 0, cuda_clip = 0;
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWStepResult cpu = FusedAdamWStep(mirror.Groups(false, step), options);
      CUDA_OK(cuda.Step(mirror.Groups(true, step), options, stream));
      AdamWStepResult r;
      CUDA_OK(cuda.LastResult(&r));
      cpu_norm = cpu.grad_norm;
      cuda_norm = r.grad_norm;
      cpu_clip = cpu.clip_coef;
      cuda_clip = r.clip_coef;
    }
    std::printf("     grad norm cpu %.17g cuda %.17g; clip %.17g / %.17g\n", cpu_norm, cuda_norm,
                cpu_clip, cuda_clip);
    Expect(std::fabs(cpu_norm - cuda_norm) <= 1e-12 * cpu_norm, "clipped: norms agree to 1e-12");
    Expect(cpu_clip < 1, "clipped: the clip factor was applied");
    const double diff = mirror.MaxRelativeDiff();
    std::printf("     max relative difference %.3g\n", diff);
    Expect(diff <= 1e-6, "clipped: CUDA == CPU within 1e-6 relative");
  }
  {  // A NaN gradient: the step is skipped and nothing on the device changes.
    Mirror mirror(sizes, 3);
    mirror.host(1)[8][123456] = std::numeric_limits<float>::quiet_NaN();
    mirror.Upload();
    AdamWStepOptions options;
    options.max_grad_norm = 1.0;
    CUDA_OK(cuda.Step(mirror.Groups(true, 1), options, stream));
    AdamWStepResult r;
    r.applied = true;
    CUDA_OK(cuda.LastResult(&r));
    Expect(!r.applied && std::isnan(r.grad_norm), "NaN gradient: step reported skipped");
    Expect(mirror.DeviceBitEqualsHost(), "NaN gradient: device arrays unchanged");
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------
// Bandwidth.

__global__ void InitKernel(float* p, float* g, float* m, float* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    p[i] = 0.02f * (static_cast<float>(h >> 8) / 16777216.0f - 0.5f);
    g[i] = 1e-3f * (static_cast<float>((h >> 4) & 0xffff) / 65536.0f - 0.5f) + 1e-6f;
    m[i] = 0;
    v[i] = 0;
  }
}

// AdamW's access pattern with trivial arithmetic: the roofline.
__global__ void StreamKernel(float4* p, const float4* g, float4* m, float4* v, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float4 gi = g[i];
    float4 pi = p[i], mi = m[i], vi = v[i];
    pi.x -= 1e-7f * gi.x;
    pi.y -= 1e-7f * gi.y;
    pi.z -= 1e-7f * gi.z;
    pi.w -= 1e-7f * gi.w;
    mi.x = 0.5f * mi.x + gi.x;
    mi.y = 0.5f * mi.y + gi.y;
    mi.z = 0.5f * mi.z + gi.z;
    mi.w = 0.5f * mi.w + gi.w;
    vi.x = 0.5f * vi.x + gi.x * gi.x;
    vi.y = 0.5f * vi.y + gi.y * gi.y;
    vi.z = 0.5f * vi.z + gi.z * gi.z;
    vi.w = 0.5f * vi.w + gi.w * gi.w;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename Fn>
double MedianMs(cudaStream_t stream, int reps, Fn&& fn) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  fn();  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CUDA_OK(cudaEventRecord(start, stream));
    fn();
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Bandwidth(int64_t params) {
  constexpr int64_t kParamsPerTensor = 1000000;
  params = params / 4 * 4;
  float *p, *g, *m, *v, *copy;
  for (float** a : {&p, &g, &m, &v, &copy}) CUDA_OK(cudaMalloc(a, params * sizeof(float)));
  InitKernel<<<1024, 256>>>(p, g, m, v, params);
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  AdamWGroup group;
  group.hyperparams.lr = 1e-4;
  group.hyperparams.beta2 = 0.95;
  for (int64_t offset = 0; offset < params; offset += kParamsPerTensor) {
    AdamWTensor t;
    t.param = p + offset;
    t.grad = g + offset;
    t.exp_avg = m + offset;
    t.exp_avg_sq = v + offset;
    t.size = std::min(kParamsPerTensor, params - offset);
    t.weight_decay = 0.1;
    group.tensors.push_back(t);
  }
  std::vector<AdamWGroup> groups = {group};
  FusedAdamWCuda cuda;
  AdamWStepOptions options;
  options.max_grad_norm = 1.0;
  const int reps = 20;
  const double copy_ms = MedianMs(stream, reps, [&] {
    CUDA_OK(cudaMemcpyAsync(copy, p, params * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  });
  const double stream_ms = MedianMs(stream, reps, [&] {
    StreamKernel<<<sms * 8, 512, 0, stream>>>(
        reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
        reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), params / 4);
  });
  int64_t step = 0;
  const double fused_ms = MedianMs(stream, reps, [&] {
    ++step;
    for (AdamWTensor& t : groups[0].tensors) t.step = step;
    CUDA_OK(cuda.Step(groups, options, stream));
  });
  AdamWStepResult r;
  CUDA_OK(cuda.LastResult(&r));
  Expect(r.applied, "bandwidth run: steps applied");

  const double bytes = 28.0 * params;
  const double copy_gbps = 2.0 * params * sizeof(float) / (copy_ms * 1e6);
  const double stream_gbps = bytes / (stream_ms * 1e6), fused_gbps = bytes / (fused_ms * 1e6);
  std::printf("adamw-cuda: %lld params in %zu tensors, median of %d\n",
              static_cast<long long>(params), groups[0].tensors.size(), reps);
  std::printf("adamw-cuda device copy (read + write): %8.3f ms %8.1f GB/s\n", copy_ms, copy_gbps);
  std::printf("adamw-cuda stream (same pattern):      %8.3f ms %8.1f GB/s\n", stream_ms,
              stream_gbps);
  std::printf("adamw-cuda fused step (norm + update): %8.3f ms %8.1f GB/s\n", fused_ms, fused_gbps);
  std::printf("adamw-cuda: %.0f GB/s ratio=%.2f of same-pattern stream, %.2f of device copy\n",
              fused_gbps, fused_gbps / stream_gbps, fused_gbps / copy_gbps);
  CUDA_OK(cudaStreamDestroy(stream));
  for (float* a : {p, g, m, v, copy}) CUDA_OK(cudaFree(a));
}

}  // namespace
}  // namespace loom::engine

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  loom::engine::CheckAgainstCpu();
  const int64_t params = argc > 1 ? std::atoll(argv[1]) : 100000000;
  if (params > 0) loom::engine::Bandwidth(params);
  std::printf("%s\n", loom::engine::failures == 0 ? "PASSED" : "FAILED");
  return loom::engine::failures == 0 ? 0 : 1;
}
