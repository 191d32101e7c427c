// loom-rank: one training rank, started by loom-worker as a child process.
//
// Reads its assignment (loom.v1.StartRank as JSON), joins the job's c10d
// group (TCPStore at master_addr:master_port, hosted by rank 0; Gloo on CPU,
// NCCL on the GPU the controller assigned with resources.gpus_per_rank 1),
// trains, and writes one JSON loom.v1.RankEvent per line to stdout. Human
// logs go to stderr (the worker keeps them in rank-<r>.log). Exit code 0 =
// training finished; 1 = error (last stderr line says why); 143 = stopped.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/checkpoint_retention.h"
#include "common/device_catalog.h"
#include "common/file_util.h"
#include "common/formats/data.h"
#include "common/jobspec.h"
#include "common/rank_exit.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/job.pb.h"
#include "worker/blas_info.h"
#include "worker/engine/block_probe.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"  // IsCheckpointVolumeFull
#include "worker/engine/gpt.h"
#include "worker/engine/host_allocator.h"
#include "worker/engine/openmp_wait.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/trainer.h"
#include "worker/gemm_peak_cache.h"
#include "worker/rank_process.h"
#include "worker/telemetry/gemm_calibration.h"
#include "worker/telemetry/nvml.h"
#include "worker/telemetry/peak_flops.h"
#include "worker/telemetry/telemetry.h"

