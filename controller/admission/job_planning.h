// The bridge between job specs and the parallelism planner
// (controller/planner): the planner's request for a JobSpec, the topology of
// the live cluster derived from registered workers, and the proto forms of a
// plan (PlannedLayout, JobPlan, PlanResponse). JobManager uses it at submit
// time and for the Plan RPC; loomctl uses SpecToPlanRequest offline.
//
// Pure functions of their arguments; thread-safe. No gRPC types.
#ifndef LOOM_CONTROLLER_ADMISSION_JOB_PLANNING_H_
#define LOOM_CONTROLLER_ADMISSION_JOB_PLANNING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/planner/planner.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

// Documented estimates, used where a worker reported no measurement (an
// older worker, or no libblas.so.3) or no worker is registered at all. They
// are deliberately modest so that an estimated plan errs towards "slow", and
// a plan built on any of them says so (JobPlan.topology_measured = false).
//   One thread's fp32 GEMM rate: OpenBLAS sgemm on one AVX2 core at ~2.5 GHz
//   runs 50-80 GFLOP/s (16 FLOP/cycle x 2 FMA ports); 20e9 leaves room for
//   older cores and the reference BLAS is far below either.
inline constexpr double kEstimatedGemmFlopsPerThread = 20e9;
//   One thread's copy bandwidth (a single core streams ~10 GB/s).
inline constexpr double kEstimatedMemoryBandwidthBytesPerSecond = 10e9;
//   Memory per slot when a worker reported none, bytes.
inline constexpr double kEstimatedMemoryPerSlotBytes = 4e9;
//   Ranks on different workers talk through Gloo over TCP; we assume a
//   10 Gb/s NIC per node, shared by the node's slots. Always an assumption:
//   no worker measures its network yet (worker/cpu_probe.h times GEMM and
//   memory copies only), and LiveTopology::description says so.
inline constexpr double kEstimatedNodeNetworkBytesPerSecond = 10e9 / 8;

// The cluster a job's gang runs on, as the planner sees it.
struct LiveTopology {
  planner::ClusterTopology topology;
  bool measured = false;  // every device figure came from registered workers (never the network)
  // e.g. "4 x 1 cpu, 2 racks of 2 worker(s), 50.0 GFLOP/s and 8.0 GB per
  // slot, network assumed 10 Gb/s per worker, not measured (4 live
  // worker(s), measured GEMM)"
  std::string description;
};

// Topology for `spec`'s gang (resources.workers nodes x ranks/workers slots;
// ranks nodes x 1 when workers does not divide ranks). Its nodes_per_rack
// comes from the zone/rack labels of the workers the scheduler would choose
// for the gang on an idle cluster (scheduler.h: rack order, whole replicas
// per rack first), when they split evenly into racks; else 0. Per-slot device
// figures from the alive `workers` (the smallest over them, so a plan fits
// on any of them): peak = GEMM rate per thread x the threads a rank gets
// (threads_per_rank, at most cpus/slots), memory = RAM / slots. With no
// alive worker, the estimates above. `spec` must be defaulted.
absl::StatusOr<LiveTopology> TopologyForSpec(const loom::v1::JobSpec& spec,
                                             const std::vector<loom::v1::WorkerInfo>& workers);

// Planner input for a defaulted spec: the GPT shape with its family fields
// (n_kv_head, mlp.gated/hidden, norm, untied_embeddings) in the planner's
// ModelSpec. INVALID_ARGUMENT "model.gpt: required" without a GPT model.
// token_budget 0 = total_steps x global_batch x seq_len.
absl::StatusOr<planner::PlanRequest> SpecToPlanRequest(const loom::v1::JobSpec& spec,
                                                       const planner::ClusterTopology& topology,
                                                       int top_k, double token_budget = 0);

// Restricts the search to what the engine executes today (see
// job_planning.cc): TP inside a worker without sequence parallelism, plain
// 1F1B pipelines (uneven stages allowed), ZeRO 0-1, no recompute, the
// spec's micro-batch; data parallelism only on GPU ranks. ZeRO-3 is never
// chosen for a job (the engine does not run it); `loomctl plan` without
// the restriction may show it.
void RestrictToExecutable(const loom::v1::JobSpec& spec, planner::PlannerOptions* options);

// The spec's own layout: parallelism.data/tensor/pipeline/zero_stage/
// virtual_stages/sequence_parallel, the micro-batch, and recompute from
// activation_checkpointing (SpecRecompute).
planner::Layout SpecLayout(const loom::v1::JobSpec& spec);

// The planner's recompute for the spec's activation_checkpointing: any
// setting keeps only block inputs and reruns blocks in backward, which the
// planner models as full recompute. Exact for 1 (every block); for k > 1 or
// sqrt segments the engine stores fewer inputs than that, but keeps a
// segment's k blocks of activations alive while it reruns them.
planner::Recompute SpecRecompute(const loom::v1::JobSpec& spec);

loom::v1::PlannedLayout ToProto(const planner::LayoutEvaluation& evaluation);

// The device-count sweep (planner/device_sweep.h) into the Plan RPC's
// answer: device_counts, recommended_devices and the rule. Nothing when the
// sweep is empty.
void AddDeviceSweep(const planner::DeviceSweep& sweep, loom::v1::PlanResponse* resp);

// The Plan RPC's answer for a defaulted, validated spec on `topology`, with
// the device-count sweep.
// FAILED_PRECONDITION (the planner's reason) when nothing fits and the spec
// has no explicit layout to report on; INVALID_ARGUMENT for bad input.
absl::StatusOr<loom::v1::PlanResponse> PlanSpec(const loom::v1::JobSpec& spec,
                                                const LiveTopology& topology, int top_k,
                                                bool executable_only);

// Submit-time planning of a defaulted, validated spec.
//  * parallelism.auto: plans executable layouts; on success writes the
//    chosen degrees (and micro-batch) into `spec` and returns the plan.
//  * otherwise: evaluates the spec's layout.
// A layout that does not fit is INVALID_ARGUMENT naming the field path and
// the planner's reason, e.g. "parallelism.data: layout tp 1 | pp 1 | dp 2 |
// ... does not fit on 2 x 1 cpu: needs 112.0 GB per device before
// activations, device has 8.0 GB" -- but only when the topology is
// measured: on estimates the plan is returned with fits = false and a note.
absl::StatusOr<loom::v1::JobPlan> PlanAtSubmit(loom::v1::JobSpec* spec,
                                               const LiveTopology& topology);

// For a spec with tensor or pipeline > 1 that ValidateJobSpec rejected as
// UNIMPLEMENTED (something beside the layout does not execute under it yet:
// dropout under TP, GPU ranks, ZeRO-3): when its layout is valid for the
// planner and does not fit on a measured topology, INVALID_ARGUMENT with the
// reason, followed by `unimplemented`'s message (the user must change more
// than that one field); otherwise `unimplemented` unchanged.
absl::Status ExplainUnexecutableLayout(const loom::v1::JobSpec& spec,
                                       const LiveTopology& topology,
                                       const absl::Status& unimplemented);

// Text rendering of a stored plan, for `loomctl status`.
std::string FormatJobPlan(const loom::v1::JobPlan& plan);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_JOB_PLANNING_H_
