#include "controller/checkpoints/retention_planner.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/checkpoint_retention.h"
#include "common/formats/checkpoint_files.h"
#include "common/formats/retention.h"
#include "common/object_store/remote_checkpoints.h"
#include "common/object_store/s3_client.h"

namespace loom::controller {
namespace {

void AddVerdicts(const std::vector<engine::RetentionVerdict>& verdicts, const std::string& tier,
                 loom::v1::PlanCheckpointRetentionResponse* out) {
  for (const engine::RetentionVerdict& v : verdicts) {
    loom::v1::RetentionVerdict* r = out->add_verdicts();
    r->set_step(v.checkpoint.step);
    r->set_tier(tier);
    r->set_location(v.checkpoint.name);
    r->set_keep(v.keep);
    r->set_reason(v.reason);
    r->set_generation(v.checkpoint.generation);
    if (v.checkpoint.val_loss.has_value()) {
      r->set_has_val_loss(true);
      r->set_val_loss(*v.checkpoint.val_loss);
    }
  }
}

void AddProtections(const std::string& tier, int64_t tip, int64_t window,
                    loom::v1::PlanCheckpointRetentionResponse* out) {
  if (window <= 0) return;
  out->add_protections(
      absl::StrCat(tier, ": the rollback window: the newest checkpoint at or before step ",
                   std::max<int64_t>(tip - window, 0), " (the newest, ", tip, ", less ", window,
                   " steps: twice recovery.rollback_distance) and every one after it"));
}

}  // namespace

RetentionPlanner::RetentionPlanner(ConfigSource config) : config_(std::move(config)) {
  if (!config_) {
    config_ = [] {
      return object_store::S3ConfigFromEnvironment(object_store::ProcessEnvironment());
    };
  }
}

loom::v1::PlanCheckpointRetentionResponse RetentionPlanner::Plan(
    const loom::v1::Job& job, const std::map<int64_t, std::string>& holds) {
  loom::v1::PlanCheckpointRetentionResponse out;
  const loom::v1::CheckpointSpec& spec = job.spec().checkpoint();
  const int64_t window = RollbackWindowSteps(job.spec().recovery());
  for (const auto& [step, why] : holds) {
    out.add_protections(absl::StrCat("step ", step, ": ", why));
  }
  // The directory, as rank 0 prunes it: the tip is its newest checkpoint in
  // lineage order whose manifest reads.
  const engine::RetentionPolicy local = LocalRetentionPolicy(spec);
  out.set_local_policy(engine::DescribeRetention(local));
  const std::vector<engine::CheckpointEntry> entries = engine::ListCheckpoints(spec.dir());
  std::vector<engine::RetentionCandidate> candidates;
  engine::RetentionGuard guard;
  guard.rollback_distance = window;
  guard.held = holds;
  if (!spec.remote().empty()) guard.upload = RemoteRetentionPolicy(spec);
  bool have_tip = false;
  for (const engine::CheckpointEntry& e : entries) {
    engine::RetentionCandidate c{e.path, e.step, e.generation, std::nullopt};
    if (guard.upload.has_value() && !e.legacy) c.awaiting_upload = !engine::UploadSettled(e.path);
    if (!e.legacy) {
      absl::StatusOr<engine::CheckpointManifest> m = engine::ReadManifest(e.path);
      if (m.ok() && m->state.has_val_loss) c.val_loss = m->state.val_loss;
      if (m.ok() && !have_tip) {
        have_tip = true;
        guard.tip_step = e.step;
        guard.lineage = m->state.lineage;
      }
    }
    candidates.push_back(std::move(c));
  }
  AddVerdicts(engine::PlanRetention(candidates, local, guard), "local", &out);
  if (have_tip) AddProtections("local", guard.tip_step, window, &out);
  if (spec.remote().empty()) return out;
  // The object store, as the uploading worker prunes it.
  const engine::RetentionPolicy remote = RemoteRetentionPolicy(spec);
  out.set_remote_policy(engine::DescribeRetention(remote));
  const std::string url = absl::StrCat(absl::StripSuffix(spec.remote(), "/"), "/", job.id());
  absl::StatusOr<object_store::S3Location> location = object_store::ParseS3Url(url);
  if (!location.ok()) {
    out.set_remote_error(std::string(location.status().message()));
    return out;
  }
  absl::StatusOr<object_store::S3Config> config = config_();
  if (!config.ok()) {
    out.set_remote_error(
        absl::StrCat("the controller cannot read ", url, ": ", config.status().message()));
    return out;
  }
  object_store::S3ClientOptions options;
  options.max_attempts = 2;  // an operator waits for this answer
  object_store::S3Client client(*config, options);
  object_store::RemoteRetention retention;
  retention.policy = remote;
  retention.rollback_window = window;
  retention.held = holds;
  absl::StatusOr<std::vector<engine::RetentionVerdict>> verdicts =
      object_store::PruneRemoteCheckpoints(client, *location, retention, /*apply=*/false);
  if (!verdicts.ok()) {
    out.set_remote_error(absl::StrCat("listing ", url, ": ", verdicts.status().message()));
    return out;
  }
  AddVerdicts(*verdicts, "remote", &out);
  if (!verdicts->empty()) {
    // PruneRemoteCheckpoints's tip: the newest listed in lineage order.
    AddProtections("remote", verdicts->front().checkpoint.step, window, &out);
  }
  return out;
}

}  // namespace loom::controller