namespace {

std::atomic<bool> g_stop{false};
void OnTerm(int) { g_stop = true; }
// SIGUSR1: checkpoint-then-preempt (StopRank.checkpoint_first).
std::atomic<bool> g_save_and_stop{false};
void OnSaveAndStop(int) { g_save_and_stop = true; }

void Emit(const loom::v1::RankEvent& event) {
  std::string line;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(event, &line, opts);
  line.push_back('\n');
  fwrite(line.data(), 1, line.size(), stdout);
  fflush(stdout);
}

[[noreturn]] void Die(const std::string& msg, int code = 1) {
  std::cerr << msg << std::endl;
  fflush(stdout);
  _exit(code);
}

loom::engine::TrainerConfig ToTrainerConfig(const loom::v1::StartRank& a) {
  const loom::v1::JobSpec& spec = a.spec();
  loom::engine::TrainerConfig c;
  // model.gpt or model.llama, with its family's defaults (common/jobspec.h).
  const loom::v1::GptModel g = loom::EffectiveDecoder(spec.model());
  c.model.n_layer = g.n_layer();
  c.model.n_head = g.n_head();
  c.model.d_model = g.d_model();
  c.model.seq_len = g.seq_len();
  c.model.vocab_size = g.vocab_size();
  c.model.dropout = g.dropout();
  c.model.n_kv_head = g.n_kv_head();
  c.model.ffn_hidden = g.mlp().hidden();
  c.model.gated_mlp = g.mlp().gated();
  c.model.bias = g.bias();
  c.model.rms_norm = g.norm() == loom::v1::GptModel::RMSNORM;
  c.model.rotary = g.positions() == loom::v1::GptModel::ROTARY;
  c.model.tied_embeddings = !g.untied_embeddings();
  c.model.rope_theta = g.rope_theta();
  c.model.norm_eps = g.norm_eps();
  // Execution choices. ValidateJobSpec refused FP16 already (it
  // needs GPU workers); the engine refuses it again if it gets here.
  switch (spec.precision()) {
    case loom::v1::BF16:
      c.model.precision = loom::engine::Precision::kBf16;
      break;
    case loom::v1::FP16:
      c.model.precision = loom::engine::Precision::kFp16;
      break;
    default:
      c.model.precision = loom::engine::Precision::kFp32;
  }
  c.model.activation_checkpointing = spec.activation_checkpointing();
  const auto& o = spec.optimizer().adamw();
  c.optimizer.lr = o.lr();
  c.optimizer.beta1 = o.beta1();
  c.optimizer.beta2 = o.beta2();
  c.optimizer.eps = o.eps();
  c.optimizer.weight_decay = o.weight_decay();
  c.optimizer.grad_clip = o.grad_clip();
  const auto& s = spec.schedule();
  c.schedule.total_steps = s.total_steps();
  c.schedule.warmup_steps = s.warmup_steps();
  c.schedule.min_lr_ratio = s.min_lr_ratio();
  c.global_batch = spec.batch().global_batch();
  c.micro_batch = spec.batch().micro_batch();
  c.seed = spec.seed();
  if (spec.data().has_prefetch_depth()) c.prefetch_depth = spec.data().prefetch_depth();
  c.eval_interval = s.eval_interval();
  c.eval_batches = s.eval_batches();
  c.log_interval = s.log_interval() > 0 ? s.log_interval() : 1;
  c.checkpoint_dir = a.checkpoint_dir().empty() ? spec.checkpoint().dir() : a.checkpoint_dir();
  c.checkpoint_interval = spec.checkpoint().interval_steps();
  const loom::engine::RetentionPolicy local = loom::LocalRetentionPolicy(spec.checkpoint());
  c.keep_checkpoints = local.all ? 0 : local.newest;
  c.keep_every_steps = local.every;
  c.keep_best = local.best;
  for (const auto& [step, why] : a.held_checkpoints()) c.held_checkpoints[step] = why;
  if (!spec.checkpoint().remote().empty()) {
    c.upload_retention = loom::RemoteRetentionPolicy(spec.checkpoint());
  }
  c.continue_after_failed_save =
      spec.checkpoint().on_save_failure() == loom::v1::CheckpointSpec::CONTINUE;
  // Recovery: which checkpoint to resume from, the attempt, and the data
  // batches to skip. Retention keeps a rollback target this far back.
  c.generation = a.generation();
  c.job_id = a.job_id();
  c.resume_step = a.resume_step();
  c.allow_start_from_scratch = spec.recovery().allow_start_from_scratch();
  c.init_from = spec.init_from().path();
  if (absl::StartsWith(c.init_from, "s3://") && !c.checkpoint_dir.empty()) {
    // A checkpoint in an object store: rank 0 brings it into the job's own
    // (shared) checkpoint directory before it is read (RunRank's
    // before_init_from); every rank then reads it there.
    c.init_from =
        (std::filesystem::path(c.checkpoint_dir) / "init-from" /
         std::filesystem::path(std::string(absl::StripSuffix(c.init_from, "/"))).filename())
            .string();
  }
  c.init_optimizer = spec.init_from().optimizer();
  for (const auto& r : a.skip_batches()) c.skip_batches.push_back({r.begin(), r.end()});
  // The layout: data = world / (tensor x pipeline).
  const auto& par = spec.parallelism();
  c.tensor_parallel = par.tensor() > 0 ? par.tensor() : 1;
  c.pipeline_parallel = par.pipeline() > 0 ? par.pipeline() : 1;
  c.zero_stage = par.zero_stage();
  c.stage_layers.assign(par.stage_layers().begin(), par.stage_layers().end());
  c.retain_distance_steps = loom::RollbackWindowSteps(spec.recovery());
  return c;
}

}  // namespace

