#include "controller/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/parallel_layout.h"
#include "common/status_macros.h"

namespace loom::planner {

bool Layout::operator==(const Layout& o) const {
  return tp == o.tp && pp == o.pp && dp == o.dp && virtual_stages == o.virtual_stages &&
         micro_batch == o.micro_batch && recompute == o.recompute &&
         zero_stage == o.zero_stage && sequence_parallel == o.sequence_parallel;
}

std::string LayoutToString(const Layout& l) {
  return absl::StrCat("tp ", l.tp, " | pp ", l.pp, " | dp ", l.dp, " | mb ", l.micro_batch,
                      " | v ", l.virtual_stages, " | recompute ", RecomputeName(l.recompute),
                      " | ZeRO-", l.zero_stage, l.sequence_parallel ? " | SP" : "");
}

// ---------------------------------------------------------------- CostModel

absl::StatusOr<CostModel> CostModel::Create(const ModelSpec& model,
                                            const TrainingSpec& training,
                                            const ClusterTopology& topology,
                                            const CostOptions& options) {
  RETURN_IF_ERROR(ValidateModel(model));
  RETURN_IF_ERROR(ValidateTraining(training));
  RETURN_IF_ERROR(ValidateTopology(topology));
  if (!(options.memory_reserve_fraction >= 0 && options.memory_reserve_fraction < 1)) {
    return absl::InvalidArgumentError("options.memory_reserve_fraction: must be in [0, 1)");
  }
  if (!(options.memory_reserve_bytes >= 0)) {
    return absl::InvalidArgumentError("options.memory_reserve_bytes: must be >= 0");
  }
  if (!(options.dp_overlap_fraction >= 0 && options.dp_overlap_fraction <= 1)) {
    return absl::InvalidArgumentError("options.dp_overlap_fraction: must be in [0, 1]");
  }
  CostModel cost;
  cost.peak_flops_ = topology.device.PeakFlops(training.precision);
  if (!(cost.peak_flops_ > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("training.precision: ", topology.device.name, " has no ",
                     PrecisionName(training.precision), " peak"));
  }
  cost.model_ = model;
  cost.training_ = training;
  cost.topology_ = topology;
  cost.options_ = options;
  cost.params_ = CountParameters(model);
  cost.forward_ = ForwardFlopsPerSequence(model);
  cost.state_bytes_ = BytesPerParam(training);
  cost.activation_bytes_ = ActivationBytesPerElement(training.precision);
  cost.model_flops_per_step_ = ModelFlopsPerStep(model, training.global_batch_sequences);
  // The LM head's forward FLOPs in blocks' worth: 2shV against 24sh^2 +
  // 4s^2h for a GPT (Narayanan et al. 2021, Sec. 5.1), i.e. V / (12h + 2s),
  // the engine's LastStageExtraBlocks (worker/engine/parallel/parallel_gpt.h).
  cost.last_stage_extra_layers_ = cost.forward_.logits / cost.forward_.per_layer;
  const int n = topology.total_devices();
  for (int pp = 1; pp <= n && pp <= model.n_layer; ++pp) {
    if (n % pp == 0) cost.stage_layers_[pp] = cost.StageLayers(pp);
  }
  return cost;
}

std::vector<int> CostModel::StageLayers(int pp) const {
  if (auto it = stage_layers_.find(pp); it != stage_layers_.end()) return it->second;
  absl::StatusOr<std::vector<int>> split =
      SplitLayers(static_cast<int>(model_.n_layer), pp, 0.0, last_stage_extra_layers_);
  // CheckLayout() keeps pp in [1, n_layer]; the extra cost is finite, >= 0.
  if (!split.ok()) return std::vector<int>(std::max(pp, 1), 0);
  return *std::move(split);
}

absl::Status CostModel::CheckLayout(const Layout& l) const {
  auto invalid = [](absl::string_view field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("layout.", field, ": ", why));
  };
  if (l.tp < 1) return invalid("tp", "must be >= 1");
  if (l.pp < 1) return invalid("pp", "must be >= 1");
  if (l.dp < 1) return invalid("dp", "must be >= 1");
  if (l.virtual_stages < 1) return invalid("virtual_stages", "must be >= 1");
  if (l.micro_batch < 1) return invalid("micro_batch", "must be >= 1");
  if (l.zero_stage < 0 || l.zero_stage > 3) return invalid("zero_stage", "must be 0..3");
  const int n = topology_.total_devices();
  if (static_cast<int64_t>(l.tp) * l.pp * l.dp != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: tp x pp x dp = ", static_cast<int64_t>(l.tp) * l.pp * l.dp,
                     ", but the cluster has ", n, " devices"));
  }
  if (model_.n_head % l.tp != 0) {
    return invalid("tp", absl::StrCat(l.tp, " does not divide model.n_head ", model_.n_head));
  }
  if (KvHeads(model_) % l.tp != 0 && l.tp % KvHeads(model_) != 0) {
    return invalid("tp", absl::StrCat(l.tp, " and the ", KvHeads(model_),
                                      " key/value heads do not divide one another (heads are "
                                      "split, or copied when fewer than the ranks)"));
  }
  if (FfnHidden(model_) % l.tp != 0) {
    return invalid("tp", absl::StrCat(l.tp, " does not divide the MLP width ",
                                      FfnHidden(model_)));
  }
  const int per_node = topology_.devices_per_node;
  if ((l.tp <= per_node && per_node % l.tp != 0) || (l.tp > per_node && l.tp % per_node != 0)) {
    return invalid("tp", absl::StrCat(l.tp, " would split a node's ", per_node,
                                      " devices unevenly"));
  }
  if (l.pp > model_.n_layer) {
    return invalid("pp", absl::StrCat(l.pp, " exceeds model.n_layer ", model_.n_layer,
                                      ": every stage needs at least one layer"));
  }
  const int64_t batch = training_.global_batch_sequences;
  if (batch % l.dp != 0) {
    return invalid("dp", absl::StrCat(l.dp, " does not divide the global batch of ", batch,
                                      " sequences"));
  }
  if ((batch / l.dp) % l.micro_batch != 0) {
    return invalid("micro_batch", absl::StrCat(l.micro_batch, " does not divide the ",
                                               batch / l.dp, " sequences per replica"));
  }
  // Interleaving: the same rule the job spec is checked against.
  if (absl::Status v = CheckInterleaving(model_.n_layer, l.pp, l.virtual_stages,
                                         batch / l.dp / l.micro_batch);
      !v.ok()) {
    return invalid("virtual_stages", std::string(v.message()));
  }
  // ZeRO-2/3 with pp > 1 is allowed: gradients are reduce-scattered (and,
  // for ZeRO-3, parameters gathered) per micro-batch, which Time() charges;
  // torchtitan runs FSDP with pipeline parallelism this way (Llama 3 405B,
  // Dubey et al. 2024, Sec. 3.3.2).
  return absl::OkStatus();
}

