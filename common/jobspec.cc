#include "common/jobspec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parallel_layout.h"
#include "common/status_macros.h"
#include "common/yaml_util.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace loom {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::EnumDescriptor;
using ::google::protobuf::EnumValueDescriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::OneofDescriptor;
using ::loom::v1::JobSpec;

// Spec files are a few hundred bytes; anything this large is a mistake (a
// token shard passed by accident) and is refused before YAML sees it.
constexpr size_t kMaxSpecFileBytes = 1 << 20;

// Prefix for problems that are not about one field.
constexpr char kSpecPath[] = "job spec";

std::string JoinPath(absl::string_view parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

absl::Status FieldError(absl::string_view path, absl::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat(path.empty() ? kSpecPath : path, ": ", detail));
}

// ---------------------------------------------------------------------------
// YAML scalars. yaml-cpp keeps every scalar as text and tags plain (unquoted)
// scalars "?"; quoted ones get "!" and explicitly tagged ones their tag.

bool IsPlain(const YAML::Node& node) { return node.Tag() == "?"; }

// How a node reads in an error message.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar: {
      std::string text = node.Scalar();
      if (text.size() > 64) text = text.substr(0, 61) + "...";
      return absl::StrCat("\"", absl::Utf8SafeCHexEscape(text), "\"");
    }
    default:
      return "nothing";
  }
}

// YAML 1.2 core schema, decimal only: [-+]?[0-9]+
bool IsIntLiteral(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

// YAML 1.2 core schema: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
// Includes every IsIntLiteral().
bool IsFloatLiteral(absl::string_view s) {
  size_t i = 0;
  auto digits = [&s, &i]() {
    const size_t start = i;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    return i - start;
  };
  auto sign = [&s, &i]() {
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  };
  sign();
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  } else {
    if (digits() == 0) return false;
    if (i < s.size() && s[i] == '.') {
      ++i;
      digits();
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    sign();
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// Maps the proto3 JSON and YAML spellings of non-finite numbers to the proto3
// JSON one; nullptr for anything else.
const char* NonFiniteJson(absl::string_view s) {
  for (const char* nan : {"NaN", ".nan", ".NaN", ".NAN"}) {
    if (s == nan) return "NaN";
  }
  for (const char* inf :
       {"Infinity", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"}) {
    if (s == inf) return "Infinity";
  }
  for (const char* inf : {"-Infinity", "-.inf", "-.Inf", "-.INF"}) {
    if (s == inf) return "-Infinity";
  }
  return nullptr;
}

bool IsBoolLiteral(absl::string_view s) {
  for (const char* b : {"true", "True", "TRUE", "false", "False", "FALSE"}) {
    if (s == b) return true;
  }
  return false;
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Optimal string alignment distance (Levenshtein plus adjacent swaps), so
// "nmae" is one edit from "name".
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Lowercase without '_' and '-', so "nHead", "n_head" and "N-HEAD" compare
// equal.
std::string Fold(absl::string_view s) {
  std::string folded;
  for (const char c : s) {
    if (c != '_' && c != '-') folded.push_back(absl::ascii_tolower(c));
  }
  return folded;
}

// " (did you mean "x"?)" for the candidate closest to `name`, or "" when none
// is within a third of the name's length (at least 1, at most 3 edits).
std::string DidYouMean(absl::string_view name,
                       const std::vector<std::string>& candidates) {
  const std::string folded = Fold(name);
  const size_t limit = std::clamp<size_t>(folded.size() / 3, 1, 3);
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(folded, Fold(candidate));
    if (distance < best_distance) {
      best = &candidate;
      best_distance = distance;
    }
  }
  if (best == nullptr) return "";
  return absl::StrCat(" (did you mean \"", *best, "\"?)");
}

// ---------------------------------------------------------------------------
// YAML tree -> proto3 JSON text, checked against the descriptor. The JSON is
// only ever read by JsonStringToMessage, which does the actual conversion.

absl::Status IntegerToJson(const YAML::Node& node, const FieldDescriptor* field,
                           const std::string& path, std::string* out) {
  const std::string& text = node.Scalar();
  const auto out_of_range = [&] {
    return FieldError(path, absl::StrCat(text, " is out of range for ",
                                         field->cpp_type_name()));
  };
  bool negative = false;
  uint64_t magnitude = 0;
  if (IsIntLiteral(text)) {
    absl::string_view digits = text;
    if (digits[0] == '-' || digits[0] == '+') {
      negative = digits[0] == '-';
      digits.remove_prefix(1);
    }
    for (const char c : digits) {
      const uint64_t digit = c - '0';
      if (magnitude > (UINT64_MAX - digit) / 10) return out_of_range();
      magnitude = magnitude * 10 + digit;
    }
  } else if (double value = 0;
             IsFloatLiteral(text) && absl::SimpleAtod(text, &value)) {
    // 1e6 or 5.0: proto3 JSON accepts numbers with an integral value.
    if (!std::isfinite(value)) return out_of_range();
    if (value != std::trunc(value)) {
      return FieldError(
          path, absl::StrCat("expected an integer, got ", Describe(node)));
    }
    negative = value < 0;
    if (std::fabs(value) >= 18446744073709551616.0) return out_of_range();
    magnitude = static_cast<uint64_t>(std::fabs(value));
  } else {
    return FieldError(
        path, absl::StrCat("expected an integer, got ", Describe(node)));
  }
  if (magnitude == 0) negative = false;

  uint64_t max = 0;
  bool quote = false;  // 64-bit values are quoted, as proto3 JSON prints them
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      max = negative ? uint64_t{1} << 31 : INT32_MAX;
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      max = negative ? uint64_t{1} << 63 : INT64_MAX;
      quote = true;
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      max = negative ? 0 : UINT32_MAX;
      break;
    default:  // CPPTYPE_UINT64
      max = negative ? 0 : UINT64_MAX;
      quote = true;
      break;
  }
  if (magnitude > max) return out_of_range();
  const std::string decimal = absl::StrCat(negative ? "-" : "", magnitude);
  if (quote) {
    AppendJsonString(decimal, out);
  } else {
    out->append(decimal);
  }
  return absl::OkStatus();
}

absl::Status FloatToJson(const YAML::Node& node, const FieldDescriptor* field,
                         const std::string& path, std::string* out) {
  const std::string& text = node.Scalar();
  if (const char* non_finite = NonFiniteJson(text)) {
    AppendJsonString(non_finite, out);  // ValidateJobSpec() rejects these
    return absl::OkStatus();
  }
  double value = 0;
  if (!IsFloatLiteral(text) || !absl::SimpleAtod(text, &value)) {
    return FieldError(path,
                      absl::StrCat("expected a number, got ", Describe(node)));
  }
  const double max =
      field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT ? FLT_MAX : DBL_MAX;
  if (!std::isfinite(value) || std::fabs(value) > max) {
    return FieldError(path, absl::StrCat(text, " is out of range for ",
                                         field->cpp_type_name()));
  }
  // %.17g round-trips every double exactly.
  absl::StrAppendFormat(out, "%.17g", value);
  return absl::OkStatus();
}

absl::Status EnumToJson(const YAML::Node& node, const FieldDescriptor* field,
                        const std::string& path, std::string* out) {
  const EnumDescriptor* type = field->enum_type();
  const std::string& text = node.Scalar();
  const EnumValueDescriptor* value = type->FindValueByName(text);
  // proto3 JSON also takes the number, as a JSON number: unquoted.
  if (int number = 0; value == nullptr && IsPlain(node) && IsIntLiteral(text) &&
                      absl::SimpleAtoi(text, &number)) {
    value = type->FindValueByNumber(number);
  }
  if (value == nullptr) {
    std::vector<std::string> names;
    for (int i = 0; i < type->value_count(); ++i) {
      names.push_back(type->value(i)->name());
    }
    return FieldError(
        path,
        absl::StrCat("unknown value ", Describe(node), ", expected one of ",
                     absl::StrJoin(names, ", "), DidYouMean(text, names)));
  }
  AppendJsonString(value->name(), out);
  return absl::OkStatus();
}

absl::Status MessageToJson(const YAML::Node& node, const Descriptor* type,
                           const std::string& path, std::string* out);

// One value of `field` (one element, if the field is repeated).
absl::Status ValueToJson(const YAML::Node& node, const FieldDescriptor* field,
                         const std::string& path, std::string* out) {
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return MessageToJson(node, field->message_type(), path, out);
  }
  const char* expected = "";
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      expected = "an integer";
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      expected = "a number";
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      expected = "true or false";
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      expected = "an enum value name";
      break;
    default:
      expected = "a string";
      break;
  }
  if (!node.IsScalar()) {
    return FieldError(
        path, absl::StrCat("expected ", expected, ", got ", Describe(node)));
  }
  const std::string& text = node.Scalar();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return IntegerToJson(node, field, path, out);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return FloatToJson(node, field, path, out);
    case FieldDescriptor::CPPTYPE_ENUM:
      return EnumToJson(node, field, path, out);
    case FieldDescriptor::CPPTYPE_BOOL:
      if (!IsPlain(node) || !IsBoolLiteral(text)) {
        return FieldError(path, absl::StrCat("expected true or false",
                                             IsPlain(node) ? "" : " unquoted",
                                             ", got ", Describe(node)));
      }
      out->append(absl::AsciiStrToLower(text));
      return absl::OkStatus();
    default:  // CPPTYPE_STRING, string or base64 bytes
      if (IsPlain(node) && (IsFloatLiteral(text) || IsBoolLiteral(text) ||
                            NonFiniteJson(text) != nullptr)) {
        return FieldError(path, absl::StrCat("expected a string, got ", text,
                                             " (quote it to use it as one)"));
      }
      AppendJsonString(text, out);
      return absl::OkStatus();
  }
}

