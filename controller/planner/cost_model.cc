#include "controller/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  return cost;
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
  if (KvHeads(model_) % l.tp != 0) {
    return invalid("tp", absl::StrCat(l.tp, " does not divide the ", KvHeads(model_),
                                      " key/value heads"));
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
  if (model_.n_layer % l.pp != 0) {
    return invalid("pp", absl::StrCat(l.pp, " does not divide model.n_layer ", model_.n_layer));
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
  if (l.virtual_stages > 1) {
    if (l.pp == 1) return invalid("virtual_stages", "interleaving needs pp > 1");
    const int64_t layers_per_stage = model_.n_layer / l.pp;
    if (layers_per_stage % l.virtual_stages != 0) {
      return invalid("virtual_stages", absl::StrCat(l.virtual_stages, " does not divide the ",
                                                    layers_per_stage, " layers per stage"));
    }
    const int64_t m = batch / l.dp / l.micro_batch;
    if (m % l.pp != 0) {
      // Megatron-LM's interleaved schedule runs micro-batches in groups of p.
      return invalid("virtual_stages",
                     absl::StrCat("the interleaved schedule needs the ", m,
                                  " micro-batches to be a multiple of pp ", l.pp));
    }
  }
  if (l.zero_stage >= 2 && l.pp > 1) {
    // DeepSpeed rejects ZeRO-2/3 with pipeline parallelism; Megatron-LM's
    // distributed optimizer is ZeRO-1.
    return invalid("zero_stage",
                   absl::StrCat("ZeRO-", l.zero_stage,
                                " shards gradients that pipeline parallelism accumulates over "
                                "micro-batches; use ZeRO-0 or ZeRO-1 with pp > 1"));
  }
  return absl::OkStatus();
}

void CostModel::StageParameters(const Layout& l, double* first, double* last) const {
  const double t = l.tp;
  // Megatron-LM splits every weight matrix and bias over the TP group and
  // replicates the norms (Shoeybi et al. 2019, Sec. 3); the word embedding
  // and output head are vocabulary-parallel.
  const double layer = static_cast<double>(params_.per_layer - params_.per_layer_norm) / t +
                       static_cast<double>(params_.per_layer_norm);
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
  const double layers = static_cast<double>(model_.n_layer / l.pp);
  if (l.pp == 1) {
    *first = *last = layers * layer + first_extra + last_extra;
  } else {
    *first = layers * layer + first_extra;
    *last = layers * layer + last_extra;
  }
}

namespace {

// Training state of `params` parameters under ZeRO stage `zero` over `dp`
// replicas (Rajbhandari et al. 2020, ZeRO, Sec. 5.1 and Fig. 1: P_os divides
// optimizer states (here: master weights and moments), P_os+g also
// gradients, P_os+g+p also parameters, each by N_d).
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
  double first = 0, last = 0;
  StageParameters(l, &first, &last);
  return Sum(ShardedState(std::max(first, last), state_bytes_, l.zero_stage, l.dp));
}

double CostModel::UsableBytes() const {
  const double capacity = static_cast<double>(topology_.device.memory_bytes);
  return capacity * (1.0 - options_.memory_reserve_fraction) - options_.memory_reserve_bytes;
}

MemoryBreakdown CostModel::Memory(const Layout& l) const {
  double first_params = 0, last_params = 0;
  StageParameters(l, &first_params, &last_params);
  const int64_t m = training_.global_batch_sequences / l.dp / l.micro_batch;
  const int p = l.pp, v = l.virtual_stages;
  const double t = l.tp;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double s = static_cast<double>(model_.seq_len);
  const double b = static_cast<double>(l.micro_batch);
  const double h = static_cast<double>(model_.d_model);
  const double layers = static_cast<double>(model_.n_layer / p);
  const double per_layer =
      ActivationBytesPerLayer(model_, l.micro_batch, l.tp, sp, l.recompute, activation_bytes_);

  // Micro-batches whose activations a stage holds at its peak. 1F1B: stage i
  // holds p - i, so the first stage holds min(m, p) (Narayanan et al. 2021,
  // Sec. 2.2.1; Korthikanti et al. 2022, Sec. 4.2.3: L layers' worth). The
  // interleaved schedule holds (1 + (p-1)/(p v)) times more on the first
  // stage (Korthikanti et al. 2022, Sec. 4.2.3), and the last stage warms
  // up (v-1) p chunk-micro-batches of L/(p v) layers each.
  double first_layers = layers * static_cast<double>(std::min<int64_t>(m, p));
  double last_layers = layers;
  if (v > 1) {
    first_layers *= 1.0 + static_cast<double>(p - 1) / (static_cast<double>(p) * v);
    last_layers = layers * static_cast<double>((v - 1) * p + 1) / v;
  }
  // Embedding dropout mask, sbh per in-flight micro-batch (Korthikanti et
  // al. 2022, Sec. 4.3); logits for the fp32 cross-entropy, 4sbV/t (ibid.).
  const double embedding_mask =
      s * b * h * static_cast<double>(std::min<int64_t>(m, p)) / (sp ? t : 1.0);
  const double logits = 4.0 * s * b * static_cast<double>(model_.vocab_size) / t;
  double workspace = 0;
  if (l.recompute != Recompute::kNone) {
    // Recomputing a layer in backward materializes what it did not keep.
    workspace = ActivationBytesPerLayer(model_, l.micro_batch, l.tp, sp, Recompute::kNone,
                                        activation_bytes_) - per_layer;
  }
  const double capacity = static_cast<double>(topology_.device.memory_bytes);
  const double reserve = capacity * options_.memory_reserve_fraction + options_.memory_reserve_bytes;

  auto build = [&](int stage, double params, double acts, double logit_bytes) {
    MemoryBreakdown mem;
    mem.stage = stage;
    mem.parameters = params;
    const State state = ShardedState(params, state_bytes_, l.zero_stage, l.dp);
    mem.weights = state.weights;
    mem.gradients = state.gradients;
    mem.master_weights = state.master;
    mem.optimizer_states = state.optimizer;
    mem.activations = acts;
    mem.recompute_workspace = workspace;
    mem.logits = logit_bytes;
    mem.reserve = reserve;
    mem.capacity = capacity;
    return mem;
  };
  if (p == 1) {
    return build(0, first_params, first_layers * per_layer + embedding_mask, logits);
  }
  MemoryBreakdown first = build(0, first_params, first_layers * per_layer + embedding_mask, 0);
  MemoryBreakdown last = build(p - 1, last_params, last_layers * per_layer, logits);
  return last.total() > first.total() ? last : first;
}

TimeBreakdown CostModel::Time(const Layout& l) const {
  TimeBreakdown time;
  const ClusterTopology& topo = topology_;
  const int p = l.pp, v = l.virtual_stages, d = l.dp, tp = l.tp;
  const double t = tp;
  const double s = static_cast<double>(model_.seq_len);
  const double b = static_cast<double>(l.micro_batch);
  const double h = static_cast<double>(model_.d_model);
  const int64_t m = training_.global_batch_sequences / d / l.micro_batch;
  time.micro_batches = m;

  // Compute of one micro-batch on the slowest stage: the last one, which
  // also runs the output layer. Forward + backward = 3 x forward; full
  // recompute adds a forward of every layer, selective only the attention
  // scores (Korthikanti et al. 2022, Sec. 5; Narayanan et al. 2021, Sec. 5.1, FLOPs
  // per iteration).
  const double layers = static_cast<double>(p == 1 ? model_.n_layer : model_.n_layer / p);
  const double model_flops = b * (3.0 * layers * forward_.per_layer + 3.0 * forward_.logits);
  double recompute_flops = 0;
  if (l.recompute == Recompute::kFull) recompute_flops = b * layers * forward_.per_layer;
  if (l.recompute == Recompute::kSelective) recompute_flops = b * layers * forward_.attention_scores;
  time.gemm_efficiency = topo.device.efficiency.At(h / t, b * s);
  const double rate = peak_flops_ * time.gemm_efficiency;
  const double compute_mb = (model_flops + recompute_flops) / t / rate;
  const double recompute_mb = recompute_flops / t / rate;

  // Tensor parallelism: 2 all-reduces in forward and 2 in backward per layer,
  // each of b s h elements (Shoeybi et al. 2019, Sec. 3, Fig. 4; Narayanan et
  // al. 2021, Sec. 3); full recompute repeats the forward pair.
  // Sequence parallelism swaps each for a reduce-scatter + all-gather of the
  // same volume (Korthikanti et al. 2022, Sec. 4.2.2).
  double tp_mb = 0;
  if (tp > 1) {
    const bool in_node = tp <= topo.devices_per_node;
    const double bw = in_node ? topo.intra_node_bandwidth_bytes_per_second
                              : topo.inter_node_bandwidth_bytes_per_second;
    const double lat = in_node ? topo.intra_node_latency_seconds : topo.inter_node_latency_seconds;
    const double collectives = 4.0 + (l.recompute == Recompute::kFull ? 2.0 : 0.0);
    tp_mb = layers * collectives * RingAllReduceSeconds(b * s * h * activation_bytes_, tp, bw, lat);
  }

  // Pipeline point-to-point: each stage sends one activation forward and
  // one gradient backward per micro-batch and model chunk, b s h elements,
  // split t ways by the scatter/gather optimization (Narayanan et al. 2021,
  // Sec. 4.1); interleaving multiplies the sends by v (ibid., Sec. 2.2.2).
  const int replica = tp * p;
  const int per_rack = topo.nodes_per_rack > 0 ? topo.nodes_per_rack * topo.devices_per_node : 0;
  double p2p_mb = 0;
  if (p > 1) {
    const bool in_node = replica <= topo.devices_per_node && topo.devices_per_node % replica == 0;
    const bool crosses_racks = per_rack > 0 && (replica > per_rack || per_rack % replica != 0);
    const double bw = in_node ? topo.intra_node_bandwidth_bytes_per_second
                              : crosses_racks ? topo.effective_inter_rack_bandwidth()
                                              : topo.inter_node_bandwidth_bytes_per_second;
    const double lat = in_node ? topo.intra_node_latency_seconds : topo.inter_node_latency_seconds;
    const double bytes = b * s * h * activation_bytes_ / t;
    p2p_mb = 2.0 * v * (bytes / bw + lat);
  }

  const double mb_time = compute_mb + tp_mb + p2p_mb;
  const double md = static_cast<double>(m);
  time.compute = md * compute_mb;
  time.recompute = md * recompute_mb;
  time.tensor_parallel_comm = md * tp_mb;
  time.pipeline_p2p = md * p2p_mb;
  // Bubble = (p-1)/(m v) of the ideal m x t_mb (Narayanan et al. 2021,
  // Sec. 2.2).
  time.pipeline_bubble = PipelineBubbleFraction(p, m, v) * md * mb_time;

  // Data parallelism over the slowest link the DP ring crosses: ranks of one
  // DP group sit tp x pp apart, so with more than one node they span nodes.
  double first_params = 0, last_params = 0;
  StageParameters(l, &first_params, &last_params);
  const double params = std::max(first_params, last_params);
  if (d > 1) {
    const bool in_node = topo.nodes == 1;
    const double bw = in_node ? topo.intra_node_bandwidth_bytes_per_second
                              : topo.racks() > 1 ? topo.effective_inter_rack_bandwidth()
                                                 : topo.inter_node_bandwidth_bytes_per_second;
    const double lat = in_node ? topo.intra_node_latency_seconds : topo.inter_node_latency_seconds;
    const double grads = params * state_bytes_.gradients;
    const double weights = params * state_bytes_.weights;
    double comm = 0;
    double overlappable = 0;
    switch (l.zero_stage) {
      case 0:  // one gradient all-reduce, 2(d-1)/d (the chapter, 1501-1512)
        comm = RingAllReduceSeconds(grads, d, bw, lat);
        overlappable = 2.0 / 3.0 * compute_mb;  // backward of the last micro-batch
        break;
      case 1:  // reduce-scatter grads, all-gather updated weights (ZeRO Sec. 7.2.1)
        comm = RingAllGatherSeconds(grads, d, bw, lat) + RingAllGatherSeconds(weights, d, bw, lat);
        overlappable = 2.0 / 3.0 * compute_mb;
        break;
      case 2:  // reduce-scatter after every micro-batch's backward (ZeRO Sec. 7.2.1)
        comm = md * RingAllGatherSeconds(grads, d, bw, lat) + RingAllGatherSeconds(weights, d, bw, lat);
        overlappable = md * compute_mb;
        break;
      default:  // ZeRO-3: all-gather weights in forward and again in backward,
                // reduce-scatter grads, per micro-batch: 3 x (d-1)/d (ZeRO Sec. 7.2.2)
        comm = md * (2.0 * RingAllGatherSeconds(weights, d, bw, lat) +
                     RingAllGatherSeconds(grads, d, bw, lat));
        overlappable = md * compute_mb;
        break;
    }
    time.data_parallel_comm = comm;
    time.data_parallel_exposed = comm - std::min(options_.dp_overlap_fraction * comm, overlappable);
  }

  // Optimizer step: elementwise and HBM-bound, ~28 bytes per parameter it
  // updates (the chapter, lines 420-430); ZeRO >= 1 updates a 1/d shard.
  const double updated = params / (l.zero_stage >= 1 ? d : 1);
  time.optimizer = updated * OptimizerStepBytesPerParam(training_) /
                   topo.device.hbm_bandwidth_bytes_per_second;
  return time;
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
  const std::string capacity = absl::StrFormat("%g", mem.capacity / gb);
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
    return absl::StrFormat(
        "needs %.1f GB per device (%.1f GB state + %.1f GB activations), device has %s GB "
        "of which %.1f GB is reserved",
        (mem.total() - mem.reserve) / gb, mem.state() / gb,
        (mem.activations + mem.recompute_workspace + mem.logits) / gb, capacity,
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