double CostModel::LayerParametersPerRank(int tp) const {
  const double t = tp;
  // Megatron-LM splits every weight matrix and bias over the TP group and
  // replicates the norms (Shoeybi et al. 2019, Sec. 3).
  double layer = static_cast<double>(params_.per_layer - params_.per_layer_norm) / t +
                 static_cast<double>(params_.per_layer_norm);
  const int64_t kv = KvHeads(model_);
  if (kv < tp) {
    // Each rank holds a whole key/value head (1 / kv of them) instead of
    // 1 / tp of them (Megatron-LM's replicated query groups).
    const double h_kv = static_cast<double>(model_.d_model) * kv / model_.n_head;
    const double kv_params = 2.0 * (h_kv * model_.d_model + (model_.bias ? h_kv : 0.0));
    layer += kv_params * (1.0 / kv - 1.0 / t);
  }
  return layer;
}

std::vector<double> CostModel::StageParameters(const Layout& l,
                                               const std::vector<int>& stage_layers) const {
  const double t = l.tp;
  // The word embedding and output head are vocabulary-parallel.
  const double layer = LayerParametersPerRank(l.tp);
  const double first_extra =
      static_cast<double>(params_.word_embedding) / t + static_cast<double>(params_.position_embedding);
  // The last stage holds the final norm and the output head; with tied
  // embeddings and pp > 1 it keeps its own copy of the word embedding, as
  // Megatron-LM does (the two copies' gradients are summed each step).
  double last_extra = static_cast<double>(params_.final_norm);
  if (params_.output_head > 0) {
    last_extra += static_cast<double>(params_.output_head) / t;
  } else if (l.pp > 1) {
    last_extra += static_cast<double>(params_.word_embedding) / t;
  }
  std::vector<double> params(stage_layers.size());
  for (size_t i = 0; i < stage_layers.size(); ++i) {
    params[i] = stage_layers[i] * layer;
    if (i == 0) params[i] += first_extra;
    if (i + 1 == stage_layers.size()) params[i] += last_extra;
  }
  return params;
}

