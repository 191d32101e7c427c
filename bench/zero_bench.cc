// What sharded data parallelism's collectives cost on Gloo:
// LibTorch 1.13's Gloo has no reduce_scatter,
// so Loom builds a ring one from send/recv (reduce_scatter.h). Measured in
// one run on the same ranks (threads of this process over loopback) and
// the same gradient buffer:
//   * data parallelism's all-reduce of the whole buffer (the baseline);
//   * ZeRO's exchange built as Loom does it: ring reduce-scatter + ring
//     all-gather of the updated parameters, both from Gloo's send/recv;
//   * the fallback: all-reduce, keep a slice (then all-gather).
// A ring reduce-scatter moves (n-1)/n of the buffer per rank, half of an
// all-reduce's 2(n-1)/n, and the all-gather moves the other half: so ZeRO's
// exchange should cost about one all-reduce. The last line is
//   zero: ring reduce-scatter + all-gather <ms> vs all-reduce <ms> ratio=<zero/all-reduce>
// Usage: loom_zero_bench [elements=25000000] [ranks=2] [rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/reduce_scatter.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace {

using loom::engine::AllGatherInPlace;
using loom::engine::AllReduceInPlace;
using loom::engine::ReduceScatterAlgorithm;
using loom::engine::ReduceScatterInPlace;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Timings {
  double all_reduce = 1e30, ring_rs = 1e30, ring_ag = 1e30, fallback_rs = 1e30,
         owner_reduce = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t elements = argc > 1 ? std::atoll(argv[1]) : 25'000'000;
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 2;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (elements < ranks || ranks < 2 || rounds < 1) {
    std::fprintf(stderr, "usage: loom_zero_bench [elements] [ranks >= 2] [rounds >= 1]\n");
    return 2;
  }
  torch::set_num_threads(1);
  const int64_t padded = (elements + ranks - 1) / ranks * ranks;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Timings> timings(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        loom::engine::ParallelGroupOptions options;
        options.local_addr = "127.0.0.1";
        auto groups = loom::engine::CreateParallelGroups(store, rank,
                                                         loom::ParallelLayout{ranks, 1, 1}, options);
        if (!groups.ok()) {
          errors[rank] = groups.status().ToString();
          return;
        }
        c10d::ProcessGroup* group = groups->data.get();
        torch::Tensor buffer = torch::rand({padded});
        torch::Tensor scratch;  // kept, as ShardedAdamW keeps its own
        Timings& t = timings[rank];
        // Each measurement starts together: a barrier-like all-reduce of one
        // element first, so no rank's wait for a late peer is counted.
        auto sync = [&] {
          torch::Tensor one = torch::ones({1});
          AllReduceInPlace(one, group);
        };
        for (int round = 0; round < rounds; ++round) {
          sync();
          double start = Now();
          AllReduceInPlace(buffer, group);
          t.all_reduce = std::min(t.all_reduce, Now() - start);
          sync();
          start = Now();
          ReduceScatterInPlace(buffer, group, ReduceScatterAlgorithm::kRing, &scratch);
          t.ring_rs = std::min(t.ring_rs, Now() - start);
          sync();
          start = Now();
          AllGatherInPlace(buffer, group);
          t.ring_ag = std::min(t.ring_ag, Now() - start);
          sync();
          start = Now();
          ReduceScatterInPlace(buffer, group, ReduceScatterAlgorithm::kAllReduce);
          t.fallback_rs = std::min(t.fallback_rs, Now() - start);
          buffer.uniform_();  // keep the sums finite
          // ZeRO-2's exchange (gradient_partitioner.h): each shard's range
          // reduced to its owner, all launched at once.
          sync();
          start = Now();
          {
            std::vector<c10::intrusive_ptr<c10d::Work>> works;
            const int64_t shard = padded / ranks;
            for (int owner = 0; owner < ranks; ++owner) {
              std::vector<torch::Tensor> part = {buffer.narrow(0, owner * shard, shard)};
              c10d::ReduceOptions reduce;
              reduce.rootRank = owner;
              works.push_back(group->reduce(part, reduce));
            }
            for (auto& w : works) w->wait();
          }
          t.owner_reduce = std::min(t.owner_reduce, Now() - start);
          buffer.uniform_();
        }
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < ranks; ++rank) {
    if (!errors[rank].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, errors[rank].c_str());
      return 1;
    }
  }
  // The slowest rank sets the pace of a collective.
  Timings worst{0, 0, 0, 0, 0};
  for (const Timings& t : timings) {
    worst.all_reduce = std::max(worst.all_reduce, t.all_reduce);
    worst.ring_rs = std::max(worst.ring_rs, t.ring_rs);
    worst.ring_ag = std::max(worst.ring_ag, t.ring_ag);
    worst.fallback_rs = std::max(worst.fallback_rs, t.fallback_rs);
    worst.owner_reduce = std::max(worst.owner_reduce, t.owner_reduce);
  }
  const double mb = padded * 4.0 / 1e6;
  std::printf("buffer %.1f MB fp32 over %d Gloo ranks (loopback), best of %d rounds\n", mb, ranks,
              rounds);
  std::printf("all-reduce (data parallelism)          %8.1f ms  %6.2f GB/s bus\n",
              worst.all_reduce * 1e3, 2.0 * (ranks - 1) / ranks * mb / 1e3 / worst.all_reduce);
  std::printf("ring reduce-scatter (send/recv)        %8.1f ms  %6.2f GB/s bus\n",
              worst.ring_rs * 1e3, 1.0 * (ranks - 1) / ranks * mb / 1e3 / worst.ring_rs);
  std::printf("ring all-gather (send/recv)             %8.1f ms\n", worst.ring_ag * 1e3);
  std::printf("fallback reduce-scatter (all-reduce)   %8.1f ms\n", worst.fallback_rs * 1e3);
  std::printf("reduce to each shard's owner (ZeRO-2) %8.1f ms\n", worst.owner_reduce * 1e3);
  std::printf("ring reduce-scatter / fallback: %.2f\n", worst.ring_rs / worst.fallback_rs);
  const double zero = worst.ring_rs + worst.ring_ag;
  std::printf("zero: ring reduce-scatter + all-gather %.1f ms vs all-reduce %.1f ms ratio=%.3f\n",
              zero * 1e3, worst.all_reduce * 1e3, zero / worst.all_reduce);
  return 0;
}
