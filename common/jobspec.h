// Job specs (loom.v1.JobSpec): loading, defaulting and validating them.
//
// A spec travels through three steps, each a separate call so that specs
// arriving over gRPC (already messages) share the last two with files:
//
//   ASSIGN_OR_RETURN(loom::v1::JobSpec spec, LoadJobSpecFile(path));  // jobspec_parse.h
//   ApplyJobSpecDefaults(&spec);                                      // jobspec_defaults.h
//   RETURN_IF_ERROR(ValidateJobSpec(spec));     // to run it          // jobspec_validate.h
//   RETURN_IF_ERROR(ValidatePlanSpec(spec));    // to plan it
//
// The validations share one set of field rules (jobspec_rules.h); the model
// helpers (EffectiveDecoder, ModelShapeOf) are in jobspec_model.h.
//
// Error messages start with the proto field path of the problem, written with
// the proto (snake_case) field names and [i] for list elements, e.g.
//   INVALID_ARGUMENT: model.gpt.n_heads: unknown field (did you mean "n_head"?)
//   INVALID_ARGUMENT: data.train[1]: empty path
// Problems that are not about one field (YAML syntax, empty input) start with
// "job spec: " instead. Messages never include the file name; callers that
// know it (loomctl) prefix it themselves.
//
// All functions are thread-safe: they keep no state between calls.
#ifndef LOOM_COMMON_JOBSPEC_H_
#define LOOM_COMMON_JOBSPEC_H_

#include "common/jobspec_defaults.h"
#include "common/jobspec_model.h"
#include "common/jobspec_parse.h"
#include "common/jobspec_validate.h"

#endif  // LOOM_COMMON_JOBSPEC_H_
