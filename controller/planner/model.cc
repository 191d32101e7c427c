#include "controller/planner/model.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::planner {

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

}  // namespace

absl::string_view OptimizerName(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kAdamW: return "adamw";
    case Optimizer::kSgdMomentum: return "sgd-momentum";
  }
  return "?";
}

absl::Status ValidateTraining(const TrainingSpec& training) {
  if (training.global_batch_sequences < 1) {
    return Invalid("training.global_batch_sequences", "must be >= 1");
  }
  if (!(std::isfinite(training.token_budget) && training.token_budget >= 0)) {
    return Invalid("training.token_budget", "must be a finite number >= 0");
  }
  return absl::OkStatus();
}

namespace {

bool IsFullPrecision(Precision precision) {
  return precision == Precision::kFp32 || precision == Precision::kTf32;
}

}  // namespace

StateBytesPerParam BytesPerParam(const TrainingSpec& training) {
  StateBytesPerParam bytes;
  const double moments = training.optimizer == Optimizer::kAdamW ? 8.0 : 4.0;
  if (IsFullPrecision(training.precision)) {
    bytes.weights = 4;
    bytes.gradients = 4;
    bytes.master_weights = 0;  // the weights are the master copy
  } else {
    bytes.weights = 2;
    bytes.gradients = 2;
    bytes.master_weights = training.fp32_master_weights ? 4 : 0;
  }
  bytes.optimizer_states = moments;  // moments are kept in fp32
  return bytes;
}

double ActivationBytesPerElement(Precision precision) {
  return IsFullPrecision(precision) ? 4.0 : 2.0;
}

double OptimizerStepBytesPerParam(const TrainingSpec& training) {
  return training.optimizer == Optimizer::kAdamW ? 28.0 : 20.0;
}

}  // namespace loom::planner
