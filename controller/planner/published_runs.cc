#include "controller/planner/published_runs.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/jobspec.h"
#include "common/status_macros.h"
#include "controller/planner/topology_yaml.h"

namespace loom::planner {
namespace {

absl::Status Bad(const std::string& run, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("published run ", run, ": ", field, ": ", why));
}

template <typename T>
absl::StatusOr<T> Get(const YAML::Node& node, const std::string& run, const std::string& field) {
  const YAML::Node value = node[field];
  if (!value.IsDefined() || value.IsNull()) return Bad(run, field, "required");
  try {
    return value.as<T>();
  } catch (const YAML::Exception& e) {
    return Bad(run, field, e.what());
  }
}

absl::StatusOr<Recompute> ParseRecompute(const std::string& run, const std::string& text) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (RecomputeName(r) == text) return r;
  }
  return Bad(run, "published.recompute",
             absl::StrCat("\"", text, "\" is not none, selective or full"));
}

// The run's `framework` map (every key optional, each defaulting to
// CostOptions' default): attention fused|unfused, dropout, a gated
// activation recomputed in backward, pipeline scatter/gather.
absl::Status ReadFramework(const std::string& run, const YAML::Node& node, CostOptions* options) {
  if (!node.IsDefined()) return absl::OkStatus();
  if (!node.IsMap()) return Bad(run, "framework", "a map is required");
  static const char* const kKeys[] = {"attention", "dropout", "gated_activation_recomputed",
                                      "pipeline_scatter_gather"};
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      return Bad(run, "framework." + key, "unknown key");
    }
  }
  if (node["attention"]) {
    ASSIGN_OR_RETURN(const std::string attention, Get<std::string>(node, run, "attention"));
    if (attention == "fused") {
      options->kernels.attention = AttentionKernel::kFused;
    } else if (attention == "unfused") {
      options->kernels.attention = AttentionKernel::kUnfused;
    } else {
      return Bad(run, "framework.attention",
                 absl::StrCat("\"", attention, "\" is not fused or unfused"));
    }
  }
  if (node["dropout"]) {
    ASSIGN_OR_RETURN(options->kernels.dropout, Get<bool>(node, run, "dropout"));
  }
  if (node["gated_activation_recomputed"]) {
    ASSIGN_OR_RETURN(options->kernels.gated_activation_recomputed,
                     Get<bool>(node, run, "gated_activation_recomputed"));
  }
  if (node["pipeline_scatter_gather"]) {
    ASSIGN_OR_RETURN(options->pipeline_scatter_gather,
                     Get<bool>(node, run, "pipeline_scatter_gather"));
  }
  return absl::OkStatus();
}

// A job spec from `fields` (a YAML map), through the same parser, defaults
// and conversion as a spec file.
absl::StatusOr<loom::v1::JobSpec> SpecFrom(const std::string& run, const YAML::Node& fields,
                                           const std::string& which) {
  YAML::Emitter out;
  out << fields;
  absl::StatusOr<loom::v1::JobSpec> spec = ParseJobSpec(out.c_str());
  if (!spec.ok()) return Bad(run, which, std::string(spec.status().message()));
  ApplyJobSpecDefaults(&*spec);
  return spec;
}

