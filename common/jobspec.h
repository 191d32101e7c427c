// Loading, defaulting and validating job specs (loom.v1.JobSpec).
//
// A spec travels through three steps, each a separate call so that specs
// arriving over gRPC (already messages) share the last two with files:
//
//   ASSIGN_OR_RETURN(loom::v1::JobSpec spec, LoadJobSpecFile(path));
//   ApplyJobSpecDefaults(&spec);
//   RETURN_IF_ERROR(ValidateJobSpec(spec));
//
// Error messages start with the proto field path of the problem, written with
// the proto (snake_case) field names and [i] for list elements, e.g.
//   INVALID_ARGUMENT: model.gpt.n_heads: unknown field (did you mean "n_head"?)
//   INVALID_ARGUMENT: data.train[1]: empty path
// Problems that are not about one field (YAML syntax, empty input) start with
// "job spec: " instead. Messages never include the file name; callers that
// know it (loomctl) prefix it themselves.
//
// All functions are thread-safe: they keep no state between calls.
#ifndef LOOM_COMMON_JOBSPEC_H_
#define LOOM_COMMON_JOBSPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_shape.h"
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

// Fills in defaults. proto3 scalars have no presence, so "unset" and "zero"
// are the same thing; for each field below 0 (or UNSPECIFIED) means "use the
// default", which means a literal 0 cannot be asked for where a default
// exists:
//   optimizer.adamw.beta1         0.9     (only if optimizer.adamw is set;
//   optimizer.adamw.beta2         0.95     the oneof member is never created)
//   optimizer.adamw.eps           1e-8
//   optimizer.adamw.weight_decay  0.1     (so weight decay cannot be disabled;
//                                          use a tiny value such as 1e-12)
//   schedule.min_lr_ratio         0.1     (likewise; decay to ~0 with 1e-12)
//   schedule.eval_batches         8
//   schedule.log_interval         1
//   resources.workers             1
//   resources.ranks               resources.workers
//   resources.threads_per_rank    1
//   batch.micro_batch             max(1, global_batch / ranks) when
//                                 global_batch > 0 (ValidateJobSpec() reports
//                                 a global_batch that does not split evenly)
//   parallelism.tensor, .pipeline 1, unless parallelism.auto
//   parallelism.data              ranks / (tensor x pipeline) when that
//                                 divides evenly, unless parallelism.auto
//   precision                     FP32
//   checkpoint.keep               3
//   seed                          1337    (so seed 0 cannot be asked for)
// Deliberately NOT defaulted:
//   optimizer.adamw.lr            required; 0 is an error, not "unset".
//   optimizer.adamw.grad_clip     0 disables clipping (the proto's contract),
//                                 so a default of 1.0 cannot be expressed.
//   schedule.eval_interval        0 = evaluate only at the end.
//   checkpoint.interval_steps     0 = only the final checkpoint.
//   checkpoint.dir                the controller picks
//                                 <data-dir>/checkpoints/<job>; it knows
//                                 the data dir, this library does not.
// Never creates the model or optimizer oneof members, so ValidateJobSpec()
// can still report them missing. Idempotent. `spec` must be non-null.
void ApplyJobSpecDefaults(loom::v1::JobSpec* spec);

