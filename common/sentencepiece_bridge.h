// SentencePiece (Kudo & Richardson 2018; Debian's libsentencepiece) runs in
// a process of its own, loom-sentencepiece (sentencepiece_main.cc), never
// inside Loom's binaries: Debian's libsentencepiece carries its own copy of
// protobuf's symbols, and in a process that also loads libprotobuf (every
// Loom binary: gRPC, LibTorch) the two copies collide and the process
// crashes while loading. Its headers also clash with Debian's Abseil (each
// defines absl::string_view). So this file has no SentencePiece, protobuf
// or Abseil include, and speaks to the helper over pipes.
//
// Protocol (serve mode): requests on the helper's stdin, one per line
// header; answers on its stdout.
//   "E <n>\n" + n bytes of text  ->  "<k>\n" + k space-separated ids + "\n"
//   "D <k>\n" + k space-separated ids + "\n"  ->  "<n>\n" + n bytes of text
//   "V\n"                          ->  "<vocabulary size>\n"
//   any failure                    ->  "!<message>\n"
#ifndef LOOM_COMMON_SENTENCEPIECE_BRIDGE_H_
#define LOOM_COMMON_SENTENCEPIECE_BRIDGE_H_

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom::sp {

// The helper's path: $LOOM_SENTENCEPIECE if set, else loom-sentencepiece
// beside the running executable.
std::string HelperPath();

// Trains a byte-fallback BPE model (see sentencepiece_main.cc) by running
// the helper; false with `*error` (its stderr) on failure.
bool TrainBpe(const std::string& input, const std::string& model_prefix, int vocab_size,
              int threads, std::string* error);

// A model loaded in a helper process that lives as long as this object.
// Thread-safe (calls are serialised).
class Model {
 public:
  // Null with `*error` set when the helper cannot start or `path` is not a
  // SentencePiece model.
  static std::unique_ptr<Model> Load(const std::string& path, std::string* error);
  ~Model();  // closes the pipes and reaps the helper

  bool Encode(const std::string& text, std::vector<int>* ids, std::string* error);
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error);
  int vocab_size() const { return vocab_size_; }

 private:
  Model() = default;
  bool ReadLine(std::string* line);
  bool ReadBytes(size_t n, std::string* out);
  bool WriteAll(const std::string& data);

  std::mutex mu_;
  pid_t pid_ = -1;
  int to_helper_ = -1, from_helper_ = -1;
  std::string buffered_;  // read from the helper, not yet consumed
  int vocab_size_ = 0;
};

}  // namespace loom::sp

#endif  // LOOM_COMMON_SENTENCEPIECE_BRIDGE_H_
