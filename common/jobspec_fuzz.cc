// libFuzzer target: the job-spec parser (YAML and JSON) and what submit does
// with what it parses (defaults, both validations), plus the JSON round trip
// loomctl relies on. Built only in the fuzz build (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/jobspec.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<loom::v1::JobSpec> spec = loom::ParseJobSpec(text);
  if (!spec.ok()) return 0;
  loom::v1::JobSpec with_defaults = *spec;
  loom::ApplyJobSpecDefaults(&with_defaults);
  const absl::Status run = loom::ValidateJobSpec(with_defaults);
  // What a run accepts (or would, once Loom executes it), a plan accepts:
  // the plan's checks are a subset of the run's (jobspec_validate.h).
  if ((run.ok() || run.code() == absl::StatusCode::kUnimplemented) &&
      !loom::ValidatePlanSpec(with_defaults).ok()) {
    std::cerr << "runnable but not plannable: " << loom::ValidatePlanSpec(with_defaults)
              << std::endl;
    std::abort();
  }
  if (!run.ok()) return 0;
  // A valid spec prints as JSON that parses back to an equal message.
  const std::string json = loom::JobSpecToJson(with_defaults);
  absl::StatusOr<loom::v1::JobSpec> again = loom::ParseJobSpec(json);
  if (!again.ok() ||
      !google::protobuf::util::MessageDifferencer::Equals(*again, with_defaults)) {
    std::cerr << "round trip failed: " << (again.ok() ? "messages differ" : again.status().ToString())
              << "\n" << json << std::endl;
    std::abort();
  }
  return 0;
}
