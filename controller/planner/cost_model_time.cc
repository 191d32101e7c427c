// CostModel::Time: the step-time breakdown of a layout (compute, each
// collective, pipeline bubbles, recompute), cost_model.h's other half.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/parallel_layout.h"
#include "common/status_macros.h"
#include "controller/planner/cost_model.h"

namespace loom::planner {

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

  // The pipeline runs at the pace of its slowest stage: the one with the
  // most layers, counting the output layer on the last (with equal stages,
  // the last). SplitLayers keeps that stage as small as the split allows.
  const std::vector<int> stage_layers = StageLayers(p);
  auto stage_cost = [&](int stage) {
    return stage_layers[stage] + (stage == p - 1 ? last_stage_extra_layers_ : 0.0);
  };
  int bottleneck = p - 1;
  for (int stage = 0; stage < p; ++stage) {
    if (stage_cost(stage) > stage_cost(bottleneck)) bottleneck = stage;
  }
  time.bottleneck_stage = bottleneck;
  time.bottleneck_layers = stage_layers[bottleneck];

  // Compute of one micro-batch on that stage. Forward + backward = 3 x
  // forward; full recompute adds a forward of every layer, selective only
  // the attention scores (Korthikanti et al. 2022, Sec. 5; Narayanan et al.
  // 2021, Sec. 5.1, FLOPs per iteration).
  const double layers = static_cast<double>(stage_layers[bottleneck]);
  const double head_flops = bottleneck == p - 1 ? 3.0 * forward_.logits : 0.0;
  const double model_flops = b * (3.0 * layers * forward_.per_layer + head_flops);
  double recompute_flops = 0;
  if (l.recompute == Recompute::kFull) recompute_flops = b * layers * forward_.per_layer;
  if (l.recompute == Recompute::kSelective)
    recompute_flops = b * layers * forward_.attention_scores;
  time.gemm_efficiency = topo.device.efficiency.At(h / t, b * s);
  const double rate = peak_flops_ * time.gemm_efficiency;
  // Beyond the FLOPs (DeviceSpec::layer_*, measured for CPU ranks): per
  // layer, a fixed cost plus one per element of the [b s, h] activation,
  // counted whole under tensor parallelism (without sequence parallelism
  // the LayerNorms and residuals, most of it, run on every rank); full
  // recompute reruns the forward, a third of forward + backward.
  const double layer_extra =
      topo.device.layer_fixed_seconds + topo.device.layer_seconds_per_activation * b * s * h;
  const double recompute_extra = l.recompute == Recompute::kFull ? layers * layer_extra / 3.0 : 0.0;
  // Materialized attention scores (CostOptions::kernels, kUnfused): the
  // softmax and dropout passes over a s^2 b / t elements per layer are
  // bound by device-memory bandwidth; their recomputed forward is recompute.
  const double hbm = topo.device.hbm_bandwidth_bytes_per_second;
  double score_passes = 0, score_recompute = 0;
  if (options_.kernels.attention == AttentionKernel::kUnfused && hbm > 0) {
    score_passes = layers *
                   UnfusedScoreTrafficBytes(model_, l.micro_batch, tp, l.recompute,
                                            activation_bytes_, options_.kernels) /
                   hbm;
    if (l.recompute != Recompute::kNone) {
      score_recompute =
          score_passes - layers *
                             UnfusedScoreTrafficBytes(model_, l.micro_batch, tp, Recompute::kNone,
                                                      activation_bytes_, options_.kernels) /
                             hbm;
    }
  }
  const double compute_mb = (model_flops + recompute_flops) / t / rate + layers * layer_extra +
                            recompute_extra + score_passes;
  const double recompute_mb = recompute_flops / t / rate + recompute_extra + score_recompute;

