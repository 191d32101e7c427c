#include "worker/engine/parallel/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/engine/optimizer_state_key.h"
#include "worker/engine/parallel/tensor_parallel.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

// Bytes read first from every shard: enough for the header of a model of a
// few thousand tensors; a larger header is read again at its full length.
constexpr size_t kHeaderReadBytes = size_t{1} << 20;

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Reads `size` bytes at `offset` of `path` into `out`.
absl::Status PreadAll(const std::string& path, uint64_t offset, size_t size, void* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  size_t done = 0;
  absl::Status status;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(out) + done, size - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoError("read", path);
      break;
    }
    if (n == 0) {
      status = absl::DataLossError(absl::StrCat(path, ": ends before byte ", offset + size));
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return status;
}

// "model/<p>" -> p; "optimizer/<p>/<moment>" -> p; anything else -> "".
std::string ParameterOf(const std::string& name) {
  if (absl::StartsWith(name, "model/")) return name.substr(6);
  if (absl::StartsWith(name, "optimizer/")) {
    const size_t slash = name.rfind('/');
    if (slash > 10) return name.substr(10, slash - 10);
  }
  return "";
}

bool IsReplicatedOverTensorGroup(const std::string& parameter) {
  return TensorParallelSplitOf(parameter) == TensorParallelSplit::kReplicated;
}

}  // namespace

ShardContents LayoutShardContents(const ShardedAdamW& optimizer, const ParallelGroups& groups,
                                  const OptimizerConfig& config) {
  ShardContents contents;
  const RankCoordinates me = groups.coordinates;
  const int tp_size = groups.layout.tensor;
  const int64_t step = optimizer.step_count();
  const int64_t shard_begin = optimizer.shard_begin();
  const int64_t shard_end = shard_begin + optimizer.shard_elements();
  // ZeRO 0 keeps every moment on every replica: replica 0 writes them.
  const bool moments_sharded = optimizer.zero_stage() > 0;
  ShardOptimizerGroup group;
  group.lr = config.lr;
  group.beta1 = config.beta1;
  group.beta2 = config.beta2;
  group.eps = config.eps;
  group.weight_decay = config.weight_decay;
  const std::vector<ShardedParameter>& parameters = optimizer.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ShardedParameter& p = parameters[i];
    // The last stage's copy of the tied wte: the first stage writes it.
    if (!p.counted_in_norm) continue;
    const bool replicated = IsReplicatedOverTensorGroup(p.name);
    if (replicated && me.tp != 0) continue;
    ShardTensor piece;
    piece.tp_rank = replicated ? 0 : me.tp;
    piece.tp_size = replicated ? 1 : tp_size;
    piece.begin = 0;
    const int64_t numel = p.tensor.numel();
    bool wrote = false;
    if (me.dp == 0) {
      piece.name = "model/" + p.name;
      contents.Add(piece, p.tensor.detach().reshape({-1}));
      wrote = true;
    }
    if (step > 0 && (moments_sharded || me.dp == 0)) {
      const int64_t offset = optimizer.offset_of(i);
      const int64_t lo = std::max(offset, shard_begin);
      const int64_t hi = std::min(offset + numel, shard_end);
      if (lo < hi) {
        piece.begin = lo - offset;
        piece.name = absl::StrCat("optimizer/", p.name, "/exp_avg");
        contents.Add(piece, optimizer.exp_avg().narrow(0, lo - shard_begin, hi - lo));
        piece.name = absl::StrCat("optimizer/", p.name, "/exp_avg_sq");
        contents.Add(piece, optimizer.exp_avg_sq().narrow(0, lo - shard_begin, hi - lo));
        wrote = true;
      }
    }
    if (wrote) {
      group.params.push_back(p.name);
      group.steps.push_back(step > 0 ? step : -1);
    }
  }
  contents.optimizer_groups.push_back(std::move(group));
  if (groups.rank == 0) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    ShardTensor rng;
    rng.name = "rng/cpu";
    contents.Add(std::move(rng), generator.get_state());  // a copy
  }
  return contents;
}

