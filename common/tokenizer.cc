#include "common/tokenizer.h"

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/sentencepiece_bridge.h"

namespace loom {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text) const override {
    std::vector<int> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  absl::StatusOr<std::string> Decode(const std::vector<int>& ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int id : ids) {
      if (id < 0 || id > 255) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the byte vocabulary [0, 256)"));
      }
      text.push_back(static_cast<char>(id));
    }
    return text;
  }
};

// Encodes and decodes through loom-sentencepiece (sentencepiece_bridge.h).
class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(std::unique_ptr<sp::Model> model) : model_(std::move(model)) {}
  std::string kind() const override { return "bpe"; }
  int vocab_size() const override { return model_->vocab_size(); }
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text) const override {
    std::vector<int> ids;
    std::string error;
    if (!model_->Encode(std::string(text), &ids, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("BPE encode: ", error));
    }
    return ids;
  }
  absl::StatusOr<std::string> Decode(const std::vector<int>& ids) const override {
    std::string text, error;
    if (!model_->Decode(ids, &text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("BPE decode: ", error));
    }
    return text;
  }

 private:
  std::unique_ptr<sp::Model> model_;
};

// The value of "key": "value" in a flat JSON object written by loomctl.
std::string JsonString(const std::string& json, const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\"");
  size_t at = json.find(needle);
  if (at == std::string::npos) return "";
  at = json.find('"', json.find(':', at + needle.size()) + 1);
  if (at == std::string::npos) return "";
  const size_t end = json.find('"', at + 1);
  return end == std::string::npos ? "" : json.substr(at + 1, end - at - 1);
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& model_path) {
  if (!std::ifstream(model_path).good()) {
    return absl::NotFoundError(absl::StrCat(model_path, ": no such tokenizer model"));
  }
  std::string error;
  std::unique_ptr<sp::Model> model = sp::Model::Load(model_path, &error);
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": not a SentencePiece model (", error, ")"));
  }
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(model)));
}

absl::Status TrainBpeTokenizer(const std::string& train_text, const std::string& model_prefix,
                               int vocab_size) {
  if (vocab_size < 260 || vocab_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-size ", vocab_size,
        " is not in [260, 65536]: a byte-fallback BPE vocabulary holds the 256 bytes, <unk> and "
        "its merges, and token shards store 16-bit ids"));
  }
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::string error;
  if (!sp::TrainBpe(train_text, model_prefix, vocab_size, threads, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("training the BPE tokenizer on ", train_text,
                                                   " (vocabulary ", vocab_size, "): ", error));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadDataTokenizer(const std::string& data_dir) {
  std::ifstream meta(data_dir + "/meta.json");
  if (!meta.good()) return MakeByteTokenizer();
  std::stringstream text;
  text << meta.rdbuf();
  const std::string kind = JsonString(text.str(), "tokenizer");
  if (kind == "byte" || kind.empty()) return MakeByteTokenizer();
  if (kind == "bpe") {
    const std::string model = JsonString(text.str(), "model");
    return LoadBpeTokenizer(absl::StrCat(data_dir, "/", model.empty() ? "tokenizer.model" : model));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      data_dir, "/meta.json names tokenizer \"", kind, "\", which Loom cannot read (byte, bpe)"));
}

}  // namespace loom
