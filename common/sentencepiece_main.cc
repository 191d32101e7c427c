// loom-sentencepiece: SentencePiece in a process of its own (see
// sentencepiece_bridge.h for why and for the serve protocol).
//   loom-sentencepiece train INPUT MODEL_PREFIX VOCAB_SIZE THREADS
//     trains a byte-fallback BPE model on the text file INPUT (one sentence
//     per line) and writes MODEL_PREFIX.model and .vocab. The normalizer is
//     the identity and no dummy prefix is added, so decoding what was encoded
//     gives the text back exactly; only <unk> is reserved (no BOS/EOS/PAD):
//     the token stream is the text's, as llm.c's shards hold it.
//   loom-sentencepiece serve MODEL
//     answers encode/decode requests on stdin until it closes.
// Exit 0, or 1 with the reason on stderr; 2 for bad usage.
// Links SentencePiece and the C++ library only: no protobuf, no Abseil.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int Train(int argc, char** argv) {
  if (argc != 6) return 2;
  const std::unordered_map<std::string, std::string> args = {
      {"input", argv[2]},
      {"model_prefix", argv[3]},
      {"model_type", "bpe"},
      {"vocab_size", argv[4]},
      {"num_threads", argv[5]},
      {"byte_fallback", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"max_sentence_length", "65536"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  const sentencepiece::util::Status s = sentencepiece::SentencePieceTrainer::Train(args);
  if (!s.ok()) {
    std::cerr << s.ToString() << std::endl;
    return 1;
  }
  return 0;
}

bool ReadExactly(size_t n, std::string* out) {
  out->resize(n);
  return n == 0 || std::fread(out->data(), 1, n, stdin) == n;
}

int Serve(int argc, char** argv) {
  if (argc != 3) return 2;
  sentencepiece::SentencePieceProcessor processor;
  const sentencepiece::util::Status loaded = processor.Load(argv[2]);
  std::string header;
  auto fail = [](const std::string& message) {
    std::string one_line = message;
    for (char& c : one_line) {
      if (c == '\n') c = ' ';
    }
    std::printf("!%s\n", one_line.c_str());
    std::fflush(stdout);
  };
  if (!loaded.ok()) {
    // Answer the client's first request with the reason, then exit.
    std::getline(std::cin, header);
    fail(std::string(argv[2]) + ": not a SentencePiece model (" + loaded.ToString() + ")");
    return 1;
  }
  const int vocab = processor.GetPieceSize();
  char line[64];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    if (line[0] == 'V') {
      std::printf("%d\n", vocab);
    } else if (line[0] == 'E') {
      std::string text;
      if (!ReadExactly(std::strtoul(line + 2, nullptr, 10), &text)) return 1;
      std::vector<int> ids;
      const sentencepiece::util::Status s = processor.Encode(text, &ids);
      if (!s.ok()) {
        fail(s.ToString());
        continue;
      }
      std::printf("%zu\n", ids.size());
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
      std::printf("\n");
    } else if (line[0] == 'D') {
      const size_t count = std::strtoul(line + 2, nullptr, 10);
      std::vector<int> ids(count);
      bool in_range = true;
      for (size_t i = 0; i < count; ++i) {
        if (std::scanf("%d", &ids[i]) != 1) return 1;
        in_range = in_range && ids[i] >= 0 && ids[i] < vocab;
      }
      std::fgets(line, sizeof(line), stdin);  // the rest of the ids' line
      if (!in_range) {
        fail("a token id is outside the vocabulary of " + std::to_string(vocab));
        continue;
      }
      std::string text;
      const sentencepiece::util::Status s = processor.Decode(ids, &text);
      if (!s.ok()) {
        fail(s.ToString());
        continue;
      }
      std::printf("%zu\n", text.size());
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      fail("unknown request");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc >= 2 ? argv[1] : "";
  int rc = 2;
  if (command == "train") rc = Train(argc, argv);
  if (command == "serve") rc = Serve(argc, argv);
  if (rc == 2) {
    std::cerr << "usage: loom-sentencepiece train INPUT MODEL_PREFIX VOCAB_SIZE THREADS | "
                 "loom-sentencepiece serve MODEL"
              << std::endl;
  }
  return rc;
}