absl::Status MessageToJson(const YAML::Node& node, const Descriptor* type,
                           const std::string& path, std::string* out) {
  if (!node.IsMap()) {
    return FieldError(path,
                      absl::StrCat("expected a mapping, got ", Describe(node)));
  }
  // field number -> the key it was given as; oneof -> the member set.
  absl::flat_hash_map<int, std::string> seen;
  absl::flat_hash_map<const OneofDescriptor*, const FieldDescriptor*> oneofs;
  out->push_back('{');
  bool first = true;
  for (const auto& entry : node) {
    const YAML::Node& key = entry.first;
    const YAML::Node& value = entry.second;
    if (!key.IsScalar()) {
      return FieldError(path, absl::StrCat("field names must be strings, got ",
                                           Describe(key)));
    }
    const std::string& name = key.Scalar();
    const FieldDescriptor* field = type->FindFieldByName(name);
    for (int i = 0; field == nullptr && i < type->field_count(); ++i) {
      if (type->field(i)->json_name() == name) field = type->field(i);
    }
    if (field == nullptr) {
      std::vector<std::string> names;
      for (int i = 0; i < type->field_count(); ++i) {
        names.push_back(type->field(i)->name());
      }
      return FieldError(JoinPath(path, name),
                        absl::StrCat("unknown field", DidYouMean(name, names)));
    }
    const std::string field_path = JoinPath(path, field->name());
    if (const auto [it, inserted] = seen.emplace(field->number(), name);
        !inserted) {
      return FieldError(field_path,
                        it->second == name
                            ? std::string("set twice")
                            : absl::StrCat("set twice (as \"", it->second,
                                           "\" and \"", name, "\")"));
    }
    if (value.IsNull()) continue;  // proto3 JSON: null means "not set"
    if (const OneofDescriptor* oneof = field->real_containing_oneof()) {
      if (const auto [it, inserted] = oneofs.emplace(oneof, field); !inserted) {
        return FieldError(field_path,
                          absl::StrCat("cannot be set together with ",
                                       JoinPath(path, it->second->name()),
                                       " (they are alternatives of oneof ",
                                       oneof->name(), ")"));
      }
    }
    if (field->is_map()) {
      // JobSpec has no map fields; supporting them is not worth the code yet.
      return absl::UnimplementedError(
          absl::StrCat(field_path, ": map fields are not supported in specs"));
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
        absl::StartsWith(field->message_type()->file()->name(),
                         "google/protobuf/")) {
      // Well-known types (Duration, Struct, ...) have special JSON forms that
      // this walk does not know; JobSpec uses none.
      return absl::UnimplementedError(absl::StrCat(
          field_path, ": well-known type ", field->message_type()->full_name(),
          " is not supported in specs"));
    }

    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(field->name(), out);
    out->push_back(':');
    if (!field->is_repeated()) {
      RETURN_IF_ERROR(ValueToJson(value, field, field_path, out));
      continue;
    }
    if (!value.IsSequence()) {
      return FieldError(field_path,
                        absl::StrCat("expected a list, got ", Describe(value)));
    }
    out->push_back('[');
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out->push_back(',');
      RETURN_IF_ERROR(ValueToJson(value[i], field,
                                  absl::StrCat(field_path, "[", i, "]"), out));
    }
    out->push_back(']');
  }
  out->push_back('}');
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Files.

