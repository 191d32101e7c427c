#include "common/jobspec.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "loom/v1/job.pb.h"

namespace loom {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::loom::v1::JobSpec;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kGoodYaml[] = R"yaml(
# A small but complete spec.
name: tiny-shakespeare
model:
  gpt:
    n_layer: 2
    n_head: 4
    d_model: 128
    seq_len: 64
    vocab_size: 50257
    dropout: 0.1
data:
  train: [shards/train_*.bin]
  validation:
    - shards/val.bin
optimizer:
  adamw:
    lr: 6e-4
    grad_clip: 1.0
schedule:
  total_steps: 1000
  warmup_steps: 100
  eval_interval: 100
batch:
  global_batch: 32
  micro_batch: 4
precision: FP32
resources:
  workers: 2
  ranks: 4
checkpoint:
  interval_steps: 200
seed: 42
)yaml";

// kGoodYaml as JSON, with lowerCamel names, quoted 64-bit integers and the
// enum by number, all as proto3 JSON allows.
constexpr char kGoodJson[] = R"json({
  "name": "tiny-shakespeare",
  "model": {"gpt": {"nLayer": 2, "nHead": 4, "dModel": 128, "seqLen": 64,
                    "vocabSize": 50257, "dropout": 0.1}},
  "data": {"train": ["shards/train_*.bin"], "validation": ["shards/val.bin"]},
  "optimizer": {"adamw": {"lr": 0.0006, "gradClip": 1}},
  "schedule": {"totalSteps": "1000", "warmupSteps": 100, "evalInterval": 100},
  "batch": {"globalBatch": 32, "microBatch": 4},
  "precision": 1,
  "resources": {"workers": 2, "ranks": 4},
  "checkpoint": {"intervalSteps": 200},
  "seed": "42"
})json";

JobSpec MustParse(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(ParseJobSpecTest, GoodSpecParsesAndValidates) {
  JobSpec spec = MustParse(kGoodYaml);
  EXPECT_EQ(spec.name(), "tiny-shakespeare");
  ASSERT_TRUE(spec.model().has_gpt());
  EXPECT_EQ(spec.model().gpt().n_head(), 4);
  EXPECT_EQ(spec.model().gpt().vocab_size(), 50257);
  EXPECT_DOUBLE_EQ(spec.model().gpt().dropout(), 0.1);
  ASSERT_EQ(spec.data().train_size(), 1);
  EXPECT_EQ(spec.data().train(0), "shards/train_*.bin");
  EXPECT_EQ(spec.data().validation(0), "shards/val.bin");
  EXPECT_DOUBLE_EQ(spec.optimizer().adamw().lr(), 6e-4);
  EXPECT_EQ(spec.schedule().total_steps(), 1000);
  EXPECT_EQ(spec.precision(), v1::FP32);
  EXPECT_EQ(spec.seed(), 42u);

  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ParseJobSpecTest, YamlAndJsonGiveEqualMessages) {
  const JobSpec from_yaml = MustParse(kGoodYaml);
  const JobSpec from_json = MustParse(kGoodJson);
  EXPECT_TRUE(MessageDifferencer::Equals(from_yaml, from_json))
      << from_yaml.DebugString() << "\nvs\n"
      << from_json.DebugString();
}

TEST(ParseJobSpecTest, SnakeAndCamelCaseBothAccepted) {
  const JobSpec snake = MustParse(
      "name: a\nmodel: {gpt: {n_head: 4, d_model: 8}}\n"
      "batch: {global_batch: 8, micro_batch: 2}\n"
      "resources: {threads_per_rank: 3}\n");
  const JobSpec camel = MustParse(
      "name: a\nmodel: {gpt: {nHead: 4, dModel: 8}}\n"
      "batch: {globalBatch: 8, microBatch: 2}\n"
      "resources: {threadsPerRank: 3}\n");
  EXPECT_EQ(snake.batch().global_batch(), 8);
  EXPECT_EQ(snake.resources().threads_per_rank(), 3);
  EXPECT_TRUE(MessageDifferencer::Equals(snake, camel));
}

TEST(ParseJobSpecTest, UnknownTopLevelFieldNamesIt) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("nmae: x\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "nmae: unknown field (did you mean \"name\"?)");

  spec = ParseJobSpec("name: x\nfavourite_colour: blue\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), "favourite_colour: unknown field");
}

TEST(ParseJobSpecTest, UnknownNestedFieldNamesItsPath) {
  const absl::StatusOr<JobSpec> spec =
      ParseJobSpec("model:\n  gpt:\n    n_layer: 2\n    n_heads: 12\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "model.gpt.n_heads: unknown field (did you mean \"n_head\"?)");
}

TEST(ParseJobSpecTest, WrongTypeNamesItsPath) {
  const absl::StatusOr<JobSpec> spec =
      ParseJobSpec("batch:\n  global_batch: lots\n");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "batch.global_batch: expected an integer, got \"lots\"");
}

TEST(ParseJobSpecTest, NumbersMayBeQuotedOrWrittenWithExponents) {
  const JobSpec spec = MustParse(
      "batch: {global_batch: \"64\"}\n"
      "schedule: {total_steps: 1e6, warmup_steps: '2000'}\n"
      "optimizer: {adamw: {lr: \"3e-4\", eps: .5}}\n"
      "seed: 18446744073709551615\n");
  EXPECT_EQ(spec.batch().global_batch(), 64);
  EXPECT_EQ(spec.schedule().total_steps(), 1000000);
  EXPECT_EQ(spec.schedule().warmup_steps(), 2000);
  EXPECT_DOUBLE_EQ(spec.optimizer().adamw().lr(), 3e-4);
  EXPECT_DOUBLE_EQ(spec.optimizer().adamw().eps(), 0.5);
  EXPECT_EQ(spec.seed(), 18446744073709551615u);
}

TEST(ParseJobSpecTest, NullMeansNotSet) {
  const JobSpec spec = MustParse("name: a\ncheckpoint:\nseed: ~\n");
  EXPECT_FALSE(spec.has_checkpoint());
  EXPECT_EQ(spec.seed(), 0u);
}

TEST(ParseJobSpecTest, NonFiniteNumbersParseAndFailValidation) {
  for (const char* lr : {".nan", "\"NaN\"", ".inf", "-Infinity"}) {
    JobSpec spec = MustParse(kGoodYaml);
    const JobSpec patch =
        MustParse(absl::StrCat("optimizer: {adamw: {lr: ", lr, "}}"));
    EXPECT_FALSE(std::isfinite(patch.optimizer().adamw().lr())) << lr;
    spec.mutable_optimizer()->mutable_adamw()->set_lr(
        patch.optimizer().adamw().lr());
    ApplyJobSpecDefaults(&spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << lr;
    EXPECT_THAT(std::string(status.message()),
                StartsWith("optimizer.adamw.lr: must be finite"))
        << lr;
  }
}

struct BadParseCase {
  const char* text;
  absl::StatusCode code;
  const char* message_prefix;  // the field path, and sometimes more
};

TEST(ParseJobSpecTest, BadInputsNameTheProblem) {
  const BadParseCase cases[] = {
      {"batch: {global_batch: 2.5}", absl::StatusCode::kInvalidArgument,
       "batch.global_batch: expected an integer, got \"2.5\""},
      {"batch: {global_batch: 3000000000}", absl::StatusCode::kInvalidArgument,
       "batch.global_batch: 3000000000 is out of range for int32"},
      {"seed: -1", absl::StatusCode::kInvalidArgument,
       "seed: -1 is out of range for uint64"},
      {"schedule: {total_steps: 99999999999999999999}",
       absl::StatusCode::kInvalidArgument,
       "schedule.total_steps: 99999999999999999999 is out of range for int64"},
      {"name: 123", absl::StatusCode::kInvalidArgument,
       "name: expected a string, got 123"},
      {"name: true", absl::StatusCode::kInvalidArgument,
       "name: expected a string"},
      {"{\"name\": 5}", absl::StatusCode::kInvalidArgument,
       "name: expected a string"},
      {"parallelism: {auto: \"true\"}", absl::StatusCode::kInvalidArgument,
       "parallelism.auto: expected true or false unquoted"},
      {"parallelism: {auto: yes}", absl::StatusCode::kInvalidArgument,
       "parallelism.auto: expected true or false, got \"yes\""},
      {"precision: FP8", absl::StatusCode::kInvalidArgument,
       "precision: unknown value \"FP8\""},
      {"precision: bf16", absl::StatusCode::kInvalidArgument,
       "precision: unknown value \"bf16\", expected one of "
       "PRECISION_UNSPECIFIED, FP32, BF16, FP16 (did you mean \"BF16\"?)"},
      {"precision: \"2\"", absl::StatusCode::kInvalidArgument,
       "precision: unknown value \"2\""},
      {"seed: 0x10", absl::StatusCode::kInvalidArgument,
       "seed: expected an integer, got \"0x10\""},
      {"data: {train: shards/a.bin}", absl::StatusCode::kInvalidArgument,
       "data.train: expected a list, got \"shards/a.bin\""},
      {"data: {train: [a.bin, ~]}", absl::StatusCode::kInvalidArgument,
       "data.train[1]: expected a string, got null"},
      {"data: {train: [[a.bin]]}", absl::StatusCode::kInvalidArgument,
       "data.train[0]: expected a string, got a list"},
      {"model: [gpt]", absl::StatusCode::kInvalidArgument,
       "model: expected a mapping, got a list"},
      {"model: {gpt: 12}", absl::StatusCode::kInvalidArgument,
       "model.gpt: expected a mapping, got \"12\""},
      {"model: {gpt: {n_head: 4, nHead: 4}}",
       absl::StatusCode::kInvalidArgument,
       "model.gpt.n_head: set twice (as \"n_head\" and \"nHead\")"},
      {"name: a\nname: b", absl::StatusCode::kInvalidArgument,
       "name: set twice"},
      {"optimizer: {adamw: {lr: fast}}", absl::StatusCode::kInvalidArgument,
       "optimizer.adamw.lr: expected a number, got \"fast\""},
      {"optimizer: {adamw: {lr: 1e400}}", absl::StatusCode::kInvalidArgument,
       "optimizer.adamw.lr: 1e400 is out of range for double"},
      {"optimizer: {adam: {lr: 1}}", absl::StatusCode::kInvalidArgument,
       "optimizer.adam: unknown field (did you mean \"adamw\"?)"},
      {"[1, 2]", absl::StatusCode::kInvalidArgument,
       "job spec: expected a mapping, got a list"},
      {"", absl::StatusCode::kInvalidArgument, "job spec: empty"},
      {"# nothing but a comment\n", absl::StatusCode::kInvalidArgument,
       "job spec: empty"},
      {"name: a\n---\nname: b\n", absl::StatusCode::kInvalidArgument,
       "job spec: expected one YAML document, got 2"},
      {"model: {gpt: [1, 2\n", absl::StatusCode::kInvalidArgument,
       "job spec: invalid YAML at line"},
      {"{\"name\": \"a\",}}", absl::StatusCode::kInvalidArgument,
       "job spec: invalid YAML"},
  };
  for (const BadParseCase& c : cases) {
    SCOPED_TRACE(c.text);
    const absl::StatusOr<JobSpec> spec = ParseJobSpec(c.text);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), c.code) << spec.status();
    EXPECT_THAT(std::string(spec.status().message()),
                StartsWith(c.message_prefix));
  }
}

// scheduling.priority is an integer or a priority class's name; both parse.
TEST(ParseJobSpecTest, SchedulingPriorityIsAnIntegerOrAClassName) {
  const std::string base = std::string(kGoodYaml);
  auto ValidateJobSpec = [](JobSpec spec) {  // as submit validates: after the defaults
    ApplyJobSpecDefaults(&spec);
    return loom::ValidateJobSpec(spec);
  };
  absl::StatusOr<JobSpec> number =
      ParseJobSpec(base + "scheduling: {queue: research, priority: 100, max_runtime_seconds: 3600}\n");
  ASSERT_TRUE(number.ok()) << number.status();
  EXPECT_EQ(number->scheduling().queue(), "research");
  EXPECT_EQ(number->scheduling().priority(), "100");
  EXPECT_EQ(number->scheduling().max_runtime_seconds(), 3600);
  EXPECT_FALSE(number->scheduling().has_preemptible());
  EXPECT_TRUE(ValidateJobSpec(*number).ok()) << ValidateJobSpec(*number);
  absl::StatusOr<JobSpec> named =
      ParseJobSpec(base + "scheduling: {priority: high, preemptible: false}\n");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->scheduling().priority(), "high");
  EXPECT_TRUE(named->scheduling().has_preemptible());
  EXPECT_FALSE(named->scheduling().preemptible());
  EXPECT_TRUE(ValidateJobSpec(*named).ok()) << ValidateJobSpec(*named);
  absl::StatusOr<JobSpec> negative = ParseJobSpec(base + "scheduling: {priority: -5}\n");
  ASSERT_TRUE(negative.ok()) << negative.status();
  EXPECT_EQ(negative->scheduling().priority(), "-5");
  // Other strings still refuse numbers that are not integers.
  absl::StatusOr<JobSpec> fraction = ParseJobSpec(base + "scheduling: {priority: 1.5}\n");
  EXPECT_EQ(fraction.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fraction.status().message()),
              HasSubstr("scheduling.priority: expected a string, got 1.5"));
  absl::StatusOr<JobSpec> queue = ParseJobSpec(base + "scheduling: {queue: 7}\n");
  EXPECT_THAT(std::string(queue.status().message()), HasSubstr("scheduling.queue: expected a string"));
}