namespace {

// Datasheet peak of GPU `gpu` (NVML index) for `precision`, from the
// device catalog (common/device_catalog.h); 0, with a line on stderr saying why, when NVML cannot
// name the board or the catalog does not know it.
// The datasheet peak of GPU `gpu` for the training precision, and in
// `what` which board and precision it is; 0 (no MFU) for a board the
// catalog does not know.
double GpuPeakFlops(int gpu, loom::engine::Precision precision, std::string* what) {
  absl::StatusOr<std::unique_ptr<loom::telemetry::Nvml>> nvml = loom::telemetry::Nvml::Open();
  absl::StatusOr<std::string> product =
      nvml.ok() ? (*nvml)->DeviceName(gpu) : absl::StatusOr<std::string>(nvml.status());
  absl::StatusOr<loom::DeviceSpec> device =
      product.ok() ? loom::LookupDeviceByProductName(*product)
                   : absl::StatusOr<loom::DeviceSpec>(product.status());
  if (!device.ok()) {
    std::cerr << "loom-rank: no peak for GPU " << gpu << ", so no MFU: " << device.status()
              << std::endl;
    return 0;
  }
  const loom::MatmulPrecision p = precision == loom::engine::Precision::kBf16
                                         ? loom::MatmulPrecision::kBf16
                                     : precision == loom::engine::Precision::kFp16
                                         ? loom::MatmulPrecision::kFp16
                                         : loom::MatmulPrecision::kFp32;
  const double peak = device->PeakFlops(p);
  *what = absl::StrCat("datasheet ", loom::PrecisionName(p), " peak of ", device->name);
  std::cerr << "loom-rank: GPU " << gpu << " is " << *product << " (" << device->name << "), peak "
            << peak / 1e12 << " TFLOP/s " << loom::PrecisionName(p) << std::endl;
  return peak;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else runs or prints: OpenMP threads that spin only
  // briefly before they sleep, since this process's OpenMP team and
  // OpenBLAS's threads share the cores (openmp_wait.h). Replaces the process image
  // (same pid) unless the environment chose a policy.
  const absl::Status openmp_wait = loom::engine::ReexecWithShortOpenMpSpin(argv);
  std::string assignment_path;
  bool warm = false;
  for (int i = 1; i < argc; ++i) {
    // The worker's start-up measurement of what a block costs beyond its
    // FLOPs (block_probe.h), for the controller's planner: one line on
    // stdout.
    if (std::string(argv[i]) == "--probe") {
      // Under the allocator policy the ranks train with (below): without
      // it every pass page-faults its buffers back in, and the probe's
      // block took 21 ms where a training rank's takes 8.
      if (absl::Status s = loom::engine::RetainFreedHostMemory(); !s.ok()) {
        std::cerr << "loom-rank: host allocator left as it is: " << s << std::endl;
      }
      // A one-thread rank's BLAS, as the ranks train with (below).
      loom::worker::SetBlasThreads(1);
      std::cout << loom::engine::FormatBlockCost(loom::engine::ProbeBlockCost()) << std::endl;
      return 0;
    }
    if (std::string(argv[i]) == "--assignment" && i + 1 < argc) assignment_path = argv[i + 1];
    if (std::string(argv[i]) == "--warm") warm = true;
  }
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  std::string warm_note;
  if (warm) {
    absl::StatusOr<std::optional<loom::worker::WarmAssignment>> given =
        loom::worker::AwaitWarmAssignment();
    if (!given.ok()) Die(std::string(given.status().message()));
    if (!given->has_value()) return 0;  // not needed after all
    assignment_path = (*given)->assignment_path;
    warm_note = (*given)->note;
  }
  if (assignment_path.empty()) Die("usage: loom-rank --assignment FILE | --warm | --probe");
  // Start-up, in parts, for the rank's log: from the worker's fork to here
  // (exec, loading LibTorch; nothing for a warm rank), then the steps below
  // until training starts.
  const double loaded_seconds = warm ? 0.0 : loom::telemetry::SecondsSinceProcessStart();
  const auto main_at = std::chrono::steady_clock::now();
  struct sigaction sa {};
  sa.sa_handler = OnTerm;
  sa.sa_flags = SA_RESTART;  // a stop request must not fail an interrupted read or write
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction save {};
  save.sa_handler = OnSaveAndStop;
  save.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &save, nullptr);
  // This process exists to train: keep freed host memory for the next step
  // instead of page-faulting it back in (host_allocator.h).
  if (absl::Status s = loom::engine::RetainFreedHostMemory(); !s.ok()) {
    std::cerr << "loom-rank: host allocator left as it is: " << s << std::endl;
  }
  if (!openmp_wait.ok()) std::cerr << "loom-rank: " << openmp_wait.message() << std::endl;

  auto text = loom::ReadFile(assignment_path);
  if (!text.ok()) Die(absl::StrCat("cannot read assignment: ", text.status().message()));
  loom::v1::StartRank a;
  auto parsed = google::protobuf::util::JsonStringToMessage(*text, &a);
  if (!parsed.ok()) Die(absl::StrCat("bad assignment ", assignment_path, ": ", parsed.ToString()));

