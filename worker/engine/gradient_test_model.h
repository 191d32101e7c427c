// The model and batches the gradient reducers' tests share
// (gradient_averager_test.cc, parallel/gradient_partitioner_test.cc): a
// 3-block GPT small enough to run several in-process ranks, and per-rank
// batches that differ, so that sums over ranks are not multiples of one.
#ifndef LOOM_WORKER_ENGINE_GRADIENT_TEST_MODEL_H_
#define LOOM_WORKER_ENGINE_GRADIENT_TEST_MODEL_H_

#include <utility>

#include <torch/torch.h>

#include "worker/engine/config.h"

namespace loom::engine::testing {

inline GptConfig SmallGpt() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 64;
  return c;
}

// Rows of rank `rank`'s batch: a deterministic function of (rank, micro).
inline std::pair<torch::Tensor, torch::Tensor> Batch(int rank, int micro, const GptConfig& c) {
  torch::Tensor x = torch::arange(2 * c.seq_len, torch::kLong)
                        .reshape({2, c.seq_len})
                        .mul(7 * rank + 3 * micro + 1)
                        .remainder(c.vocab_size);
  return {x, x.roll(-1, 1)};
}

}  // namespace loom::engine::testing

#endif  // LOOM_WORKER_ENGINE_GRADIENT_TEST_MODEL_H_