TEST(ApplyJobSpecDefaultsTest, FillsDocumentedDefaults) {
  JobSpec spec = MustParse(
      "name: a\noptimizer: {adamw: {lr: 0.001}}\nbatch: {global_batch: 32}\n"
      "resources: {workers: 2}\n");
  ApplyJobSpecDefaults(&spec);
  const v1::AdamW& adamw = spec.optimizer().adamw();
  EXPECT_DOUBLE_EQ(adamw.beta1(), 0.9);
  EXPECT_DOUBLE_EQ(adamw.beta2(), 0.95);
  EXPECT_DOUBLE_EQ(adamw.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(adamw.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(adamw.grad_clip(), 0.0);  // 0 disables clipping
  EXPECT_DOUBLE_EQ(spec.schedule().min_lr_ratio(), 0.1);
  EXPECT_EQ(spec.schedule().eval_interval(), 0);
  EXPECT_EQ(spec.schedule().eval_batches(), 8);
  EXPECT_EQ(spec.schedule().log_interval(), 1);
  EXPECT_EQ(spec.resources().workers(), 2);
  EXPECT_EQ(spec.resources().ranks(), 2);
  EXPECT_EQ(spec.resources().threads_per_rank(), 1);
  EXPECT_EQ(spec.batch().micro_batch(), 16);
  EXPECT_EQ(spec.parallelism().data(), 2);
  EXPECT_EQ(spec.parallelism().tensor(), 1);
  EXPECT_EQ(spec.parallelism().pipeline(), 1);
  EXPECT_EQ(spec.precision(), v1::FP32);
  EXPECT_EQ(spec.checkpoint().keep(), 3);
  EXPECT_EQ(spec.checkpoint().dir(), "");
  EXPECT_EQ(spec.seed(), 1337u);
  EXPECT_FALSE(spec.model().has_gpt());

  const JobSpec once = spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(MessageDifferencer::Equals(once, spec)) << "not idempotent";
}

// checkpoint.keep and retention.local.newest name one number; the object
// store keeps everything unless a rule is given, then the newest 3 besides.
TEST(ApplyJobSpecDefaultsTest, RetentionDefaultsFollowKeepAndTheObjectStore) {
  JobSpec spec = MustParse(kGoodYaml);
  spec.mutable_checkpoint()->set_keep(5);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.checkpoint().retention().local().newest(), 5);
  EXPECT_FALSE(spec.checkpoint().retention().has_remote());
  EXPECT_TRUE(ValidateJobSpec(spec).ok());

  spec = MustParse(kGoodYaml);
  spec.mutable_checkpoint()->mutable_retention()->mutable_local()->set_newest(2);
  spec.mutable_checkpoint()->set_remote("s3://ckpts/runs");
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.checkpoint().keep(), 2);
  EXPECT_TRUE(spec.checkpoint().retention().remote().all());
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  spec = MustParse(kGoodYaml);
  spec.mutable_checkpoint()->set_remote("s3://ckpts/runs");
  spec.mutable_checkpoint()->mutable_retention()->mutable_remote()->set_every(1000);
  spec.mutable_checkpoint()->mutable_retention()->mutable_remote()->set_best(2);
  ApplyJobSpecDefaults(&spec);
  const v1::RetentionPolicy& remote = spec.checkpoint().retention().remote();
  EXPECT_EQ(remote.newest(), 3);
  EXPECT_FALSE(remote.all());
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const JobSpec again = spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(MessageDifferencer::Equals(spec, again));  // idempotent
}