CheckpointManifest ShardedLayoutOf(const ParallelGroups& groups, int zero_stage) {
  CheckpointManifest manifest;
  manifest.layout = kShardedLayout;
  manifest.data_parallel = groups.layout.data;
  manifest.pipeline_parallel = groups.layout.pipeline;
  manifest.tensor_parallel = groups.layout.tensor;
  manifest.zero_stage = zero_stage;
  return manifest;
}

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& path,
                                                        const GptConfig& config) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is a version 1/2 checkpoint file: resume it once with tensor_parallel 1, "
              "pipeline_parallel 1, zero_stage 0 to convert it"));
  }
  CheckpointReader reader;
  reader.config_ = config;
  const std::string manifest_path = (fs::path(path) / kManifestFileName).string();
  const uintmax_t manifest_size = fs::file_size(manifest_path, ec);
  if (ec) return absl::DataLossError(absl::StrCat(manifest_path, ": ", ec.message()));
  std::string manifest_bytes(manifest_size, '\0');
  RETURN_IF_ERROR(PreadAll(manifest_path, 0, manifest_bytes.size(), manifest_bytes.data()));
  ASSIGN_OR_RETURN(reader.manifest_, ParseManifest(manifest_bytes, manifest_path));

  for (const ManifestFile& file : reader.manifest_.files) {
    const std::string file_path = (fs::path(path) / file.name).string();
    std::string prefix(std::min<uint64_t>(kHeaderReadBytes, file.bytes), '\0');
    RETURN_IF_ERROR(PreadAll(file_path, 0, prefix.size(), prefix.data()));
    absl::StatusOr<ShardHeader> header = ParseShardHeader(prefix, file.bytes);
    if (absl::IsOutOfRange(header.status())) {  // a header past the first read
      uint64_t length = 0;
      for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<uint8_t>(prefix[8 + i])} << (8 * i);
      prefix.resize(16 + length);
      RETURN_IF_ERROR(PreadAll(file_path, 0, prefix.size(), prefix.data()));
      header = ParseShardHeader(prefix, file.bytes);
    }
    if (!header.ok()) {
      return absl::Status(header.status().code(),
                          absl::StrCat(file_path, ": ", header.status().message()));
    }
    const int index = static_cast<int>(reader.files_.size());
    reader.files_.push_back(file_path);
    for (const ShardTensor& t : header->tensors) {
      reader.index_[t.name].push_back({index, header->data_offset + t.offset, t});
    }
    for (const ShardOptimizerGroup& group : header->optimizer_groups) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        int64_t& step = reader.steps_.try_emplace(group.params[i], -1).first->second;
        step = std::max(step, group.steps[i]);
      }
    }
  }
  return reader;
}

absl::Status CheckpointReader::ReadPiece(const Piece& piece, void* out) const {
  return PreadAll(files_[piece.file], piece.offset, piece.tensor.bytes, out);
}

int64_t CheckpointReader::StepOf(const std::string& name) const {
  auto it = steps_.find(name);
  return it == steps_.end() ? -1 : it->second;
}

