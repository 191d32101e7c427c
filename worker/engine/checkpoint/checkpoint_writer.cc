#include "worker/engine/checkpoint/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <thread>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "worker/engine/optimizer_state_key.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

// write() size, as `dd bs=8M`.
constexpr size_t kWriteChunkBytes = size_t{8} << 20;
// Files at least this large are written by a second thread while this one
// computes their CRC-32C.
constexpr size_t kOverlapBytes = size_t{1} << 20;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t RoundUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// CheckpointErrnoError (checkpoint_fence.h) for the errno just set.
absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return CheckpointErrnoError(what, path);
}

// `status` with `prefix` before its message, payloads kept.
absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status FsyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  const bool ok = ::fsync(fd) == 0;
  absl::Status status = ok ? absl::OkStatus() : ErrnoError("fsync", path);
  ::close(fd);
  return status;
}

// Writes data[0, size) to `fd` from offset 0. With O_DIRECT set on `fd`, if
// the filesystem refuses a direct write (EINVAL), clears O_DIRECT and goes on
// buffered.
absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, std::min(kWriteChunkBytes, size - done),
                               static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && (::fcntl(fd, F_GETFL) & O_DIRECT) != 0) {
      if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
        return ErrnoError("fcntl", path);
      }
      continue;
    }
    if (n < 0) return ErrnoError("write", path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Creates `path` (which must not exist) with data[0, size), fsyncs and closes
// it; returns the CRC-32C of the data.
//
// A page-aligned buffer of whole pages (a shard) is written with O_DIRECT:
// the device reads the staging buffer itself, so the write costs no CPU copy
// into the page cache (and evicts nothing from it); that matters when
// training keeps every core busy. A large file is written on a second thread
// while this one checksums the same bytes, so the device, not the checksum,
// sets the pace.
absl::StatusOr<uint32_t> WriteNewFileDurably(const std::string& path, const char* data,
                                             size_t size) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  const bool aligned = reinterpret_cast<uintptr_t>(data) % kShardDataAlignment == 0 &&
                       size % kShardDataAlignment == 0;
  int fd = aligned ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  if (fd < 0) fd = ::open(path.c_str(), flags, 0644);  // no O_DIRECT here (tmpfs)
  if (fd < 0) return ErrnoError("create", path);
  absl::Status written;
  uint32_t crc = 0;
  if (size >= kOverlapBytes) {
    std::thread io([&] { written = WriteAll(fd, data, size, path); });
    crc = Crc32c(data, size);
    io.join();
  } else {
    written = WriteAll(fd, data, size, path);
    crc = Crc32c(data, size);
  }
  if (written.ok() && ::fsync(fd) != 0) written = ErrnoError("fsync", path);
  if (::close(fd) != 0 && written.ok()) written = ErrnoError("close", path);
  if (!written.ok()) return written;
  return crc;
}

// Renames directory `temp` to `final`. If `final` exists (a rewrite of that
// step), the two are exchanged atomically and the old one, now at `temp`, is
// deleted; where the filesystem cannot exchange, the old one is first moved
// aside (a crash in between leaves that step missing, never half-written).
absl::Status CommitDirectory(const std::string& temp, const std::string& final) {
  if (::rename(temp.c_str(), final.c_str()) == 0) return absl::OkStatus();
  if (errno != EEXIST && errno != ENOTEMPTY) return ErrnoError("rename", temp);
  std::error_code ec;
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(temp, ec);
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) return ErrnoError("exchange", temp);
  const std::string aside = absl::StrCat(temp, "-old");
  fs::remove_all(aside, ec);
  if (::rename(final.c_str(), aside.c_str()) != 0) return ErrnoError("rename", final);
  if (::rename(temp.c_str(), final.c_str()) != 0) return ErrnoError("rename", temp);
  fs::remove_all(aside, ec);
  return absl::OkStatus();
}

}  // namespace

// One save. Everything but the outcome is set by Start() before the thread
// starts and read-only afterwards.
struct CheckpointWriter::Job {
  struct Copy {
    const void* source;
    uint64_t offset;  // in the shard file
    uint64_t bytes;
  };
  TrainingState state;
  std::string prefix;  // shard bytes [0, data_offset)
  std::vector<Copy> copies;  // ascending offsets
  // The source tensors: live parameters and optimizer state (read by the
  // copy), or copies made at capture (non-contiguous or non-CPU tensors,
  // the generator state). Released by the training thread.
  std::vector<torch::Tensor> sources;
  uint64_t file_bytes = 0;
  ManifestFile shard;     // set by the background thread once written
  char* image = nullptr;  // the staging buffer
  double stall_seconds = 0;  // training thread only
  absl::StatusOr<CheckpointReport> outcome = absl::UnknownError("not finished");
};

