#include "worker/engine/ops/fused_adamw_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace loom::engine {
namespace {

constexpr int kBlockThreads = 512;
constexpr int kFinalizeThreads = 1024;

// One tensor as the kernels see it; the scalars are those of MakeCoeffs in
// fused_adamw.cc (fp32, rounded from the same double expressions), except
// grad_scale, which launch 2 computes on the device.
struct DeviceTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float decay;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;
  int32_t aligned;  // all four pointers 16-byte aligned: float4 accesses
};

// Elements [begin, end) of tensor `tensor`.
struct DeviceChunk {
  int32_t tensor;
  int64_t begin;
  int64_t end;
};

struct DeviceVerdict {
  double grad_norm;
  double clip_coef;
  float grad_scale;
  int32_t applied;
};

DeviceTensor MakeDeviceTensor(const AdamWHyperparams& h, const AdamWTensor& t) {
  // Keep in step with MakeCoeffs in fused_adamw.cc: fused_adamw_cuda_test.cu
  // checks that both give bit-identical results.
  const double step = static_cast<double>(t.step);
  const double bias_correction1 = 1 - std::pow(h.beta1, step);
  const double bias_correction2 = 1 - std::pow(h.beta2, step);
  DeviceTensor d;
  d.param = t.param;
  d.grad = t.grad;
  d.exp_avg = t.exp_avg;
  d.exp_avg_sq = t.exp_avg_sq;
  d.decay = static_cast<float>(1 - h.lr * t.weight_decay);
  d.beta1 = static_cast<float>(h.beta1);
  d.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  d.beta2 = static_cast<float>(h.beta2);
  d.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  d.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  d.eps = static_cast<float>(h.eps);
  d.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  d.aligned =
      aligned16(t.param) && aligned16(t.grad) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq);
  return d;
}

// Sums `value` over the block; the result is valid in thread 0.
template <int kThreads>
__device__ double BlockSum(double value) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  value = 0;
  if (warp == 0) {
    value = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_down_sync(0xffffffffu, value, offset);
    }
  }
  return value;
}

__device__ __forceinline__ double Square(float x) {
  const double d = x;
  return d * d;
}

// Launch 1: partials[chunk] = sum of grad^2 over the chunk.
__global__ void __launch_bounds__(kBlockThreads)
    SumSquaresKernel(const DeviceTensor* tensors, const DeviceChunk* chunks, double* partials) {
  const DeviceChunk chunk = chunks[blockIdx.x];
  const DeviceTensor& t = tensors[chunk.tensor];
  double sum = 0;
  int64_t i = chunk.begin + threadIdx.x * 4;
  if (t.aligned) {
    // chunk.begin is a multiple of kChunkElements, so i is a multiple of 4.
    for (; i + 4 <= chunk.end; i += kBlockThreads * 4) {
      const float4 g = *reinterpret_cast<const float4*>(t.grad + i);
      sum += Square(g.x) + Square(g.y) + Square(g.z) + Square(g.w);
    }
    const int64_t tail = chunk.begin + (chunk.end - chunk.begin) / 4 * 4;
    i = tail + threadIdx.x;
  } else {
    i = chunk.begin + threadIdx.x;
  }
  for (; i < chunk.end; i += kBlockThreads) sum += Square(t.grad[i]);
  sum = BlockSum<kBlockThreads>(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Launch 2: the verdict, as FusedAdamWStep in fused_adamw.cc computes it.
__global__ void __launch_bounds__(kFinalizeThreads)
    VerdictKernel(const double* partials, int64_t count, double inv_scale, double max_grad_norm,
                  DeviceVerdict* verdict) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += kFinalizeThreads) sum += partials[i];
  sum = BlockSum<kFinalizeThreads>(sum);
  if (threadIdx.x != 0) return;
  DeviceVerdict v;
  if (!isfinite(sum)) {
    v.grad_norm = sum;
    v.clip_coef = 0;
    v.grad_scale = 0;
    v.applied = 0;
  } else {
    v.grad_norm = sqrt(sum) * fabs(inv_scale);
    v.clip_coef = 1;
    // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6).
    if (max_grad_norm > 0 && v.grad_norm > max_grad_norm) {
      v.clip_coef = max_grad_norm / (v.grad_norm + 1e-6);
    }
    v.grad_scale = __double2float_rn(inv_scale * v.clip_coef);
    v.applied = 1;
  }
  *verdict = v;
}