// Checks a spec after ApplyJobSpecDefaults(). Returns OK, or the first problem
// found, checked in this order: non-finite floating-point values anywhere,
// name, model, data, optimizer, schedule, resources, batch, parallelism,
// checkpoint (all INVALID_ARGUMENT), then the features that a valid spec may
// ask for but Loom cannot run yet (UNIMPLEMENTED): ZeRO-3, sequence
// parallelism, interleaved pipelines (virtual_stages > 1), dropout under
// tensor parallelism, tensor/pipeline/ZeRO layouts on GPU ranks, and for
// models other than the GPT-2 shape (the Llama family: grouped-query
// attention, a gated or resized MLP, RMSNorm, rotary positions, no biases,
// untied embeddings) any layout but data parallelism, and FP16 precision
// (it needs GPU workers). The planner accepts all of these (`loomctl plan`, the Plan RPC
// let UNIMPLEMENTED through); their malformed values (n_kv_head not
// dividing n_head, mlp.hidden < 1, sequence_parallel without tensor > 1,
// an interleaving the layers or micro-batches do not allow) are
// INVALID_ARGUMENT. Tensor and pipeline parallelism and ZeRO
// 0-2 execute; a degree the model cannot be split into (tensor not dividing
// the heads, pipeline above the layers) is INVALID_ARGUMENT. The
// activation_checkpointing check comes after parallelism. Ranges (README,
// "Job spec ranges"): model.gpt.n_layer and n_head in [1, 1024], d_model
// and seq_len in [1, 65536], vocab_size in [1, 2^22], n_kv_head in
// [0, n_head], mlp.hidden in [1, 2^20]; schedule.total_steps in [1, 1e9],
// eval_interval and log_interval up to 1e9, eval_batches in [1, 1e6];
// batch.global_batch in [1, 2^24], micro_batch in [1, global_batch];
// activation_checkpointing in [-1, n_layer]; checkpoint.interval_steps in
// [0, 1e9], keep in [1, 1e5]; recovery.max_restarts and max_rollbacks in
// [0, 1e4], and (0 = the default) window in [8, 1e5], min_history and
// confirm_steps in [1, window], threshold in [1, 1e6], rollback_distance,
// skip_before and skip_after in [1, 1e9]; skip_batches as
// ValidateSkipBatches. So no arithmetic on a valid spec overflows. The
// message starts with the field path, e.g.
//   model.gpt.n_head: 5 does not divide model.gpt.d_model 768
// Does not touch the filesystem: whether data paths exist is checked when the
// job is planned.
absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec);

// Data batch ranges [begin, end) to skip, as in JobSpec.skip_batches and
// RollbackJob: each non-empty, 0 <= begin < end <= 2^50, at most 10000.
// INVALID_ARGUMENT naming `path`[i] otherwise.
absl::Status ValidateSkipBatches(
    const google::protobuf::RepeatedPtrField<loom::v1::SkipRange>& ranges,
    absl::string_view path);

// "model.gpt" or "model.llama": the model arm the spec sets (model.gpt when
// neither), for field paths in messages.
std::string ModelPath(const loom::v1::ModelSpec& model);

// The decoder the spec describes, model.gpt or model.llama, with the arm's
// defaults made explicit (loom.v1.GptModel): n_kv_head, mlp.gated,
// mlp.hidden, norm, untied_embeddings, positions, bias, rope_theta and
// norm_eps are all set. Idempotent. The engine, the planner and the
// telemetry read the model through it (and ModelShapeOf).
loom::v1::GptModel EffectiveDecoder(const loom::v1::ModelSpec& model);

// True when `model` (effective or not) is GPT-2's shape: what the tensor,
// pipeline and ZeRO engine builds.
bool IsGpt2Shape(const loom::v1::GptModel& model);

// "SwiGLU MLP, RMSNorm, rotary positions, ..." for messages; "GPT-2 shape".
std::string DescribeDecoder(const loom::v1::GptModel& model);

// The spec's model as the shared shape (common/model_shape.h).
ModelShape ModelShapeOf(const loom::v1::ModelSpec& model);

// Pretty-printed JSON for display (loomctl): proto field names, enums by name,
// scalar fields printed even when zero (after ApplyJobSpecDefaults() a zero
// is meaningful, e.g. eval_interval 0). 64-bit integers are quoted, as proto3
// JSON requires. ParseJobSpec() reads the output back to an equal message.
std::string JobSpecToJson(const loom::v1::JobSpec& spec);

}  // namespace loom

#endif  // LOOM_COMMON_JOBSPEC_H_