  loom::engine::TrainerConfig config = ToTrainerConfig(a);
  // Memory this rank may use: the host's (or container's) limit shared by
  // the ranks this worker runs of the job (the scheduler spreads ranks
  // evenly over resources.workers).
  const int workers = std::max(1, a.spec().resources().workers());
  const int local_ranks = std::max(1, (a.world_size() + workers - 1) / workers);
  const uint64_t memory_limit =
      loom::telemetry::ReadMemoryLimitBytes() / static_cast<uint64_t>(local_ranks);
  const loom::v1::MemorySnapshotSpec& snapshot_spec = a.spec().checkpoint().snapshots();
  const loom::worker::RankSnapshots snapshots = loom::worker::ChooseRankSnapshots(
      snapshot_spec.disable(), snapshot_spec.interval_steps(), snapshot_spec.max_bytes(),
      a.job_id(), config.checkpoint_dir, a.generation(), memory_limit);
  config.snapshot_dir = snapshots.dir;
  config.snapshot_interval = snapshots.interval;
  config.snapshot_writer = snapshots.writer;
  config.snapshot_max_bytes = snapshots.max_bytes;
  if (snapshots.writer && loom::engine::UsesParallelLayout(config)) {
    std::cerr << "loom-rank " << a.rank() << ": no in-memory snapshots: this layout's shards "
              << "would each need a copy on another node; restarts resume from checkpoints"
              << std::endl;
  } else if (snapshots.writer) {
    std::cerr << "loom-rank " << a.rank() << ": writes this node's in-memory snapshots every "
              << snapshots.interval << " step(s) into " << snapshots.dir << " (at most "
              << snapshots.max_bytes / (1024 * 1024) << " MiB)" << std::endl;
  }
  // resources.gpus_per_rank 1: the controller gave this rank a GPU of its
  // own. CUDA numbers devices in PCI order here, as NVML does, so that the
  // power meter reads the same board.
  const int gpu = a.spec().resources().gpus_per_rank() > 0 ? a.gpu() : -1;
  if (gpu >= 0) {
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", /*overwrite=*/0);
    config.device = absl::StrCat("cuda:", gpu);
  }
  auto train = loom::engine::ExpandShardPatterns(
      std::vector<std::string>(a.spec().data().train().begin(), a.spec().data().train().end()));
  if (!train.ok()) Die(absl::StrCat("data.train: ", train.status().message()));
  config.train_shards = *train;
  if (a.spec().data().validation_size() > 0) {
    auto val = loom::engine::ExpandShardPatterns(std::vector<std::string>(
        a.spec().data().validation().begin(), a.spec().data().validation().end()));
    if (!val.ok()) Die(absl::StrCat("data.validation: ", val.status().message()));
    config.val_shards = *val;
  }

  int threads = a.spec().resources().threads_per_rank() > 0 ? a.spec().resources().threads_per_rank() : 1;
  torch::set_num_threads(threads);
  const int blas_threads = loom::worker::SetBlasThreads(threads);
  loom::worker::BlasInfo blas = loom::worker::DetectBlas();
  std::cerr << "loom-rank " << a.rank() << "/" << a.world_size() << " of " << a.job_id()
            << ": " << threads << " thread(s), BLAS " << blas.vendor << " (" << blas.path << ")"
            << (blas_threads > 0 ? absl::StrCat(" on ", blas_threads, " thread(s)")
                                 : std::string(" (its threads not settable)"))
            << ", OpenMP wait " << loom::engine::OpenMpWaitPolicyDescription() << std::endl;
  if (!blas.optimized) std::cerr << "WARNING: slow reference BLAS in use" << std::endl;