// The per-element update of fused_adamw.h with every rounding spelled out,
// so that nvcc's default FMA contraction cannot change a result.
__device__ __forceinline__ void UpdateOne(const DeviceTensor& t, float grad_scale, float& param,
                                          float grad, float& m, float& v) {
  const float g = __fmul_rn(grad, grad_scale);
  const float p = __fmul_rn(param, t.decay);
  m = __fmaf_rn(g, t.one_minus_beta1, __fmul_rn(m, t.beta1));
  v = __fmaf_rn(__fmul_rn(t.one_minus_beta2, g), g, __fmul_rn(v, t.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), t.sqrt_bias_correction2), t.eps);
  param = __fadd_rn(p, __fdiv_rn(__fmul_rn(t.neg_step_size, m), denom));
}

// Launch 3: the update, or nothing when the verdict says skip.
__global__ void __launch_bounds__(kBlockThreads)
    UpdateKernel(const DeviceTensor* tensors, const DeviceChunk* chunks,
                 const DeviceVerdict* verdict) {
  if (!verdict->applied) return;
  const float grad_scale = verdict->grad_scale;
  const DeviceChunk chunk = chunks[blockIdx.x];
  const DeviceTensor& t = tensors[chunk.tensor];
  int64_t i;
  if (t.aligned) {
    for (i = chunk.begin + threadIdx.x * 4; i + 4 <= chunk.end; i += kBlockThreads * 4) {
      float4 p = *reinterpret_cast<const float4*>(t.param + i);
      const float4 g = *reinterpret_cast<const float4*>(t.grad + i);
      float4 m = *reinterpret_cast<const float4*>(t.exp_avg + i);
      float4 v = *reinterpret_cast<const float4*>(t.exp_avg_sq + i);
      UpdateOne(t, grad_scale, p.x, g.x, m.x, v.x);
      UpdateOne(t, grad_scale, p.y, g.y, m.y, v.y);
      UpdateOne(t, grad_scale, p.z, g.z, m.z, v.z);
      UpdateOne(t, grad_scale, p.w, g.w, m.w, v.w);
      *reinterpret_cast<float4*>(t.param + i) = p;
      *reinterpret_cast<float4*>(t.exp_avg + i) = m;
      *reinterpret_cast<float4*>(t.exp_avg_sq + i) = v;
    }
    i = chunk.begin + (chunk.end - chunk.begin) / 4 * 4 + threadIdx.x;
  } else {
    i = chunk.begin + threadIdx.x;
  }
  for (; i < chunk.end; i += kBlockThreads) {
    UpdateOne(t, grad_scale, t.param[i], t.grad[i], t.exp_avg[i], t.exp_avg_sq[i]);
  }
}

