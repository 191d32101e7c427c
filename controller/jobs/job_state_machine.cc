#include "controller/jobs/job_state_machine.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::controller {

using loom::v1::JobState;

bool IsLegalTransition(JobState from, JobState to) {
  switch (from) {
    case loom::v1::JOB_STATE_UNSPECIFIED:
      return to == loom::v1::PENDING;
    case loom::v1::PENDING:
    case loom::v1::PREEMPTED:
      return to == loom::v1::SCHEDULED || to == loom::v1::PENDING || to == loom::v1::FAILED ||
             to == loom::v1::CANCELLED;
    case loom::v1::SCHEDULED:
      if (to == loom::v1::RUNNING) return true;
      [[fallthrough]];
    case loom::v1::RUNNING:
      return to == loom::v1::PENDING || to == loom::v1::PREEMPTED || to == loom::v1::SUCCEEDED ||
             to == loom::v1::FAILED || to == loom::v1::CANCELLED;
    case loom::v1::SUCCEEDED:
    case loom::v1::FAILED:
    case loom::v1::CANCELLED:
      return false;
    default:
      return false;
  }
}

bool IsTerminalJobState(JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

bool IsQueuedJobState(JobState s) { return s == loom::v1::PENDING || s == loom::v1::PREEMPTED; }

bool IsAttemptRunningState(JobState s) {
  return s == loom::v1::SCHEDULED || s == loom::v1::RUNNING;
}

std::vector<std::pair<JobState, JobState>> LegalTransitions() {
  std::vector<std::pair<JobState, JobState>> legal;
  const auto* states = loom::v1::JobState_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    for (int j = 0; j < states->value_count(); ++j) {
      const auto from = static_cast<JobState>(states->value(i)->number());
      const auto to = static_cast<JobState>(states->value(j)->number());
      if (IsLegalTransition(from, to)) legal.emplace_back(from, to);
    }
  }
  return legal;
}

std::string DescribeIllegalTransition(JobState from, JobState to) {
  std::vector<std::string> targets;
  for (const auto& [f, t] : LegalTransitions()) {
    if (f == from) targets.push_back(loom::v1::JobState_Name(t));
  }
  return absl::StrCat(loom::v1::JobState_Name(from), " -> ", loom::v1::JobState_Name(to),
                      " is not a transition a job makes (from ", loom::v1::JobState_Name(from),
                      ": ", targets.empty() ? "none, it has ended" : absl::StrJoin(targets, ", "),
                      ")");
}

}  // namespace loom::controller
