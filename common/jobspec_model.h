// The model a job spec describes: which arm (model.gpt or model.llama) it
// sets, the decoder with the arm's defaults made explicit, and the shape the
// engine, the planner and the telemetry share. Thread-safe.
#ifndef LOOM_COMMON_JOBSPEC_MODEL_H_
#define LOOM_COMMON_JOBSPEC_MODEL_H_

#include <string>

#include "common/model_shape.h"
#include "loom/v1/job.pb.h"

namespace loom {

// "model.gpt" or "model.llama": the model arm the spec sets (model.gpt when
// neither), for field paths in messages.
std::string ModelPath(const loom::v1::ModelSpec& model);

// The decoder the spec describes, model.gpt or model.llama, with the arm's
// defaults made explicit (loom.v1.GptModel): n_kv_head, mlp.gated,
// mlp.hidden, norm, untied_embeddings, positions, bias, rope_theta and
// norm_eps are all set. Idempotent. The engine, the planner and the
// telemetry read the model through it (and ModelShapeOf).
loom::v1::GptModel EffectiveDecoder(const loom::v1::ModelSpec& model);

// True when `model` (effective or not) is GPT-2's shape: what the tensor,
// pipeline and ZeRO engine builds.
bool IsGpt2Shape(const loom::v1::GptModel& model);

// "SwiGLU MLP, RMSNorm, rotary positions, ..." for messages; "GPT-2 shape".
std::string DescribeDecoder(const loom::v1::GptModel& model);

// The spec's model as the shared shape (common/model_shape.h).
ModelShape ModelShapeOf(const loom::v1::ModelSpec& model);

}  // namespace loom

#endif  // LOOM_COMMON_JOBSPEC_MODEL_H_
