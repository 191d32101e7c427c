#include "worker/engine/sampler.h"

#include <algorithm>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

torch::Tensor ToIds(const std::vector<int>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return torch::tensor(wide, torch::kLong).view({1, static_cast<int64_t>(wide.size())});
}

}  // namespace

absl::StatusOr<std::vector<int>> Generate(Gpt& model, const std::vector<int>& prompt,
                                          const SampleOptions& options) {
  const GptConfig& config = model->config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  for (int id : prompt) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token ", id, " is outside the model's vocabulary of ", config.vocab_size));
    }
  }
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError("--tokens must be >= 1");
  }
  if (!(options.temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (options.top_k < 0) return absl::InvalidArgumentError("--top-k must be >= 0");
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Generator generator = at::detail::createCPUGenerator(options.seed);

  std::vector<int> context(prompt);
  // Only the newest tokens fit the window.
  const size_t window = static_cast<size_t>(config.seq_len);
  auto prefill = [&](KvCache* cache) {
    *cache = KvCache();
    // All of the context while it fits, else its newest half window.
    const size_t keep =
        context.size() <= window ? context.size() : std::max<size_t>(1, window / 2);
    const std::vector<int> tail(context.end() - static_cast<std::ptrdiff_t>(keep), context.end());
    return model->ForwardCached(ToIds(tail), cache);
  };
  KvCache cache;
  torch::Tensor logits = prefill(&cache);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(options.max_new_tokens));
  while (static_cast<int>(out.size()) < options.max_new_tokens) {
    torch::Tensor last = logits.select(1, logits.size(1) - 1).squeeze(0).to(torch::kDouble);
    int next = 0;
    if (options.temperature == 0) {
      next = static_cast<int>(last.argmax().item<int64_t>());
    } else {
      last = last / options.temperature;
      if (options.top_k > 0 && options.top_k < last.size(0)) {
        const torch::Tensor kth = std::get<0>(last.topk(options.top_k)).min();
        last = last.masked_fill(last < kth, -std::numeric_limits<double>::infinity());
      }
      const torch::Tensor probs = torch::softmax(last, -1);
      next = static_cast<int>(torch::multinomial(probs, 1, false, generator).item<int64_t>());
    }
    out.push_back(next);
    context.push_back(next);
    if (static_cast<int>(out.size()) == options.max_new_tokens) break;
    if (cache.length + 1 > config.seq_len) {
      logits = prefill(&cache);  // slide the window
    } else {
      logits = model->ForwardCached(ToIds({next}), &cache);
    }
  }
  return out;
}

}  // namespace loom::engine