absl::StatusOr<torch::Tensor> CheckpointReader::Whole(const std::string& name,
                                                      const std::vector<int64_t>& shape,
                                                      torch::ScalarType dtype) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("the checkpoint has no tensor ", name));
  }
  const std::vector<Piece>& pieces = it->second;
  for (const Piece& piece : pieces) {
    if (piece.tensor.dtype != dtype) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint tensor ", name, " is ",
                                                        c10::toString(piece.tensor.dtype),
                                                        ", expected ", c10::toString(dtype)));
    }
  }
  const torch::TensorOptions options = torch::TensorOptions().dtype(dtype);
  // A replicated shard's whole tensor.
  if (pieces.size() == 1 && pieces[0].tensor.begin < 0) {
    if (pieces[0].tensor.shape != shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint tensor ", name, " is [", absl::StrJoin(pieces[0].tensor.shape, ","),
          "], the model's [", absl::StrJoin(shape, ","), "]"));
    }
    torch::Tensor whole = torch::empty(shape, options);
    RETURN_IF_ERROR(ReadPiece(pieces[0], whole.data_ptr()));
    return whole;
  }
  const int tp_size = pieces[0].tensor.tp_size;
  const std::string parameter = ParameterOf(name);
  std::vector<torch::Tensor> partitions;
  for (int t = 0; t < tp_size; ++t) {
    const std::vector<int64_t> part_shape =
        tp_size == 1 ? shape : TensorParallelShardShape(parameter, shape, config_, t, tp_size);
    int64_t numel = 1;
    for (int64_t d : part_shape) numel *= d;
    std::vector<const Piece*> mine;
    for (const Piece& piece : pieces) {
      if (piece.tensor.begin < 0 || piece.tensor.tp_size != tp_size) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint tensor ", name, " mixes pieces of different tensor-parallel degrees"));
      }
      if (piece.tensor.tp_rank == t) mine.push_back(&piece);
    }
    std::sort(mine.begin(), mine.end(), [](const Piece* a, const Piece* b) {
      return a->tensor.begin < b->tensor.begin;
    });
    torch::Tensor flat = torch::empty({numel}, options);
    int64_t covered = 0;
    for (const Piece* piece : mine) {
      const int64_t count = piece->tensor.shape[0];
      if (piece->tensor.begin != covered || covered + count > numel) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint tensor ", name, ": the pieces of tensor-parallel part ", t, " of ",
            tp_size, " do not cover its ", numel, " elements exactly once (a piece at ",
            piece->tensor.begin, " where ", covered, " was expected)"));
      }
      RETURN_IF_ERROR(ReadPiece(*piece, flat.data_ptr<float>() + covered));
      covered += count;
    }
    if (covered != numel) {
      return absl::DataLossError(absl::StrCat("checkpoint tensor ", name, ": part ", t, " of ",
                                              tp_size, " has ", covered, " of its ", numel,
                                              " elements"));
    }
    partitions.push_back(flat.view(part_shape));
  }
  if (tp_size == 1) return partitions[0];
  return MergeTensorParallelShards(parameter, partitions, config_);
}

absl::Status CheckShapeAndReadState(const CheckpointReader& reader,
                                    const CheckpointShape& expected, TrainingState* state) {
  const CheckpointManifest& m = reader.manifest();
  if (m.shape.model != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint is for model ", m.shape.model,
                                                      ", config says ", expected.model));
  }
  if (m.shape.global_batch != expected.global_batch) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint was written with global_batch ", m.shape.global_batch,
                     ", config says ", expected.global_batch,
                     "; data batch indices would not line up"));
  }
  *state = m.state;
  return absl::OkStatus();
}

namespace {

absl::Status RestoreGenerator(const CheckpointReader& reader) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  const torch::Tensor current = generator.get_state();
  ASSIGN_OR_RETURN(torch::Tensor saved,
                   reader.Whole("rng/cpu", current.sizes().vec(), current.scalar_type()));
  generator.set_state(saved);
  return absl::OkStatus();
}