TEST(ApplyJobSpecDefaultsTest, KeepsGivenValuesAndAutoParallelism) {
  JobSpec spec = MustParse(kGoodYaml);
  spec.mutable_parallelism()->set_auto_(true);
  ApplyJobSpecDefaults(&spec);
  EXPECT_DOUBLE_EQ(spec.optimizer().adamw().grad_clip(), 1.0);
  EXPECT_EQ(spec.batch().micro_batch(), 4);
  EXPECT_EQ(spec.resources().ranks(), 4);
  EXPECT_EQ(spec.seed(), 42u);
  EXPECT_EQ(spec.parallelism().data(), 0);  // the planner decides
  EXPECT_FALSE(spec.optimizer().adamw().lr() == 0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ApplyJobSpecDefaultsTest, DoesNotCreateOneofMembers) {
  JobSpec spec;
  ApplyJobSpecDefaults(&spec);
  EXPECT_FALSE(spec.optimizer().has_adamw());
  EXPECT_FALSE(spec.model().has_gpt());
}

struct BadSpecCase {
  const char* description;
  std::function<void(JobSpec*)> mutate;  // applied before the defaults
  absl::StatusCode code;
  const char* message_prefix;  // starts with the field path
};

TEST(ValidateJobSpecTest, BadSpecsReportCodeAndFieldPath) {
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  const double kInf = std::numeric_limits<double>::infinity();
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;
  const std::vector<BadSpecCase> cases = {
      {"empty name", [](JobSpec* s) { s->clear_name(); }, kInvalid, "name: required"},
      {"uppercase name", [](JobSpec* s) { s->set_name("Tiny_Run"); }, kInvalid,
       "name: \"Tiny_Run\" must be 1-63 characters"},
      {"name starts with dash", [](JobSpec* s) { s->set_name("-run"); }, kInvalid, "name: "},
      {"name of 64 chars", [](JobSpec* s) { s->set_name(std::string(64, 'a')); }, kInvalid,
       "name: "},
      {"no model", [](JobSpec* s) { s->clear_model(); }, kInvalid,
       "model: required: model.gpt (GPT-2 family) or model.llama (Llama family)"},
      {"no layers", [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_layer(0); }, kInvalid,
       "model.gpt.n_layer: must be in [1, 1024], got 0"},
      {"negative heads", [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_head(-2); },
       kInvalid, "model.gpt.n_head: must be in [1, 1024], got -2"},
      {"no width", [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_d_model(0); }, kInvalid,
       "model.gpt.d_model: "},
      {"heads do not divide width",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_n_head(5);
         s->mutable_model()->mutable_gpt()->set_d_model(768);
       },
       kInvalid, "model.gpt.n_head: 5 does not divide model.gpt.d_model 768"},
      {"no context", [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_seq_len(0); },
       kInvalid, "model.gpt.seq_len: must be in [1, 65536], got 0"},
      {"context too long",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_seq_len(65537); }, kInvalid,
       "model.gpt.seq_len: "},
      {"vocabulary beyond uint16",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_vocab_size(65537); },
       absl::StatusCode::kUnimplemented, "model.gpt.vocab_size: 65537 tokens do not fit"},
      {"dropout of 1", [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_dropout(1.0); },
       kInvalid, "model.gpt.dropout: must be in [0, 1), got 1"},
      {"infinite dropout",
       [&](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_dropout(kInf); }, kInvalid,
       "model.gpt.dropout: must be finite, got inf"},
      {"no training data", [](JobSpec* s) { s->mutable_data()->clear_train(); }, kInvalid,
       "data.train: at least one shard is required"},
      {"empty training path", [](JobSpec* s) { s->mutable_data()->add_train(""); }, kInvalid,
       "data.train[1]: empty path"},
      {"empty validation path", [](JobSpec* s) { s->mutable_data()->set_validation(0, ""); },
       kInvalid, "data.validation[0]: empty path"},
      {"negative prefetch depth", [](JobSpec* s) { s->mutable_data()->set_prefetch_depth(-1); },
       kInvalid, "data.prefetch_depth"},
      {"absurd prefetch depth", [](JobSpec* s) { s->mutable_data()->set_prefetch_depth(1000); },
       kInvalid, "data.prefetch_depth"},
      {"no optimizer", [](JobSpec* s) { s->clear_optimizer(); }, kInvalid,
       "optimizer.adamw: required"},
      {"zero learning rate", [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_lr(0); },
       kInvalid, "optimizer.adamw.lr: must be in (0, 1], got 0"},
      {"learning rate above 1",
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_lr(3); }, kInvalid,
       "optimizer.adamw.lr: must be in (0, 1], got 3"},
      {"NaN learning rate",
       [&](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_lr(kNaN); }, kInvalid,
       "optimizer.adamw.lr: must be finite, got nan"},
      {"beta1 negative",
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_beta1(-0.5); }, kInvalid,
       "optimizer.adamw.beta1: must be in [0, 1), got -0.5"},
      {"beta2 of 1", [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_beta2(1); },
       kInvalid, "optimizer.adamw.beta2: must be in [0, 1), got 1"},
      {"negative eps", [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_eps(-1); },
       kInvalid, "optimizer.adamw.eps: must be > 0, got -1"},
      {"negative weight decay",
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_weight_decay(-0.1); },
       kInvalid, "optimizer.adamw.weight_decay: must be >= 0, got -0.1"},
      {"negative grad clip",
       [](JobSpec* s) { s->mutable_optimizer()->mutable_adamw()->set_grad_clip(-1); }, kInvalid,
       "optimizer.adamw.grad_clip: must be >= 0, got -1"},
      {"no steps", [](JobSpec* s) { s->mutable_schedule()->set_total_steps(0); }, kInvalid,
       "schedule.total_steps: must be in [1, 1000000000], got 0"},
      {"too many steps", [](JobSpec* s) { s->mutable_schedule()->set_total_steps(2000000000); },
       kInvalid, "schedule.total_steps: "},
      {"warmup as long as training",
       [](JobSpec* s) { s->mutable_schedule()->set_warmup_steps(1000); }, kInvalid,
       "schedule.warmup_steps: must be in [0, schedule.total_steps 1000), "
       "got 1000"},
      {"negative warmup", [](JobSpec* s) { s->mutable_schedule()->set_warmup_steps(-1); }, kInvalid,
       "schedule.warmup_steps: "},
      {"min lr ratio above 1", [](JobSpec* s) { s->mutable_schedule()->set_min_lr_ratio(1.5); },
       kInvalid, "schedule.min_lr_ratio: must be in [0, 1], got 1.5"},
      {"negative eval interval", [](JobSpec* s) { s->mutable_schedule()->set_eval_interval(-1); },
       kInvalid, "schedule.eval_interval: must be in [0, 1000000000], got -1"},
      {"negative eval batches", [](JobSpec* s) { s->mutable_schedule()->set_eval_batches(-3); },
       kInvalid, "schedule.eval_batches: must be in [1, 1000000], got -3"},
      {"negative log interval", [](JobSpec* s) { s->mutable_schedule()->set_log_interval(-1); },
       kInvalid, "schedule.log_interval: "},
      {"negative workers", [](JobSpec* s) { s->mutable_resources()->set_workers(-1); }, kInvalid,
       "resources.workers: must be >= 1, got -1"},
      {"fewer ranks than workers",
       [](JobSpec* s) {
         s->mutable_resources()->set_workers(4);
         s->mutable_resources()->set_ranks(2);
         s->mutable_batch()->set_micro_batch(1);
       },
       kInvalid, "resources.ranks: 2 is less than resources.workers (4)"},
      {"too many ranks", [](JobSpec* s) { s->mutable_resources()->set_ranks(5000); }, kInvalid,
       "resources.ranks: must be in [1, 4096], got 5000"},
      {"two GPUs per rank", [](JobSpec* s) { s->mutable_resources()->set_gpus_per_rank(2); },
       kInvalid, "resources.gpus_per_rank: 2 is not 0 (CPU) or 1 (one GPU per rank)"},
      {"too many threads", [](JobSpec* s) { s->mutable_resources()->set_threads_per_rank(300); },
       kInvalid, "resources.threads_per_rank: must be in [1, 256], got 300"},
      {"negative global batch", [](JobSpec* s) { s->mutable_batch()->set_global_batch(-32); },
       kInvalid, "batch.global_batch: must be in [1, 16777216], got -32"},
      {"negative micro batch", [](JobSpec* s) { s->mutable_batch()->set_micro_batch(-4); },
       kInvalid, "batch.micro_batch: must be in [1, 32], got -4"},
      {"batch does not split over ranks",
       [](JobSpec* s) {
         s->mutable_batch()->set_global_batch(10);
         s->mutable_batch()->set_micro_batch(1);
       },
       kInvalid,
       "batch.global_batch: 10 is not divisible by resources.ranks (4) x "
       "batch.micro_batch (1)"},
      {"defaulted micro batch does not split",
       [](JobSpec* s) {
         s->mutable_batch()->set_global_batch(2);
         s->mutable_batch()->clear_micro_batch();
       },
       kInvalid,
       "batch.global_batch: 2 is not divisible by resources.ranks (4) x "
       "batch.micro_batch (1)"},
      {"data degree differs from ranks", [](JobSpec* s) { s->mutable_parallelism()->set_data(2); },
       kInvalid, "parallelism.data: 2 does not equal resources.ranks (4)"},
      {"negative tensor degree", [](JobSpec* s) { s->mutable_parallelism()->set_tensor(-1); },
       kInvalid, "parallelism.tensor: must be >= 0, got -1"},
      {"degrees multiply to the wrong rank count",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_data(4);
         s->mutable_parallelism()->set_tensor(2);
       },
       kInvalid,
       "parallelism.data: 4 x tensor (2) x pipeline (1) = 8 does not equal "
       "resources.ranks (4)"},
      {"unknown precision number",
       [](JobSpec* s) { s->set_precision(static_cast<v1::Precision>(7)); }, kInvalid,
       "precision: unknown value 7"},
      {"negative checkpoint interval",
       [](JobSpec* s) { s->mutable_checkpoint()->set_interval_steps(-5); }, kInvalid,
       "checkpoint.interval_steps: must be in [0, 1000000000], got -5"},
      {"negative keep", [](JobSpec* s) { s->mutable_checkpoint()->set_keep(-1); }, kInvalid,
       "checkpoint.keep: must be in [1, 100000], got -1"},
      {"remote tier not in an object store",
       [](JobSpec* s) { s->mutable_checkpoint()->set_remote("/mnt/backup"); }, kInvalid,
       "checkpoint.remote: \"/mnt/backup\" is not an object-store location: write "
       "s3://bucket/prefix"},
      {"remote tier with a bucket S3 refuses",
       [](JobSpec* s) { s->mutable_checkpoint()->set_remote("s3://My_Bucket/x"); }, kInvalid,
       "checkpoint.remote: \"s3://My_Bucket/x\": bucket \"My_Bucket\" is not a valid bucket"},
      {"invalid beats unimplemented",
       [](JobSpec* s) {
         s->set_precision(v1::FP16);
         s->mutable_checkpoint()->set_keep(-1);
       },
       kInvalid, "checkpoint.keep: "},
      {"tensor parallelism with dropout",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_data(2);
         s->mutable_parallelism()->set_tensor(2);
       },
       kUnimplemented,
       "model.gpt.dropout: dropout (0.1) under tensor parallelism is not executable yet"},
      {"tensor degree that does not divide the heads",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_dropout(0);
         s->mutable_resources()->set_ranks(3);
         s->mutable_parallelism()->set_data(1);
         s->mutable_parallelism()->set_tensor(3);
         s->mutable_batch()->set_global_batch(36);
       },
       kInvalid, "parallelism.tensor: 3 does not divide model.gpt.n_head (4)"},
      {"more pipeline stages than blocks",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_data(1);
         s->mutable_parallelism()->set_pipeline(4);
       },
       kInvalid, "parallelism.pipeline: 4 exceeds model.gpt.n_layer (2)"},
      {"ZeRO-3", [](JobSpec* s) { s->mutable_parallelism()->set_zero_stage(3); }, kUnimplemented,
       "parallelism.zero_stage: ZeRO-3"},
      {"ZeRO stage out of range", [](JobSpec* s) { s->mutable_parallelism()->set_zero_stage(7); },
       kInvalid, "parallelism.zero_stage: 7 is not 0, 1, 2 or 3"},
      {"layout on GPU ranks",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_zero_stage(1);
         s->mutable_resources()->set_gpus_per_rank(1);
       },
       kUnimplemented, "resources.gpus_per_rank: tensor, pipeline and ZeRO layouts run on CPU"},
      {"global batch not divisible by the data degree",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_dropout(0);
         s->mutable_parallelism()->set_data(2);
         s->mutable_parallelism()->set_tensor(2);
         s->mutable_batch()->set_global_batch(12);
       },
       kInvalid,
       "batch.global_batch: 12 is not divisible by parallelism.data (2) x "
       "batch.micro_batch (4)"},
      {"fp16", [](JobSpec* s) { s->set_precision(v1::FP16); }, kUnimplemented,
       "precision: FP16 is planned but not executable yet: it needs GPU "
       "workers"},
      {"activation checkpointing below -1", [](JobSpec* s) { s->set_activation_checkpointing(-2); },
       kInvalid,
       "activation_checkpointing: must be 0 (off), k >= 1 (every k-th block) "
       "or -1"},
      // Model family: malformed values are INVALID_ARGUMENT,
      // well-formed ones the engine does not build are UNIMPLEMENTED.
      {"negative n_kv_head",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_kv_head(-1); }, kInvalid,
       "model.gpt.n_kv_head: must be in [0, 4], got -1"},
      {"n_kv_head not dividing n_head",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_kv_head(3); }, kInvalid,
       "model.gpt.n_kv_head: 3 does not divide model.gpt.n_head 4"},
      {"MLP hidden 0",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->mutable_mlp()->set_hidden(0); },
       kInvalid, "model.gpt.mlp.hidden: must be in [1, 1048576], got 0"},
      {"unknown norm",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_norm(static_cast<v1::GptModel::Norm>(7));
       },
       kInvalid, "model.gpt.norm: unknown value 7"},
      {"unknown positions",
       [](JobSpec* s) {
         const v1::GptModel gpt = s->model().gpt();  // mutable_llama() clears the gpt arm
         *s->mutable_model()->mutable_llama() = gpt;
         s->mutable_model()->mutable_llama()->set_positions(
             static_cast<v1::GptModel::Positions>(9));
       },
       kInvalid, "model.llama.positions: unknown value 9"},
      // The Llama family's knobs run under every layout; key/value heads
      // split across the tensor group, or copied when fewer than its ranks,
      // but not shared unevenly.
      {"key/value heads and tensor ranks that do not divide one another",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_n_head(6);
         s->mutable_model()->mutable_gpt()->set_d_model(48);
         s->mutable_model()->mutable_gpt()->set_n_kv_head(3);
         s->mutable_model()->mutable_gpt()->set_dropout(0);
         s->mutable_parallelism()->set_tensor(2);
         s->mutable_resources()->set_ranks(2);
       },
       kUnimplemented,
       "parallelism.tensor: 2 and the 3 key/value heads of model.gpt (n_kv_head) must divide"},
      {"an MLP width the tensor degree does not divide",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->mutable_mlp()->set_hidden(383);
         s->mutable_model()->mutable_gpt()->set_dropout(0);
         s->mutable_parallelism()->set_tensor(2);
         s->mutable_resources()->set_ranks(2);
       },
       kInvalid, "parallelism.tensor: 2 does not divide the MLP's hidden width (383)"},
      {"a Llama's range errors name model.llama",
       [](JobSpec* s) {
         const v1::GptModel gpt = s->model().gpt();  // mutable_llama() clears the gpt arm
         *s->mutable_model()->mutable_llama() = gpt;
         s->mutable_model()->mutable_llama()->set_n_layer(0);
       },
       kInvalid, "model.llama.n_layer: must be in [1, "},
      {"rope_theta out of range",
       [](JobSpec* s) {
         const v1::GptModel gpt = s->model().gpt();  // mutable_llama() clears the gpt arm
         *s->mutable_model()->mutable_llama() = gpt;
         s->mutable_model()->mutable_llama()->set_rope_theta(-5);
       },
       kInvalid, "model.llama.rope_theta: "},
      {"malformed family value beats unimplemented family value",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_norm(v1::GptModel::RMSNORM);
         s->mutable_model()->mutable_gpt()->set_n_kv_head(3);
       },
       kInvalid, "model.gpt.n_kv_head: 3 does not divide"},
      // Layout knobs the planner evaluates and the engine does not run.
      {"negative virtual stages",
       [](JobSpec* s) { s->mutable_parallelism()->set_virtual_stages(-1); }, kInvalid,
       "parallelism.virtual_stages: must be >= 0, got -1"},
      {"interleaving without a pipeline",
       [](JobSpec* s) { s->mutable_parallelism()->set_virtual_stages(2); }, kInvalid,
       "parallelism.virtual_stages: interleaving needs more than one pipeline stage"},
      {"sequence parallelism without tensor parallelism",
       [](JobSpec* s) { s->mutable_parallelism()->set_sequence_parallel(true); }, kInvalid,
       "parallelism.sequence_parallel: needs parallelism.tensor > 1"},
      {"sequence parallelism",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_data(2);
         s->mutable_parallelism()->set_tensor(2);
         s->mutable_parallelism()->set_sequence_parallel(true);
       },
       kUnimplemented,
       "parallelism.sequence_parallel: sequence parallelism is planned but not "
       "executable yet"},
      // Where it waits on a shared cluster.
      {"queue that is not a name", [](JobSpec* s) { s->mutable_scheduling()->set_queue("Team A"); },
       kInvalid, "scheduling.queue: \"Team A\" must be 1-63 characters of [a-z0-9-]"},
      {"priority out of range",
       [](JobSpec* s) { s->mutable_scheduling()->set_priority("2000000"); }, kInvalid,
       "scheduling.priority: must be in [-1000000, 1000000], got 2000000"},
      {"priority that is neither a number nor a class",
       [](JobSpec* s) { s->mutable_scheduling()->set_priority("very high"); }, kInvalid,
       "scheduling.priority: \"very high\" is neither an integer nor a priority class name"},
      {"negative max runtime",
       [](JobSpec* s) { s->mutable_scheduling()->set_max_runtime_seconds(-1); }, kInvalid,
       "scheduling.max_runtime_seconds: must be in [0, 31622400], got -1"},
      // Elastic bounds around the gang it is submitted with.
      {"elastic min_ranks of 0",
       [](JobSpec* s) {
         s->mutable_elastic()->set_min_ranks(0);
         s->mutable_elastic()->set_max_ranks(s->resources().ranks());
       },
       kInvalid, "elastic.min_ranks: must be in [1, resources.ranks = "},
      {"elastic max_ranks below the gang",
       [](JobSpec* s) {
         s->mutable_elastic()->set_min_ranks(1);
         s->mutable_elastic()->set_max_ranks(s->resources().ranks() - 1);
       },
       kInvalid, "elastic.max_ranks: must be in [resources.ranks = "},
      // Slow ranks.
      {"slow-rank action that is not one",
       [](JobSpec* s) { s->mutable_recovery()->mutable_slow_rank()->set_action("evict"); },
       kInvalid,
       "recovery.slow_rank.action: \"evict\" is not one of \"report\", \"cordon\", "
       "\"replan\""},
      {"stage layers that do not sum to the layers",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_pipeline(2);
         s->mutable_parallelism()->set_data(s->resources().ranks() / 2);
         s->mutable_parallelism()->add_stage_layers(1);
         s->mutable_parallelism()->add_stage_layers(s->model().gpt().n_layer());
       },
       kInvalid, "parallelism.stage_layers: sums to "},
      {"stage layers for another number of stages",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_pipeline(2);
         s->mutable_parallelism()->set_data(s->resources().ranks() / 2);
         s->mutable_parallelism()->add_stage_layers(s->model().gpt().n_layer());
       },
       kInvalid, "parallelism.stage_layers: 1 entries for 2 pipeline stage(s)"},
      {"an empty stage",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_pipeline(2);
         s->mutable_parallelism()->set_data(s->resources().ranks() / 2);
         s->mutable_parallelism()->add_stage_layers(0);
         s->mutable_parallelism()->add_stage_layers(s->model().gpt().n_layer());
       },
       kInvalid, "parallelism.stage_layers[0]: must be >= 1, got 0"},
      {"stage layers under auto",
       [](JobSpec* s) {
         s->mutable_parallelism()->set_auto_(true);
         s->mutable_parallelism()->add_stage_layers(1);
       },
       kInvalid, "parallelism.stage_layers: needs a pinned layout"},
      {"slow-rank slowdown that any jitter reaches",
       [](JobSpec* s) { s->mutable_recovery()->mutable_slow_rank()->set_min_slowdown(1.01); },
       kInvalid, "recovery.slow_rank.min_slowdown: must be 0 (the default) or in [1.1, 1000]"},
      {"slow-rank window shorter than its confirmation",
       [](JobSpec* s) {
         s->mutable_recovery()->mutable_slow_rank()->set_confirm_reports(8);
         s->mutable_recovery()->mutable_slow_rank()->set_window(4);
       },
       kInvalid, "recovery.slow_rank.window: must be 0 (the default) or in [8, 4096], got 4"},
      {"slow-rank cordon of a negative time",
       [](JobSpec* s) { s->mutable_recovery()->mutable_slow_rank()->set_cordon_seconds(-5); },
       kInvalid, "recovery.slow_rank.cordon_seconds: must be 0 (the default) or in [1, 604800]"},
      {"keep and retention.local.newest that disagree",
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_keep(5);
         s->mutable_checkpoint()->mutable_retention()->mutable_local()->set_newest(2);
       },
       kInvalid,
       "checkpoint.keep: 5 and checkpoint.retention.local.newest 2 disagree: give one (keep is "
       "the older name of newest)"},
      {"retention every step count that misses the checkpoints",
       [](JobSpec* s) {
         s->mutable_checkpoint()->mutable_retention()->mutable_local()->set_every(300);
       },
       kInvalid,
       "checkpoint.retention.local.every: 300 is not a multiple of checkpoint.interval_steps "
       "(200)"},
      {"retention all beside another rule",
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_remote("s3://ckpts/runs");
         s->mutable_checkpoint()->mutable_retention()->mutable_remote()->set_all(true);
         s->mutable_checkpoint()->mutable_retention()->mutable_remote()->set_best(2);
       },
       kInvalid, "checkpoint.retention.remote.all: keeps every checkpoint: give it alone"},
      {"retention best without a validation pass during training",
       [](JobSpec* s) {
         s->mutable_schedule()->set_eval_interval(0);
         s->mutable_checkpoint()->mutable_retention()->mutable_local()->set_best(2);
       },
       kInvalid,
       "checkpoint.retention.local.best: ranks checkpoints by validation loss, which needs "
       "data.validation and schedule.eval_interval > 0"},
      {"remote retention without an object store",
       [](JobSpec* s) {
         s->mutable_checkpoint()->mutable_retention()->mutable_remote()->set_newest(4);
       },
       kInvalid,
       "checkpoint.retention.remote: the job has no object-store tier: set checkpoint.remote"},
      {"negative retention newest",
       [](JobSpec* s) {
         s->mutable_checkpoint()->set_remote("s3://ckpts/runs");
         s->mutable_checkpoint()->mutable_retention()->mutable_remote()->set_newest(-1);
       },
       kInvalid, "checkpoint.retention.remote.newest: must be in [1, 100000], got -1"},
  };
  ASSERT_GE(cases.size(), 20u);

  const JobSpec good = MustParse(kGoodYaml);
  for (const BadSpecCase& c : cases) {
    SCOPED_TRACE(c.description);
    JobSpec spec = good;
    c.mutate(&spec);
    ApplyJobSpecDefaults(&spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), StartsWith(c.message_prefix));
  }
}