size_t AlignUp(size_t n, size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace

FusedAdamWCuda::~FusedAdamWCuda() {
  if (step_done_ != nullptr) cudaEventSynchronize(step_done_);
  cudaFreeHost(host_table_);
  cudaFree(device_table_);
  cudaFree(partials_);
  cudaFree(verdict_);
  if (table_copied_ != nullptr) cudaEventDestroy(table_copied_);
  if (step_done_ != nullptr) cudaEventDestroy(step_done_);
}

cudaError_t FusedAdamWCuda::Reserve(size_t table_bytes, size_t chunks) {
  cudaError_t err = cudaSuccess;
  if (table_copied_ == nullptr) {
    if ((err = cudaEventCreateWithFlags(&table_copied_, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaEventCreateWithFlags(&step_done_, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaMalloc(&verdict_, sizeof(DeviceVerdict))) != cudaSuccess) {
      return err;
    }
  }
  if (table_bytes > table_capacity_bytes_) {
    // The old buffers may still be in use by the last step.
    if ((err = cudaEventSynchronize(step_done_)) != cudaSuccess) return err;
    cudaFreeHost(host_table_);
    cudaFree(device_table_);
    host_table_ = device_table_ = nullptr;
    table_capacity_bytes_ = 0;
    const size_t bytes = std::max<size_t>(table_bytes * 2, 4096);
    if ((err = cudaMallocHost(&host_table_, bytes)) != cudaSuccess ||
        (err = cudaMalloc(&device_table_, bytes)) != cudaSuccess) {
      return err;
    }
    table_capacity_bytes_ = bytes;
  }
  if (chunks > partials_capacity_) {
    if ((err = cudaEventSynchronize(step_done_)) != cudaSuccess) return err;
    cudaFree(partials_);
    partials_ = nullptr;
    partials_capacity_ = 0;
    const size_t count = std::max<size_t>(chunks * 2, 256);
    if ((err = cudaMalloc(&partials_, count * sizeof(double))) != cudaSuccess) return err;
    partials_capacity_ = count;
  }
  return cudaSuccess;
}

cudaError_t FusedAdamWCuda::Step(absl::Span<const AdamWGroup> groups,
                                 const AdamWStepOptions& options, cudaStream_t stream) {
  std::vector<DeviceTensor> tensors;
  std::vector<DeviceChunk> chunks;
  for (const AdamWGroup& group : groups) {
    for (const AdamWTensor& t : group.tensors) {
      if (t.size <= 0) continue;
      const int32_t index = static_cast<int32_t>(tensors.size());
      tensors.push_back(MakeDeviceTensor(group.hyperparams, t));
      for (int64_t begin = 0; begin < t.size; begin += kChunkElements) {
        chunks.push_back({index, begin, std::min(t.size, begin + kChunkElements)});
      }
    }
  }
  const size_t tensor_bytes = AlignUp(tensors.size() * sizeof(DeviceTensor), 256);
  const size_t table_bytes = tensor_bytes + chunks.size() * sizeof(DeviceChunk);
  cudaError_t err = Reserve(table_bytes, chunks.size());
  if (err != cudaSuccess) return err;

  // The last step's copy out of host_table_ must be done before rewriting it.
  if (stepped_ && (err = cudaEventSynchronize(table_copied_)) != cudaSuccess) return err;
  char* host = static_cast<char*>(host_table_);
  std::memcpy(host, tensors.data(), tensors.size() * sizeof(DeviceTensor));
  std::memcpy(host + tensor_bytes, chunks.data(), chunks.size() * sizeof(DeviceChunk));
  if ((err = cudaMemcpyAsync(device_table_, host_table_, table_bytes, cudaMemcpyHostToDevice,
                             stream)) != cudaSuccess ||
      (err = cudaEventRecord(table_copied_, stream)) != cudaSuccess) {
    return err;
  }
  const auto* device_tensors = static_cast<const DeviceTensor*>(device_table_);
  const auto* device_chunks =
      reinterpret_cast<const DeviceChunk*>(static_cast<const char*>(device_table_) + tensor_bytes);
  auto* verdict = static_cast<DeviceVerdict*>(verdict_);
  const unsigned blocks = static_cast<unsigned>(chunks.size());
  if (blocks > 0) {
    SumSquaresKernel<<<blocks, kBlockThreads, 0, stream>>>(device_tensors, device_chunks,
                                                           partials_);
  }
  VerdictKernel<<<1, kFinalizeThreads, 0, stream>>>(partials_, static_cast<int64_t>(chunks.size()),
                                                    options.inv_scale, options.max_grad_norm,
                                                    verdict);
  if (blocks > 0) {
    UpdateKernel<<<blocks, kBlockThreads, 0, stream>>>(device_tensors, device_chunks, verdict);
  }
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  stepped_ = true;
  return cudaEventRecord(step_done_, stream);
}

cudaError_t FusedAdamWCuda::LastResult(AdamWStepResult* result) {
  if (!stepped_) return cudaSuccess;
  cudaError_t err = cudaEventSynchronize(step_done_);
  if (err != cudaSuccess) return err;
  DeviceVerdict v;
  if ((err = cudaMemcpy(&v, verdict_, sizeof(v), cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return err;
  }
  result->applied = v.applied != 0;
  result->grad_norm = v.grad_norm;
  result->clip_coef = v.clip_coef;
  return cudaSuccess;
}

}  // namespace loom::engine