absl::StatusOr<std::string> ReadSpecFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat info;
  if (::fstat(fd, &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": stat"));
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not a job spec file"));
  }
  std::string text;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read"));
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxSpecFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": larger than ", kMaxSpecFileBytes, " bytes; not a job spec"));
    }
  }
  return text;
}

// `entry` made absolute against `dir` (itself absolute), per the contract of
// LoadJobSpecFile().
std::string ResolveAgainst(const std::filesystem::path& dir,
                           const std::string& entry) {
  if (entry.empty() || absl::StrContains(entry, "://") ||
      std::filesystem::path(entry).is_absolute()) {
    return entry;
  }
  return (dir / entry).lexically_normal().string();
}

// ---------------------------------------------------------------------------
// Validation.

// Every float/double field, however deep, must be finite. Unset fields are 0.
absl::Status CheckFinite(const google::protobuf::Message& message,
                         const std::string& path) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string field_path = JoinPath(path, field->name());
    const int count =
        field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string element_path =
          field->is_repeated() ? absl::StrCat(field_path, "[", i, "]")
                               : field_path;
      double value = 0;
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          value = field->is_repeated()
                      ? reflection->GetRepeatedDouble(message, field, i)
                      : reflection->GetDouble(message, field);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          value = field->is_repeated()
                      ? reflection->GetRepeatedFloat(message, field, i)
                      : reflection->GetFloat(message, field);
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          RETURN_IF_ERROR(CheckFinite(
              field->is_repeated()
                  ? reflection->GetRepeatedMessage(message, field, i)
                  : reflection->GetMessage(message, field),
              element_path));
          continue;
        default:
          continue;
      }
      if (!std::isfinite(value)) {
        return FieldError(element_path,
                          absl::StrCat("must be finite, got ", value));
      }
    }
  }
  return absl::OkStatus();
}

// [a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?, so names work as DNS labels and paths.
bool IsValidJobName(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (const char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return false;
    }
  }
  return name.front() != '-' && name.back() != '-';
}

// "<path>: must be in [lo, hi], got v". Values print with %g.
// Upper bounds of the spec's sizes (README, "Job spec ranges"): far beyond
// any model trained today, and small enough that every product the planner,
// the engine and the recovery arithmetic form of them stays inside int64.
constexpr int32_t kMaxLayers = 1024;
constexpr int32_t kMaxHeads = 1024;
constexpr int32_t kMaxWidth = 65536;
constexpr int32_t kMaxVocab = 1 << 22;
constexpr int32_t kMaxBatch = 1 << 24;
constexpr int64_t kMaxSteps = 1000000000;         // schedule, intervals, distances
constexpr int64_t kMaxDataBatch = int64_t{1} << 50;  // a data batch index

template <typename T>
absl::Status CheckInRange(absl::string_view path, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return FieldError(
      path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
}

template <typename T>
absl::Status CheckAtLeast(absl::string_view path, T value, T lo) {
  if (value >= lo) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be >= ", lo, ", got ", value));
}

// [0, 1), for dropout and Adam's betas.
absl::Status CheckUnitOpen(absl::string_view path, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be in [0, 1), got ", value));
}

// 0 means "the default"; anything else must be in [lo, hi].
template <typename T>
absl::Status CheckDefaultOrInRange(absl::string_view path, T value, T lo, T hi) {
  if (value == 0) return absl::OkStatus();
  if (value >= lo && value <= hi) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be 0 (the default) or in [", lo, ", ", hi,
                                       "], got ", value));
}

absl::Status ValidateRecovery(const v1::RecoverySpec& r) {
  if (r.has_max_restarts()) {
    RETURN_IF_ERROR(CheckInRange("recovery.max_restarts", r.max_restarts(), 0, 10000));
  }
  if (r.has_max_rollbacks()) {
    RETURN_IF_ERROR(CheckInRange("recovery.max_rollbacks", r.max_rollbacks(), 0, 10000));
  }
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.window", r.window(), 8, 100000));
  const int32_t window = r.window() > 0 ? r.window() : 128;
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.min_history", r.min_history(), 1, window));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.confirm_steps", r.confirm_steps(), 1, window));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.threshold", r.threshold(), 1.0, 1e6));
  RETURN_IF_ERROR(
      CheckDefaultOrInRange<int64_t>("recovery.rollback_distance", r.rollback_distance(), 1,
                                     kMaxSteps));
  RETURN_IF_ERROR(
      CheckDefaultOrInRange<int64_t>("recovery.skip_before", r.skip_before(), 1, kMaxSteps));
  return CheckDefaultOrInRange<int64_t>("recovery.skip_after", r.skip_after(), 1, kMaxSteps);
}

}  // namespace

