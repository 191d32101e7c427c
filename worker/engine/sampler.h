// Text generation from a trained model (`loomctl sample`): autoregressive
// decoding with a key/value cache (GptImpl::ForwardCached), temperature and
// top-k sampling from a seeded generator, so a given checkpoint, prompt and
// seed always give the same tokens.
#ifndef LOOM_WORKER_ENGINE_SAMPLER_H_
#define LOOM_WORKER_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/gpt.h"

namespace loom::engine {

struct SampleOptions {
  int max_new_tokens = 64;  // >= 1
  // Softmax temperature; 0 = greedy (the most likely token each step).
  double temperature = 0.8;
  // Sample among the k most likely tokens; 0 = the whole vocabulary.
  int top_k = 40;
  uint64_t seed = 1;
};

// The `max_new_tokens` tokens that follow `prompt` (ids in [0, vocab_size),
// at least one). The prompt is run once (prefill), then one token per step
// through the cache. When the context reaches seq_len, the newest
// seq_len / 2 tokens are run again as a fresh prefill and decoding goes on
// (a sliding window: the model never sees positions past its seq_len).
// INVALID_ARGUMENT for an empty prompt, an id out of range or bad options.
absl::StatusOr<std::vector<int>> Generate(Gpt& model, const std::vector<int>& prompt,
                                          const SampleOptions& options);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_SAMPLER_H_