// Bad input: every numeric field has a range checked at
// submit, with its path, so that no later arithmetic overflows. The values
// a reviewer tried (a window of 2^31 - 1, a rollback distance of 2^63 - 1, a
// reversed skip range) and the bounds on either side.
TEST(ValidateJobSpecTest, NumbersOutsideTheirRangeNameTheField) {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const int64_t kMax64 = std::numeric_limits<int64_t>::max();
  const int32_t kMax32 = std::numeric_limits<int32_t>::max();
  const std::vector<BadSpecCase> cases = {
      {"window 2^31-1", [&](JobSpec* s) { s->mutable_recovery()->set_window(kMax32); }, kInvalid,
       "recovery.window: must be 0 (the default) or in [8, 100000], got 2147483647"},
      {"window 7", [](JobSpec* s) { s->mutable_recovery()->set_window(7); }, kInvalid,
       "recovery.window: "},
      {"negative window", [](JobSpec* s) { s->mutable_recovery()->set_window(-1); }, kInvalid,
       "recovery.window: "},
      {"rollback distance 2^63-1",
       [&](JobSpec* s) { s->mutable_recovery()->set_rollback_distance(kMax64); }, kInvalid,
       "recovery.rollback_distance: must be 0 (the default) or in [1, 1000000000]"},
      {"negative rollback distance",
       [](JobSpec* s) { s->mutable_recovery()->set_rollback_distance(-5); }, kInvalid,
       "recovery.rollback_distance: "},
      {"skip_before 2^63-1", [&](JobSpec* s) { s->mutable_recovery()->set_skip_before(kMax64); },
       kInvalid, "recovery.skip_before: "},
      {"skip_after negative", [](JobSpec* s) { s->mutable_recovery()->set_skip_after(-1); },
       kInvalid, "recovery.skip_after: "},
      {"min_history above the window",
       [](JobSpec* s) {
         s->mutable_recovery()->set_window(16);
         s->mutable_recovery()->set_min_history(17);
       },
       kInvalid, "recovery.min_history: must be 0 (the default) or in [1, 16]"},
      {"confirm_steps above the default window",
       [](JobSpec* s) { s->mutable_recovery()->set_confirm_steps(129); }, kInvalid,
       "recovery.confirm_steps: "},
      {"threshold below 1", [](JobSpec* s) { s->mutable_recovery()->set_threshold(0.5); },
       kInvalid, "recovery.threshold: "},
      {"negative max_restarts", [](JobSpec* s) { s->mutable_recovery()->set_max_restarts(-1); },
       kInvalid, "recovery.max_restarts: must be in [0, 10000]"},
      {"huge max_rollbacks", [&](JobSpec* s) { s->mutable_recovery()->set_max_rollbacks(kMax32); },
       kInvalid, "recovery.max_rollbacks: "},
      {"reversed skip range",
       [](JobSpec* s) {
         auto* r = s->add_skip_batches();
         r->set_begin(200);
         r->set_end(100);
       },
       kInvalid, "skip_batches[0]: [200, 100) is empty or reversed"},
      {"empty skip range",
       [](JobSpec* s) {
         auto* r = s->add_skip_batches();
         r->set_begin(5);
         r->set_end(5);
       },
       kInvalid, "skip_batches[0]: [5, 5) is empty"},
      {"negative skip begin",
       [](JobSpec* s) {
         auto* ok = s->add_skip_batches();
         ok->set_begin(1);
         ok->set_end(2);
         auto* r = s->add_skip_batches();
         r->set_begin(-3);
         r->set_end(2);
       },
       kInvalid, "skip_batches[1].begin: must be in [0, "},
      {"skip end past 2^50",
       [&](JobSpec* s) {
         auto* r = s->add_skip_batches();
         r->set_begin(0);
         r->set_end(kMax64);
       },
       kInvalid, "skip_batches[0].end: "},
      {"2^31-1 layers",
       [&](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_layer(kMax32); }, kInvalid,
       "model.gpt.n_layer: must be in [1, 1024]"},
      {"d_model 2^17",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_d_model(1 << 17);
         s->mutable_model()->mutable_gpt()->set_n_head(1);
       },
       kInvalid, "model.gpt.d_model: must be in [1, 65536]"},
      {"vocabulary of 2^30",
       [](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_vocab_size(1 << 30); }, kInvalid,
       "model.gpt.vocab_size: must be in [1, 4194304]"},
      {"more kv heads than heads",
       [](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_n_kv_head(s->model().gpt().n_head() * 2);
       },
       kInvalid, "model.gpt.n_kv_head: must be in [0, "},
      {"global batch 2^31-1", [&](JobSpec* s) { s->mutable_batch()->set_global_batch(kMax32); },
       kInvalid, "batch.global_batch: must be in [1, 16777216]"},
      {"micro batch above the global batch",
       [](JobSpec* s) { s->mutable_batch()->set_micro_batch(s->batch().global_batch() + 1); },
       kInvalid, "batch.micro_batch: must be in [1, "},
      {"eval_interval 2^63-1", [&](JobSpec* s) { s->mutable_schedule()->set_eval_interval(kMax64); },
       kInvalid, "schedule.eval_interval: must be in [0, 1000000000]"},
      {"log_interval 2^63-1", [&](JobSpec* s) { s->mutable_schedule()->set_log_interval(kMax64); },
       kInvalid, "schedule.log_interval: "},
      {"checkpoint interval 2^63-1",
       [&](JobSpec* s) { s->mutable_checkpoint()->set_interval_steps(kMax64); }, kInvalid,
       "checkpoint.interval_steps: must be in [0, 1000000000]"},
      {"keep 2^31-1", [&](JobSpec* s) { s->mutable_checkpoint()->set_keep(kMax32); }, kInvalid,
       "checkpoint.keep: must be in [1, 100000]"},
      {"activation checkpointing past the layers",
       [](JobSpec* s) { s->set_activation_checkpointing(s->model().gpt().n_layer() + 1); },
       kInvalid, "activation_checkpointing: every k-th block with k = "},
      {"init_from naming nothing", [](JobSpec* s) { s->mutable_init_from(); }, kInvalid,
       "init_from: give job (and step) or path"},
      {"init_from a name, not a job id",
       [](JobSpec* s) { s->mutable_init_from()->set_job("tiny"); }, kInvalid,
       "init_from.job: \"tiny\" is not a job id"},
      {"init_from a negative step",
       [](JobSpec* s) {
         s->mutable_init_from()->set_job("tiny-3");
         s->mutable_init_from()->set_step(-1);
       },
       kInvalid, "init_from.step: "},
      {"init_from a step without a job",
       [](JobSpec* s) {
         s->mutable_init_from()->set_path("/ckpt/step-000000010");
         s->mutable_init_from()->set_step(10);
       },
       kInvalid, "init_from.step: goes with init_from.job"},
      {"init_from a relative path",
       [](JobSpec* s) { s->mutable_init_from()->set_path("ckpt/step-000000010"); }, kInvalid,
       "init_from.path: \"ckpt/step-000000010\" must be absolute"},
  };
  const JobSpec good = MustParse(kGoodYaml);
  for (const BadSpecCase& c : cases) {
    SCOPED_TRACE(c.description);
    JobSpec spec = good;
    c.mutate(&spec);
    ApplyJobSpecDefaults(&spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), StartsWith(c.message_prefix));
  }
  // The bounds themselves are accepted.
  JobSpec edge = good;
  edge.mutable_recovery()->set_window(100000);
  edge.mutable_recovery()->set_min_history(100000);
  edge.mutable_recovery()->set_rollback_distance(1000000000);
  edge.mutable_recovery()->set_skip_before(1000000000);
  edge.mutable_recovery()->set_skip_after(1000000000);
  edge.mutable_recovery()->set_max_restarts(0);
  auto* r = edge.add_skip_batches();
  r->set_begin(0);
  r->set_end(int64_t{1} << 50);
  edge.mutable_init_from()->set_job("tiny-12");
  edge.mutable_init_from()->set_step(1000000000);
  ApplyJobSpecDefaults(&edge);
  EXPECT_TRUE(ValidateJobSpec(edge).ok()) << ValidateJobSpec(edge);
}