double CostModel::LargestGatheredUnit(const Layout& l, int stage) const {
  const double t = l.tp;
  double unit = LayerParametersPerRank(l.tp);
  const double embedding = static_cast<double>(params_.word_embedding) / t;
  if (stage == 0) {
    unit = std::max(unit, embedding + static_cast<double>(params_.position_embedding));
  }
  if (stage == l.pp - 1) {
    const double head = params_.output_head > 0 ? static_cast<double>(params_.output_head) / t
                                                : embedding;
    unit = std::max(unit, head);
  }
  return unit;
}

namespace {

// Training state of `params` parameters under ZeRO stage `zero` over `dp`
// replicas (Rajbhandari et al. 2020, ZeRO, Sec. 5.1 and Fig. 1: P_os divides
// optimizer states (here: master weights and moments), P_os+g also
// gradients, P_os+g+p also parameters, each by N_d).
// ZeRO-2's gradient bucket (torch DDP's and the worker's 25 MiB).
constexpr double kZero2BucketBytes = 25.0 * (1 << 20);

struct State { double weights, gradients, master, optimizer; };
State ShardedState(double params, const StateBytesPerParam& bytes, int zero, int dp) {
  const double d = dp;
  State state;
  state.weights = params * bytes.weights / (zero >= 3 ? d : 1.0);
  state.gradients = params * bytes.gradients / (zero >= 2 ? d : 1.0);
  state.master = params * bytes.master_weights / (zero >= 1 ? d : 1.0);
  state.optimizer = params * bytes.optimizer_states / (zero >= 1 ? d : 1.0);
  return state;
}

double Sum(const State& s) { return s.weights + s.gradients + s.master + s.optimizer; }

}  // namespace

double CostModel::StateBytes(const Layout& l) const {
  const std::vector<double> params = StageParameters(l, StageLayers(l.pp));
  return Sum(ShardedState(*std::max_element(params.begin(), params.end()), state_bytes_,
                          l.zero_stage, l.dp));
}

double CostModel::UsableBytes() const {
  const double capacity = static_cast<double>(topology_.device.memory_bytes);
  return capacity * (1.0 - options_.memory_reserve_fraction) - options_.memory_reserve_bytes;
}