  const double setup_seconds = seconds_since(main_at);
  const auto joining_at = std::chrono::steady_clock::now();
  std::shared_ptr<c10d::ProcessGroup> pg;
  std::optional<loom::engine::ParallelGroups> layout_groups;
  loom::engine::GlooGroupOptions g;
  g.master_addr = a.master_addr();
  g.master_port = a.master_port();
  g.rank = a.rank();
  g.world_size = a.world_size();
  g.local_addr = a.local_addr();
  // The job's collective timeout: Gloo's and NCCL's (parallel/nccl_errors.h)
  // collectives, and the rendezvous, fail after it.
  if (a.spec().resources().collective_timeout_seconds() > 0) {
    g.timeout_seconds = a.spec().resources().collective_timeout_seconds();
  }
  // This attempt's keys only: a rank of another job (or of an older attempt)
  // that was handed the same port cannot be mistaken for a peer.
  g.store_namespace =
      absl::StrCat("loom/job/", a.job_id(), "/g", a.generation(), "/p", a.master_port());
  if (loom::engine::UsesParallelLayout(config)) {
    // One store, then this rank's tensor, pipeline, data (and embedding)
    // groups; the world group is layout_groups->world.
    const int model_ranks = config.tensor_parallel * config.pipeline_parallel;
    const loom::ParallelLayout layout{a.world_size() / std::max(1, model_ranks),
                                              config.tensor_parallel, config.pipeline_parallel};
    auto groups = loom::engine::CreateParallelGroups(g, config.device, layout);
    if (!groups.ok()) {
      Die(absl::StrCat("joining the ", loom::LayoutName(layout), " groups at ",
                       a.master_addr(), ":", a.master_port(), " failed: ",
                       groups.status().message()),
          loom::kRankExitRendezvousFailed);
    }
    layout_groups.emplace(*std::move(groups));
    const loom::RankCoordinates& c = layout_groups->coordinates;
    std::cerr << "loom-rank " << a.rank() << ": layout " << loom::LayoutName(layout)
              << ", ZeRO-" << config.zero_stage << "; this rank is dp " << c.dp << ", pp " << c.pp
              << ", tp " << c.tp << std::endl;
  } else if (a.world_size() > 1) {
    // Gloo for CPU ranks; NCCL for a CUDA device.
    auto group = loom::engine::CreateProcessGroup(g, config.device);
    if (!group.ok()) {
      Die(absl::StrCat("joining the process group at ", a.master_addr(), ":", a.master_port(),
                       " failed: ", group.status().message()),
          loom::kRankExitRendezvousFailed);
    }
    pg = *group;
  }

  // Telemetry: this rank's peak (the job's is that times the ranks): on a
  // GPU the datasheet figure of the board NVML names, for the training
  // precision (common/device_catalog.h; 0, and no MFU, for a
  // board it does not know); on CPU a short GEMM calibration. Then model
  // FLOPs, state bytes, power.
  const double join_seconds = seconds_since(joining_at);
  const auto calibrating_at = std::chrono::steady_clock::now();
  double rank_peak = 0;
  std::string peak_what;
  if (gpu >= 0) {
    rank_peak = GpuPeakFlops(gpu, config.model.precision, &peak_what);
  } else {
    std::string how;
    rank_peak = loom::worker::GemmPeakFor(
        threads, [] { return loom::telemetry::MeasureGemmFlopsPerSecond(); }, &how);
    std::cerr << "loom-rank " << a.rank() << ": " << how << std::endl;
    peak_what = absl::StrFormat("calibrated fp32 GEMM peak, %.1f GFLOP/s with %d thread(s)",
                                rank_peak / 1e9, threads);
  }
  const double calibration_seconds = seconds_since(calibrating_at);
  if (a.world_size() > 1) absl::StrAppend(&peak_what, " per rank x ", a.world_size(), " ranks");
  // The job's peak: MFU is never reported above 1 against it (a step faster
  // than the calibration raises a calibrated peak: peak_flops.h).
  auto job_peak = std::make_shared<loom::telemetry::PeakFlops>(
      rank_peak * a.world_size(),
      gpu >= 0 ? loom::telemetry::PeakFlops::Source::kDatasheet
               : loom::telemetry::PeakFlops::Source::kCalibrated,
      peak_what);
  const double flops_per_token =
      loom::telemetry::ModelFlopsPerToken(loom::engine::ShapeOf(config.model));
  // Training state of this rank: the whole model's under data parallelism;
  // under a layout about 1 / (tensor x pipeline) of it (the stages' split is
  // close to even), with the optimizer state (ZeRO >= 1) and the gradients
  // (ZeRO-2, which holds its shard and a few buckets in flight:
  // parallel/gradient_partitioner.h) further divided over the data replicas.
  loom::telemetry::StateBytes state_bytes =
      loom::telemetry::Fp32AdamWStateBytes(loom::engine::GptParameterCount(config.model));
  if (loom::engine::UsesParallelLayout(config)) {
    const uint64_t model_ranks = config.tensor_parallel * config.pipeline_parallel;
    const uint64_t replicas = std::max<uint64_t>(1, a.world_size() / model_ranks);
    state_bytes.parameters /= model_ranks;
    state_bytes.gradients /= model_ranks * (config.zero_stage >= 2 ? replicas : 1);
    state_bytes.optimizer /= model_ranks * (config.zero_stage >= 1 ? replicas : 1);
  }
  auto power = std::make_shared<loom::telemetry::PowerMeter>(
      threads, static_cast<int>(std::thread::hardware_concurrency()), gpu);
  std::cerr << "loom-rank " << a.rank() << ": power source " << power->source()
            << (power->fallback_reason().empty() ? "" : " (" + power->fallback_reason() + ")")
            << std::endl;

