#include "common/jobspec_defaults.h"

#include <algorithm>
#include <cstdint>

#include "common/jobspec_model.h"

namespace loom {

void ApplyJobSpecDefaults(v1::JobSpec* spec) {
  // A Llama-family model is stored with its defaults explicit, so the job
  // record (and `loomctl validate -o json`) shows what trains.
  if (spec->model().has_llama()) {
    *spec->mutable_model()->mutable_llama() = EffectiveDecoder(spec->model());
  }
  if (spec->optimizer().has_adamw()) {
    v1::AdamW* adamw = spec->mutable_optimizer()->mutable_adamw();
    if (adamw->beta1() == 0) adamw->set_beta1(0.9);
    if (adamw->beta2() == 0) adamw->set_beta2(0.95);
    if (adamw->eps() == 0) adamw->set_eps(1e-8);
    if (adamw->weight_decay() == 0) adamw->set_weight_decay(0.1);
  }

  v1::ScheduleSpec* schedule = spec->mutable_schedule();
  if (schedule->min_lr_ratio() == 0) schedule->set_min_lr_ratio(0.1);
  if (schedule->eval_batches() == 0) schedule->set_eval_batches(8);
  if (schedule->log_interval() == 0) schedule->set_log_interval(1);

  v1::ResourceSpec* resources = spec->mutable_resources();
  if (resources->workers() == 0) resources->set_workers(1);
  if (resources->ranks() == 0) resources->set_ranks(resources->workers());
  if (resources->threads_per_rank() == 0) resources->set_threads_per_rank(1);
  const int32_t ranks = resources->ranks();

  v1::ParallelismSpec* parallelism = spec->mutable_parallelism();
  if (!parallelism->auto_()) {
    if (parallelism->tensor() == 0) parallelism->set_tensor(1);
    if (parallelism->pipeline() == 0) parallelism->set_pipeline(1);
    const int64_t model_parallel =
        int64_t{parallelism->tensor()} * parallelism->pipeline();
    if (parallelism->data() == 0 && model_parallel > 0 && ranks > 0 &&
        ranks % model_parallel == 0) {
      parallelism->set_data(static_cast<int32_t>(ranks / model_parallel));
    }
  }

  // Each data-parallel replica takes global / replicas rows per step.
  v1::BatchSpec* batch = spec->mutable_batch();
  // Under parallelism.auto the planner picks the micro-batch with the
  // layout: a default here would be a constraint the user never set.
  const int32_t replicas = parallelism->data() > 0 ? parallelism->data() : ranks;
  if (!parallelism->auto_() && batch->micro_batch() == 0 && batch->global_batch() > 0 &&
      replicas > 0) {
    batch->set_micro_batch(std::max(1, batch->global_batch() / replicas));
  }

  if (spec->precision() == v1::PRECISION_UNSPECIFIED) {
    spec->set_precision(v1::FP32);
  }
  v1::CheckpointSpec* checkpoint = spec->mutable_checkpoint();
  // checkpoint.keep is the older name of retention.local.newest: each
  // defaults to the other, then to 3 (ValidateJobSpec rejects two values).
  v1::RetentionPolicy* local = checkpoint->mutable_retention()->mutable_local();
  if (!local->all() && local->newest() == 0)
    local->set_newest(checkpoint->keep() > 0 ? checkpoint->keep() : 3);
  if (checkpoint->keep() == 0) checkpoint->set_keep(local->all() ? 3 : local->newest());
  if (!checkpoint->remote().empty()) {
    v1::RetentionPolicy* remote = checkpoint->mutable_retention()->mutable_remote();
    if (!checkpoint->retention().has_remote() || remote->ByteSizeLong() == 0) {
      remote->set_all(true);  // the object store keeps everything unless told
    } else if (!remote->all() && remote->newest() == 0) {
      remote->set_newest(3);
    }
  }
  v1::MemorySnapshotSpec* snapshots = checkpoint->mutable_snapshots();
  if (!snapshots->disable() && snapshots->interval_steps() == 0) snapshots->set_interval_steps(1);
  if (spec->seed() == 0) spec->set_seed(1337);
}

}  // namespace loom
