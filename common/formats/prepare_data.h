// Data preparation with a tokenizer other than bytes (BPE): declared apart
// from data.h so that the many users of data.h do not depend on it.
#ifndef LOOM_COMMON_FORMATS_PREPARE_DATA_H_
#define LOOM_COMMON_FORMATS_PREPARE_DATA_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/data.h"

namespace loom::engine {

// Tokenisation by `encode` (BPE: common/tokenizer.h) of the same text
// stream as PrepareByteLevelData (files in order, '\n' between files that
// lack one), into the same shard files. The split is by bytes: validation
// is the stream's last val_fraction of bytes, moved forward to the start of
// a line so that no line is split. `train_text` (if not empty) receives the
// train split's text before any encoding, and `prepare` (if set) is then
// called with that path (the BPE trainer learns from the train split only).
// Each line, '\n' included, is encoded on its own; every id must be in
// [0, vocab_size) and vocab_size <= 65536 (16-bit shards). The text is held
// in memory. unigram_entropy_nats is over the train split's token ids.
// Errors as PrepareByteLevelData's, INVALID_ARGUMENT for an id out of
// range, and `prepare`'s or `encode`'s.
absl::StatusOr<PrepareResult> PrepareEncodedData(
    const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
    int vocab_size, const std::string& train_text,
    const std::function<absl::Status(const std::string&)>& prepare,
    const std::function<absl::StatusOr<std::vector<int>>(std::string_view)>& encode,
    int64_t max_tokens_per_shard = 100'000'000);

}  // namespace loom::engine

#endif  // LOOM_COMMON_FORMATS_PREPARE_DATA_H_