// Tensor, pipeline and ZeRO layouts execute; the batch is
// split over the data-parallel replicas only.
TEST(ValidateJobSpecTest, TensorPipelineAndZeroLayoutsAreAccepted) {
  JobSpec spec = MustParse(kGoodYaml);
  spec.mutable_model()->mutable_gpt()->set_dropout(0);
  spec.mutable_resources()->set_ranks(8);
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_pipeline(2);
  spec.mutable_parallelism()->set_zero_stage(1);
  spec.mutable_batch()->clear_micro_batch();
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.parallelism().data(), 2);
  EXPECT_EQ(spec.batch().micro_batch(), 16);  // 32 rows over 2 replicas
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

// Interleaving: the planner's rule (common/parallel_layout.h
// CheckInterleaving) on the spec's fields, each failure naming
// parallelism.virtual_stages; a valid interleaving is UNIMPLEMENTED.
TEST(ValidateJobSpecTest, InterleavingFollowsThePlannersRule) {
  JobSpec base = MustParse(kGoodYaml);
  auto* gpt = base.mutable_model()->mutable_gpt();
  gpt->set_n_layer(8);
  gpt->set_dropout(0);
  base.mutable_parallelism()->set_data(2);
  base.mutable_parallelism()->set_pipeline(2);  // 4 ranks; 32 / (2 x 4) = 4 micro-batches
  struct Case {
    int n_layer, virtual_stages, micro_batch;
    absl::StatusCode code;
    const char* message_prefix;
  } cases[] = {
      {8, 0, 4, absl::StatusCode::kOk, ""},
      {8, 1, 4, absl::StatusCode::kOk, ""},
      {8, 2, 4, absl::StatusCode::kUnimplemented,
       "parallelism.virtual_stages: interleaved 1F1B (2 chunks per pipeline rank) is planned"},
      {8, 4, 4, absl::StatusCode::kUnimplemented, "parallelism.virtual_stages: interleaved"},
      {8, 3, 4, absl::StatusCode::kInvalidArgument,
       "parallelism.virtual_stages: 3 does not divide the 4 layers per stage"},
      {7, 2, 4, absl::StatusCode::kInvalidArgument,
       "parallelism.virtual_stages: interleaving needs equal stages, but 2 pipeline stages do "
       "not divide the 7 layers"},
      {8, 2, 16, absl::StatusCode::kInvalidArgument,
       "parallelism.virtual_stages: the interleaved schedule needs the 1 micro-batches per "
       "replica to be a multiple of the 2 pipeline stages"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.n_layer, " layers, v ", c.virtual_stages, ", mb ", c.micro_batch));
    JobSpec spec = base;
    spec.mutable_model()->mutable_gpt()->set_n_layer(c.n_layer);
    spec.mutable_parallelism()->set_virtual_stages(c.virtual_stages);
    spec.mutable_batch()->set_micro_batch(c.micro_batch);
    ApplyJobSpecDefaults(&spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), StartsWith(c.message_prefix));
  }
}

