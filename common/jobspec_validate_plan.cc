// ValidatePlanSpec(): what a plan needs (jobspec_validate.h).
#include <cstdint>

#include "common/jobspec_rules.h"
#include "common/jobspec_validate.h"
#include "common/status_macros.h"

namespace loom {

absl::Status ValidatePlanSpec(const v1::JobSpec& spec) {
  namespace rules = jobspec_rules;
  RETURN_IF_ERROR(rules::CheckFinite(spec, ""));
  // The name only labels the report; a spec written to ask "how should I lay
  // this out?" may have none.
  RETURN_IF_ERROR(rules::CheckName(spec, /*required=*/false));
  RETURN_IF_ERROR(rules::CheckModel(spec.model()));
  // Only time to train reads the schedule; none means no time to train.
  RETURN_IF_ERROR(rules::CheckInRange<int64_t>("schedule.total_steps",
                                               spec.schedule().total_steps(), 0, rules::kMaxSteps));
  RETURN_IF_ERROR(rules::CheckResources(spec.resources(), rules::kMaxPlanRanks));
  RETURN_IF_ERROR(rules::CheckBatch(spec));
  RETURN_IF_ERROR(rules::CheckParallelism(spec));
  return rules::CheckPrecisionAndRecompute(spec);
}

}  // namespace loom