void CheckpointWriter::FreeDeleter::operator()(char* p) const { std::free(p); }

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options)
    : options_(std::move(options)) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void ShardContents::Add(ShardTensor tensor, const torch::Tensor& tensor_source) {
  torch::Tensor source = tensor_source.detach();
  if (!source.is_cpu() || !source.is_contiguous()) {
    source = source.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  tensor.dtype = source.scalar_type();
  if (tensor.begin >= 0) {
    tensor.shape = {source.numel()};
  } else {
    tensor.shape = source.sizes().vec();
  }
  tensor.bytes = source.nbytes();
  tensors.push_back(std::move(tensor));
  sources.push_back(std::move(source));
}

absl::StatusOr<ShardContents> ReplicatedShardContents(torch::nn::Module& module,
                                                      torch::optim::Optimizer& optimizer) {
  ShardContents contents;
  auto add = [&](std::string name, const torch::Tensor& tensor) {
    ShardTensor t;
    t.name = std::move(name);
    contents.Add(std::move(t), tensor);
  };
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    names[item.value().unsafeGetTensorImpl()] = item.key();
    add("model/" + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    add("model/" + item.key(), item.value());
  }
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    const auto* options = dynamic_cast<const torch::optim::AdamWOptions*>(&group.options());
    if (options == nullptr) {
      return absl::FailedPreconditionError("checkpoints hold AdamW state; the optimizer is not AdamW");
    }
    ShardOptimizerGroup g;
    g.lr = options->lr();
    g.beta1 = std::get<0>(options->betas());
    g.beta2 = std::get<1>(options->betas());
    g.eps = options->eps();
    g.weight_decay = options->weight_decay();
    g.amsgrad = options->amsgrad();
    for (const torch::Tensor& p : group.params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      if (name == names.end()) {
        return absl::FailedPreconditionError(
            "the optimizer holds a tensor that is not a parameter of the module");
      }
      g.params.push_back(name->second);
      auto it = optimizer.state().find(StateKeyOf(p));
      const auto* adam = it == optimizer.state().end()
                             ? nullptr
                             : dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      g.steps.push_back(adam != nullptr ? adam->step() : -1);
      if (adam == nullptr) continue;
      const std::string prefix = absl::StrCat("optimizer/", name->second, "/");
      add(prefix + "exp_avg", adam->exp_avg());
      add(prefix + "exp_avg_sq", adam->exp_avg_sq());
      if (adam->max_exp_avg_sq().defined()) add(prefix + "max_exp_avg_sq", adam->max_exp_avg_sq());
    }
    contents.optimizer_groups.push_back(std::move(g));
  }
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    add("rng/cpu", generator.get_state());  // a copy
  }
  return contents;
}

absl::Status CheckpointWriter::Start(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                     const TrainingState& state) {
  if (job_ != nullptr) return absl::FailedPreconditionError("a checkpoint save is in flight");
  ASSIGN_OR_RETURN(ShardContents contents, ReplicatedShardContents(module, optimizer));
  return Start(std::move(contents), state);
}

absl::Status CheckpointWriter::Start(ShardContents contents, const TrainingState& state) {
  const auto start = std::chrono::steady_clock::now();
  if (job_ != nullptr) return absl::FailedPreconditionError("a checkpoint save is in flight");
  auto job = std::make_unique<Job>();
  job->state = state;
  ShardHeader header;
  header.rank = options_.rank;
  header.shape = options_.shape;
  header.state = state;
  header.tensors = std::move(contents.tensors);
  header.optimizer_groups = std::move(contents.optimizer_groups);
  job->sources = std::move(contents.sources);

  uint64_t end = 0;
  for (ShardTensor& t : header.tensors) {
    t.offset = RoundUp(end, kShardTensorAlignment);
    end = t.offset + t.bytes;
  }
  job->prefix = SerializeShardPrefix(&header);
  // Whole pages, zero-padded at the end, so that the shard can be written
  // with O_DIRECT.
  job->file_bytes = RoundUp(header.data_offset + end, kShardDataAlignment);
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    job->copies.push_back({job->sources[i].data_ptr(), header.data_offset + header.tensors[i].offset,
                           header.tensors[i].bytes});
  }
  if (staging_capacity_ < job->file_bytes) {
    staging_.reset();
    staging_capacity_ = 0;
    const size_t capacity = job->file_bytes;
    staging_.reset(static_cast<char*>(std::aligned_alloc(kShardDataAlignment, capacity)));
    if (staging_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", capacity, " bytes of checkpoint staging memory"));
    }
    staging_capacity_ = capacity;
  }
  job->image = staging_.get();
  {
    absl::MutexLock lock(&mu_);
    snapshotted_ = false;
    done_ = false;
  }
  job->stall_seconds = SecondsSince(start);
  job_ = std::move(job);
  thread_ = std::thread(&CheckpointWriter::Run, this, job_.get());
  return absl::OkStatus();
}

