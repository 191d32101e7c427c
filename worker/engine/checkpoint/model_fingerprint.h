// The model a checkpoint was written for, as the string its manifest keeps
// (CheckpointShape::model, common/formats/checkpoint_files.h): a checkpoint
// resumes only under the same fingerprint.
#ifndef LOOM_WORKER_ENGINE_CHECKPOINT_MODEL_FINGERPRINT_H_
#define LOOM_WORKER_ENGINE_CHECKPOINT_MODEL_FINGERPRINT_H_

#include <string>

#include "worker/engine/config.h"

namespace loom::engine {

// "n_layer=2,n_head=2,d_model=64,seq_len=64,vocab_size=256".
std::string ModelFingerprint(const GptConfig& config);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_CHECKPOINT_MODEL_FINGERPRINT_H_
