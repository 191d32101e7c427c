// Tokenizers of prepared data (`loomctl data prepare`): byte-level (token =
// byte value, vocabulary 256) or BPE (a SentencePiece model trained on the
// data, common/sentencepiece_bridge.h). The data directory's meta.json
// names which, and a BPE directory holds its model as tokenizer.model
// beside the shards, so whoever reads the shards (sampling, export) decodes
// them with the tokenizer that wrote them.
#ifndef LOOM_COMMON_TOKENIZER_H_
#define LOOM_COMMON_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "byte" or "bpe"
  virtual int vocab_size() const = 0;
  // Token ids of `text`, each in [0, vocab_size).
  virtual absl::StatusOr<std::vector<int>> Encode(absl::string_view text) const = 0;
  // The text of `ids`; INVALID_ARGUMENT for an id outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(const std::vector<int>& ids) const = 0;
};

// Byte-level: Encode gives each byte's value, Decode the bytes back.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// A SentencePiece model file (tokenizer.model). NOT_FOUND / INVALID_ARGUMENT
// naming the path.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& model_path);

// Trains a byte-fallback BPE model of `vocab_size` pieces (in [260, 65536]:
// 256 byte pieces, <unk> and room for merges; token shards hold 16-bit ids)
// on the text file `train_text` and writes <model_prefix>.model and .vocab.
// Decode(Encode(text)) == text for any UTF-8 text.
absl::Status TrainBpeTokenizer(const std::string& train_text, const std::string& model_prefix,
                               int vocab_size);

// The tokenizer a data directory was prepared with: meta.json's "tokenizer"
// ("byte", or "bpe" with its tokenizer.model); a directory without
// meta.json is byte-level (llm.c-prepared GPT-2 shards have their own
// tokenizer, which Loom does not read: FAILED_PRECONDITION when meta.json
// names another).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadDataTokenizer(const std::string& data_dir);

}  // namespace loom

#endif  // LOOM_COMMON_TOKENIZER_H_
