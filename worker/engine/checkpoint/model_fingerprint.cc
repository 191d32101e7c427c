#include "worker/engine/checkpoint/model_fingerprint.h"

#include "absl/strings/str_cat.h"

namespace loom::engine {

std::string ModelFingerprint(const GptConfig& c) {
  std::string f = absl::StrCat("n_layer=", c.n_layer, ",n_head=", c.n_head, ",d_model=", c.d_model,
                               ",seq_len=", c.seq_len, ",vocab_size=", c.vocab_size);
  // GPT-2's shape keeps the fingerprint it always had (so its checkpoints
  // stay loadable); every other member of the family names its knobs.
  if (!IsGpt2Shape(c)) {
    absl::StrAppend(&f, ",n_kv_head=", KvHeads(c), ",ffn_hidden=", FfnHidden(c),
                    ",gated_mlp=", c.gated_mlp ? 1 : 0, ",bias=", c.bias ? 1 : 0,
                    ",rms_norm=", c.rms_norm ? 1 : 0, ",rotary=", c.rotary ? 1 : 0,
                    ",tied_embeddings=", c.tied_embeddings ? 1 : 0, ",rope_theta=", c.rope_theta,
                    ",norm_eps=", c.norm_eps);
  }
  return f;
}

}  // namespace loom::engine
