// Analytical cost model: memory per device and time per optimizer step of one
// parallel layout (tensor x pipeline x data parallel, micro-batch,
// interleaving, recompute, ZeRO stage) of one model on one cluster.
//
// Each formula cites its source where it is computed (cost_model.cc,
// formulas.cc). Units: bytes, seconds, FLOPs. A CostModel is immutable after
// Create() and safe to share between threads.
//
// Scope of the model: 1F1B (optionally interleaved) pipeline schedule,
// Megatron-style tensor/sequence parallelism, ZeRO 0-3 over the
// data-parallel group (with or without pipeline parallelism), one
// homogeneous device type. Pipeline stages hold the layers as the engine
// splits them (common/parallel_layout.h SplitLayers: uneven when pp does not
// divide the layers, the LM head's cost counted on the last stage); memory
// is that of the most loaded stage, time that of the slowest (bottleneck)
// stage. Not modelled: GPipe's all-forward schedule, expert parallelism,
// context parallelism, compute/communication overlap for TP, and the
// first/last-stage embedding all-reduce.
#ifndef LOOM_CONTROLLER_PLANNER_COST_MODEL_H_
#define LOOM_CONTROLLER_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/planner/formulas.h"
#include "controller/planner/iron_law.h"
#include "controller/planner/model.h"
#include "controller/planner/topology.h"

namespace loom::planner {

// One candidate layout. Ranks = tp x pp x dp.
struct Layout {
  int tp = 1;              // tensor-parallel degree
  int pp = 1;              // pipeline stages
  int dp = 1;              // data-parallel replicas
  int virtual_stages = 1;  // v: model chunks per pipeline rank (interleaved 1F1B)
  int64_t micro_batch = 1; // sequences per micro-batch per replica
  Recompute recompute = Recompute::kNone;
  int zero_stage = 0;      // 0 = plain DP; 1 optimizer states; 2 + grads; 3 + params
  bool sequence_parallel = false;  // Megatron sequence parallelism (needs tp > 1)

  int devices() const { return tp * pp * dp; }
  bool operator==(const Layout& other) const;
};
// "tp 8 | pp 1 | dp 32 | mb 1 | v 1 | recompute selective | ZeRO-1 | SP"
std::string LayoutToString(const Layout& layout);

struct CostOptions {
  // Memory kept free for cuBLAS/NCCL workspaces, the CUDA context and
  // allocator fragmentation: fraction x device memory + bytes.
  double memory_reserve_fraction = 0.05;
  double memory_reserve_bytes = 1e9;
  // Fraction of a data-parallel / ZeRO collective that may run concurrently
  // with backward compute (bucketed all-reduce, ZeRO-3 prefetch); the hidden
  // part is also capped by the backward time available. 0 = none hidden.
  double dp_overlap_fraction = 0.5;
  // What the kernels store and move (formulas.h Kernels). The attention
  // kernel: Loom's engine always runs a fused one (SDPA / FlashAttention on
  // GPU, a blocked kernel on CPU), which keeps no s x s score matrix;
  // kUnfused reproduces Korthikanti et al. 2022's counts for a
  // Megatron-LM-style materialized softmax and charges its memory-bound
  // passes (UnfusedScoreTrafficBytes) against device-memory bandwidth.
  Kernels kernels;
  // Pipeline sends split over the TP group: each of the t ranks sends 1/t
  // of the stage-boundary activation and the receivers all-gather it inside
  // their node (Megatron-LM's scatter/gather, Narayanan et al. 2021, Sec.
  // 4.1). false: every TP rank sends the whole activation (DeepSpeed's
  // pipeline engine). With sequence parallelism the activation is already
  // split, so it makes no difference.
  bool pipeline_scatter_gather = true;
};

// Per-device memory on the most loaded pipeline stage, bytes.
struct MemoryBreakdown {
  int stage = 0;                     // which stage this is (0 = first)
  int layers = 0;                    // transformer blocks on that stage
  double parameters = 0;             // parameter count held (before ZeRO-3)
  double weights = 0;
  double gradients = 0;
  double master_weights = 0;
  double optimizer_states = 0;
  double activations = 0;            // stored for in-flight micro-batches
  double recompute_workspace = 0;    // one layer's recomputed activations
  double logits = 0;                 // output layer, fp32 (last stage only)
  // ZeRO-3 with dp > 1: the largest layer's parameters (this stage's TP
  // shard), gathered in full in the compute dtype while it runs.
  double gathered_parameters = 0;
  // Where host memory is the device's (CPU ranks,
  // DeviceSpec::host_memory_is_device_memory): the asynchronous checkpoint
  // writer's staging buffer, the rank's fp32 parameters and its shard of the
  // optimizer state, kept between saves (worker/engine/checkpoint/checkpoint_writer.h).
  double checkpoint_staging = 0;
  double reserve = 0;                // CostOptions reserve
  double capacity = 0;               // device memory

