// loom_trainer_kill_helper: the child process of trainer_test.cc's kill -9
// tests. Trains the configuration given by its flags on one rank, with one
// LibTorch thread, and SIGKILLs itself, so it dies the way a crashed or
// preempted rank does: no destructors, no flushing, state past the last
// committed checkpoint lost. Where it dies:
//   --kill_at_step=K             in on_step of step K, once every checkpoint
//                                started before step K has committed (so the
//                                test knows which checkpoints exist);
//   --kill_at_stage=STAGE --kill_at_checkpoint=S
//                                on the checkpoint writer's thread, as the
//                                save of checkpoint S reaches STAGE:
//                                shards_written (shard files written, no
//                                manifest) or manifest_written (manifest
//                                written, directory not yet renamed).
//
//   loom_trainer_kill_helper --train=PATH --val=PATH --checkpoint_dir=DIR
//       (--kill_at_step=K | --kill_at_stage=STAGE --kill_at_checkpoint=S)
//       [--n_layer=.. --n_head=.. --d_model=.. --seq_len=.. --vocab_size=..
//       --dropout=.. --lr=.. --total_steps=.. --warmup_steps=..
//       --global_batch=.. --micro_batch=.. --seed=.. --eval_batches=..
//       --checkpoint_interval=..]
//
// Exit status: 2 for bad flags, 1 if training ended or failed before the
// kill point (it prints why); killed by SIGKILL otherwise.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <type_traits>

#include <torch/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "worker/engine/trainer.h"

namespace {

bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (!absl::StartsWith(arg, "--") || eq == std::string::npos) return false;
    (*flags)[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return true;
}

[[noreturn]] void KillSelf() {
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: %s --name=value ...\n", argv[0]);
    return 2;
  }
  loom::engine::TrainerConfig c;
  int64_t kill_at_step = 0, kill_at_checkpoint = 0;
  bool ok = true;
  auto take_int = [&](const char* name, auto* field) {
    auto it = flags.find(name);
    if (it == flags.end()) return;
    int64_t v = 0;
    ok = ok && absl::SimpleAtoi(it->second, &v);
    *field = static_cast<std::remove_pointer_t<decltype(field)>>(v);
    flags.erase(it);
  };
  auto take_double = [&](const char* name, double* field) {
    auto it = flags.find(name);
    if (it == flags.end()) return;
    ok = ok && absl::SimpleAtod(it->second, field);
    flags.erase(it);
  };
  auto take_string = [&](const char* name, std::string* field) {
    auto it = flags.find(name);
    if (it == flags.end()) return;
    *field = it->second;
    flags.erase(it);
  };
  std::string train, val, kill_at_stage;
  take_string("train", &train);
  take_string("val", &val);
  take_string("checkpoint_dir", &c.checkpoint_dir);
  take_int("kill_at_step", &kill_at_step);
  take_string("kill_at_stage", &kill_at_stage);
  take_int("kill_at_checkpoint", &kill_at_checkpoint);
  take_int("n_layer", &c.model.n_layer);
  take_int("n_head", &c.model.n_head);
  take_int("d_model", &c.model.d_model);
  take_int("seq_len", &c.model.seq_len);
  take_int("vocab_size", &c.model.vocab_size);
  take_double("dropout", &c.model.dropout);
  take_double("lr", &c.optimizer.lr);
  take_int("total_steps", &c.schedule.total_steps);
  take_int("warmup_steps", &c.schedule.warmup_steps);
  take_int("global_batch", &c.global_batch);
  take_int("micro_batch", &c.micro_batch);
  take_int("seed", &c.seed);
  take_int("eval_batches", &c.eval_batches);
  take_int("checkpoint_interval", &c.checkpoint_interval);
  using loom::engine::CheckpointStage;
  CheckpointStage stage = CheckpointStage::kCommitted;
  if (kill_at_stage == "shards_written") {
    stage = CheckpointStage::kShardsWritten;
  } else if (kill_at_stage == "manifest_written") {
    stage = CheckpointStage::kManifestWritten;
  } else if (!kill_at_stage.empty()) {
    ok = false;
  }
  const bool by_step = kill_at_step >= 1 && kill_at_stage.empty();
  const bool by_stage = kill_at_step == 0 && !kill_at_stage.empty() && kill_at_checkpoint >= 1;
  if (!ok || !flags.empty() || train.empty() || c.checkpoint_dir.empty() ||
      by_step == by_stage) {
    std::fprintf(stderr, "%s: bad or unknown flags (first unknown: %s)\n", argv[0],
                 flags.empty() ? "none" : flags.begin()->first.c_str());
    return 2;
  }
  c.train_shards = {train};
  if (!val.empty()) c.val_shards = {val};

  torch::set_num_threads(1);
  // The newest checkpoint that has committed, as the writer's thread says.
  std::atomic<int64_t> committed{0};
  loom::engine::TrainerCallbacks callbacks;
  callbacks.on_checkpoint_stage = [&](CheckpointStage at, int64_t step) {
    if (by_stage && at == stage && step == kill_at_checkpoint) KillSelf();
    if (at == CheckpointStage::kCommitted) committed = step;
  };
  callbacks.on_step = [&](const loom::v1::StepMetrics& report) {
    if (!by_step || report.step() != kill_at_step) return;
    // Checkpoints are saved after on_step of their step.
    const int64_t interval = c.checkpoint_interval;
    const int64_t started = interval > 0 ? (kill_at_step - 1) / interval * interval : 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (committed.load() < started) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "%s: checkpoint %lld did not commit\n", argv[0],
                     static_cast<long long>(started));
        std::_Exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    KillSelf();
  };
  absl::StatusOr<loom::engine::TrainResult> result =
      loom::engine::Train(c, nullptr, callbacks);
  std::fprintf(stderr, "%s: training ended before the kill point: %s\n", argv[0],
               result.status().ToString().c_str());
  return 1;
}
