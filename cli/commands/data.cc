// `loomctl data prepare`: text files into token shards, a validation split,
// the tokenizer and meta.json (common/formats/prepare_data.h)
// (cli/commands/commands.h). Runs here; needs no controller.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "common/file_util.h"
#include "common/json_writer.h"
#include "common/tokenizer.h"
#include "common/formats/data.h"
#include "common/formats/prepare_data.h"

namespace loom::cli {
namespace {

int CmdDataPrepare(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> inputs;
  std::string out;
  std::string tokenizer = "byte";
  int vocab_size = 4096;
  double val_fraction = 0.1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--val-fraction" && i + 1 < args.size()) {
      if (!absl::SimpleAtod(args[++i], &val_fraction)) {
        return Usage("--val-fraction: not a number: " + args[i]);
      }
    } else if (args[i] == "--tokenizer" && i + 1 < args.size()) {
      tokenizer = args[++i];
      if (tokenizer != "byte" && tokenizer != "bpe") {
        return Usage("--tokenizer: expected byte or bpe, got " + tokenizer);
      }
    } else if (args[i] == "--vocab-size" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &vocab_size)) {
        return Usage("--vocab-size: not a number: " + args[i]);
      }
    } else if (args[i] == "--input") {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) inputs.push_back(args[++i]);
    } else {
      return Usage("data prepare: unexpected " + args[i]);
    }
  }
  if (inputs.empty()) return Usage("data prepare: --input FILE... is required");
  if (out.empty()) return Usage("data prepare: --out DIR is required");
  absl::Status made = MakeDirs(out);
  if (!made.ok()) return Fail(made);
  absl::StatusOr<engine::PrepareResult> r;
  bool bpe_model = false;  // meta.json names tokenizer.model
  if (tokenizer == "byte") {
    vocab_size = 256;
    r = engine::PrepareByteLevelData(inputs, out, val_fraction);
    // A BPE model from an earlier run no longer describes these shards.
    std::remove((out + "/tokenizer.model").c_str());
    std::remove((out + "/tokenizer.vocab").c_str());
  } else {
    // SentencePiece BPE trained on the train split (common/tokenizer.h),
    // written beside the shards as tokenizer.model.
    const std::string train_text = out + "/.tokenizer-train.txt";
    std::unique_ptr<Tokenizer> bpe;
    r = engine::PrepareEncodedData(
        inputs, out, val_fraction, vocab_size, train_text,
        [&](const std::string& text) -> absl::Status {
          absl::Status trained = TrainBpeTokenizer(text, out + "/tokenizer", vocab_size);
          std::remove(text.c_str());
          if (!trained.ok()) return trained;
          absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
              LoadBpeTokenizer(out + "/tokenizer.model");
          if (!loaded.ok()) return loaded.status();
          bpe = std::move(*loaded);
          return absl::OkStatus();
        },
        [&](std::string_view line) { return bpe->Encode(absl::string_view(line.data(), line.size())); });
    bpe_model = true;
  }
  if (!r.ok()) return Fail(r.status());
  double bits = r->unigram_entropy_nats / std::log(2.0);
  JsonWriter w;
  w.BeginObject();
  w.Field("tokenizer", tokenizer);
  w.Field("vocab_size", vocab_size);
  if (bpe_model) w.Field("model", "tokenizer.model");
  w.Field("train_tokens", static_cast<int64_t>(r->train_tokens));
  w.Field("val_tokens", static_cast<int64_t>(r->val_tokens));
  w.Field("unigram_entropy_nats", r->unigram_entropy_nats);
  w.EndObject();
  const std::string meta = w.Finish();
  if (absl::Status s = WriteFileAtomically(out + "/meta.json", meta); !s.ok()) return Fail(s);
  if (g.json) {
    std::cout << meta;
  } else {
    std::cout << absl::StrFormat(
        "wrote %d train shard(s) (%d tokens) and %d validation shard(s) (%d tokens) to %s\n"
        "tokenizer: %s, vocabulary %d%s (set model.*.vocab_size >= %d)\n"
        "unigram entropy of the train split: %.4f nats/token (%.3f bits)\n",
        r->train_shards.size(), r->train_tokens, r->val_shards.size(), r->val_tokens, out,
        tokenizer == "bpe" ? "SentencePiece BPE" : "byte-level", vocab_size,
        tokenizer == "bpe" ? ", model " + out + "/tokenizer.model" : "", vocab_size,
        r->unigram_entropy_nats, bits);
  }
  return 0;
}

}  // namespace

int CmdData(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "prepare") return Usage("data: expected `data prepare`");
  return CmdDataPrepare(g, std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace loom::cli
