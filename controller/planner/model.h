// What is being trained: the transformer's shape and the training recipe, as
// the parallelism planner sees them. Plain structs; the controller converts
// its JobSpec proto into these (loom.v1.GptModel maps onto ModelSpec with the
// GPT defaults below).
//
// Units: counts are plain integers, bytes are bytes, FLOPs are floating-point
// operations (one multiply-add = 2 FLOPs). Everything here is a pure function
// of its arguments and safe to call from any thread.
#ifndef LOOM_CONTROLLER_PLANNER_MODEL_H_
#define LOOM_CONTROLLER_PLANNER_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "common/device_catalog.h"
#include "common/model_shape.h"

namespace loom::planner {

// A decoder-only transformer: the shared description (common/model_shape.h),
// under the planner's names.
using ModelSpec = ::loom::ModelShape;
using ::loom::CountParameters;
using ::loom::FfnHidden;
using ::loom::ForwardFlops;
using ::loom::ForwardFlopsPerSequence;
using ::loom::KvHeads;
using ::loom::ModelFlopsPerStep;
using ::loom::ParameterCount;
inline absl::Status ValidateModel(const ModelSpec& model) {
  return ::loom::ValidateModelShape(model);
}

// Matmul precision: common/device_catalog.h (the catalog's peaks are per
// precision).
using Precision = ::loom::MatmulPrecision;
using ::loom::PrecisionName;
enum class Optimizer { kAdamW, kSgdMomentum };

absl::string_view OptimizerName(Optimizer optimizer);   // "adamw", ...

// How the model is trained.
struct TrainingSpec {
  int64_t global_batch_sequences = 0;  // sequences per optimizer step
  Precision precision = Precision::kBf16;  // matmul precision
  Optimizer optimizer = Optimizer::kAdamW;
  bool fp32_master_weights = true;  // ignored when weights are already fp32
  // Tokens to train for the iron-law estimates (time, device-hours, cost,
  // energy); 0 = report per-step figures only.
  double token_budget = 0;
};

absl::Status ValidateTraining(const TrainingSpec& training);

// Bytes of training state per parameter, before any sharding.
// Mixed-precision Adam (bf16/fp16/fp8 with fp32 master weights): 2 (weights)
// + 2 (gradients) + 4 (master) + 4 + 4 (moments) = 16; fp32 Adam: 4 + 4 + 8
// = 16 (the chapter's GPT-2 XL example, lines 362-369; Rajbhandari et al.
// 2020, ZeRO, Sec. 3.1, K = 12). SGD with momentum keeps one moment (4).
// fp8 keeps 16-bit weights and gradients (Transformer Engine style).
struct StateBytesPerParam {
  double weights = 0;
  double gradients = 0;
  double master_weights = 0;
  double optimizer_states = 0;
  double total() const {
    return weights + gradients + master_weights + optimizer_states;
  }
};
StateBytesPerParam BytesPerParam(const TrainingSpec& training);

// Bytes per stored activation element: 4 for fp32/tf32 training, else 2.
double ActivationBytesPerElement(Precision precision);

// Bytes the optimizer step reads and writes per parameter it updates: the
// chapter (lines 420-430) counts 28 for fp32 Adam (read g, theta, m, v; write
// m, v, theta); mixed Adam also reads 16-bit g and writes 16-bit weights (28);
// SGD-momentum touches three tensors (20).
double OptimizerStepBytesPerParam(const TrainingSpec& training);

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_MODEL_H_
