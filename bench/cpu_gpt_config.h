// The GPT configuration the CPU training benchmarks share (as measured on
// these machines): 4 layers, 4 heads, d_model 256, seq 256, vocab 50304, global
// batch = micro-batch = 8 sequences, AdamW (lr 3e-4 held constant, betas
// 0.9/0.95, eps 1e-8, weight decay 0.1), clipping at 1.0, no dropout, no
// validation. Used by train_bench.cc and loader_bench.cc.
#ifndef LOOM_BENCH_CPU_GPT_CONFIG_H_
#define LOOM_BENCH_CPU_GPT_CONFIG_H_

#include <cstdint>

#include "worker/engine/trainer.h"

namespace loom::bench {

inline loom::engine::TrainerConfig CpuBenchGptConfig(int64_t steps) {
  loom::engine::TrainerConfig c;
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.d_model = 256;
  c.model.seq_len = 256;
  c.model.vocab_size = 50304;
  c.model.dropout = 0.0;
  c.optimizer.lr = 3e-4;
  c.optimizer.beta1 = 0.9;
  c.optimizer.beta2 = 0.95;
  c.optimizer.eps = 1e-8;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.grad_clip = 1.0;
  // Constant learning rate (no warm-up, min_lr = max_lr), so the PyTorch
  // side needs no schedule to do the same optimizer work.
  c.schedule.total_steps = steps;
  c.schedule.warmup_steps = 0;
  c.schedule.min_lr_ratio = 1.0;
  c.global_batch = 8;
  c.micro_batch = 8;
  c.seed = 1;
  c.eval_batches = 0;
  c.log_interval = 1;
  return c;
}

}  // namespace loom::bench

#endif  // LOOM_BENCH_CPU_GPT_CONFIG_H_