// The checks and the state of `scope` (RestoreScope).
absl::Status CheckForScope(const CheckpointReader& reader, const CheckpointShape& expected,
                           TrainingState* state, RestoreScope scope) {
  if (scope == RestoreScope::kResume) return CheckShapeAndReadState(reader, expected, state);
  if (reader.manifest().shape.model != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint is for model ",
                                                      reader.manifest().shape.model,
                                                      ", config says ", expected.model));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreLayoutRank(const CheckpointReader& reader, const CheckpointShape& expected,
                               ParallelGptImpl& model, ShardedAdamW& optimizer,
                               TrainingState* state, RestoreScope scope) {
  RETURN_IF_ERROR(CheckForScope(reader, expected, state, scope));
  const bool with_optimizer = scope != RestoreScope::kWeights;
  torch::NoGradGuard no_grad;
  const GptConfig& config = model.config();
  const GptPartition& partition = model.partition();
  std::unordered_map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, shape] : GptParameterShapes(config)) shapes[name] = shape;
  auto mine = [&](const std::string& name, const torch::Tensor& whole) {
    return ShardForTensorParallel(name, whole, config, partition.tp_rank, partition.tp_size);
  };
  // Moments of the whole flat index space of this rank (only its shard is
  // kept by LoadMoments); zeros where no state was saved.
  torch::Tensor exp_avg = torch::zeros({optimizer.total_elements()});
  torch::Tensor exp_avg_sq = torch::zeros({optimizer.total_elements()});
  int64_t step = 0;
  const std::vector<ShardedParameter>& parameters = optimizer.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const std::string& name = parameters[i].name;
    const std::vector<int64_t>& shape = shapes.at(name);
    torch::Tensor p = parameters[i].tensor;
    ASSIGN_OR_RETURN(torch::Tensor whole, reader.Whole("model/" + name, shape));
    p.copy_(mine(name, whole));
    const int64_t saved_step = reader.StepOf(name);
    if (saved_step < 0 || !with_optimizer) continue;
    step = std::max(step, saved_step);
    const int64_t offset = optimizer.offset_of(i);
    ASSIGN_OR_RETURN(torch::Tensor m, reader.Whole(absl::StrCat("optimizer/", name, "/exp_avg"),
                                                   shape));
    exp_avg.narrow(0, offset, p.numel()).copy_(mine(name, m).reshape({-1}));
    ASSIGN_OR_RETURN(torch::Tensor v, reader.Whole(absl::StrCat("optimizer/", name, "/exp_avg_sq"),
                                                   shape));
    exp_avg_sq.narrow(0, offset, p.numel()).copy_(mine(name, v).reshape({-1}));
  }
  if (!with_optimizer) return absl::OkStatus();
  optimizer.LoadMoments(exp_avg, exp_avg_sq, step);
  return scope == RestoreScope::kResume ? RestoreGenerator(reader) : absl::OkStatus();
}

absl::Status RestoreWholeModel(const CheckpointReader& reader, const CheckpointShape& expected,
                               torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               TrainingState* state, RestoreScope scope) {
  RETURN_IF_ERROR(CheckForScope(reader, expected, state, scope));
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    torch::Tensor p = item.value();
    const std::string& name = item.key();
    ASSIGN_OR_RETURN(torch::Tensor whole, reader.Whole("model/" + name, p.sizes().vec()));
    p.copy_(whole);
    if (scope == RestoreScope::kWeights) continue;  // the optimizer stays fresh
    const int64_t step = reader.StepOf(name);
    const OptimizerStateKey key = StateKeyOf(p);
    if (step < 0) {
      optimizer.state().erase(key);
      continue;
    }
    auto adam = std::make_unique<torch::optim::AdamWParamState>();
    adam->step(step);
    ASSIGN_OR_RETURN(torch::Tensor m, reader.Whole(absl::StrCat("optimizer/", name, "/exp_avg"),
                                                   p.sizes().vec()));
    ASSIGN_OR_RETURN(torch::Tensor v,
                     reader.Whole(absl::StrCat("optimizer/", name, "/exp_avg_sq"),
                                  p.sizes().vec()));
    adam->exp_avg(m.to(p.device()));
    adam->exp_avg_sq(v.to(p.device()));
    optimizer.state()[key] = std::move(adam);
  }
  return scope == RestoreScope::kResume ? RestoreGenerator(reader) : absl::OkStatus();
}

}  // namespace loom::engine