// The family fields parse from YAML, and GPT-2's own values (n_kv_head =
// n_head, hidden = 4 x d_model, LayerNorm, tied) are what the engine runs.
TEST(ValidateJobSpecTest, ModelFamilyFieldsParseAndGpt2ValuesAreAccepted) {
  JobSpec plain = MustParse(absl::StrCat(kGoodYaml, R"yaml(parallelism:
  sequence_parallel: false
  virtual_stages: 1
)yaml"));
  ApplyJobSpecDefaults(&plain);
  EXPECT_TRUE(ValidateJobSpec(plain).ok()) << ValidateJobSpec(plain);

  std::string yaml = kGoodYaml;
  const std::string at = "    dropout: 0.1\n";
  yaml.replace(yaml.find("    dropout: 0.1\n"), at.size(),
               "    dropout: 0.1\n    n_kv_head: 2\n    mlp: {gated: true, hidden: 344}\n"
               "    norm: RMSNORM\n    untied_embeddings: true\n");
  JobSpec spec = MustParse(yaml);
  const v1::GptModel& gpt = spec.model().gpt();
  EXPECT_EQ(gpt.n_kv_head(), 2);
  EXPECT_TRUE(gpt.mlp().gated());
  EXPECT_EQ(gpt.mlp().hidden(), 344);
  EXPECT_EQ(gpt.norm(), v1::GptModel::RMSNORM);
  EXPECT_TRUE(gpt.untied_embeddings());
  ApplyJobSpecDefaults(&spec);
  // The Llama family's knobs train under data parallelism.
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  JobSpec gpt2 = MustParse(kGoodYaml);
  auto* g = gpt2.mutable_model()->mutable_gpt();
  g->set_n_kv_head(4);  // = n_head: multi-head attention
  g->mutable_mlp()->set_hidden(512);  // = 4 x d_model
  g->set_norm(v1::GptModel::LAYERNORM);
  ApplyJobSpecDefaults(&gpt2);
  EXPECT_TRUE(ValidateJobSpec(gpt2).ok()) << ValidateJobSpec(gpt2);

  // Every knob of the family runs under tensor, pipeline and ZeRO layouts.
  JobSpec llama = MustParse(kGoodYaml);
  v1::GptModel model = llama.model().gpt();
  model.set_n_kv_head(2);
  model.set_dropout(0);
  *llama.mutable_model()->mutable_llama() = model;
  llama.mutable_parallelism()->set_tensor(2);
  llama.mutable_parallelism()->set_zero_stage(1);
  llama.mutable_resources()->set_ranks(2);
  ApplyJobSpecDefaults(&llama);
  EXPECT_TRUE(ValidateJobSpec(llama).ok()) << ValidateJobSpec(llama);
}

// BF16 and activation checkpointing execute (on CPU workers).
TEST(ValidateJobSpecTest, Bf16AndActivationCheckpointingAreAccepted) {
  JobSpec spec = MustParse(absl::StrCat(kGoodYaml,
                                        "activation_checkpointing: -1\n"));
  spec.set_precision(v1::BF16);
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(spec.activation_checkpointing(), -1);
  spec.set_activation_checkpointing(2);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(JobSpecToJsonTest, RoundTripsThroughParse) {
  JobSpec spec = MustParse(kGoodYaml);
  ApplyJobSpecDefaults(&spec);
  const std::string json = JobSpecToJson(spec);
  EXPECT_THAT(json, HasSubstr("\"global_batch\": 32"));
  EXPECT_THAT(json, HasSubstr("\"precision\": \"FP32\""));
  EXPECT_THAT(json, HasSubstr("\"eval_interval\": \"100\""));
  const JobSpec reparsed = MustParse(json);
  EXPECT_TRUE(MessageDifferencer::Equals(spec, reparsed)) << json;
}

class LoadJobSpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("jobspec_test_", ::getpid(), "_", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "specs");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = dir_ / relative;
    std::ofstream(path) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

TEST_F(LoadJobSpecFileTest, ResolvesRelativePathsAgainstSpecDirectory) {
  const std::string path = Write("specs/run.yaml", R"yaml(
name: run
data:
  train: [shards/train_*.bin, /abs/train.bin, "s3://bucket/train.bin"]
  validation: [../val/./val.bin]
checkpoint: {dir: ckpt}
)yaml");
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string specs = (dir_ / "specs").lexically_normal().string();
  ASSERT_EQ(spec->data().train_size(), 3);
  EXPECT_EQ(spec->data().train(0), specs + "/shards/train_*.bin");
  EXPECT_EQ(spec->data().train(1), "/abs/train.bin");
  EXPECT_EQ(spec->data().train(2), "s3://bucket/train.bin");
  EXPECT_EQ(spec->data().validation(0),
            (dir_ / "val/val.bin").lexically_normal().string());
  EXPECT_EQ(spec->checkpoint().dir(), specs + "/ckpt");
}

TEST_F(LoadJobSpecFileTest, RelativeSpecPathStillGivesAbsolutePaths) {
  const std::string path = Write(
      "specs/run.json", R"({"name": "run", "data": {"train": ["a.bin"]}})");
  const std::string relative =
      std::filesystem::relative(path, std::filesystem::current_path()).string();
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(relative);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().train(0),
            (dir_ / "specs/a.bin").lexically_normal().string());
  EXPECT_FALSE(spec->has_checkpoint());  // no dir given, none invented
}

TEST_F(LoadJobSpecFileTest, MissingFileIsNotFound) {
  const absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile((dir_ / "specs/missing.yaml").string());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("missing.yaml"));
}

