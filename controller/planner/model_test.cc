#include "controller/planner/model.h"

#include <cmath>

#include "controller/planner/test_models.h"
#include "gtest/gtest.h"

namespace loom::planner {
namespace {

using test_models::Gpt2Xl;
using test_models::Gpt7B;
using test_models::kMegatronRows;
using test_models::Llama2_70B;
using test_models::MegatronGpt;

// The chapter's worked examples (lines 362-369 and the 7B/20B figures):
// exact within 1%.
TEST(BytesPerParamTest, Gpt2XlFp32AdamIs24GbStatic) {
  TrainingSpec training;
  training.precision = Precision::kFp32;
  const StateBytesPerParam bytes = BytesPerParam(training);
  const double params = 1.5e9;
  EXPECT_NEAR(params * bytes.weights, 6e9, 0.01 * 6e9);
  EXPECT_NEAR(params * bytes.gradients, 6e9, 0.01 * 6e9);
  EXPECT_NEAR(params * (bytes.master_weights + bytes.optimizer_states), 12e9, 0.01 * 12e9);
  EXPECT_NEAR(params * bytes.total(), 24e9, 0.01 * 24e9);
  EXPECT_EQ(bytes.total(), 16);  // 4 + 4 + 8
}

TEST(BytesPerParamTest, SevenBMixedPrecisionAdamIs112Gb) {
  TrainingSpec training;
  training.precision = Precision::kBf16;
  const StateBytesPerParam bytes = BytesPerParam(training);
  const double params = 7e9;
  EXPECT_NEAR(params * bytes.weights, 14e9, 0.01 * 14e9);
  EXPECT_NEAR(params * bytes.gradients, 14e9, 0.01 * 14e9);
  EXPECT_NEAR(params * bytes.master_weights, 28e9, 0.01 * 28e9);
  EXPECT_NEAR(params * bytes.optimizer_states, 56e9, 0.01 * 56e9);
  EXPECT_NEAR(params * bytes.total(), 112e9, 0.01 * 112e9);
  EXPECT_EQ(bytes.total(), 16);  // 2 + 2 + 4 + 4 + 4
}

TEST(BytesPerParamTest, TwentyBMixedPrecisionAdamIs320Gb) {
  TrainingSpec training;
  training.precision = Precision::kFp16;
  EXPECT_NEAR(20e9 * BytesPerParam(training).total(), 320e9, 0.01 * 320e9);
}

TEST(BytesPerParamTest, SgdMomentumAndNoMasterWeights) {
  TrainingSpec training;
  training.optimizer = Optimizer::kSgdMomentum;
  EXPECT_EQ(BytesPerParam(training).total(), 2 + 2 + 4 + 4);
  training.fp32_master_weights = false;
  EXPECT_EQ(BytesPerParam(training).total(), 2 + 2 + 4);
  training.precision = Precision::kFp32;
  EXPECT_EQ(BytesPerParam(training).total(), 4 + 4 + 4);
}

TEST(CountParametersTest, Gpt2XlMatchesTheReleasedCheckpoint) {
  EXPECT_EQ(CountParameters(Gpt2Xl()).total, 1557611200);
}

TEST(CountParametersTest, Llama2With8KvHeadsMatchesTheReleasedCheckpoint) {
  const ParameterCount count = CountParameters(Llama2_70B());
  EXPECT_EQ(count.total, 68976648192);
  EXPECT_EQ(count.output_head, 32000 * 8192);  // untied
  EXPECT_EQ(count.position_embedding, 0);      // rotary
}

TEST(CountParametersTest, GqaShrinksOnlyKeyAndValueProjections) {
  ModelSpec mha = MegatronGpt("mha", 2, 1024, 16);
  ModelSpec gqa = mha;
  gqa.n_kv_head = 4;
  gqa.bias = false;
  mha.bias = false;
  // K and V go from h x h to h x h/4 each.
  EXPECT_EQ(CountParameters(mha).per_layer_matmul - CountParameters(gqa).per_layer_matmul,
            2 * (1024 * 1024 - 1024 * 256));
}

TEST(CountParametersTest, FfnMultiplierSetsTheMlpWidth) {
  ModelSpec model = MegatronGpt("ffn", 1, 1000, 10);
  model.ffn_multiplier = 2.5;
  EXPECT_EQ(FfnHidden(model), 2500);
  model.ffn_hidden = 1234;
  EXPECT_EQ(FfnHidden(model), 1234);
}

TEST(CountParametersTest, MegatronRowsMatchTheClosedFormAndTable1) {
  // Narayanan et al. 2021: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).
  const double published[] = {18.4e9, 145.6e9, 529.6e9, 1008e9};
  int i = 0;
  for (const auto& row : kMegatronRows) {
    const ModelSpec model = MegatronGpt(row.name, row.layers, row.hidden, row.heads);
    const double l = row.layers, h = row.hidden;
    const double closed = 12 * l * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * l * h));
    const double total = static_cast<double>(CountParameters(model).total);
    EXPECT_NEAR(total, closed, 1e-4 * closed) << row.name;
    EXPECT_NEAR(total, published[i], 0.01 * published[i]) << row.name;
    ++i;
  }
}

TEST(ModelFlopsTest, MatchesNarayananEquation) {
  // 72 B s l h^2 (1 + s/(6h) + V/(12 l h)), Narayanan et al. 2021,
  // Sec. 5.1
  // without the recompute pass.
  for (const auto& row : kMegatronRows) {
    const ModelSpec model = MegatronGpt(row.name, row.layers, row.hidden, row.heads);
    const double b = row.batch, s = 2048, l = row.layers, h = row.hidden, v = 51200;
    const double expected = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
    EXPECT_NEAR(ModelFlopsPerStep(model, row.batch), expected, 1e-9 * expected) << row.name;
  }
}

TEST(ModelFlopsTest, CloseToSixPD) {
  // For a large model the 6PD rule and the detailed count agree within a
  // few percent (the attention term s/(6h) is the difference).
  const ModelSpec model = Gpt7B();
  const double tokens = 1024.0 * 2048;
  const double six_pd = 6.0 * static_cast<double>(CountParameters(model).total) * tokens;
  EXPECT_NEAR(ModelFlopsPerStep(model, 1024), six_pd, 0.1 * six_pd);
}

TEST(ValidateModelTest, ReportsTheFieldPath) {
  ModelSpec model = MegatronGpt("bad", 2, 768, 5);
  EXPECT_EQ(ValidateModel(model).message(), "model.n_head: 5 does not divide model.d_model 768");
  model.n_head = 12;
  model.n_kv_head = 5;
  EXPECT_EQ(ValidateModel(model).message(), "model.n_kv_head: 5 does not divide model.n_head 12");
  model.n_kv_head = 0;
  model.seq_len = 0;
  EXPECT_EQ(ValidateModel(model).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateModel(model).message(), "model.seq_len: must be >= 1");
  model.seq_len = 16;
  EXPECT_TRUE(ValidateModel(model).ok());
}

TEST(ValidateTrainingTest, NeedsABatch) {
  TrainingSpec training;
  EXPECT_EQ(ValidateTraining(training).message(), "training.global_batch_sequences: must be >= 1");
  training.global_batch_sequences = 8;
  EXPECT_TRUE(ValidateTraining(training).ok());
}

}  // namespace
}  // namespace loom::planner
