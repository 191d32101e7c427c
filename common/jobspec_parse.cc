#include "common/jobspec_parse.h"

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
#include "common/jobspec_rules.h"
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

using jobspec_rules::FieldError;

std::string JoinPath(absl::string_view parent, absl::string_view name) {
  return parent.empty() ? std::string(name) : absl::StrCat(parent, ".", name);
}

// ---------------------------------------------------------------------------
// YAML scalars. yaml-cpp keeps every scalar as text and tags plain (unquoted)
// scalars "?"; quoted ones get "!" and explicitly tagged ones their tag.

bool IsPlain(const YAML::Node& node) { return node.Tag() == "?"; }

// How a node reads in an error message.
std::string Describe(const YAML::Node& node) { return DescribeYamlNode(node, 64); }

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
      // scheduling.priority is an integer or a class name: both are text.
      if (IsPlain(node) && (IsFloatLiteral(text) || IsBoolLiteral(text) ||
                            NonFiniteJson(text) != nullptr) &&
          !(field->full_name() == "loom.v1.SchedulingSpec.priority" && IsIntLiteral(text))) {
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