MemoryBreakdown CostModel::Memory(const Layout& l) const {
  const std::vector<int> stage_layers = StageLayers(l.pp);
  const std::vector<double> stage_params = StageParameters(l, stage_layers);
  const int64_t m = training_.global_batch_sequences / l.dp / l.micro_batch;
  const int p = l.pp, v = l.virtual_stages;
  const double t = l.tp;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double s = static_cast<double>(model_.seq_len);
  const double b = static_cast<double>(l.micro_batch);
  const double h = static_cast<double>(model_.d_model);
  const double per_layer = ActivationBytesPerLayer(model_, l.micro_batch, l.tp, sp, l.recompute,
                                                   activation_bytes_, options_.kernels);

  // Layers' worth of activations stage i holds at its peak. 1F1B: stage i
  // has p - i micro-batches in flight (at most m), so the first stage holds
  // min(m, p) (Narayanan et al. 2021, Sec. 2.2.1; Korthikanti et al. 2022,
  // Sec. 4.2.3: L layers' worth when stages are equal). With uneven stages
  // each stage's own layer count multiplies its own in-flight count, so the
  // most loaded stage need not be the first. The interleaved schedule
  // (equal stages only) warms stage i up with 2(p-i-1) + (v-1)p chunk
  // micro-batches of L/(p v) layers, plus the one in its first backward
  // (Megatron-LM's schedule; for stage 0 this is Korthikanti et al.'s
  // (1 + (p-1)/(p v)) x L, for the last ((v-1)p + 1) L/(p v)).
  auto stored_layers = [&](int stage) {
    const double layers = stage_layers[stage];
    if (v == 1) return layers * static_cast<double>(std::min<int64_t>(m, p - stage));
    const int64_t chunks = std::min<int64_t>(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1);
    return layers / v * static_cast<double>(chunks);
  };
  // Embedding dropout mask, sbh per in-flight micro-batch (Korthikanti et
  // al. 2022, Sec. 4.3); logits for the fp32 cross-entropy, 4sbV/t (ibid.).
  const double embedding_mask =
      s * b * h * static_cast<double>(std::min<int64_t>(m, p)) / (sp ? t : 1.0);
  const double logits = 4.0 * s * b * static_cast<double>(model_.vocab_size) / t;
  double workspace = 0;
  if (l.recompute != Recompute::kNone) {
    // Recomputing a layer in backward materializes what it did not keep.
    workspace = ActivationBytesPerLayer(model_, l.micro_batch, l.tp, sp, Recompute::kNone,
                                        activation_bytes_, options_.kernels) -
                per_layer;
  }
  const double capacity = static_cast<double>(topology_.device.memory_bytes);
  const double reserve = capacity * options_.memory_reserve_fraction + options_.memory_reserve_bytes;

  MemoryBreakdown most;
  for (int stage = 0; stage < p; ++stage) {
    MemoryBreakdown mem;
    mem.stage = stage;
    mem.layers = stage_layers[stage];
    mem.parameters = stage_params[stage];
    const State state = ShardedState(mem.parameters, state_bytes_, l.zero_stage, l.dp);
    mem.weights = state.weights;
    mem.gradients = state.gradients;
    if (l.zero_stage == 2 && l.dp > 1) {
      // ZeRO-2 sends gradients to their owners in buckets as backward makes
      // them (the worker's gradient_partitioner.h): about one bucket being
      // filled and two in flight, 25 MiB each, beyond the owned shard, and
      // never more than the rest of the stage's gradients.
      const double unowned = mem.parameters * state_bytes_.gradients - state.gradients;
      mem.gradients += std::min(unowned, 3.0 * kZero2BucketBytes);
    }
    mem.master_weights = state.master;
    mem.optimizer_states = state.optimizer;
    mem.activations = stored_layers(stage) * per_layer + (stage == 0 ? embedding_mask : 0.0);
    mem.recompute_workspace = workspace;
    mem.logits = stage == p - 1 ? logits : 0.0;
    if (l.zero_stage >= 3 && l.dp > 1) {
      // ZeRO-3 keeps 1/N_d of the parameters and all-gathers each layer's
      // in full just before its forward and again before its backward,
      // releasing it after (Rajbhandari et al. 2020, ZeRO, Sec. 5.3; PyTorch
      // FSDP, Zhao et al. 2023, with one FSDP unit per block). At the
      // peak one unit is gathered, in the compute dtype: the largest of this
      // stage's blocks, embedding and head. Prefetching the next unit
      // (FSDP's backward prefetch) would hold a second one.
      mem.gathered_parameters = LargestGatheredUnit(l, stage) * state_bytes_.weights;
    }
    if (topology_.device.host_memory_is_device_memory) {
      // The rank of data replica 0 writes its stage's TP slice of the fp32
      // parameters and its ZeRO shard of the moments (ZeRO-0: all of them);
      // the writer's staging buffer is the shard file's image.
      const double moments_share = l.zero_stage >= 1 ? static_cast<double>(l.dp) : 1.0;
      mem.checkpoint_staging =
          mem.parameters * (4.0 + state_bytes_.optimizer_states / moments_share);
    }
    mem.reserve = reserve;
    mem.capacity = capacity;
    if (stage == 0 || mem.total() > most.total()) most = mem;
  }
  return most;
}

