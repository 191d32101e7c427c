// A job's wall time split into goodput buckets, after Google's
// ML Productivity Goodput, extended: what share of the time a job has
// existed trained the model, and where the rest went. A pure function of
// the job record (its state transitions and recovery events) and its
// step reports; the controller's exports (Prometheus, `loomctl status`, the
// report, the dashboard) are to read it.
//
// Buckets, from the job's history:
//   queued             PENDING before its first placement;
//   preempted_waiting  PREEMPTED: back in its queue after a preemption;
//   recovery_waiting   PENDING again after a failure or a rollback;
//   startup            from a placement to the start of the attempt's first
//                      reported step: launch, rendezvous, probe, less the
//                      restore;
//   checkpoint_restore loading the checkpoint an attempt resumed from (rank
//                      0's StepMetrics.checkpoint_restore_seconds on its
//                      first step report);
//   productive         reported step time, less what follows; a report
//                      stands for the steps since the attempt's previous
//                      report (log_interval > 1, or a thinned series);
//   data_stall         the steps' waits for the loader;
//   checkpoint_stall   the steps' checkpoint-save stalls;
//   evaluation         validation passes (StepMetrics.eval_seconds);
//   redone             the steps a rollback, restart or preemption undid (its
//                      steps_lost, at the attempt's median step time):
//                      trained twice, counted once as productive;
//   unaccounted        the rest of the wall time while placed (steps not
//                      reported, the time after the last step to the end).
// Every bucket is >= 0 and they sum to the wall time: where reports timed
// by another host's clock overlap it, the excess is taken out of start-up,
// then the steps' buckets (see ComputeGoodput).
// ETTR (effective training time ratio) = productive / (wall - queued -
// preempted_waiting).
#ifndef LOOM_CONTROLLER_PROGRESS_GOODPUT_H_
#define LOOM_CONTROLLER_PROGRESS_GOODPUT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

struct GoodputBuckets {
  double wall = 0;  // seconds from submission to the end (or `now`)
  double queued = 0;
  double preempted_waiting = 0;
  double recovery_waiting = 0;
  double startup = 0;
  double checkpoint_restore = 0;
  double productive = 0;
  double data_stall = 0;
  double checkpoint_stall = 0;
  double evaluation = 0;
  double redone = 0;
  double unaccounted = 0;

  // productive / (wall - queued - preempted_waiting); 0 before any of it.
  double ettr() const;

  // Every bucket (all but wall) in a fixed order: its series label
  // ("preempted_waiting"), how a person reads it ("preempted, waiting") and
  // its seconds.
  struct Named {
    const char* label;
    const char* description;
    double seconds;
  };
  std::vector<Named> List() const;
};

// `steps`: the job's step reports, any order (StepMetrics.time_unix_ms is
// when a step ended). `now` ends the wall time of a job still going.
GoodputBuckets ComputeGoodput(const loom::v1::Job& job,
                              const std::vector<loom::v1::StepMetrics>& steps, absl::Time now);

// The buckets as Prometheus series, per job (the controller refreshes the
// jobs not ended, and each job once more when it ends):
//   loom_controller_job_goodput_seconds{job_id, bucket}   gauge
//   loom_controller_job_ettr{job_id}                       gauge
// bucket is one of queued, preempted_waiting, recovery_waiting, startup,
// checkpoint_restore, productive, data_stall, checkpoint_stall, evaluation,
// redone, unaccounted. Thread-safe (the metric types are).
class GoodputMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit GoodputMetrics(metrics::Registry& registry);
  void Record(const std::string& job_id, const GoodputBuckets& buckets);

 private:
  metrics::Family<metrics::Gauge>& seconds_;
  metrics::Family<metrics::Gauge>& ettr_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_GOODPUT_H_