TEST_F(LoadJobSpecFileTest, DirectoryIsInvalidArgument) {
  const absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile((dir_ / "specs").string());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("is a directory"));
}

TEST_F(LoadJobSpecFileTest, ParseErrorsKeepTheFieldPath) {
  const std::string path = Write("specs/bad.yaml", "batch:\n  micro: 4\n");
  const absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith("batch.micro: unknown field"));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// model.llama: the Llama family's defaults, made explicit at submit.
TEST(LlamaSpecTest, LlamaDefaultsAreExplicitAfterDefaultsAndTrainUnderDataParallelism) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(R"yaml(
name: llama-tiny
model:
  llama: {n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 96, seq_len: 64, vocab_size: 512}
data: {train: [x.bin]}
optimizer: {adamw: {lr: 0.001}}
schedule: {total_steps: 10}
batch: {global_batch: 8}
resources: {workers: 2, ranks: 2}
)yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  const v1::GptModel& m = spec->model().llama();
  EXPECT_EQ(m.n_kv_head(), 2);
  EXPECT_TRUE(m.mlp().gated());
  EXPECT_EQ(m.mlp().hidden(), 256);  // 8/3 x 96 = 256, a multiple of 64
  EXPECT_EQ(m.norm(), v1::GptModel::RMSNORM);
  EXPECT_EQ(m.positions(), v1::GptModel::ROTARY);
  EXPECT_TRUE(m.has_bias() && !m.bias());
  EXPECT_TRUE(m.untied_embeddings());
  EXPECT_EQ(m.rope_theta(), 10000);
  EXPECT_EQ(m.norm_eps(), 1e-5);
  EXPECT_EQ(ModelPath(spec->model()), "model.llama");
  EXPECT_FALSE(IsGpt2Shape(m));
  // Idempotent, and the JSON round trip keeps it.
  JobSpec again = *spec;
  ApplyJobSpecDefaults(&again);
  EXPECT_EQ(again.DebugString(), spec->DebugString());
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(JobSpecToJson(*spec));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->DebugString(), spec->DebugString());
  // The shared shape: 2 layers of q 96x96, k,v 96x48, o 96x96, 3 x 96x256.
  const ModelShape shape = ModelShapeOf(spec->model());
  EXPECT_EQ(CountParameters(shape).per_layer_matmul,
            2 * 96 * 96 + 2 * 96 * 48 + 3 * 96 * 256);
  EXPECT_FALSE(shape.tied_embeddings);
  EXPECT_FALSE(shape.learned_position_embedding);
}

TEST(LlamaSpecTest, GptDefaultsStayGpt2) {
  v1::ModelSpec model;
  v1::GptModel* g = model.mutable_gpt();
  g->set_n_layer(2);
  g->set_n_head(2);
  g->set_d_model(64);
  const v1::GptModel e = EffectiveDecoder(model);
  EXPECT_EQ(e.n_kv_head(), 2);
  EXPECT_FALSE(e.mlp().gated());
  EXPECT_EQ(e.mlp().hidden(), 256);
  EXPECT_EQ(e.norm(), v1::GptModel::LAYERNORM);
  EXPECT_EQ(e.positions(), v1::GptModel::LEARNED);
  EXPECT_TRUE(e.bias());
  EXPECT_FALSE(e.untied_embeddings());
  EXPECT_TRUE(IsGpt2Shape(e));
  EXPECT_EQ(DescribeDecoder(e), "GPT-2 shape");
  // A Llama knob set explicitly under model.gpt is honoured.
  g->set_positions(v1::GptModel::ROTARY);
  EXPECT_FALSE(IsGpt2Shape(EffectiveDecoder(model)));
}

