// The elastic jobs' exactly-once check: what data a job's committed trajectory
// trained, from its step records (StepMetrics.data_batch, .generation,
// .layout_generation). `loomctl steps JOB --ledger` prints it; the elastic
// tests read it.
//
// A pure function of the records; no clock, no I/O. Thread-compatible.
#ifndef LOOM_CONTROLLER_PROGRESS_DATA_LEDGER_H_
#define LOOM_CONTROLLER_PROGRESS_DATA_LEDGER_H_

#include <cstdint>
#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::controller {

// The data ledger of a job's committed trajectory: for each step, the
// record of the newest attempt that trained it (the one the final
// parameters descend from), and the data batch it trained on. A batch is
// skipped when it lies below the last one trained, was never trained, and
// no skip range covers it; duplicated when two committed steps trained it.
// Steps trained again after a restart, rollback, preemption or re-plan are
// `replayed`: work redone, not duplicated data.
struct DataLedger {
  int64_t steps = 0;               // committed steps with a record (1..last)
  int64_t first_batch = -1;        // data batch of step 1's record (-1: none)
  int64_t last_batch = -1;         // and of the last step's
  int64_t skipped = 0;             // batches skipped, outside the skip ranges
  int64_t duplicated = 0;          // batches two committed steps trained
  int64_t replayed = 0;            // step records superseded by a later attempt's
  int64_t missing_steps = 0;       // steps 1..last without a record (log_interval > 1)
  int64_t layout_generations = 0;  // distinct layouts the committed steps ran under
};
DataLedger ComputeDataLedger(const std::vector<loom::v1::StepMetrics>& records,
                             const std::vector<loom::v1::SkipRange>& skip_ranges);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_DATA_LEDGER_H_