absl::Status ValidateSkipBatches(
    const google::protobuf::RepeatedPtrField<v1::SkipRange>& ranges, absl::string_view path) {
  if (ranges.size() > 10000) {
    return FieldError(path, absl::StrCat(ranges.size(), " ranges; at most 10000"));
  }
  for (int i = 0; i < ranges.size(); ++i) {
    const v1::SkipRange& r = ranges[i];
    const std::string at = absl::StrCat(path, "[", i, "]");
    RETURN_IF_ERROR(CheckInRange<int64_t>(at + ".begin", r.begin(), 0, kMaxDataBatch));
    RETURN_IF_ERROR(CheckInRange<int64_t>(at + ".end", r.end(), 0, kMaxDataBatch));
    if (r.end() <= r.begin()) {
      return FieldError(at, absl::StrCat("[", r.begin(), ", ", r.end(),
                                         ") is empty or reversed: end must be > begin"));
    }
  }
  return absl::OkStatus();
}

std::string ModelPath(const v1::ModelSpec& model) {
  return model.has_llama() ? "model.llama" : "model.gpt";
}

v1::GptModel EffectiveDecoder(const v1::ModelSpec& model) {
  const bool llama = model.has_llama();
  v1::GptModel m = llama ? model.llama() : model.gpt();
  if (m.n_kv_head() == 0) m.set_n_kv_head(m.n_head());
  v1::GptMlp* mlp = m.mutable_mlp();
  if (!mlp->has_gated()) mlp->set_gated(llama);
  if (!mlp->has_hidden()) {
    const int64_t d = m.d_model();
    // SwiGLU's three matrices of 8d/3 hold as many parameters as GELU's two
    // of 4d (Shazeer 2020); Llama rounds the width up (to 256, here 64 so
    // that small models stay small).
    const int64_t hidden = llama ? (8 * d / 3 + 63) / 64 * 64 : 4 * d;
    mlp->set_hidden(static_cast<int32_t>(std::min<int64_t>(hidden, INT32_MAX)));
  }
  if (m.norm() == v1::GptModel::NORM_UNSPECIFIED) {
    m.set_norm(llama ? v1::GptModel::RMSNORM : v1::GptModel::LAYERNORM);
  }
  if (!m.has_untied_embeddings()) m.set_untied_embeddings(llama);
  if (m.positions() == v1::GptModel::POSITIONS_UNSPECIFIED) {
    m.set_positions(llama ? v1::GptModel::ROTARY : v1::GptModel::LEARNED);
  }
  if (!m.has_bias()) m.set_bias(!llama);
  if (m.rope_theta() == 0) m.set_rope_theta(10000);
  if (m.norm_eps() == 0) m.set_norm_eps(1e-5);
  return m;
}

bool IsGpt2Shape(const v1::GptModel& m) {
  return (m.n_kv_head() == 0 || m.n_kv_head() == m.n_head()) && !m.mlp().gated() &&
         (!m.mlp().has_hidden() || int64_t{m.mlp().hidden()} == 4 * int64_t{m.d_model()}) &&
         m.norm() != v1::GptModel::RMSNORM && !m.untied_embeddings() &&
         m.positions() != v1::GptModel::ROTARY && (!m.has_bias() || m.bias()) &&
         (m.norm_eps() == 0 || m.norm_eps() == 1e-5);
}

std::string DescribeDecoder(const v1::GptModel& m) {
  std::vector<std::string> parts;
  if (m.n_kv_head() != 0 && m.n_kv_head() != m.n_head()) {
    parts.push_back(absl::StrCat("grouped-query attention, ", m.n_kv_head(), " key/value heads"));
  }
  if (m.mlp().gated()) parts.push_back("SwiGLU MLP");
  if (m.mlp().has_hidden() && int64_t{m.mlp().hidden()} != 4 * int64_t{m.d_model()}) {
    parts.push_back(absl::StrCat("MLP width ", m.mlp().hidden()));
  }
  if (m.norm() == v1::GptModel::RMSNORM) parts.push_back("RMSNorm");
  if (m.positions() == v1::GptModel::ROTARY) parts.push_back("rotary positions");
  if (m.has_bias() && !m.bias()) parts.push_back("no biases");
  if (m.untied_embeddings()) parts.push_back("untied embeddings");
  if (parts.empty()) return "GPT-2 shape";
  return absl::StrJoin(parts, ", ");
}

ModelShape ModelShapeOf(const v1::ModelSpec& model) {
  const v1::GptModel m = EffectiveDecoder(model);
  ModelShape shape;
  shape.name = model.has_llama() ? "llama" : "gpt";
  shape.n_layer = m.n_layer();
  shape.d_model = m.d_model();
  shape.n_head = m.n_head();
  shape.n_kv_head = m.n_kv_head();
  shape.ffn_hidden = m.mlp().hidden();
  shape.vocab_size = m.vocab_size();
  shape.seq_len = m.seq_len();
  shape.gated_mlp = m.mlp().gated();
  shape.bias = m.bias();
  shape.rms_norm = m.norm() == v1::GptModel::RMSNORM;
  shape.learned_position_embedding = m.positions() != v1::GptModel::ROTARY;
  shape.tied_embeddings = !m.untied_embeddings();
  return shape;
}