  // Tensor parallelism: 2 all-reduces in forward and 2 in backward per layer,
  // each of b s h elements (Shoeybi et al. 2019, Sec. 3, Fig. 4; Narayanan et
  // al. 2021, Sec. 3); full recompute repeats the forward pair.
  // Sequence parallelism swaps each for a reduce-scatter + all-gather of the
  // same volume (Korthikanti et al. 2022, Sec. 4.2.2).
  double tp_mb = 0, tp_step = 0;
  if (tp > 1) {
    const bool in_node = tp <= topo.devices_per_node;
    const double bw = in_node ? topo.intra_node_bandwidth_bytes_per_second
                              : topo.inter_node_bandwidth_bytes_per_second;
    const double lat = in_node ? topo.intra_node_latency_seconds : topo.inter_node_latency_seconds;
    const double collectives = 4.0 + (l.recompute == Recompute::kFull ? 2.0 : 0.0);
    const double extra = in_node ? topo.intra_node_collective_extra_seconds : 0.0;
    const double activation =
        RingAllReduceSeconds(b * s * h * activation_bytes_, tp, bw, lat) + extra;
    // Outside the blocks (worker/engine/parallel/tensor_parallel.cc): the
    // vocabulary-parallel embedding on the first stage sums its rows (one
    // activation all-reduce in forward); the vocabulary-parallel LM head and
    // cross-entropy on the last sum the head input's gradient (one in
    // backward) and three per-token figures (the logits' maximum, the sum
    // of exponentials, the target's logit: b s fp32 each). On a small model
    // these are a fifth of its collectives.
    const double per_token = RingAllReduceSeconds(b * s * 4.0, tp, bw, lat) + extra;
    double outside_blocks = 0;
    if (bottleneck == 0) outside_blocks += activation;
    if (bottleneck == p - 1) outside_blocks += activation + 3.0 * per_token;
    tp_mb = layers * collectives * activation + outside_blocks;
    // Once a step: the global gradient norm's sum over the group.
    tp_step = RingAllReduceSeconds(8.0, tp, bw, lat) + extra;
  }

  // Pipeline point-to-point: each stage sends one activation forward and
  // one gradient backward per micro-batch and model chunk, b s h elements,
  // split t ways where the framework scatters and gathers them (Narayanan et al. 2021,
  // Sec. 4.1); interleaving multiplies the sends by v (ibid., Sec. 2.2.2).
  const int replica = tp * p;
  const int per_rack = topo.nodes_per_rack > 0 ? topo.nodes_per_rack * topo.devices_per_node : 0;
  double p2p_mb = 0, pp_step = 0;
  if (p > 1) {
    const bool in_node = replica <= topo.devices_per_node && topo.devices_per_node % replica == 0;
    const bool crosses_racks = per_rack > 0 && (replica > per_rack || per_rack % replica != 0);
    const double bw = in_node         ? topo.intra_node_bandwidth_bytes_per_second
                      : crosses_racks ? topo.effective_inter_rack_bandwidth()
                                      : topo.inter_node_bandwidth_bytes_per_second;
    const double lat = in_node ? topo.intra_node_latency_seconds : topo.inter_node_latency_seconds;
    const bool split = options_.pipeline_scatter_gather || (l.sequence_parallel && tp > 1);
    const double bytes = b * s * h * activation_bytes_ / (split ? t : 1.0);
    p2p_mb = 2.0 * v * (bytes / bw + lat);
    // Once a step, over the stages: the loss and the global gradient norm
    // are summed (worker/engine/parallel/pipeline.cc, sharded_adamw.cc),
    // and with tied embeddings the first and last stage sum their copies'
    // gradients and the last takes the first's updated copy again.
    pp_step = 2.0 * RingAllReduceSeconds(8.0, p, bw, lat);
    if (params_.output_head == 0) {
      const double tied = static_cast<double>(params_.word_embedding) / t;
      pp_step += RingAllReduceSeconds(tied * state_bytes_.gradients, 2, bw, lat) +
                 tied * state_bytes_.weights / bw + lat;
    }
  }

  const double mb_time = compute_mb + tp_mb + p2p_mb;
  const double md = static_cast<double>(m);
  time.compute = md * compute_mb;
  time.recompute = md * recompute_mb;
  time.tensor_parallel_comm = md * tp_mb + tp_step;
  time.pipeline_p2p = md * p2p_mb + pp_step;
  // Bubble = (p-1)/(m v) of the ideal m x t_mb (Narayanan et al. 2021,
  // Sec. 2.2), with t_mb the bottleneck stage's (uneven stages make the
  // fill and drain no faster than their slowest member).
  time.pipeline_bubble = PipelineBubbleFraction(p, m, v) * md * mb_time;