void CheckpointWriter::Run(Job* job) {
  // Snapshot: the shard's exact image, padding zeroed so that equal states
  // give equal bytes.
  std::memcpy(job->image, job->prefix.data(), job->prefix.size());
  uint64_t at = job->prefix.size();
  for (const Job::Copy& copy : job->copies) {
    std::memset(job->image + at, 0, copy.offset - at);
    if (copy.bytes > 0) std::memcpy(job->image + copy.offset, copy.source, copy.bytes);
    at = copy.offset + copy.bytes;
  }
  std::memset(job->image + at, 0, job->file_bytes - at);
  {
    absl::MutexLock lock(&mu_);
    snapshotted_ = true;
  }
  absl::StatusOr<CheckpointReport> outcome = WriteAndCommit(*job);
  if (!outcome.ok() && options_.fence.has_value()) {
    outcome = ExplainSaveFailure(options_.dir, *options_.fence, outcome.status());
  }
  absl::MutexLock lock(&mu_);
  job->outcome = std::move(outcome);
  done_ = true;
}

namespace {

// Writes the manifest into `temp` (which holds every shard it lists), commits
// it as checkpoint `state.step` and prunes (checkpoint.h's protocol). On
// error removes `temp` and returns the error, naming the step.
absl::StatusOr<CheckpointReport> CommitTemporary(const CheckpointWriterOptions& options,
                                                 const std::string& temp,
                                                 CheckpointManifest manifest,
                                                 std::chrono::steady_clock::time_point start) {
  const int64_t step = manifest.state.step;
  auto stage = [&](CheckpointStage s) {
    if (options.on_stage) options.on_stage(s, step);
  };
  const std::string final = CheckpointPath(options.dir, step);
  auto commit = [&]() -> absl::StatusOr<CheckpointReport> {
    stage(CheckpointStage::kShardsWritten);
    const std::string text = SerializeManifest(manifest);
    RETURN_IF_ERROR(WriteNewFileDurably((fs::path(temp) / kManifestFileName).string(),
                                        text.data(), text.size())
                        .status());
    RETURN_IF_ERROR(FsyncDirectory(temp));
    stage(CheckpointStage::kManifestWritten);
    auto rename_into_place = [&]() -> absl::Status {
      RETURN_IF_ERROR(CommitDirectory(temp, final));
      return FsyncDirectory(options.dir);
    };
    if (options.fence.has_value()) {
      RETURN_IF_ERROR(WhileFenceHeld(options.dir, *options.fence, rename_into_place));
    } else {
      RETURN_IF_ERROR(rename_into_place());
    }
    CheckpointReport report;
    report.step = step;
    report.path = final;
    report.bytes = text.size();
    for (const ManifestFile& file : manifest.files) report.bytes += file.bytes;
    report.sha256 = Sha256Hex(text);
    report.generation = manifest.state.generation;
    report.write_seconds = SecondsSince(start);
    return report;
  };
  absl::StatusOr<CheckpointReport> report = commit();
  if (!report.ok()) {
    std::error_code ec;
    fs::remove_all(temp, ec);
    return Prefixed(report.status(), absl::StrCat("checkpoint at step ", step, ": "));
  }
  stage(CheckpointStage::kCommitted);
  if (options.upload_retention.has_value()) {
    // A mark left by an earlier checkpoint of this step (an attempt that
    // got this far before a restart) is not this one's: it is not uploaded.
    std::error_code ec;
    fs::remove(UploadSettledPath(CheckpointPath(options.dir, step)), ec);
  }
  auto prune = [&]() -> absl::Status {
    // A version 1/2 file of this step is superseded (as a rewrite replaced it).
    std::error_code ec;
    CheckpointEntry legacy{step, LegacyCheckpointPath(options.dir, step), -1, true};
    if (fs::exists(legacy.path, ec)) DeleteCheckpoint(legacy);
    RetentionPolicy policy;
    policy.all = options.keep_checkpoints <= 0;
    policy.newest = options.keep_checkpoints;
    policy.every = options.keep_every_steps;
    policy.best = options.keep_best;
    RetentionGuard guard;
    guard.tip_step = step;
    guard.lineage = manifest.state.lineage;
    guard.rollback_distance = options.retain_distance_steps;
    guard.held = options.held_checkpoints;
    guard.upload = options.upload_retention;
    report->pruned = PruneCheckpoints(options.dir, policy, guard);
    return absl::OkStatus();
  };
  if (!options.fence.has_value()) {
    prune().IgnoreError();  // cannot fail
    return report;
  }
  // Fenced between the commit and here: this checkpoint is committed (the
  // newer attempt may resume from it), but this attempt deletes nothing
  // more and must stop.
  RETURN_IF_ERROR(WhileFenceHeld(options.dir, *options.fence, prune));
  return report;
}

std::string TemporaryPath(const CheckpointWriterOptions& options, int64_t step) {
  return absl::StrCat(CheckpointPath(options.dir, step), ".tmp-",
                      options.shared_temp_tag.empty() ? std::to_string(::getpid())
                                                      : options.shared_temp_tag);
}

}  // namespace