namespace {

absl::Status ValidateModel(const v1::ModelSpec& model) {
  if (!model.has_gpt() && !model.has_llama()) {
    return FieldError("model", "required: model.gpt (GPT-2 family) or model.llama (Llama family)");
  }
  const std::string at = ModelPath(model);
  const v1::GptModel& gpt = model.has_gpt() ? model.gpt() : model.llama();
  RETURN_IF_ERROR(CheckInRange(at + ".n_layer", gpt.n_layer(), 1, kMaxLayers));
  RETURN_IF_ERROR(CheckInRange(at + ".n_head", gpt.n_head(), 1, kMaxHeads));
  RETURN_IF_ERROR(CheckInRange(at + ".d_model", gpt.d_model(), 1, kMaxWidth));
  if (gpt.d_model() % gpt.n_head() != 0) {
    return FieldError(at + ".n_head", absl::StrCat(gpt.n_head(), " does not divide ", at,
                                                   ".d_model ", gpt.d_model()));
  }
  RETURN_IF_ERROR(CheckInRange(at + ".seq_len", gpt.seq_len(), 1, 65536));
  // Larger than the token shards hold is UNIMPLEMENTED (ValidateSupported),
  // so that `loomctl plan` can still plan a 128K-token vocabulary.
  RETURN_IF_ERROR(CheckInRange(at + ".vocab_size", gpt.vocab_size(), 1, kMaxVocab));
  RETURN_IF_ERROR(CheckUnitOpen(at + ".dropout", gpt.dropout()));
  // Model family (issue 11): shape rules here; which shapes the engine runs
  // under which layouts is ValidateSupported()'s business.
  RETURN_IF_ERROR(CheckInRange(at + ".n_kv_head", gpt.n_kv_head(), 0, gpt.n_head()));
  if (gpt.n_kv_head() > 0 && gpt.n_head() % gpt.n_kv_head() != 0) {
    return FieldError(
        at + ".n_kv_head",
        absl::StrCat(gpt.n_kv_head(), " does not divide ", at, ".n_head ", gpt.n_head(),
                     ": each key/value head serves a whole group of query heads"));
  }
  if (gpt.mlp().has_hidden()) {
    RETURN_IF_ERROR(CheckInRange(at + ".mlp.hidden", gpt.mlp().hidden(), 1, 16 * kMaxWidth));
  }
  if (!v1::GptModel::Norm_IsValid(gpt.norm())) {
    return FieldError(at + ".norm", absl::StrCat("unknown value ", gpt.norm()));
  }
  if (!v1::GptModel::Positions_IsValid(gpt.positions())) {
    return FieldError(at + ".positions", absl::StrCat("unknown value ", gpt.positions()));
  }
  const v1::GptModel effective = EffectiveDecoder(model);
  if (effective.positions() == v1::GptModel::ROTARY && (gpt.d_model() / gpt.n_head()) % 2 != 0) {
    return FieldError(at + ".positions",
                      absl::StrCat("rotary embeddings rotate pairs of a head's dimensions, and ",
                                   at, ".d_model / n_head = ", gpt.d_model() / gpt.n_head(),
                                   " is odd"));
  }
  RETURN_IF_ERROR(CheckDefaultOrInRange(at + ".rope_theta", gpt.rope_theta(), 1.0, 1e9));
  RETURN_IF_ERROR(CheckDefaultOrInRange(at + ".norm_eps", gpt.norm_eps(), 1e-12, 0.1));
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataSpec& data) {
  if (data.train_size() == 0) {
    return FieldError("data.train", "at least one shard is required");
  }
  for (int i = 0; i < data.train_size(); ++i) {
    if (data.train(i).empty()) {
      return FieldError(absl::StrCat("data.train[", i, "]"), "empty path");
    }
  }
  for (int i = 0; i < data.validation_size(); ++i) {
    if (data.validation(i).empty()) {
      return FieldError(absl::StrCat("data.validation[", i, "]"), "empty path");
    }
  }
  if (data.has_prefetch_depth()) {
    RETURN_IF_ERROR(CheckInRange("data.prefetch_depth", data.prefetch_depth(), 0, 64));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& optimizer) {
  if (!optimizer.has_adamw()) {
    return FieldError("optimizer.adamw",
                      "required (the only optimizer so far)");
  }
  const v1::AdamW& adamw = optimizer.adamw();
  if (!(adamw.lr() > 0 && adamw.lr() <= 1)) {
    return FieldError("optimizer.adamw.lr",
                      absl::StrCat("must be in (0, 1], got ", adamw.lr()));
  }
  RETURN_IF_ERROR(CheckUnitOpen("optimizer.adamw.beta1", adamw.beta1()));
  RETURN_IF_ERROR(CheckUnitOpen("optimizer.adamw.beta2", adamw.beta2()));
  if (!(adamw.eps() > 0)) {
    return FieldError("optimizer.adamw.eps",
                      absl::StrCat("must be > 0, got ", adamw.eps()));
  }
  RETURN_IF_ERROR(
      CheckAtLeast("optimizer.adamw.weight_decay", adamw.weight_decay(), 0.0));
  return CheckAtLeast("optimizer.adamw.grad_clip", adamw.grad_clip(), 0.0);
}

absl::Status ValidateSchedule(const v1::ScheduleSpec& schedule) {
  RETURN_IF_ERROR(CheckInRange<int64_t>("schedule.total_steps",
                                        schedule.total_steps(), 1, kMaxSteps));
  if (schedule.warmup_steps() < 0 ||
      schedule.warmup_steps() >= schedule.total_steps()) {
    return FieldError("schedule.warmup_steps",
                      absl::StrCat("must be in [0, schedule.total_steps ",
                                   schedule.total_steps(), "), got ",
                                   schedule.warmup_steps()));
  }
  RETURN_IF_ERROR(
      CheckInRange("schedule.min_lr_ratio", schedule.min_lr_ratio(), 0.0, 1.0));
  RETURN_IF_ERROR(CheckInRange<int64_t>("schedule.eval_interval",
                                        schedule.eval_interval(), 0, kMaxSteps));
  RETURN_IF_ERROR(CheckInRange<int64_t>("schedule.eval_batches",
                                        schedule.eval_batches(), 1, 1000000));
  return CheckInRange<int64_t>("schedule.log_interval", schedule.log_interval(), 1, kMaxSteps);
}

absl::Status ValidateResources(const v1::ResourceSpec& resources) {
  RETURN_IF_ERROR(CheckAtLeast("resources.workers", resources.workers(), 1));
  if (resources.ranks() < resources.workers()) {
    return FieldError(
        "resources.ranks",
        absl::StrCat(resources.ranks(), " is less than resources.workers (",
                     resources.workers(),
                     "); every worker needs at least one rank"));
  }
  RETURN_IF_ERROR(CheckInRange("resources.ranks", resources.ranks(), 1, 4096));
  RETURN_IF_ERROR(CheckInRange("resources.threads_per_rank",
                               resources.threads_per_rank(), 1, 256));
  if (resources.gpus_per_rank() < 0 || resources.gpus_per_rank() > 1) {
    return FieldError("resources.gpus_per_rank",
                      absl::StrCat(resources.gpus_per_rank(),
                                   " is not 0 (CPU) or 1 (one GPU per rank); more GPUs per "
                                   "rank need tensor parallelism, which Loom does not execute "
                                   "yet: use more ranks"));
  }
  return absl::OkStatus();
}

// `ranks` and the data-parallel degree: every rank of a replica reads the
// replica's rows (tensor and pipeline ranks share them).
absl::Status ValidateBatch(const v1::BatchSpec& batch, int32_t ranks,
                           const v1::ParallelismSpec& parallelism) {
  RETURN_IF_ERROR(CheckInRange("batch.global_batch", batch.global_batch(), 1, kMaxBatch));
  RETURN_IF_ERROR(
      CheckInRange("batch.micro_batch", batch.micro_batch(), 1, batch.global_batch()));
  const bool layout = !parallelism.auto_() && parallelism.data() > 0 &&
                      (parallelism.tensor() > 1 || parallelism.pipeline() > 1);
  const int64_t replicas = layout ? parallelism.data() : ranks;
  // Each step every replica runs global / (replicas x micro) micro-batches.
  const int64_t per_step = replicas * batch.micro_batch();
  if (batch.global_batch() % per_step != 0) {
    return FieldError(
        "batch.global_batch",
        layout ? absl::StrCat(batch.global_batch(),
                              " is not divisible by parallelism.data (", replicas,
                              ") x batch.micro_batch (", batch.micro_batch(), ")")
               : absl::StrCat(batch.global_batch(),
                              " is not divisible by resources.ranks (", ranks,
                              ") x batch.micro_batch (", batch.micro_batch(), ")"));
  }
  return absl::OkStatus();
}

// Checks the degrees and the layout knobs; UNIMPLEMENTED ones are left to
// ValidateSupported().
absl::Status ValidateParallelism(const JobSpec& spec) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  const int32_t ranks = spec.resources().ranks();
  RETURN_IF_ERROR(CheckAtLeast("parallelism.data", parallelism.data(), 0));
  RETURN_IF_ERROR(CheckAtLeast("parallelism.tensor", parallelism.tensor(), 0));
  RETURN_IF_ERROR(
      CheckAtLeast("parallelism.pipeline", parallelism.pipeline(), 0));
  RETURN_IF_ERROR(
      CheckAtLeast("parallelism.virtual_stages", parallelism.virtual_stages(), 0));
  if (!parallelism.auto_()) {
    if (parallelism.sequence_parallel() && parallelism.tensor() <= 1) {
      return FieldError("parallelism.sequence_parallel",
                        absl::StrCat("needs parallelism.tensor > 1 (it splits activations "
                                     "across the tensor group), got tensor ",
                                     parallelism.tensor()));
    }
    // The planner's rule (common/parallel_layout.h), so plan and submit agree.
    const int64_t replicas_x_micro =
        int64_t{parallelism.data()} * spec.batch().micro_batch();
    const int64_t micro_batches =
        replicas_x_micro > 0 ? spec.batch().global_batch() / replicas_x_micro : 0;
    if (absl::Status v = CheckInterleaving(EffectiveDecoder(spec.model()).n_layer(),
                                           parallelism.pipeline(),
                                           parallelism.virtual_stages(), micro_batches);
        !v.ok()) {
      return FieldError("parallelism.virtual_stages", v.message());
    }
  }
  if (parallelism.auto_() || parallelism.data() == 0) return absl::OkStatus();
  const int64_t tensor = std::max(parallelism.tensor(), 1);
  const int64_t pipeline = std::max(parallelism.pipeline(), 1);
  const int64_t product = parallelism.data() * tensor * pipeline;
  if (product == ranks) return absl::OkStatus();
  if (tensor == 1 && pipeline == 1) {
    return FieldError(
        "parallelism.data",
        absl::StrCat(parallelism.data(), " does not equal resources.ranks (",
                     ranks, ")"));
  }
  return FieldError(
      "parallelism.data",
      absl::StrCat(parallelism.data(), " x tensor (", tensor, ") x pipeline (",
                   pipeline, ") = ", product,
                   " does not equal resources.ranks (", ranks, ")"));
}

// Valid specs that ask for what Loom cannot run yet, and layouts the model
// cannot be split into (the engine's rules: worker/engine/parallel/
// layout_engine.h).
absl::Status ValidateSupported(const JobSpec& spec) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  const v1::GptModel gpt = EffectiveDecoder(spec.model());
  const std::string at = ModelPath(spec.model());
  // Token shards store ids as uint16 (llm.c's format).
  if (gpt.vocab_size() > 65536) {
    return absl::UnimplementedError(absl::StrCat(
        at, ".vocab_size: ", gpt.vocab_size(),
        " tokens do not fit the token shards' 16-bit ids, so jobs train vocabularies of at most "
        "65536; `loomctl plan` plans larger ones"));
  }
  if (parallelism.zero_stage() < 0 || parallelism.zero_stage() > 3) {
    return FieldError("parallelism.zero_stage",
                      absl::StrCat(parallelism.zero_stage(), " is not 0, 1, 2 or 3"));
  }
  if (parallelism.zero_stage() == 3) {
    return absl::UnimplementedError(
        "parallelism.zero_stage: ZeRO-3 (parameters sharded too) is planned but not executable "
        "yet; stages 0, 1 (optimizer state sharded over the data-parallel group) and 2 "
        "(gradients too) run");
  }
  if (parallelism.sequence_parallel()) {
    return absl::UnimplementedError(
        "parallelism.sequence_parallel: sequence parallelism is planned but not executable "
        "yet (tensor parallelism runs without it); `loomctl plan` evaluates it");
  }
  if (parallelism.virtual_stages() > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "parallelism.virtual_stages: interleaved 1F1B (", parallelism.virtual_stages(),
        " chunks per pipeline rank) is planned but not executable yet; pipelines run plain "
        "1F1B (virtual_stages 0 or 1); `loomctl plan` evaluates it"));
  }
  if (parallelism.tensor() > 1) {
    if (gpt.n_head() % parallelism.tensor() != 0) {
      return FieldError("parallelism.tensor",
                        absl::StrCat(parallelism.tensor(), " does not divide ", at, ".n_head (",
                                     gpt.n_head(),
                                     "): attention heads are split across the tensor group"));
    }
    const ModelShape shape = ModelShapeOf(spec.model());
    const int64_t kv = KvHeads(shape);
    if (kv % parallelism.tensor() != 0 && parallelism.tensor() % kv != 0) {
      return absl::UnimplementedError(absl::StrCat(
          "parallelism.tensor: ", parallelism.tensor(), " and the ", kv,
          " key/value heads of ", at, " (n_kv_head) must divide one another: the heads are "
          "split across the tensor group, or each copied to tensor / n_kv_head ranks when "
          "there are fewer heads than ranks; otherwise a rank's query heads would use parts "
          "of two key/value heads"));
    }
    if (FfnHidden(shape) % parallelism.tensor() != 0) {
      return FieldError("parallelism.tensor",
                        absl::StrCat(parallelism.tensor(), " does not divide the MLP's hidden "
                                     "width (", FfnHidden(shape), "): its columns are split "
                                     "across the tensor group"));
    }
    if (gpt.vocab_size() < parallelism.tensor()) {
      return FieldError("parallelism.tensor",
                        absl::StrCat(parallelism.tensor(), " exceeds ", at, ".vocab_size (",
                                     gpt.vocab_size(), ")"));
    }
    if (gpt.dropout() != 0) {
      return absl::UnimplementedError(absl::StrCat(
          at, ".dropout: dropout (", gpt.dropout(),
          ") under tensor parallelism is not executable yet; set it to 0, or use "
          "parallelism.tensor: 1"));
    }
  }
  if (parallelism.pipeline() > 1 && parallelism.pipeline() > gpt.n_layer()) {
    return FieldError("parallelism.pipeline",
                      absl::StrCat(parallelism.pipeline(), " exceeds ", at, ".n_layer (",
                                   gpt.n_layer(), "): every stage needs at least one block"));
  }
  const bool layout = parallelism.tensor() > 1 || parallelism.pipeline() > 1 ||
                      parallelism.zero_stage() > 0;
  if (layout && spec.resources().gpus_per_rank() > 0) {
    return absl::UnimplementedError(
        "resources.gpus_per_rank: tensor, pipeline and ZeRO layouts run on CPU ranks in this "
        "version; GPU ranks run data parallelism");
  }
  // BF16 runs on the CPU workers (autocast, fp32 master weights); FP16
  // needs dynamic loss scaling and GPU workers, which Loom has not yet.
  if (spec.precision() == v1::FP16) {
    return absl::UnimplementedError(
        "precision: FP16 is planned but not executable yet: it needs GPU "
        "workers (fp16 with dynamic loss scaling); use BF16 or FP32");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text) {
  std::string json;
  try {
    // Not YAML::LoadAll: it never returns on some malformed streams
    // (common/yaml_util.h).
    const std::string yaml(text);
    const int documents = CountYamlDocuments(yaml, 16);
    if (documents > 1) {
      return FieldError(kSpecPath, absl::StrCat("expected one YAML document, got ",
                                                documents > 16 ? "more than 16"
                                                               : absl::StrCat(documents)));
    }
    const YAML::Node document = documents == 0 ? YAML::Node() : YAML::Load(yaml);
    if (!document.IsDefined() || document.IsNull()) {
      return FieldError(kSpecPath, "empty");
    }
    RETURN_IF_ERROR(MessageToJson(document, JobSpec::descriptor(), "", &json));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return FieldError(kSpecPath, absl::StrCat("invalid YAML: ", e.msg));
    }
    return FieldError(
        kSpecPath, absl::StrFormat("invalid YAML at line %d, column %d: %s",
                                   e.mark.line + 1, e.mark.column + 1, e.msg));
  }

  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    // The walk above should have caught everything JsonStringToMessage
    // rejects (invalid UTF-8 or base64 aside); if not, report it unlocated.
    return FieldError(kSpecPath, std::string(status.message().data(),
                                             status.message().size()));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadSpecFile(path));
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(text));

  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot make absolute: ", error.message()));
  }
  const std::filesystem::path dir = absolute.parent_path();
  v1::DataSpec* data = spec.mutable_data();
  for (std::string& entry : *data->mutable_train()) {
    entry = ResolveAgainst(dir, entry);
  }
  for (std::string& entry : *data->mutable_validation()) {
    entry = ResolveAgainst(dir, entry);
  }
  if (spec.has_checkpoint() && !spec.checkpoint().dir().empty()) {
    spec.mutable_checkpoint()->set_dir(
        ResolveAgainst(dir, spec.checkpoint().dir()));
  }
  if (!spec.init_from().path().empty()) {
    spec.mutable_init_from()->set_path(ResolveAgainst(dir, spec.init_from().path()));
  }
  return spec;
}