StepEstimate CostModel::Estimate(const Layout& layout, const TimeBreakdown& time) const {
  StepEstimate est;
  est.step_seconds = time.step();
  const double batch = static_cast<double>(training_.global_batch_sequences);
  est.tokens_per_second = batch * static_cast<double>(model_.seq_len) / est.step_seconds;
  est.model_flops_per_step = model_flops_per_step_;
  // Recompute FLOPs count for time but not for MFU (Chowdhery et al. 2022,
  // PaLM, Appendix B; Korthikanti et al. 2022, Sec. 6.3).
  const double fleet_peak = est.step_seconds * topology_.total_devices() * peak_flops_;
  double recompute_per_layer = 0;
  if (layout.recompute == Recompute::kFull) recompute_per_layer = forward_.per_layer;
  if (layout.recompute == Recompute::kSelective) recompute_per_layer = forward_.attention_scores;
  est.hardware_flops_per_step = model_flops_per_step_ + batch * static_cast<double>(model_.n_layer) *
                                                            recompute_per_layer;
  est.mfu = est.model_flops_per_step / fleet_peak;
  est.hfu = est.hardware_flops_per_step / fleet_peak;
  return est;
}

std::string CostModel::InfeasibleReason(const MemoryBreakdown& mem) const {
  const double gb = 1e9;
  const std::string capacity = absl::StrFormat("%.1f", mem.capacity / gb);
  if (mem.state() > mem.capacity) {
    return absl::StrFormat("needs %.1f GB per device before activations, device has %s GB",
                           mem.state() / gb, capacity);
  }
  if (mem.state() + mem.reserve > mem.capacity) {
    return absl::StrFormat(
        "needs %.1f GB per device before activations, device has %s GB of which %.1f GB "
        "is reserved",
        mem.state() / gb, capacity, mem.reserve / gb);
  }
  if (mem.total() > mem.capacity) {
    const std::string gathered =
        mem.gathered_parameters > 0
            ? absl::StrFormat(" + %.1f GB ZeRO-3 gathered layer", mem.gathered_parameters / gb)
            : "";
    return absl::StrFormat(
        "needs %.1f GB per device (%.1f GB state + %.1f GB activations%s), device has %s GB "
        "of which %.1f GB is reserved",
        (mem.total() - mem.reserve) / gb, mem.state() / gb,
        (mem.activations + mem.recompute_workspace + mem.logits) / gb, gathered, capacity,
        mem.reserve / gb);
  }
  return "";
}

LayoutEvaluation CostModel::Evaluate(const Layout& layout) const {
  LayoutEvaluation eval;
  eval.layout = layout;
  eval.layout.sequence_parallel = layout.sequence_parallel && layout.tp > 1;
  eval.memory = Memory(eval.layout);
  eval.infeasible_reason = InfeasibleReason(eval.memory);
  eval.fits = eval.infeasible_reason.empty();
  // A layout that cannot run has no step time, throughput or MFU.
  if (!eval.fits) return eval;
  eval.time = Time(eval.layout);
  eval.step = Estimate(eval.layout, eval.time);
  if (training_.token_budget > 0) {
    IronLawInputs in;
    in.total_flops = model_flops_per_step_ * training_.token_budget /
                     (static_cast<double>(training_.global_batch_sequences) *
                      static_cast<double>(model_.seq_len));
    in.peak_flops_per_device = peak_flops_;
    in.utilization = eval.step.mfu;
    in.devices = topology_.total_devices();
    in.price_per_device_hour_usd = topology_.price_per_device_hour_usd;
    in.device_power_watts = topology_.effective_device_power_watts();
    in.hosts = topology_.nodes;
    in.host_power_watts = topology_.host_power_watts;
    eval.run = EstimateIronLaw(in);
  }
  return eval;
}

}  // namespace loom::planner
