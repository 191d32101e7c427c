// The resume check (gpu_check.h): loom-rank, the process loom-worker starts
// for a rank, trains a one-GPU job from its JSON assignment
// (loom.v1.StartRank, spec.resources.gpus_per_rank 1, gpu 0) and writes
// checkpoints; a second loom-rank resumes from the middle one and must
// reach the same losses and the same checkpoint bytes, bit for bit.
//
//   A: steps 1-8 from scratch, checkpoints at steps 4 and 8
//   B: a directory holding only A's step 4; resumes there, trains 5-8
//   B == A: the step 5-8 losses (as loom-rank prints them: JSON doubles,
//           which round-trip exactly) and step 8's shard, byte for byte.
// When they differ on the GPU, a third straight run C tells a resume that
// loses state (C == A) from kernels that do not repeat themselves (C != A).
// The same job on the CPU (gpus_per_rank 0) is the part that needs no GPU.
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/gpu_check.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/job.pb.h"

#ifndef LOOM_RANK_BINARY
#error "LOOM_RANK_BINARY: the path of loom-rank (bench/gpu/CMakeLists.txt defines it)"
#endif

namespace loom::gpu_check {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 8;
constexpr int kInterval = 4;

std::string StepDir(const std::string& dir, int step) {
  return absl::StrFormat("%s/step-%09d", dir, step);
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The job: the small GPT (gpu_check.h's SmallGpt, with warm-up and decay),
// fp32, checkpoints every kInterval steps into `checkpoint_dir`.
loom::v1::StartRank Assignment(const std::string& shard, const std::string& checkpoint_dir,
                               bool gpu) {
  loom::v1::StartRank a;
  a.set_job_id("gpu-check-resume");
  a.set_rank(0);
  a.set_world_size(1);
  a.set_master_addr("127.0.0.1");
  a.set_master_port(29500);  // unused by a world of one
  a.set_checkpoint_dir(checkpoint_dir);
  a.set_resume_step(-1);
  a.set_gpu(0);
  loom::v1::JobSpec* spec = a.mutable_spec();
  spec->set_name("gpu-check-resume");
  loom::v1::GptModel* m = spec->mutable_model()->mutable_gpt();
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(128);
  m->set_seq_len(128);
  m->set_vocab_size(256);
  spec->mutable_data()->add_train(shard);
  loom::v1::AdamW* o = spec->mutable_optimizer()->mutable_adamw();
  o->set_lr(1e-3);
  o->set_beta1(0.9);
  o->set_beta2(0.95);
  o->set_eps(1e-8);
  o->set_weight_decay(0.1);
  o->set_grad_clip(1.0);
  loom::v1::ScheduleSpec* s = spec->mutable_schedule();
  s->set_total_steps(kSteps);
  s->set_warmup_steps(2);
  s->set_min_lr_ratio(0.1);
  s->set_log_interval(1);
  spec->mutable_batch()->set_global_batch(8);
  spec->mutable_batch()->set_micro_batch(4);
  spec->set_precision(loom::v1::FP32);
  spec->mutable_resources()->set_workers(1);
  spec->mutable_resources()->set_ranks(1);
  spec->mutable_resources()->set_threads_per_rank(2);
  spec->mutable_resources()->set_gpus_per_rank(gpu ? 1 : 0);
  spec->mutable_checkpoint()->set_dir(checkpoint_dir);
  spec->mutable_checkpoint()->set_interval_steps(kInterval);
  spec->mutable_checkpoint()->set_keep(10);
  spec->set_seed(1234);
  return a;
}

// One loom-rank process: its step reports (step >= 1) and exit status.
struct RankRun {
  int exit_status = -1;
  std::vector<loom::v1::StepMetrics> steps;
  std::vector<int64_t> checkpoints;  // steps of committed checkpoints, in order
  std::string error;                 // why the run is unusable; "" when fine
};

RankRun RunLoomRank(const std::string& work, const std::string& name,
                    const loom::v1::StartRank& assignment) {
  RankRun run;
  const std::string json_path = absl::StrCat(work, "/", name, ".json");
  const std::string events_path = absl::StrCat(work, "/", name, ".events");
  const std::string log_path = absl::StrCat(work, "/", name, ".log");
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(assignment, &json, print).ok()) {
    run.error = "cannot print the assignment as JSON";
    return run;
  }
  std::ofstream(json_path) << json;
  // The paths are mkdtemp's and ours: no characters the shell would read.
  const std::string command = absl::StrCat("'", LOOM_RANK_BINARY, "' --assignment '", json_path,
                                           "' >'", events_path, "' 2>'", log_path, "'");
  const int status = std::system(command.c_str());
  run.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  absl::StatusOr<std::string> events = ReadAll(events_path);
  if (!events.ok()) {
    run.error = events.status().ToString();
    return run;
  }
  std::istringstream lines(*events);
  std::string line;
  while (std::getline(lines, line)) {
    loom::v1::RankEvent event;
    if (!google::protobuf::util::JsonStringToMessage(line, &event).ok()) continue;
    if (event.has_step() && event.step().step() >= 1) run.steps.push_back(event.step());
    if (event.has_checkpoint() && event.checkpoint().status().empty()) {
      run.checkpoints.push_back(event.checkpoint().step());
    }
  }
  if (run.exit_status != 0) {
    absl::StatusOr<std::string> log = ReadAll(log_path);
    std::string last = log.ok() ? *log : "";
    while (!last.empty() && last.back() == '\n') last.pop_back();
    const size_t cut = last.rfind('\n');
    run.error = absl::StrCat("loom-rank ", name, " exited ", run.exit_status, ": ",
                             cut == std::string::npos ? last : last.substr(cut + 1));
  }
  return run;
}

// Whether `b` reports the same losses, bit for bit, as `a` at every step
// `b` reports (and `a` reports them all); the first difference otherwise.
bool SameLosses(const RankRun& a, const RankRun& b, std::string* difference) {
  for (const loom::v1::StepMetrics& got : b.steps) {
    bool found = false;
    for (const loom::v1::StepMetrics& want : a.steps) {
      if (want.step() != got.step()) continue;
      found = true;
      const double x = want.loss(), y = got.loss();
      if (std::memcmp(&x, &y, sizeof x) != 0) {
        *difference = absl::StrFormat("step %d: loss %.17g against %.17g", got.step(), y, x);
        return false;
      }
    }
    if (!found) {
      *difference = absl::StrCat("step ", got.step(), " has no counterpart");
      return false;
    }
  }
  return true;
}

bool SameFile(const std::string& a, const std::string& b) {
  absl::StatusOr<std::string> x = ReadAll(a), y = ReadAll(b);
  return x.ok() && y.ok() && *x == *y;
}

// One round A, B (and C on a mismatch) on the CPU or cuda:0, as PART `part`.
bool ResumeRound(Report& report, const std::string& part, const std::string& work,
                 const std::string& shard, bool gpu) {
  const std::string dir_a = absl::StrCat(work, "/", part, "-a"), dir_b = absl::StrCat(work, "/",
                                                                                      part, "-b");
  const RankRun a = RunLoomRank(work, part + "-a", Assignment(shard, dir_a, gpu));
  if (!a.error.empty()) return report.Part(part, false, a.error);
  if (a.steps.size() != kSteps || a.checkpoints != std::vector<int64_t>{kInterval, kSteps}) {
    return report.Part(part, false,
                       absl::StrCat("the straight run reported ", a.steps.size(),
                                    " steps and ", a.checkpoints.size(), " checkpoints"));
  }
  if (gpu && a.steps.back().device_memory_peak_bytes() == 0) {
    return report.Part(part, false, "loom-rank reported no device memory: it did not train on "
                                    "a GPU");
  }
  std::error_code error;
  fs::create_directories(dir_b, error);
  fs::copy(StepDir(dir_a, kInterval), StepDir(dir_b, kInterval), fs::copy_options::recursive,
           error);
  if (error) return report.Part(part, false, absl::StrCat("copying step 4: ", error.message()));
  const RankRun b = RunLoomRank(work, part + "-b", Assignment(shard, dir_b, gpu));
  if (!b.error.empty()) return report.Part(part, false, b.error);
  std::string difference;
  const bool resumed = !b.steps.empty() && b.steps.front().step() == kInterval + 1 &&
                       b.steps.size() == kSteps - kInterval;
  const bool losses = SameLosses(a, b, &difference);
  const std::string shard_name = "/shard-00000.bin";
  const bool bytes = SameFile(StepDir(dir_a, kSteps) + shard_name,
                              StepDir(dir_b, kSteps) + shard_name);
  std::string detail = absl::StrFormat(
      "loom-rank on %s from JSON: %d steps, loss %.4f -> %.4f, checkpoints at 4 and 8; resumed "
      "at step %d: losses %s, step-8 shard %s",
      gpu ? "cuda:0" : "the CPU", kSteps, a.steps.front().loss(), a.steps.back().loss(),
      b.steps.empty() ? 0 : b.steps.front().step() - 1,
      losses ? "bit for bit" : "DIFFER (" + difference + ")",
      bytes ? "byte for byte" : "DIFFERS");
  const bool ok = resumed && losses && bytes;
  if (!ok && gpu) {
    const RankRun c = RunLoomRank(work, part + "-c",
                                  Assignment(shard, absl::StrCat(work, "/", part, "-c"), gpu));
    std::string rerun_difference;
    const bool repeatable = c.error.empty() && SameLosses(a, c, &rerun_difference);
    absl::StrAppend(&detail, repeatable
                                 ? "; a second straight run repeats the first: the resume "
                                   "loses state"
                                 : absl::StrCat("; a second straight run differs too (",
                                                c.error.empty() ? rerun_difference : c.error,
                                                "): the CUDA kernels do not repeat themselves, "
                                                "so no resume can be bit-exact"));
  }
  return report.Part(part, ok, detail);
}

}  // namespace

int CheckResume(const std::vector<std::string>&) {
  Report report("resume");
  ScratchDir dir;
  absl::StatusOr<std::string> shard = WriteTextShard(dir.path(), 7, 100000);
  if (!shard.ok()) return report.Fail(shard.status().ToString());
  ResumeRound(report, "cpu", dir.path(), *shard, /*gpu=*/false);
  if (!CudaAvailable()) return report.SkipNoCuda();
  const bool ok = ResumeRound(report, "cuda", dir.path(), *shard, /*gpu=*/true);
  return report.Finish(ok, "loom-rank trains a one-GPU job from its JSON assignment and resumes "
                           "its checkpoint bit-exactly");
}

}  // namespace loom::gpu_check