void ApplyJobSpecDefaults(JobSpec* spec) {
  // A Llama-family model is stored with its defaults explicit, so the job
  // record (and `loomctl validate -o json`) shows what trains.
  if (spec->model().has_llama()) {
    *spec->mutable_model()->mutable_llama() = EffectiveDecoder(spec->model());
  }
  if (spec->optimizer().has_adamw()) {
    v1::AdamW* adamw = spec->mutable_optimizer()->mutable_adamw();
    if (adamw->beta1() == 0) adamw->set_beta1(0.9);
    if (adamw->beta2() == 0) adamw->set_beta2(0.95);
    if (adamw->eps() == 0) adamw->set_eps(1e-8);
    if (adamw->weight_decay() == 0) adamw->set_weight_decay(0.1);
  }

  v1::ScheduleSpec* schedule = spec->mutable_schedule();
  if (schedule->min_lr_ratio() == 0) schedule->set_min_lr_ratio(0.1);
  if (schedule->eval_batches() == 0) schedule->set_eval_batches(8);
  if (schedule->log_interval() == 0) schedule->set_log_interval(1);

  v1::ResourceSpec* resources = spec->mutable_resources();
  if (resources->workers() == 0) resources->set_workers(1);
  if (resources->ranks() == 0) resources->set_ranks(resources->workers());
  if (resources->threads_per_rank() == 0) resources->set_threads_per_rank(1);
  const int32_t ranks = resources->ranks();

  v1::ParallelismSpec* parallelism = spec->mutable_parallelism();
  if (!parallelism->auto_()) {
    if (parallelism->tensor() == 0) parallelism->set_tensor(1);
    if (parallelism->pipeline() == 0) parallelism->set_pipeline(1);
    const int64_t model_parallel =
        int64_t{parallelism->tensor()} * parallelism->pipeline();
    if (parallelism->data() == 0 && model_parallel > 0 && ranks > 0 &&
        ranks % model_parallel == 0) {
      parallelism->set_data(static_cast<int32_t>(ranks / model_parallel));
    }
  }

  // Each data-parallel replica takes global / replicas rows per step.
  v1::BatchSpec* batch = spec->mutable_batch();
  const int32_t replicas = parallelism->data() > 0 ? parallelism->data() : ranks;
  if (batch->micro_batch() == 0 && batch->global_batch() > 0 && replicas > 0) {
    batch->set_micro_batch(std::max(1, batch->global_batch() / replicas));
  }

  if (spec->precision() == v1::PRECISION_UNSPECIFIED) {
    spec->set_precision(v1::FP32);
  }
  v1::CheckpointSpec* checkpoint = spec->mutable_checkpoint();
  if (checkpoint->keep() == 0) checkpoint->set_keep(3);
  if (spec->seed() == 0) spec->set_seed(1337);
}