  // Data parallelism over the slowest link the DP ring crosses: ranks of one
  // DP group sit tp x pp apart, so with more than one node they span nodes.
  // Every stage reduces its own gradients at once; the stage with the most
  // parameters finishes last.
  const std::vector<double> stage_params = StageParameters(l, stage_layers);
  const double params = *std::max_element(stage_params.begin(), stage_params.end());
  if (d > 1) {
    const bool in_node = topo.nodes == 1;
    const double bw = in_node            ? topo.intra_node_bandwidth_bytes_per_second
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
      case 2:
        // After every micro-batch's backward, each bucket is reduced to the
        // rank that owns it, as the worker (gradient_partitioner.h) and
        // DeepSpeed do: d reductions of 1/d of the gradients each, one after
        // another, about the whole gradient's bytes over the link (twice a
        // ring reduce-scatter's for d = 2; bench/zero_bench.cc measures
        // both); then the updated weights are all-gathered. Each gradient
        // is also added into its bucket's staging buffer (read the
        // gradient, read and write the bucket).
        comm = md * (grads / bw + d * (d - 1) * lat +
                     3.0 * grads / topo.device.hbm_bandwidth_bytes_per_second) +
               RingAllGatherSeconds(weights, d, bw, lat);
        overlappable = md * compute_mb;
        break;
      default:  // ZeRO-3: all-gather weights in forward and again in backward,
                // reduce-scatter grads, per micro-batch: 3 x (d-1)/d, 1.5x the
                // 2 x (d-1)/d of ZeRO-2 / plain DP (ZeRO Sec. 7.2.2). The
                // extra all-gathers repeat for every micro-batch because the
                // gathered layer is released between them (Memory()).
        comm = md * (2.0 * RingAllGatherSeconds(weights, d, bw, lat) +
                     RingAllGatherSeconds(grads, d, bw, lat));
        overlappable = md * compute_mb;
        break;
    }
    if (topo.device.collectives_share_compute_cores) overlappable = 0;
    // After backward, once a step: the replicas' losses are summed, and
    // under ZeRO the global gradient norm's sum over the shards
    // (worker/engine/parallel/layout_engine.cc, sharded_adamw.cc); nothing
    // hides them.
    const double after_backward =
        RingAllReduceSeconds(8.0, d, bw, lat) * (l.zero_stage >= 1 ? 2.0 : 1.0);
    time.data_parallel_comm = comm + after_backward;
    time.data_parallel_exposed =
        comm - std::min(options_.dp_overlap_fraction * comm, overlappable) + after_backward;
  }

  // Optimizer step: elementwise and HBM-bound, ~28 bytes per parameter it
  // updates (the chapter, lines 420-430); ZeRO >= 1 updates a 1/d shard.
  const double updated = params / (l.zero_stage >= 1 ? d : 1);
  time.optimizer =
      updated * OptimizerStepBytesPerParam(training_) / topo.device.hbm_bandwidth_bytes_per_second;

  // Time-shared cores: R = k x C ranks on a host's C cores. A rank alone
  // holds a core for its step less the bubble and less the share of its
  // collectives it spends off the CPU waiting on peers (measured:
  // collective_idle_fraction); call that busy fraction beta of its step.
  // While busy it shares the cores with whichever of the other R - 1 are
  // busy too, each with probability beta (processor sharing, independent
  // ranks): n others busy stretch its work by max(1, (n + 1) / C). Its
  // waits stretch alike, since they wait on ranks slowed the same way. So
  // the step is the rank's own times that expected stretch, and never less
  // than the host's busy work over its cores. (Measured on 2 cores, TP2 x
  // PP2, 4 ranks: the machine 84% busy at 0.36 s a step; a rank's own path
  // 0.25 s, busy 57% of it, gives 0.35 s. Counting all of a collective as
  // work said 0.43-0.45 s; counting only compute, 0.23-0.31 s.) The excess
  // over the rank's own path counts as compute (waiting for a core).
  const double k = topo.device.ranks_per_core;
  if (k > 1) {
    const double own = time.step();
    const double comm = time.tensor_parallel_comm + time.pipeline_p2p + time.data_parallel_exposed;
    const double busy =
        std::max(0.0, own - time.pipeline_bubble - topo.device.collective_idle_fraction * comm);
    const double beta = own > 0 ? std::min(1.0, busy / own) : 0.0;
    const int cores = std::max(1, topo.device.shared_host_cores);
    const int ranks = std::max(cores + 1, static_cast<int>(std::lround(k * cores)));
    double stretch = 0, others = 1;  // others: C(ranks - 1, n) beta^n (1 - beta)^(ranks - 1 - n)
    for (int n = 0; n < ranks; ++n) {
      others = n == 0 ? std::pow(1 - beta, ranks - 1)
                      : others * (ranks - n) / n * (beta < 1 ? beta / (1 - beta) : 0.0);
      if (beta >= 1) others = n == ranks - 1 ? 1.0 : 0.0;
      stretch += others * std::max(1.0, (n + 1.0) / cores);
    }
    const double shared = std::max(own * stretch, k * busy);
    if (shared > own) time.compute += shared - own;
  }
  return time;
}

}  // namespace loom::planner