  double state() const { return weights + gradients + master_weights + optimizer_states; }
  // What lives beside the training state for the step: activations and
  // transient buffers.
  double working() const {
    return activations + recompute_workspace + logits + gathered_parameters;
  }
  double total() const { return state() + working() + checkpoint_staging + reserve; }
};

// Seconds per optimizer step on the critical path (the slowest stage).
struct TimeBreakdown {
  int64_t micro_batches = 0;        // m, per replica per step
  int bottleneck_stage = 0;         // the stage that sets the pipeline's pace
  int bottleneck_layers = 0;        // transformer blocks on it
  double gemm_efficiency = 0;       // fraction of peak the GEMMs achieve
  double compute = 0;               // m x per-micro-batch compute, incl. recompute
  double recompute = 0;             // the recompute part of `compute`
  double tensor_parallel_comm = 0;  // m x TP all-reduces (not overlapped), + the step's norm
  double pipeline_p2p = 0;          // m x stage-boundary sends, + the step's sums over stages
  double pipeline_bubble = 0;       // (p-1)/v x per-micro-batch time
  double data_parallel_comm = 0;    // gradient / ZeRO collectives, total
  double data_parallel_exposed = 0; // the part not hidden behind backward
  double optimizer = 0;             // optimizer step, HBM-bandwidth bound

  double step() const {
    return compute + tensor_parallel_comm + pipeline_p2p + pipeline_bubble +
           data_parallel_exposed + optimizer;
  }
};

// Throughput and utilization of one step.
struct StepEstimate {
  double step_seconds = 0;
  double tokens_per_second = 0;
  double model_flops_per_step = 0;     // 6PD-style, no recompute (for MFU)
  double hardware_flops_per_step = 0;  // including recompute
  double mfu = 0;                      // model FLOPs / (step x devices x peak)
  double hfu = 0;                      // hardware FLOPs / (same)
};

// Everything known about one layout. A layout that does not fit cannot run,
// so it has no step time, throughput or MFU: then only `memory` and
// `infeasible_reason` are set and `time`, `step` and `run` stay zero.
struct LayoutEvaluation {
  Layout layout;
  bool fits = false;
  std::string infeasible_reason;  // empty when fits
  MemoryBreakdown memory;
  TimeBreakdown time;             // zero when !fits
  StepEstimate step;              // zero when !fits
  IronLawEstimate run;            // for TrainingSpec::token_budget tokens; zero when !fits
};

class CostModel {
 public:
  // FAILED_PRECONDITION when the device lacks the training precision;
  // INVALID_ARGUMENT (with field path) for an invalid model/training/topology.
  static absl::StatusOr<CostModel> Create(const ModelSpec& model,
                                          const TrainingSpec& training,
                                          const ClusterTopology& topology,
                                          const CostOptions& options = {});

  // Structural validity: degrees multiply to the cluster size, tp divides
  // the heads, pp is at most the layers (stages may be uneven), dp and the
  // micro-batch divide the batch; interleaving needs pp to divide the
  // layers. Returns INVALID_ARGUMENT "layout.<field>: <why>". Does not check
  // memory.
  absl::Status CheckLayout(const Layout& layout) const;

  // Training state only (weights, gradients, master, optimizer) on the most
  // loaded stage. Independent of micro-batch, recompute and interleaving.
  double StateBytes(const Layout& layout) const;
  // Usable bytes per device: capacity minus reserve.
  double UsableBytes() const;

  // The full breakdowns. `layout` must pass CheckLayout().
  MemoryBreakdown Memory(const Layout& layout) const;
  TimeBreakdown Time(const Layout& layout) const;
  // Memory and feasibility with the reason; time and estimates when it fits.
  LayoutEvaluation Evaluate(const Layout& layout) const;

  // Transformer blocks per pipeline stage for `pp` stages, as the engine
  // splits them: common/parallel_layout.h SplitLayers with no extra cost on
  // the first stage (an embedding lookup does no FLOPs) and the LM head's
  // forward FLOPs, in blocks, on the last (for a GPT V / (12h + 2s), the
  // engine's LastStageExtraBlocks). Requires 1 <= pp <= model.n_layer.
  std::vector<int> StageLayers(int pp) const;

  // "needs 112.0 GB per device before activations, device has 80 GB", or
  // empty when `memory` fits.
  std::string InfeasibleReason(const MemoryBreakdown& memory) const;

  const ModelSpec& model() const { return model_; }
  const TrainingSpec& training() const { return training_; }
  const ClusterTopology& topology() const { return topology_; }
  const CostOptions& options() const { return options_; }
  const ParameterCount& parameters() const { return params_; }
  double peak_flops() const { return peak_flops_; }

 private:
  CostModel() = default;
  // Parameters held per device (TP-sharded, before ZeRO) on each stage.
  std::vector<double> StageParameters(const Layout& layout,
                                      const std::vector<int>& stage_layers) const;
  // The largest unit ZeRO-3 gathers on `stage`: a block, or the embedding
  // (first stage) or output head (last stage), parameters per device.
  double LargestGatheredUnit(const Layout& layout, int stage) const;
  // One layer's parameters on one rank of a TP group of `tp`: every weight
  // matrix and bias split, the norms whole, and with fewer key/value heads
  // than ranks each rank's copy of the one it uses.
  double LayerParametersPerRank(int tp) const;
  StepEstimate Estimate(const Layout& layout, const TimeBreakdown& time) const;

  ModelSpec model_;
  TrainingSpec training_;
  ClusterTopology topology_;
  CostOptions options_;
  ParameterCount params_;
  ForwardFlops forward_;
  StateBytesPerParam state_bytes_;
  double activation_bytes_ = 2;
  double peak_flops_ = 0;
  double model_flops_per_step_ = 0;
  double last_stage_extra_layers_ = 0;  // the LM head's cost in blocks
  // StageLayers(pp) for every pp that divides the cluster (the only ones a
  // valid layout can have), computed once in Create().
  std::map<int, std::vector<int>> stage_layers_;
};

}  // namespace loom::planner

#endif  // LOOM_CONTROLLER_PLANNER_COST_MODEL_H_