absl::StatusOr<CheckpointReport> CommitShardedCheckpoint(const CheckpointWriterOptions& options,
                                                         const CheckpointManifest& layout,
                                                         const TrainingState& state,
                                                         const std::vector<ManifestFile>& shards) {
  CheckpointManifest manifest = layout;
  manifest.layout = kShardedLayout;
  manifest.shape = options.shape;
  manifest.state = state;
  manifest.files = shards;
  absl::StatusOr<CheckpointReport> report =
      CommitTemporary(options, TemporaryPath(options, state.step), std::move(manifest),
                      std::chrono::steady_clock::now());
  if (!report.ok() && options.fence.has_value()) {
    return ExplainSaveFailure(options.dir, *options.fence, report.status());
  }
  return report;
}

absl::StatusOr<CheckpointReport> CheckpointWriter::WriteAndCommit(Job& job) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = job.state.step;
  const bool sharded = !options_.shared_temp_tag.empty();
  const std::string temp = TemporaryPath(options_, step);
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", options_.dir, ": ", ec.message()));
  if (sharded) {
    // Shared with the other ranks: made by whichever comes first.
    fs::create_directories(temp, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", temp, ": ", ec.message()));
  } else {
    fs::remove_all(temp, ec);
    if (::mkdir(temp.c_str(), 0755) != 0) return ErrnoError("mkdir", temp);
  }
  job.shard.name = ShardFileName(options_.rank);
  job.shard.rank = options_.rank;
  job.shard.bytes = job.file_bytes;
  const std::string shard_path = (fs::path(temp) / job.shard.name).string();
  if (sharded) fs::remove(shard_path, ec);  // a retry of this step's save
  absl::StatusOr<uint32_t> crc = WriteNewFileDurably(shard_path, job.image, job.file_bytes);
  if (!crc.ok()) {
    if (!sharded) fs::remove_all(temp, ec);
    return Prefixed(crc.status(), absl::StrCat("checkpoint at step ", step, ": "));
  }
  job.shard.crc32c = *crc;
  if (sharded) {
    // Rank 0 commits once every rank's shard is in; the report says what
    // this rank wrote.
    CheckpointReport report;
    report.step = step;
    report.path = shard_path;
    report.bytes = job.file_bytes;
    report.generation = job.state.generation;
    report.write_seconds = SecondsSince(start);
    return report;
  }
  CheckpointManifest manifest;
  manifest.shape = options_.shape;
  manifest.state = job.state;
  manifest.files.push_back(job.shard);
  return CommitTemporary(options_, temp, std::move(manifest), start);
}

void CheckpointWriter::WaitForSnapshot() {
  if (job_ == nullptr) return;
  const auto start = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_, absl::Condition(&snapshotted_));
  }
  job_->stall_seconds += SecondsSince(start);
}

std::optional<absl::StatusOr<CheckpointReport>> CheckpointWriter::Poll() {
  if (job_ == nullptr) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    if (!done_) return std::nullopt;
  }
  return Finish();
}

std::optional<absl::StatusOr<CheckpointReport>> CheckpointWriter::Wait() {
  if (job_ == nullptr) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_, absl::Condition(&done_));
  }
  job_->stall_seconds += SecondsSince(start);
  return Finish();
}

std::optional<absl::StatusOr<CheckpointReport>> CheckpointWriter::Finish() {
  thread_.join();
  absl::StatusOr<CheckpointReport> outcome = std::move(job_->outcome);
  if (outcome.ok()) outcome->stall_seconds = job_->stall_seconds;
  written_shard_ = job_->shard;
  job_.reset();
  return outcome;
}


}  // namespace loom::engine
