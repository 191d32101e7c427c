// A job's state machine: every legal transition in one place.
//
//   (submitted) ──► PENDING ──► SCHEDULED ──► RUNNING ──► SUCCEEDED
//                     ▲  │          │  │         │
//                     │  │          │  └─────────┴──► PREEMPTED ──► SCHEDULED
//                     │  │          │                    │             (or PENDING, a re-plan)
//                     └──┴──────────┴─────── requeue ◄───┘
//   any state that has not ended ──► FAILED | CANCELLED
//
// Precisely, from each state:
//   JOB_STATE_UNSPECIFIED  PENDING (the submission)
//   PENDING, PREEMPTED     SCHEDULED (placed), PENDING (an elastic job
//                          re-planned for fewer ranks while it waits),
//                          FAILED, CANCELLED
//   SCHEDULED              RUNNING (its first step, or its ranks seen
//                          running), and as RUNNING below
//   RUNNING                PENDING (a restart, a rollback, an attempt that
//                          could not start, a re-plan: the attempt is
//                          requeued), PREEMPTED (checkpoint-then-preempt
//                          done), SUCCEEDED, FAILED, CANCELLED
//   SUCCEEDED, FAILED, CANCELLED  none: an ended job stays ended.
// Every transition is recorded on the job with its time and reason
// (job_table.h's RecordTransition); one outside this table is a bug in
// the controller, which the catalog records anyway (the job's history
// stays whole) and counts.
#ifndef LOOM_CONTROLLER_JOBS_JOB_STATE_MACHINE_H_
#define LOOM_CONTROLLER_JOBS_JOB_STATE_MACHINE_H_

#include <string>
#include <utility>
#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::controller {

// Whether a job may go from `from` to `to`.
bool IsLegalTransition(loom::v1::JobState from, loom::v1::JobState to);

// SUCCEEDED, FAILED or CANCELLED: the job has ended.
bool IsTerminalJobState(loom::v1::JobState s);
// PENDING or PREEMPTED: waiting in its queue to be placed.
bool IsQueuedJobState(loom::v1::JobState s);
// SCHEDULED or RUNNING: the job's current attempt has ranks placed.
bool IsAttemptRunningState(loom::v1::JobState s);

// Every legal (from, to) pair, in the proto's order of states.
std::vector<std::pair<loom::v1::JobState, loom::v1::JobState>> LegalTransitions();

// "RUNNING -> SCHEDULED is not a transition a job makes (from RUNNING:
// PENDING, SUCCEEDED, FAILED, CANCELLED, PREEMPTED)": the legal targets in
// the proto's order of states.
std::string DescribeIllegalTransition(loom::v1::JobState from, loom::v1::JobState to);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOBS_JOB_STATE_MACHINE_H_