  loom::engine::TrainerCallbacks cb;
  if (absl::StartsWith(a.spec().init_from().path(), "s3://")) {
    const std::string url = a.spec().init_from().path();
    cb.before_init_from = [url, r = a.rank()](const std::string& local) -> absl::Status {
      bool ok = false;
      const std::string dir = std::filesystem::path(local).parent_path().string();
      const std::string line = loom::worker::FetchFromObjectStore(url, dir, std::nullopt, &ok);
      std::cerr << "loom-rank " << r << ": object store: init_from: " << line << std::endl;
      if (!ok) return absl::UnavailableError(absl::StrCat("fetching ", url, ": ", line));
      return absl::OkStatus();
    };
  }
  if (!a.spec().checkpoint().remote().empty()) {
    // The remote tier: what the directory lost comes back from the store.
    const std::string remote =
        absl::StrCat(absl::StripSuffix(a.spec().checkpoint().remote(), "/"), "/", a.job_id());
    cb.before_resume = [remote, r = a.rank()](const std::string& dir, int64_t resume_step) {
      std::cerr << "loom-rank " << r << ": object store: "
                << loom::worker::FetchFromObjectStore(remote, dir, resume_step) << std::endl;
    };
  }
  int rank = a.rank();
  const char* precision = loom::engine::PrecisionName(config.model.precision);
  const int64_t total_steps = config.schedule.total_steps;
  cb.on_step = [rank, job_peak, flops_per_token, state_bytes, power, memory_limit, precision,
                total_steps](const loom::v1::StepMetrics& r) {
    // The engine's metrics, and what this process knows besides.
    loom::v1::RankEvent e;
    auto* m = e.mutable_step();
    *m = r;
    m->set_rank(rank);
    if (r.step() > 0 && r.step_time_seconds() > 0) {
      double achieved = flops_per_token * r.tokens_per_second();
      m->set_model_flops_per_second(achieved);
      const double mfu = job_peak->Observe(achieved);
      m->set_peak_flops_per_second(job_peak->peak());
      m->set_mfu(mfu);
      m->set_peak_flops_source(job_peak->Describe());
      m->set_power_watts(power->Account(r.step_time_seconds()));
    }
    m->set_energy_joules(power->energy_joules());
    m->set_power_source(power->source());
    m->set_parameter_bytes(state_bytes.parameters);
    m->set_gradient_bytes(state_bytes.gradients);
    m->set_optimizer_state_bytes(state_bytes.optimizer);
    loom::telemetry::Rss rss = loom::telemetry::ReadRss();
    m->set_rss_bytes(rss.current);
    m->set_peak_rss_bytes(rss.peak);
    m->set_memory_limit_bytes(static_cast<double>(memory_limit));
    m->set_total_steps(total_steps);
    m->set_precision(precision);
    m->set_time_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::system_clock::now().time_since_epoch()).count());
    Emit(e);
  };
  // The newest failed save (rank 0, the training thread), to tell a run that
  // stopped for it from one that stopped for something else.
  static absl::Status last_save_failure;
  cb.on_checkpoint_failed = [](int64_t step, const absl::Status& error) {
    last_save_failure = error;
    loom::v1::RankEvent e;
    auto* c = e.mutable_checkpoint();
    c->set_step(step);
    c->set_status("failed");
    c->set_error(std::string(error.message()));
    Emit(e);
  };
  cb.on_checkpoint = [](const loom::engine::CheckpointReport& r) {
    loom::v1::RankEvent e;
    auto* c = e.mutable_checkpoint();
    c->set_step(r.step);
    c->set_path(r.path);
    c->set_bytes(r.bytes);
    c->set_sha256(r.sha256);
    c->set_generation(r.generation);
    c->set_write_seconds(r.write_seconds);
    c->set_stall_seconds(r.stall_seconds);
    for (const loom::engine::PrunedDirectory& d : r.pruned) {
      loom::v1::PrunedCheckpoint* p = c->add_pruned();
      p->set_path(d.path);
      p->set_step(d.step);
      p->set_tier("local");
      p->set_reason(d.reason);
    }
    Emit(e);
  };
  cb.on_checkpoint_corrupt = [](const loom::engine::CorruptCheckpoint& corrupt) {
    loom::v1::RankEvent e;
    auto* c = e.mutable_checkpoint();
    c->set_step(corrupt.step);
    c->set_path(corrupt.path);
    c->set_generation(corrupt.generation);
    c->set_status("corrupt");
    c->set_error(corrupt.message);
    c->set_corrupt_file(corrupt.file);
    c->set_failed_check(corrupt.check);
    Emit(e);
  };
  // Told to the controller, which records it as a SNAPSHOTS_OFF event.
  cb.on_snapshots_off = [rank](const std::string& reason) {
    std::cerr << "loom-rank " << rank << ": in-memory snapshots off: " << reason << std::endl;
    loom::v1::RankEvent e;
    auto* c = e.mutable_checkpoint();
    c->set_status("snapshots_off");
    c->set_error(reason);
    Emit(e);
  };
  cb.should_stop = [] { return g_stop.load(); };
  cb.should_save_and_stop = [] { return g_save_and_stop.load(); };

  const double main_seconds = seconds_since(main_at);
  std::cerr << absl::StrFormat(
                   "loom-rank %d: ready to train %.2f s after its start%s: %s to load (exec, "
                   "LibTorch), %.2f s to read its assignment and set up, %.2f s joining its "
                   "process group(s), %.2f s %s, %.2f s else; the checkpoint restore and the "
                   "first step follow",
                   rank, (loaded_seconds < 0 ? 0 : loaded_seconds) + main_seconds, warm_note,
                   loaded_seconds < 0 ? std::string("unknown")
                                      : absl::StrFormat("%.2f s", loaded_seconds),
                   setup_seconds, join_seconds, calibration_seconds,
                   gpu >= 0 ? "reading the GPU's peak" : "GEMM calibration",
                   std::max(0.0, main_seconds - setup_seconds - join_seconds - calibration_seconds))
            << std::endl;
  auto result = layout_groups ? loom::engine::TrainWithGroups(config, *layout_groups, cb)
                              : loom::engine::Train(config, pg, cb);
  if (!result.ok()) {
    if (absl::IsCancelled(result.status())) Die("stopped on request", 143);
    if (loom::engine::IsNoGoodCheckpoint(result.status())) {
      Die(absl::StrCat("training failed: ", result.status().message()),
          loom::kRankExitNoGoodCheckpoint);
    }
    if (loom::engine::IsCheckpointFenced(result.status())) {
      Die(absl::StrCat("training stopped: ", result.status().message()),
          loom::kRankExitCheckpointFenced);
    }
    if (loom::engine::IsCheckpointVolumeFull(result.status()) &&
        result.status() == last_save_failure) {
      Die(absl::StrCat("training failed: the checkpoint volume is full: ",
                       result.status().message()),
          loom::kRankExitCheckpointVolumeFull);
    }
    Die(absl::StrCat("training failed: ", result.status().ToString()));
  }
  if (result->saved_and_stopped) {
    Die(absl::StrCat("saved a checkpoint at step ", result->steps,
                     " and stopped, as asked (preempted)"),
        loom::kRankExitSavedAndStopped);
  }
  std::cerr << "loom-rank " << rank << ": finished " << result->steps << " steps, final loss "
            << result->final_loss << std::endl;
  fflush(stdout);
  // Skip static destructors: tearing down Gloo after peers have exited can
  // block, and everything worth keeping is already on disk.
  _exit(0);
}
