#include "common/jobspec_model.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom {

std::string ModelPath(const v1::ModelSpec& model) {
  return model.has_llama() ? "model.llama" : "model.gpt";
}

v1::GptModel EffectiveDecoder(const v1::ModelSpec& model) {
  const bool llama = model.has_llama();
  v1::GptModel m = llama ? model.llama() : model.gpt();
  if (m.n_kv_head() == 0) m.set_n_kv_head(m.n_head());
  v1::GptMlp* mlp = m.mutable_mlp();
  if (!mlp->has_gated()) mlp->set_gated(llama);
  if (!mlp->has_hidden()) {
    const int64_t d = m.d_model();
    // SwiGLU's three matrices of 8d/3 hold as many parameters as GELU's two
    // of 4d (Shazeer 2020); Llama rounds the width up (to 256, here 64 so
    // that small models stay small).
    const int64_t hidden = llama ? (8 * d / 3 + 63) / 64 * 64 : 4 * d;
    mlp->set_hidden(static_cast<int32_t>(std::min<int64_t>(hidden, INT32_MAX)));
  }
  if (m.norm() == v1::GptModel::NORM_UNSPECIFIED) {
    m.set_norm(llama ? v1::GptModel::RMSNORM : v1::GptModel::LAYERNORM);
  }
  if (!m.has_untied_embeddings()) m.set_untied_embeddings(llama);
  if (m.positions() == v1::GptModel::POSITIONS_UNSPECIFIED) {
    m.set_positions(llama ? v1::GptModel::ROTARY : v1::GptModel::LEARNED);
  }
  if (!m.has_bias()) m.set_bias(!llama);
  if (m.rope_theta() == 0) m.set_rope_theta(10000);
  if (m.norm_eps() == 0) m.set_norm_eps(1e-5);
  return m;
}

bool IsGpt2Shape(const v1::GptModel& m) {
  return (m.n_kv_head() == 0 || m.n_kv_head() == m.n_head()) && !m.mlp().gated() &&
         (!m.mlp().has_hidden() || int64_t{m.mlp().hidden()} == 4 * int64_t{m.d_model()}) &&
         m.norm() != v1::GptModel::RMSNORM && !m.untied_embeddings() &&
         m.positions() != v1::GptModel::ROTARY && (!m.has_bias() || m.bias()) &&
         (m.norm_eps() == 0 || m.norm_eps() == 1e-5);
}

std::string DescribeDecoder(const v1::GptModel& m) {
  std::vector<std::string> parts;
  if (m.n_kv_head() != 0 && m.n_kv_head() != m.n_head()) {
    parts.push_back(absl::StrCat("grouped-query attention, ", m.n_kv_head(), " key/value heads"));
  }
  if (m.mlp().gated()) parts.push_back("SwiGLU MLP");
  if (m.mlp().has_hidden() && int64_t{m.mlp().hidden()} != 4 * int64_t{m.d_model()}) {
    parts.push_back(absl::StrCat("MLP width ", m.mlp().hidden()));
  }
  if (m.norm() == v1::GptModel::RMSNORM) parts.push_back("RMSNorm");
  if (m.positions() == v1::GptModel::ROTARY) parts.push_back("rotary positions");
  if (m.has_bias() && !m.bias()) parts.push_back("no biases");
  if (m.untied_embeddings()) parts.push_back("untied embeddings");
  if (parts.empty()) return "GPT-2 shape";
  return absl::StrJoin(parts, ", ");
}

ModelShape ModelShapeOf(const v1::ModelSpec& model) {
  const v1::GptModel m = EffectiveDecoder(model);
  ModelShape shape;
  shape.name = model.has_llama() ? "llama" : "gpt";
  shape.n_layer = m.n_layer();
  shape.d_model = m.d_model();
  shape.n_head = m.n_head();
  shape.n_kv_head = m.n_kv_head();
  shape.ffn_hidden = m.mlp().hidden();
  shape.vocab_size = m.vocab_size();
  shape.seq_len = m.seq_len();
  shape.gated_mlp = m.mlp().gated();
  shape.bias = m.bias();
  shape.rms_norm = m.norm() == v1::GptModel::RMSNORM;
  shape.learned_position_embedding = m.positions() != v1::GptModel::ROTARY;
  shape.tied_embeddings = !m.untied_embeddings();
  return shape;
}

}  // namespace loom
