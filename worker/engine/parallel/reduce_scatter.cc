#include "worker/engine/parallel/reduce_scatter.h"

#include <vector>

#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

// Point-to-point tags of the ring; a group runs one collective at a time,
// so one tag is enough.
constexpr int kRingTag = 0x10a;

int Mod(int a, int n) { return ((a % n) + n) % n; }

void RingReduceScatter(torch::Tensor& flat, c10d::ProcessGroup* group) {
  const int n = group->getSize();
  const int r = group->getRank();
  const int64_t chunk = flat.numel() / n;
  const int next = Mod(r + 1, n), previous = Mod(r - 1, n);
  torch::Tensor incoming = torch::empty({chunk}, flat.options());
  // Step k: send chunk (r - k - 1), receive chunk (r - k - 2) and add into
  // it. After n - 1 steps chunk (r - n) = r holds every rank's sum.
  for (int k = 0; k < n - 1; ++k) {
    std::vector<torch::Tensor> out = {flat.narrow(0, Mod(r - k - 1, n) * chunk, chunk)};
    std::vector<torch::Tensor> in = {incoming};
    auto sent = group->send(out, next, kRingTag);
    auto received = group->recv(in, previous, kRingTag);
    received->wait();
    sent->wait();
    flat.narrow(0, Mod(r - k - 2, n) * chunk, chunk).add_(incoming);
  }
}

}  // namespace

const char* ReduceScatterAlgorithmName(ReduceScatterAlgorithm algorithm) {
  switch (algorithm) {
    case ReduceScatterAlgorithm::kAuto:
      return "auto";
    case ReduceScatterAlgorithm::kNative:
      return "native";
    case ReduceScatterAlgorithm::kRing:
      return "ring";
    case ReduceScatterAlgorithm::kAllReduce:
      return "all-reduce";
  }
  return "unknown";
}

void ReduceScatterInPlace(torch::Tensor& flat, c10d::ProcessGroup* group,
                          ReduceScatterAlgorithm algorithm) {
  if (group == nullptr || group->getSize() == 1) return;
  torch::NoGradGuard no_grad;
  const int n = group->getSize();
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.numel() % n == 0,
              "ReduceScatterInPlace needs a contiguous 1-D buffer of a multiple of ", n,
              " elements, got ", flat.sizes());
  const bool nccl = group->getBackendName() == "nccl";
  if (algorithm == ReduceScatterAlgorithm::kAuto) {
    algorithm = nccl ? ReduceScatterAlgorithm::kNative : ReduceScatterAlgorithm::kRing;
  }
  switch (algorithm) {
    case ReduceScatterAlgorithm::kNative: {
      const int64_t chunk = flat.numel() / n;
      std::vector<torch::Tensor> out = {torch::empty({chunk}, flat.options())};
      std::vector<std::vector<torch::Tensor>> in(1);
      for (int i = 0; i < n; ++i) in[0].push_back(flat.narrow(0, i * chunk, chunk));
      group->reduce_scatter(out, in)->wait();
      flat.narrow(0, group->getRank() * chunk, chunk).copy_(out[0]);
      return;
    }
    case ReduceScatterAlgorithm::kRing:
      if (!nccl && !flat.device().is_cpu()) {
        torch::Tensor host = flat.to(torch::kCPU);
        RingReduceScatter(host, group);
        flat.copy_(host);
      } else {
        RingReduceScatter(flat, group);
      }
      return;
    case ReduceScatterAlgorithm::kAllReduce:
    case ReduceScatterAlgorithm::kAuto:
      AllReduceInPlace(flat, group);
      return;
  }
}

void AllGatherInPlace(torch::Tensor& flat, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return;
  torch::NoGradGuard no_grad;
  const int n = group->getSize();
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.numel() % n == 0,
              "AllGatherInPlace needs a contiguous 1-D buffer of a multiple of ", n,
              " elements, got ", flat.sizes());
  const bool stage = group->getBackendName() != "nccl" && !flat.device().is_cpu();
  torch::Tensor buffer = stage ? flat.to(torch::kCPU) : flat;
  const int64_t chunk = buffer.numel() / n;
  std::vector<torch::Tensor> in = {buffer.narrow(0, group->getRank() * chunk, chunk).clone()};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int i = 0; i < n; ++i) out[0].push_back(buffer.narrow(0, i * chunk, chunk));
  group->allgather(out, in)->wait();
  if (stage) flat.copy_(buffer);
}

}  // namespace loom::engine
