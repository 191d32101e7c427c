// The Hugging Face export check: a model exported in Hugging Face's layout
// (hf_export.h) is read back by an independent reader written from the
// published formats (tests/export/hf_logits.py, Debian's python3-torch),
// whose logits for a prompt equal Loom's within 1e-4, for GPT-2 and for a
// Llama-family model with grouped-query attention.
#include "worker/engine/hf_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/gpt.h"

namespace loom::engine {
namespace {

using ::testing::HasSubstr;

std::string Run(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

std::map<std::string, torch::Tensor> ParamsOf(Gpt& model) {
  std::map<std::string, torch::Tensor> p;
  for (const auto& item : model->named_parameters()) p[item.key()] = item.value().detach();
  return p;
}

GptConfig Gpt2() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 96;
  return c;
}

GptConfig Llama() {
  GptConfig c = Gpt2();
  c.n_kv_head = 2;
  c.ffn_hidden = 64;
  c.gated_mlp = true;
  c.bias = false;
  c.rms_norm = true;
  c.rotary = true;
  c.tied_embeddings = false;
  c.rope_theta = 500000;  // Llama 3's base, so the reader's theta is really read
  c.norm_eps = 1e-6;
  return c;
}

// Loom's own logits and the reader's, for the same prompt.
void CheckExport(const GptConfig& c, const char* arch) {
  torch::manual_seed(3);
  Gpt model(c);
  model->eval();
  // Random weights are far from init: perturb biases and norms too, so a
  // reader that ignored them would disagree.
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().add_(torch::randn_like(item.value()) * 0.05);
  }
  const std::string dir = ::testing::TempDir() + "/loom_hf_" + arch;
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  ASSERT_TRUE(ExportHf(c, ParamsOf(model), "/nonexistent-tokenizer-dir", dir).ok());
  const std::vector<int64_t> ids = {5, 17, 3, 88, 42, 7, 9, 60, 1, 33};
  torch::Tensor loom = model->forward(torch::tensor(ids, torch::kLong).view({1, -1}))
                           .select(1, static_cast<int64_t>(ids.size()) - 1)
                           .squeeze(0);
  int status = -1;
  const std::string out =
      Run(absl::StrCat("/usr/bin/python3 ", LOOM_SOURCE_DIR, "/tests/export/hf_logits.py ", dir,
                       " ", absl::StrJoin(ids, " "), " 2>&1"),
          &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_EQ(lines[0], arch);
  std::vector<float> values;
  for (absl::string_view v : absl::StrSplit(lines[1], ' ', absl::SkipEmpty())) {
    values.push_back(std::stof(std::string(v)));
  }
  ASSERT_EQ(static_cast<int64_t>(values.size()), c.vocab_size);
  torch::Tensor reader = torch::tensor(values);
  const double scale = loom.abs().max().item<double>();
  const double diff = (reader - loom).abs().max().item<double>();
  std::printf("%s export: max |logit difference| %.3e (largest logit %.3f)\n", arch, diff, scale);
  EXPECT_LT(diff, 1e-4 * std::max(1.0, scale));
  // The files a Hugging Face user expects.
  for (const char* f : {"model.safetensors", "config.json", "tokenizer_config.json",
                        "generation_config.json"}) {
    EXPECT_TRUE(std::ifstream(dir + "/" + f).good()) << f;
  }
}

TEST(HfExportTest, Gpt2LogitsMatchAnIndependentReader) { CheckExport(Gpt2(), "gpt2"); }

TEST(HfExportTest, LlamaLogitsMatchAnIndependentReader) { CheckExport(Llama(), "llama"); }

TEST(HfExportTest, ModelsNeitherArchitectureExpressesAreRefused) {
  GptConfig c = Gpt2();
  c.rms_norm = true;  // GPT-2 with RMSNorm
  auto arch = HfArchitecture(c);
  EXPECT_EQ(arch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(arch.status().message()), HasSubstr("Llama-like model with"));
  c = Gpt2();
  c.n_kv_head = 2;
  EXPECT_EQ(HfArchitecture(c).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*HfArchitecture(Gpt2()), "gpt2");
  EXPECT_EQ(*HfArchitecture(Llama()), "llama");
}

TEST(HfExportTest, SafetensorsHeaderIsAlignedAndNamesEveryTensor) {
  const std::string path = ::testing::TempDir() + "/loom_small.safetensors";
  std::map<std::string, torch::Tensor> t = {{"a", torch::arange(6, torch::kFloat).view({2, 3})},
                                            {"b.c", torch::ones({1})}};
  ASSERT_TRUE(WriteSafetensors(path, t).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  const std::string file = s.str();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = file.substr(8, n);
  EXPECT_THAT(header, HasSubstr("\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"));
  EXPECT_THAT(header, HasSubstr("\"b.c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[24,28]}"));
  EXPECT_EQ(file.size(), 8 + n + 28);
  float third;
  std::memcpy(&third, file.data() + 8 + n + 8, 4);
  EXPECT_EQ(third, 2.0f);
}

}  // namespace
}  // namespace loom::engine
