// overlap: data-parallel gradient averaging overlapped with backward
// (gradient_averager.h) against the same buckets all-reduced after backward,
// on 2 in-process ranks over a real Gloo group on loopback.
//
// Each rank trains a GPT (default 8 layers, d_model 512: 25.6M parameters,
// 4 buckets of 25 MiB) with one intra-op thread. Per step it zeroes the
// gradients, runs forward and backward over one micro-batch, and finishes
// the reduction; "overlapped" arms the averager before backward (buckets go
// out as their gradients complete), "blocking" arms it after backward (every
// bucket goes out in Finish, as a plain all-reduce at the end would). The
// modes alternate step by step so that both see the same machine. Printed:
// median backward, exposed communication (Finish) and step time of each,
// and last
//   overlap: exposed comm <o> ms vs <b> ms blocking, step <so> vs <sb> ms ratio=<sb/so>
//
// Usage: loom_overlap_bench [n_layer=8] [d_model=512] [steps=8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "worker/engine/gpt.h"
#include "worker/engine/gradient_averager.h"
#include "worker/engine/parallel/process_groups.h"

namespace {

using loom::engine::GradientAverager;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct Times {
  std::vector<double> backward, exposed, step;
};

}  // namespace

int main(int argc, char** argv) {
  const int n_layer = argc > 1 ? std::atoi(argv[1]) : 8;
  const int d_model = argc > 2 ? std::atoi(argv[2]) : 512;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 8;
  if (n_layer < 1 || d_model < 64 || d_model % 64 != 0 || steps < 2) {
    std::fprintf(stderr, "usage: loom_overlap_bench [n_layer>=1] [d_model%%64==0] [steps>=2]\n");
    return 1;
  }
  loom::engine::GptConfig config;
  config.n_layer = n_layer;
  config.d_model = d_model;
  config.n_head = d_model / 64;
  config.seq_len = 64;
  config.vocab_size = 256;
  constexpr int kWorld = 2;
  constexpr int kRows = 4;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Times> overlapped(kWorld), blocking(kWorld);
  std::vector<std::optional<loom::engine::ParallelGroups>> kept(kWorld);
  int64_t parameters = 0;
  int buckets = 0;
  std::mutex init;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      torch::set_num_threads(1);
      loom::engine::ParallelGroupOptions options;
      options.local_addr = "127.0.0.1";
      auto groups = loom::engine::CreateParallelGroups(store, rank, {kWorld, 1, 1}, options);
      if (!groups.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, groups.status().ToString().c_str());
        std::exit(1);
      }
      kept[rank].emplace(*std::move(groups));
      loom::engine::Gpt model{nullptr};
      {
        std::lock_guard<std::mutex> lock(init);
        torch::manual_seed(1);
        model = loom::engine::Gpt(config);
      }
      GradientAverager averager(model->parameters(), kept[rank]->world.get());
      if (rank == 0) {
        for (const auto& p : model->parameters()) parameters += p.numel();
        buckets = averager.buckets();
      }
      torch::Tensor x = torch::randint(0, config.vocab_size, {kRows, config.seq_len},
                                       torch::kLong);
      torch::Tensor y = x.roll(-1, 1);
      // Two warm-up steps, then the modes alternate.
      for (int s = 0; s < 2 * steps + 2; ++s) {
        const bool overlap = s % 2 == 0;
        const auto start = std::chrono::steady_clock::now();
        averager.ZeroGradients();
        torch::Tensor loss = model->Loss(x, y);
        auto phase = std::chrono::steady_clock::now();
        if (overlap) averager.Arm();
        loss.backward();
        const double backward = Since(phase);
        if (!overlap) averager.Arm();
        const double exposed = averager.Finish();
        const double step = Since(start);
        if (s < 2) continue;
        Times& t = overlap ? overlapped[rank] : blocking[rank];
        t.backward.push_back(backward);
        t.exposed.push_back(exposed);
        t.step.push_back(step);
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  // Rank 0's medians (the ranks wait for each other in every all-reduce).
  const Times& o = overlapped[0];
  const Times& b = blocking[0];
  std::printf("GPT %d x %d: %.1fM parameters, %d bucket(s), 2 ranks x 1 thread, %d steps each\n",
              n_layer, d_model, parameters / 1e6, buckets, steps);
  std::printf("overlapped: backward %.1f ms, exposed comm %.1f ms, step %.1f ms\n",
              1e3 * Median(o.backward), 1e3 * Median(o.exposed), 1e3 * Median(o.step));
  std::printf("blocking:   backward %.1f ms, exposed comm %.1f ms, step %.1f ms\n",
              1e3 * Median(b.backward), 1e3 * Median(b.exposed), 1e3 * Median(b.step));
  std::printf("overlap: exposed comm %.1f ms vs %.1f ms blocking, step %.1f vs %.1f ms ratio=%.2f\n",
              1e3 * Median(o.exposed), 1e3 * Median(b.exposed), 1e3 * Median(o.step),
              1e3 * Median(b.step), Median(b.step) / Median(o.step));
  return 0;
}
