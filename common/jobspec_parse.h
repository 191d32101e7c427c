// Job specs from text: YAML or JSON checked against the JobSpec descriptor
// field by field (every error names its field path), spec files with their
// relative paths resolved, and the JSON form for display. Parsing neither
// applies defaults nor validates values: jobspec_defaults.h and
// jobspec_validate.h do. All functions are thread-safe.
#ifndef LOOM_COMMON_JOBSPEC_PARSE_H_
#define LOOM_COMMON_JOBSPEC_PARSE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom {

// Parses a spec written in YAML or JSON (JSON is read as YAML flow style).
// Field names and values follow the proto3 JSON mapping: both the proto name
// ("global_batch") and the JSON name ("globalBatch") are accepted, enums are
// written by name ("BF16"), and null means "not set".
//
// The input is checked against the JobSpec descriptor before it reaches
// google::protobuf::util::JsonStringToMessage, so that every problem names its
// field path. The rules, kept the same for quoted and unquoted YAML scalars:
//   * Unknown fields are errors (with a suggestion when one is close).
//   * The same field given twice (also as "n_head" and "nHead"), or two
//     members of one oneof, is an error.
//   * Integer fields take an integer ("5", 5, or 1e6: a number whose value is
//     exactly an integer); quoting is allowed because proto3 JSON allows it
//     for every integer type. Out-of-range values are errors.
//   * Floating-point fields take a number, quoted or not, or one of NaN,
//     Infinity, -Infinity (proto3 JSON) or .nan/.inf/-.inf (YAML). Non-finite
//     values parse; ValidateJobSpec() rejects them.
//   * Enum fields take a value name, quoted or not, or (as proto3 JSON
//     allows) the number of a defined value, unquoted.
//   * Bool fields take unquoted true or false only.
//   * String fields reject unquoted scalars that YAML would read as a number
//     or a bool (write name: "123", not name: 123).
//   * Lists must be YAML sequences, messages YAML mappings.
// Only one YAML document is allowed. Returns INVALID_ARGUMENT on any problem.
// Does not apply defaults or validate values.
absl::StatusOr<loom::v1::JobSpec> ParseJobSpec(absl::string_view text);

// Reads the file at `path` and parses it with ParseJobSpec(). Then makes the
// relative paths in data.train, data.validation and checkpoint.dir absolute,
// resolving them against the (absolute) directory that holds the spec file;
// entries that are already absolute, empty, or contain "://" are kept as
// they are. Glob characters are kept, so "shards/*.bin" becomes
// "/abs/spec/dir/shards/*.bin". "~" is not expanded.
//
// Returns NOT_FOUND if the file does not exist, PERMISSION_DENIED if it cannot
// be read, INVALID_ARGUMENT if it is a directory, larger than 1 MiB, or does
// not parse; other I/O failures map from errno (absl::ErrnoToStatus).
// Does not apply defaults or validate values.
//
// Reads through POSIX directly: Loom has no injectable Env yet.
absl::StatusOr<loom::v1::JobSpec> LoadJobSpecFile(const std::string& path);


// Pretty-printed JSON for display (loomctl): proto field names, enums by name,
// scalar fields printed even when zero (after ApplyJobSpecDefaults() a zero
// is meaningful, e.g. eval_interval 0). 64-bit integers are quoted, as proto3
// JSON requires. ParseJobSpec() reads the output back to an equal message.
std::string JobSpecToJson(const loom::v1::JobSpec& spec);

}  // namespace loom

#endif  // LOOM_COMMON_JOBSPEC_PARSE_H_