// What a plan needs is not what a run needs.
constexpr char kPlanOnlyYaml[] = R"yaml(
# A BLOOM-176B-shaped question: how should 176B parameters sit on 384
# devices? No data, no optimizer, no schedule, no micro-batch.
name: bloom-176b
model:
  gpt: {n_layer: 70, n_head: 112, d_model: 14336, seq_len: 2048, vocab_size: 250880}
batch: {global_batch: 2048}
precision: BF16
parallelism: {auto: true}
resources: {workers: 48, ranks: 384}
)yaml";

JobSpec Defaulted(const std::string& text) {
  JobSpec spec = MustParse(text);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(ValidatePlanSpecTest, PlansWithoutScheduleDataOrOptimizer) {
  const JobSpec spec = Defaulted(kPlanOnlyYaml);
  EXPECT_TRUE(ValidatePlanSpec(spec).ok()) << ValidatePlanSpec(spec);
  // A run needs all three; the first missing one is named.
  const absl::Status run = ValidateJobSpec(spec);
  EXPECT_EQ(run.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(run.message()), StartsWith("data.train:"));
}

TEST(ValidatePlanSpecTest, AutoLeavesTheMicroBatchToThePlanner) {
  // 2048 / 384 would default to 5, which no dp of 384 devices divides into
  // 2048: the old check refused the spec with a micro-batch the user never
  // wrote.
  const JobSpec spec = Defaulted(kPlanOnlyYaml);
  EXPECT_EQ(spec.batch().micro_batch(), 0);
  EXPECT_TRUE(ValidatePlanSpec(spec).ok());
  // A run under auto does not check ranks x micro-batch either: the
  // planner checks dp x micro-batch per layout.
  JobSpec run = MustParse(kGoodYaml);
  run.mutable_batch()->set_global_batch(2048);
  run.mutable_batch()->clear_micro_batch();
  run.mutable_resources()->set_ranks(384);
  run.mutable_resources()->set_workers(48);
  run.mutable_parallelism()->set_auto_(true);
  ApplyJobSpecDefaults(&run);
  EXPECT_EQ(run.batch().micro_batch(), 0);
  EXPECT_TRUE(ValidateJobSpec(run).ok()) << ValidateJobSpec(run);
  // A micro-batch the user gives under auto is still range-checked.
  run.mutable_batch()->set_micro_batch(4096);
  EXPECT_THAT(std::string(ValidateJobSpec(run).message()),
              StartsWith("batch.micro_batch: must be in [1, 2048], got 4096"));
  EXPECT_THAT(std::string(ValidatePlanSpec(run).message()),
              StartsWith("batch.micro_batch: must be in [1, 2048], got 4096"));
}

TEST(ValidatePlanSpecTest, PinnedLayoutUsesItsOwnDataParallelDegree) {
  // BLOOM's published layout: tp 4 x pp 12 x dp 8, micro-batch 2.
  JobSpec spec = MustParse(kPlanOnlyYaml);
  auto* par = spec.mutable_parallelism();
  par->set_auto_(false);
  par->set_tensor(4);
  par->set_pipeline(12);
  par->set_data(8);
  spec.mutable_batch()->set_micro_batch(2);
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidatePlanSpec(spec).ok()) << ValidatePlanSpec(spec);
  spec.mutable_batch()->set_micro_batch(3);
  EXPECT_EQ(ValidatePlanSpec(spec).message(),
            "batch.global_batch: 2048 is not divisible by parallelism.data (8) x "
            "batch.micro_batch (3)");
}

TEST(ValidatePlanSpecTest, PlansReachTheDeviceSweepButRunsStopAtTheGang) {
  JobSpec spec = MustParse(kPlanOnlyYaml);
  spec.mutable_resources()->set_workers(2048);
  spec.mutable_resources()->set_ranks(16384);
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidatePlanSpec(spec).ok()) << ValidatePlanSpec(spec);
  JobSpec run = MustParse(kGoodYaml);
  run.mutable_resources()->set_workers(2048);
  run.mutable_resources()->set_ranks(16384);
  run.mutable_batch()->set_global_batch(16384);
  run.mutable_batch()->set_micro_batch(1);
  ApplyJobSpecDefaults(&run);
  EXPECT_EQ(ValidateJobSpec(run).message(),
            "resources.ranks: must be in [1, 4096], got 16384: a job's gang is at most 4096 "
            "ranks (`loomctl plan` plans up to 131072 devices)");
  spec.mutable_resources()->set_ranks(131073);
  EXPECT_THAT(std::string(ValidatePlanSpec(spec).message()),
              StartsWith("resources.ranks: must be in [1, 131072], got 131073"));
}

TEST(ValidatePlanSpecTest, StillRefusesHostileValuesWithTheFieldPath) {
  struct Case {
    std::function<void(JobSpec*)> mutate;
    const char* prefix;
  };
  const std::vector<Case> cases = {
      {[](JobSpec* s) { s->mutable_model()->mutable_gpt()->set_n_layer(5000); },
       "model.gpt.n_layer: must be in [1, 1024], got 5000"},
      {[](JobSpec* s) { s->mutable_model()->clear_gpt(); }, "model: required"},
      {[](JobSpec* s) { s->mutable_batch()->set_global_batch(0); },
       "batch.global_batch: must be in [1, 16777216], got 0"},
      {[](JobSpec* s) { s->mutable_batch()->set_global_batch(1 << 25); },
       "batch.global_batch: must be in [1, 16777216]"},
      {[](JobSpec* s) {
         s->mutable_model()->mutable_gpt()->set_dropout(std::nan(""));
       },
       "model.gpt.dropout: must be finite"},
      {[](JobSpec* s) { s->mutable_schedule()->set_total_steps(-1); },
       "schedule.total_steps: must be in [0, 1000000000], got -1"},
      {[](JobSpec* s) { s->mutable_parallelism()->set_zero_stage(7); },
       "parallelism.zero_stage: 7 is not 0, 1, 2 or 3"},
      {[](JobSpec* s) { s->set_name("Not A Name"); }, "name: \"Not A Name\" must be"},
      {[](JobSpec* s) {
         s->mutable_parallelism()->set_auto_(false);
         s->mutable_parallelism()->set_tensor(5);
         s->mutable_parallelism()->set_data(1);
         s->mutable_resources()->set_ranks(5);
         s->mutable_resources()->set_workers(1);
       },
       "parallelism.tensor: 5 does not divide model.gpt.n_head (112)"},
      {[](JobSpec* s) {
         s->mutable_parallelism()->set_auto_(false);
         s->mutable_parallelism()->set_pipeline(96);
         s->mutable_parallelism()->set_data(4);
       },
       "parallelism.pipeline: 96 exceeds model.gpt.n_layer (70)"},
      {[](JobSpec* s) { s->mutable_resources()->set_collective_timeout_seconds(0.5); },
       "resources.collective_timeout_seconds: must be 0 (the default) or in [1, 86400], got 0.5"},
      {[](JobSpec* s) { s->set_activation_checkpointing(71); },
       "activation_checkpointing: every k-th block with k = 71 > model.gpt.n_layer (70)"},
  };
  for (const Case& c : cases) {
    JobSpec spec = MustParse(kPlanOnlyYaml);
    c.mutate(&spec);
    ApplyJobSpecDefaults(&spec);
    const absl::Status status = ValidatePlanSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.prefix;
    EXPECT_THAT(std::string(status.message()), StartsWith(c.prefix));
  }
}

TEST(ValidatePlanSpecTest, WhatLoomCannotRunYetIsWhatPlanningIsFor) {
  // ZeRO-3, sequence parallelism, interleaving, FP16 and a 250K vocabulary:
  // UNIMPLEMENTED for a run, fine for a plan.
  JobSpec spec = MustParse(kPlanOnlyYaml);
  auto* par = spec.mutable_parallelism();
  par->set_auto_(false);
  par->set_tensor(4);
  par->set_pipeline(2);
  par->set_data(8);
  par->set_virtual_stages(7);
  par->set_sequence_parallel(true);
  par->set_zero_stage(3);
  spec.mutable_resources()->set_ranks(64);
  spec.mutable_resources()->set_workers(8);
  spec.mutable_batch()->set_micro_batch(1);
  spec.set_precision(v1::FP16);
  ApplyJobSpecDefaults(&spec);
  EXPECT_TRUE(ValidatePlanSpec(spec).ok()) << ValidatePlanSpec(spec);
}

}  // namespace
}  // namespace loom
