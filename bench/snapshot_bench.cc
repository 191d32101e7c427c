// What in-memory snapshots (worker/engine/checkpoint/snapshot_keeper.h)
// cost a step and save a restart, on the CPU benchmark GPT
// (cpu_gpt_config.h), one rank:
//   1. the same steps with snapshots off, every step (K=1) and every 10th
//      step: median step time and the snapshot stall the reports carry;
//   2. a restart (the next attempt) from the newest snapshot in /dev/shm
//      against one from a checkpoint file of the same step, read cold (its
//      pages dropped from the page cache): the seconds the first step
//      report gives for choosing, reading and loading it.
// Usage: loom_snapshot_bench WORK_DIR [STEPS] [THREADS]
// Last line: snapshot: <figure> ratio=<K=1 median step / off median step>.
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cpu_gpt_config.h"
#include "common/formats/data.h"
#include "worker/engine/gpt.h"
#include "worker/engine/trainer.h"

namespace fs = std::filesystem;

namespace {

struct Run {
  std::vector<double> step_seconds;  // steps after the first
  double stall = 0;                  // checkpoint_stall_seconds, summed
  double restore = 0;                // the first report's restore seconds
  int64_t resumed_from = 0;
  bool from_snapshot = false;
  int64_t snapshots = 0, skipped = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

Run Train(const loom::engine::TrainerConfig& config, int64_t stop_after) {
  Run run;
  loom::engine::TrainerCallbacks cb;
  int64_t polls = 0;
  cb.should_stop = [&] { return stop_after > 0 && polls++ >= stop_after; };
  bool first = true;
  cb.on_step = [&](const loom::v1::StepMetrics& m) {
    if (first) {
      // The attempt's first report: where it resumed, and what that took.
      first = false;
      run.resumed_from = m.step() - 1;
      run.restore = m.checkpoint_restore_seconds();
      run.from_snapshot = m.resumed_from_snapshot();
      return;  // (its time includes the start)
    }
    run.stall += m.checkpoint_stall_seconds();
    run.step_seconds.push_back(m.step_time_seconds());
  };
  absl::StatusOr<loom::engine::TrainResult> r = loom::engine::Train(config, nullptr, cb);
  if (r.ok()) {
    run.snapshots = r->snapshots_written;
    run.skipped = r->snapshots_skipped;
  } else if (!absl::IsCancelled(r.status())) {
    std::fprintf(stderr, "training failed: %s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s WORK_DIR [STEPS] [THREADS]\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 30;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  torch::set_num_threads(threads);
  if (!fs::is_directory("/dev/shm")) {
    std::fprintf(stderr, "snapshot bench: no /dev/shm\n");
    return 1;
  }
  const std::string work = absl::StrCat(root, "/snapshot_bench.", getpid());
  const std::string shm = absl::StrCat("/dev/shm/loom_snapshot_bench.", getpid());
  fs::create_directories(work);
  loom::engine::TrainerConfig config = loom::bench::CpuBenchGptConfig(steps);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> token(0, config.model.vocab_size - 1);
  std::vector<uint16_t> tokens(
      static_cast<size_t>(2 * steps * config.global_batch * config.model.seq_len + 1));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(token(rng));
  config.train_shards = {work + "/train_000000.bin"};
  if (absl::Status s = loom::engine::WriteShard(config.train_shards[0], tokens); !s.ok()) {
    std::fprintf(stderr, "WriteShard: %s\n", s.ToString().c_str());
    return 1;
  }
  config.job_id = "bench";
  config.checkpoint_interval = 0;  // the final checkpoint only
  std::printf("model: %lld parameters, %d thread(s), %lld steps a run\n",
              static_cast<long long>(loom::engine::GptParameterCount(config.model)), threads,
              static_cast<long long>(steps));

  // 1. Step time with snapshots off, every 10th step, every step.
  struct Variant {
    const char* name;
    int64_t interval;
  };
  double off_median = 0, k1_median = 0;
  for (const Variant v : {Variant{"off", 0}, Variant{"K=10", 10}, Variant{"K=1", 1}}) {
    loom::engine::TrainerConfig c = config;
    c.checkpoint_dir = absl::StrCat(work, "/ckpt-", v.interval);
    if (v.interval > 0) {
      c.snapshot_dir = absl::StrCat(shm, "/", v.interval);
      c.snapshot_interval = v.interval;
      c.snapshot_writer = true;
    }
    const Run r = Train(c, 0);
    const double median = Median(r.step_seconds);
    if (v.interval == 0) off_median = median;
    if (v.interval == 1) k1_median = median;
    std::printf(
        "%-5s median step %.4f s, snapshot+checkpoint stall %.4f s over %lld steps, "
        "%lld snapshot(s) written, %lld skipped (one still being written)\n",
        v.name, median, r.stall, static_cast<long long>(steps), static_cast<long long>(r.snapshots),
        static_cast<long long>(r.skipped));
  }

  // 2. A restart from memory against one from a file of the same step.
  loom::engine::TrainerConfig c = config;
  c.checkpoint_dir = work + "/restart";
  c.snapshot_dir = shm + "/restart";
  c.snapshot_interval = 1;
  c.snapshot_writer = true;
  c.checkpoint_interval = steps / 2;  // a file at the step the run stops at
  c.generation = 0;
  Train(c, steps / 2 + 1);  // stops after step steps/2 + 1: the snapshot is newer
  c.generation = 1;
  const Run from_memory = Train(c, 1);
  // The file read cold, as after a node's restart or from another node:
  // its pages leave the page cache first.
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(c.checkpoint_dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  loom::engine::TrainerConfig files = c;
  files.snapshot_dir.clear();
  files.generation = 2;
  const Run from_file = Train(files, 1);
  std::printf(
      "restart: from memory %.3f s (step %lld, snapshot %s), from the checkpoint file "
      "read cold %.3f s (step %lld)\n",
      from_memory.restore, static_cast<long long>(from_memory.resumed_from),
      from_memory.from_snapshot ? "yes" : "no", from_file.restore,
      static_cast<long long>(from_file.resumed_from));
  fs::remove_all(work);
  fs::remove_all(shm);
  const double ratio = off_median > 0 ? k1_median / off_median : 0;
  std::printf(
      "snapshot: K=1 step %.4f s vs %.4f s off, restart %.3f s from memory vs %.3f s "
      "from a cold file ratio=%.3f\n",
      k1_median, off_median, from_memory.restore, from_file.restore, ratio);
  return 0;
}
