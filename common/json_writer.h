// A minimal pretty-printing JSON writer: every JSON that Loom writes by
// hand goes through it (the planner's reports, `loomctl -o json` output
// that is not a protobuf message, the daemons' ready files, data prepare's
// meta.json), so that every string is escaped the same way; protobuf
// messages go through protobuf's own JSON mapping. Callers must balance
// Begin/End calls and give a Key() before each object member; misuse
// produces invalid JSON rather than crashing. Strings are written as given
// (UTF-8 expected), with '"', '\\' and control characters escaped. Not
// thread-safe (one writer per document).
#ifndef LOOM_COMMON_JSON_WRITER_H_
#define LOOM_COMMON_JSON_WRITER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace loom {

class JsonWriter {
 public:
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }

  void Key(absl::string_view key) {
    Separate();
    absl::StrAppend(&out_, Quote(key), ": ");
    after_key_ = true;
  }
  void Value(absl::string_view s) { Scalar(Quote(s)); }
  void Value(const char* s) { Value(absl::string_view(s)); }
  void Value(const std::string& s) { Value(absl::string_view(s)); }
  void Value(bool b) { Scalar(b ? "true" : "false"); }
  void Value(int i) { Scalar(absl::StrCat(i)); }
  void Value(int64_t i) { Scalar(absl::StrCat(i)); }
  void Value(uint64_t i) { Scalar(absl::StrCat(i)); }
  // 12 significant digits; non-finite numbers have no JSON form and are
  // written as null.
  void Value(double d) { Scalar(std::isfinite(d) ? absl::StrFormat("%.12g", d) : "null"); }
  // A short list of integers on one line, e.g. a placement row.
  void InlineInts(const std::vector<int>& values) {
    Scalar(absl::StrCat("[", absl::StrJoin(values, ", "), "]"));
  }

  template <typename T>
  void Field(absl::string_view key, const T& value) {
    Key(key);
    Value(value);
  }

  std::string Finish() { return out_ + "\n"; }

 private:
  static std::string Quote(absl::string_view s) {
    std::string out = "\"";
    for (char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            out += absl::StrFormat("\\u%04x", static_cast<int>(c));
          } else {
            out += c;
          }
      }
    }
    return out + "\"";
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ",";
      first_.back() = false;
      out_ += "\n" + std::string(2 * first_.size(), ' ');
    }
  }
  void Scalar(const std::string& text) {
    Separate();
    out_ += text;
  }
  void Open(char bracket) {
    Separate();
    out_ += bracket;
    first_.push_back(true);
  }
  void Close(char bracket) {
    const bool empty = first_.empty() || first_.back();
    if (!first_.empty()) first_.pop_back();
    if (!empty) out_ += "\n" + std::string(2 * first_.size(), ' ');
    out_ += bracket;
  }

  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace loom

#endif  // LOOM_COMMON_JSON_WRITER_H_