// init_from: a job (and step) or a path; a job's own name is not a source.
absl::Status ValidateInitFrom(const JobSpec& spec) {
  if (!spec.has_init_from()) return absl::OkStatus();
  const v1::InitFrom& from = spec.init_from();
  if (from.job().empty() && from.path().empty()) {
    return FieldError("init_from", "give job (and step) or path");
  }
  if (!from.job().empty()) {
    // A job id is "<name>-<n>".
    const size_t dash = from.job().rfind('-');
    int64_t n = 0;
    if (dash == std::string::npos || dash == 0 ||
        !IsValidJobName(from.job().substr(0, dash)) ||
        !absl::SimpleAtoi(from.job().substr(dash + 1), &n) || n < 1) {
      return FieldError("init_from.job",
                        absl::StrCat("\"", absl::Utf8SafeCHexEscape(from.job()),
                                     "\" is not a job id (NAME-N, as loomctl list shows)"));
    }
  }
  RETURN_IF_ERROR(CheckInRange<int64_t>("init_from.step", from.step(), 0, kMaxSteps));
  if (from.job().empty() && from.step() != 0) {
    return FieldError("init_from.step", "goes with init_from.job; a path names its step");
  }
  if (!from.path().empty() && from.path()[0] != '/') {
    return FieldError("init_from.path",
                      absl::StrCat("\"", absl::Utf8SafeCHexEscape(from.path()),
                                   "\" must be absolute (or relative to the spec file)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  RETURN_IF_ERROR(CheckFinite(spec, ""));
  if (spec.name().empty()) return FieldError("name", "required");
  if (!IsValidJobName(spec.name())) {
    return FieldError(
        "name", absl::StrCat("\"", absl::Utf8SafeCHexEscape(spec.name()),
                             "\" must be 1-63 characters of [a-z0-9-], "
                             "starting and ending with a letter or digit"));
  }
  RETURN_IF_ERROR(ValidateModel(spec.model()));
  RETURN_IF_ERROR(ValidateData(spec.data()));
  RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  RETURN_IF_ERROR(ValidateSchedule(spec.schedule()));
  RETURN_IF_ERROR(ValidateResources(spec.resources()));
  RETURN_IF_ERROR(
      ValidateBatch(spec.batch(), spec.resources().ranks(), spec.parallelism()));
  RETURN_IF_ERROR(ValidateParallelism(spec));
  if (!v1::Precision_IsValid(spec.precision())) {
    return FieldError("precision",
                      absl::StrCat("unknown value ", spec.precision()));
  }
  if (spec.activation_checkpointing() < -1) {
    return FieldError(
        "activation_checkpointing",
        absl::StrCat("must be 0 (off), k >= 1 (every k-th block) or -1 "
                     "(every ceil(sqrt(n_layer))-th block), got ",
                     spec.activation_checkpointing()));
  }
  if (spec.activation_checkpointing() > EffectiveDecoder(spec.model()).n_layer()) {
    return FieldError("activation_checkpointing",
                      absl::StrCat("every k-th block with k = ", spec.activation_checkpointing(),
                                   " > ", ModelPath(spec.model()), ".n_layer (", EffectiveDecoder(spec.model()).n_layer(),
                                   ") checkpoints nothing; use 0 for off"));
  }
  RETURN_IF_ERROR(CheckInRange<int64_t>("checkpoint.interval_steps",
                                        spec.checkpoint().interval_steps(), 0, kMaxSteps));
  RETURN_IF_ERROR(CheckInRange("checkpoint.keep", spec.checkpoint().keep(), 1, 100000));
  RETURN_IF_ERROR(ValidateRecovery(spec.recovery()));
  RETURN_IF_ERROR(ValidateSkipBatches(spec.skip_batches(), "skip_batches"));
  RETURN_IF_ERROR(ValidateInitFrom(spec));
  return ValidateSupported(spec);
}

std::string JobSpecToJson(const JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!status.ok()) {
    // JobSpec has no Any fields, so printing cannot fail to resolve a type;
    // keep the output useful for display rather than empty.
    return absl::StrCat(
        "# not printable as JSON: ",
        std::string(status.message().data(), status.message().size()), "\n",
        spec.DebugString());
  }
  return json;
}

}  // namespace loom