absl::StatusOr<PublishedRun> ReadRun(const YAML::Node& node) {
  PublishedRun r;
  ASSIGN_OR_RETURN(r.name, Get<std::string>(node, "?", "name"));
  ASSIGN_OR_RETURN(r.source, Get<std::string>(node, r.name, "source"));
  ASSIGN_OR_RETURN(r.style, Get<std::string>(node, r.name, "style"));
  ASSIGN_OR_RETURN(const std::string precision, Get<std::string>(node, r.name, "precision"));
  ASSIGN_OR_RETURN(const int64_t global_batch, Get<int64_t>(node, r.name, "global_batch"));
  if (!node["model"].IsMap()) return Bad(r.name, "model", "a ModelSpec map is required");
  if (!node["topology"].IsMap()) return Bad(r.name, "topology", "a topology map is required");
  YAML::Emitter topology_text;
  topology_text << node["topology"];
  absl::StatusOr<ClusterTopology> topology = ParseTopologyYaml(topology_text.c_str());
  if (!topology.ok()) return Bad(r.name, "topology", std::string(topology.status().message()));
  r.topology = *topology;

  // The spec a user writes to ask how to lay the run out.
  YAML::Node spec;
  spec["name"] = r.name;
  spec["model"] = node["model"];
  spec["batch"]["global_batch"] = global_batch;
  spec["precision"] = precision;
  spec["resources"]["workers"] = r.topology.nodes;
  spec["resources"]["ranks"] = r.devices();
  spec["parallelism"]["auto"] = true;
  ASSIGN_OR_RETURN(r.auto_spec, SpecFrom(r.name, spec, "auto spec"));

  const YAML::Node published = node["published"];
  if (!published.IsMap()) return Bad(r.name, "published", "the published layout is required");
  Layout& l = r.published;
  ASSIGN_OR_RETURN(l.tp, Get<int>(published, r.name, "tp"));
  ASSIGN_OR_RETURN(l.pp, Get<int>(published, r.name, "pp"));
  ASSIGN_OR_RETURN(l.dp, Get<int>(published, r.name, "dp"));
  ASSIGN_OR_RETURN(l.micro_batch, Get<int64_t>(published, r.name, "micro_batch"));
  ASSIGN_OR_RETURN(l.zero_stage, Get<int>(published, r.name, "zero_stage"));
  ASSIGN_OR_RETURN(l.virtual_stages, Get<int>(published, r.name, "virtual_stages"));
  ASSIGN_OR_RETURN(l.sequence_parallel, Get<bool>(published, r.name, "sequence_parallel"));
  ASSIGN_OR_RETURN(const std::string recompute, Get<std::string>(published, r.name, "recompute"));
  ASSIGN_OR_RETURN(l.recompute, ParseRecompute(r.name, recompute));

  // The same run with every knob a job spec has pinned (a spec cannot say
  // "selective": its activation_checkpointing is block recompute).
  YAML::Node pinned = YAML::Clone(spec);
  pinned["parallelism"] = YAML::Node(YAML::NodeType::Map);
  pinned["parallelism"]["tensor"] = l.tp;
  pinned["parallelism"]["pipeline"] = l.pp;
  pinned["parallelism"]["data"] = l.dp;
  pinned["parallelism"]["zero_stage"] = l.zero_stage;
  pinned["parallelism"]["virtual_stages"] = l.virtual_stages;
  pinned["parallelism"]["sequence_parallel"] = l.sequence_parallel;
  pinned["batch"]["micro_batch"] = l.micro_batch;
  if (l.recompute == Recompute::kFull) pinned["activation_checkpointing"] = 1;
  ASSIGN_OR_RETURN(r.published_spec, SpecFrom(r.name, pinned, "published spec"));

  // The planner's input, converted as loomctl converts a spec
  // (controller/admission/job_planning.cc SpecToPlanRequest).
  r.request.model = ModelShapeOf(r.auto_spec.model());
  r.request.model.name = r.name;
  r.request.training.global_batch_sequences = r.auto_spec.batch().global_batch();
  switch (r.auto_spec.precision()) {
    case loom::v1::BF16:
      r.request.training.precision = Precision::kBf16;
      break;
    case loom::v1::FP16:
      r.request.training.precision = Precision::kFp16;
      break;
    default:
      r.request.training.precision = Precision::kFp32;
  }
  r.request.topology = r.topology;
  RETURN_IF_ERROR(ReadFramework(r.name, node["framework"], &r.request.options.cost));

  const YAML::Node reported = node["reported"];
  if (reported.IsMap()) {
    if (reported["tflops_per_device"]) {
      ASSIGN_OR_RETURN(r.reported_tflops_per_device,
                       Get<double>(reported, r.name, "tflops_per_device"));
    }
    if (reported["mfu"]) {
      ASSIGN_OR_RETURN(r.reported_mfu, Get<double>(reported, r.name, "mfu"));
    }
    if (reported["counts_recompute"]) {
      ASSIGN_OR_RETURN(r.reported_counts_recompute,
                       Get<bool>(reported, r.name, "counts_recompute"));
    }
  }
  const YAML::Node gaps = node["known_gaps"];
  if (gaps.IsDefined() && !gaps.IsMap()) {
    return Bad(r.name, "known_gaps", "a map of check name to reason");
  }
  for (const auto& gap : gaps) {
    const std::string check = gap.first.as<std::string>();
    static const char* const kChecks[] = {"auto",       "published", "fits",    "speed",
                                          "tp_in_node", "mfu_range", "reported"};
    if (std::find(std::begin(kChecks), std::end(kChecks), check) == std::end(kChecks)) {
      return Bad(r.name, "known_gaps." + check, "not a check of the suite");
    }
    r.known_gaps[check] = gap.second.as<std::string>();
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<PublishedRun>> LoadPublishedRuns(const std::string& path) {
  if (!std::filesystem::exists(path))
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (!root["runs"].IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": runs: a list is required"));
  }
  std::vector<PublishedRun> runs;
  for (const YAML::Node& node : root["runs"]) {
    ASSIGN_OR_RETURN(PublishedRun run, ReadRun(node));
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace loom::planner
