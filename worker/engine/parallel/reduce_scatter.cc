#include "worker/engine/parallel/reduce_scatter.h"

#include <algorithm>
#include <vector>

#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

// Point-to-point tags of the ring; a group runs one collective at a time,
// so one tag is enough.
constexpr int kRingTag = 0x10a;

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Pieces a chunk travels in: Gloo's point-to-point transfer of one large
// buffer runs far below loopback bandwidth (bench/zero_bench.cc), so each
// step's chunk goes as pieces posted together, which Gloo pipelines.
constexpr int64_t kPieceElements = int64_t{1} << 18;  // 1 MiB of fp32

// Sends flat[send_begin, +size) to `next` and receives `size` elements from
// `previous` into `incoming`, in pieces; waits for both.
void Exchange(c10d::ProcessGroup* group, torch::Tensor& flat, int64_t send_begin,
              torch::Tensor& incoming, int next, int previous) {
  const int64_t size = incoming.numel();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<torch::Tensor>> buffers;
  buffers.reserve(2 * (size / kPieceElements + 1));
  for (int64_t begin = 0; begin < size; begin += kPieceElements) {
    const int64_t n = std::min(kPieceElements, size - begin);
    buffers.push_back({flat.narrow(0, send_begin + begin, n)});
    works.push_back(group->send(buffers.back(), next, kRingTag));
    buffers.push_back({incoming.narrow(0, begin, n)});
    works.push_back(group->recv(buffers.back(), previous, kRingTag));
  }
  for (auto& work : works) work->wait();
}

void RingReduceScatter(torch::Tensor& flat, c10d::ProcessGroup* group, torch::Tensor* scratch) {
  const int n = group->getSize();
  const int r = group->getRank();
  const int64_t chunk = flat.numel() / n;
  const int next = Mod(r + 1, n), previous = Mod(r - 1, n);
  torch::Tensor local;
  if (scratch == nullptr) scratch = &local;
  if (!scratch->defined() || scratch->numel() != chunk ||
      scratch->options().dtype() != flat.options().dtype()) {
    *scratch = torch::empty({chunk}, flat.options());
  }
  torch::Tensor& incoming = *scratch;
  // Step k: send chunk (r - k - 1), receive chunk (r - k - 2) and add into
  // it. After n - 1 steps chunk (r - n) = r holds every rank's sum.
  for (int k = 0; k < n - 1; ++k) {
    Exchange(group, flat, Mod(r - k - 1, n) * chunk, incoming, next, previous);
    flat.narrow(0, Mod(r - k - 2, n) * chunk, chunk).add_(incoming);
  }
}

// The ring all-gather: step k sends chunk (r - k), which this rank owns or
// received at the step before, and receives chunk (r - k - 1).
void RingAllGather(torch::Tensor& flat, c10d::ProcessGroup* group) {
  const int n = group->getSize();
  const int r = group->getRank();
  const int64_t chunk = flat.numel() / n;
  const int next = Mod(r + 1, n), previous = Mod(r - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    torch::Tensor incoming = flat.narrow(0, Mod(r - k - 1, n) * chunk, chunk);
    Exchange(group, flat, Mod(r - k, n) * chunk, incoming, next, previous);
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
                          ReduceScatterAlgorithm algorithm, torch::Tensor* scratch) {
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
        RingReduceScatter(host, group, nullptr);
        flat.copy_(host);
      } else {
        RingReduceScatter(flat, group, scratch);
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
  if (group->getBackendName() == "nccl") {
    const int64_t chunk = flat.numel() / n;
    std::vector<torch::Tensor> in = {flat.narrow(0, group->getRank() * chunk, chunk).clone()};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int i = 0; i < n; ++i) out[0].push_back(flat.narrow(0, i * chunk, chunk));
    group->allgather(out, in)->wait();
    return;
  }
  // Gloo: the ring from send/recv (Gloo's own allgather measured 11x slower
  // than an all-reduce of the same buffer, bench/zero_bench.cc).
  if (!flat.device().is_cpu()) {
    torch::Tensor host = flat.to(torch::kCPU);
    RingAllGather(host, group);
    flat.copy_(host);
  } else {
    RingAllGather(flat, group);
  }
}

}  // namespace loom::engine
