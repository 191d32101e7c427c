#include "common/model_shape.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loom {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

}  // namespace

int64_t FfnHidden(const ModelShape& model) {
  if (model.ffn_hidden > 0) return model.ffn_hidden;
  return static_cast<int64_t>(
      std::llround(model.ffn_multiplier * static_cast<double>(model.d_model)));
}

int64_t KvHeads(const ModelShape& model) {
  return model.n_kv_head > 0 ? model.n_kv_head : model.n_head;
}

absl::Status ValidateModelShape(const ModelShape& model) {
  if (model.n_layer < 1) return Invalid("model.n_layer", "must be >= 1");
  if (model.d_model < 1) return Invalid("model.d_model", "must be >= 1");
  if (model.n_head < 1) return Invalid("model.n_head", "must be >= 1");
  if (model.d_model % model.n_head != 0) {
    return Invalid("model.n_head",
                   absl::StrCat(model.n_head, " does not divide model.d_model ",
                                model.d_model));
  }
  if (model.n_kv_head < 0) return Invalid("model.n_kv_head", "must be >= 0");
  if (model.n_kv_head > 0 && model.n_head % model.n_kv_head != 0) {
    return Invalid("model.n_kv_head",
                   absl::StrCat(model.n_kv_head, " does not divide model.n_head ",
                                model.n_head));
  }
  if (model.ffn_hidden < 0) return Invalid("model.ffn_hidden", "must be >= 0");
  if (model.ffn_hidden == 0 &&
      !(std::isfinite(model.ffn_multiplier) && model.ffn_multiplier > 0)) {
    return Invalid("model.ffn_multiplier", "must be a finite number > 0");
  }
  if (model.vocab_size < 1) return Invalid("model.vocab_size", "must be >= 1");
  if (model.seq_len < 1) return Invalid("model.seq_len", "must be >= 1");
  return absl::OkStatus();
}

ParameterCount CountParameters(const ModelShape& model) {
  const int64_t h = model.d_model;
  const int64_t f = FfnHidden(model);
  const int64_t h_kv = h * KvHeads(model) / model.n_head;
  ParameterCount count;
  const int64_t attention = 2 * h * h + 2 * h * h_kv;
  const int64_t mlp = (model.gated_mlp ? 3 : 2) * h * f;
  count.per_layer_matmul = attention + mlp;
  int64_t biases = 0;
  if (model.bias) {
    biases = (h + 2 * h_kv) + h;                       // QKV and output
    biases += (model.gated_mlp ? 2 * f : f) + h;       // MLP in and out
  }
  const int64_t norm = model.rms_norm ? h : 2 * h;     // one norm's params
  count.per_layer_norm = 2 * norm;
  count.per_layer = count.per_layer_matmul + biases + count.per_layer_norm;
  count.word_embedding = model.vocab_size * h;
  count.position_embedding =
      model.learned_position_embedding ? model.seq_len * h : 0;
  count.output_head = model.tied_embeddings ? 0 : model.vocab_size * h;
  count.final_norm = norm;
  count.total = model.n_layer * count.per_layer + count.word_embedding +
                count.position_embedding + count.output_head + count.final_norm;
  return count;
}

ForwardFlops ForwardFlopsPerSequence(const ModelShape& model) {
  const double s = static_cast<double>(model.seq_len);
  const double h = static_cast<double>(model.d_model);
  const double v = static_cast<double>(model.vocab_size);
  const ParameterCount count = CountParameters(model);
  ForwardFlops flops;
  // Narayanan et al. 2021, Sec. 5.1: QK^T and (softmax) x V are each
  // 2 s^2 h per sequence, whatever the number of KV heads.
  flops.attention_scores = 4.0 * s * s * h;
  flops.per_layer =
      2.0 * static_cast<double>(count.per_layer_matmul) * s + flops.attention_scores;
  flops.logits = 2.0 * s * h * v;
  return flops;
}

double ModelFlopsPerStep(const ModelShape& model, int64_t global_batch_sequences) {
  const ForwardFlops forward = ForwardFlopsPerSequence(model);
  // Backward is twice the forward (two matmuls per forward matmul), so a
  // step is 3x forward (the chapter, lines 440-446).
  return 3.0 * static_cast<double>(global_batch_sequences) *
         (static_cast<double>(model.n_layer) * forward.per_layer + forward.logits);
}

double ModelFlopsPerToken(const ModelShape& model) {
  return ModelFlopsPerStep(model, 1) / static_cast<double>(model.seq_len);
}

}  // namespace loom
