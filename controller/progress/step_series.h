// StepSeriesBuilder: GetStepSeries's downsampling, with no store and no
// gRPC: steps go in (in step order, as the store reads them) and the
// response comes out.
//
// The range [from, to] is cut into `buckets` equal ranges of steps (or one
// per step when it holds fewer steps than that). Each bucket keeps, per
// series, the first, last, smallest and largest value of its steps: a spike
// at any step shows at every resolution. A step recorded more than once (a
// rollback re-trained it) counts once, as its latest record.
#ifndef LOOM_CONTROLLER_PROGRESS_STEP_SERIES_H_
#define LOOM_CONTROLLER_PROGRESS_STEP_SERIES_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

// How many series GetStepSeries knows (StepSeriesBuilder::SeriesNames()).
inline constexpr int kStepSeriesCount = 17;

// One series over some consecutive steps.
struct SeriesValue {
  float first = 0, last = 0, min = 0, max = 0;
  bool set = false;  // some step had a value
  void Add(float v);
  void Merge(const SeriesValue& later);  // `later`'s steps come after this one's
};

// Every series over a run of consecutive steps (a block of an index).
struct StepSummary {
  int64_t first_step = -1;  // -1: no step yet
  int64_t last_step = -1;
  int64_t steps = 0;
  std::array<SeriesValue, kStepSeriesCount> values;
  // Adds the next step (after last_step).
  void Add(const loom::v1::StepMetrics& step);
};

class StepSeriesBuilder {
 public:
  static constexpr int kDefaultBuckets = 1000;
  static constexpr int kMaxBuckets = 20000;

  // `first_step` and `last_step`: the job's recorded range (last_step <
  // first_step when it has none). INVALID_ARGUMENT naming the field for an unknown series, a
  // repeated one, more buckets than kMaxBuckets, a negative bound, or
  // from_step > to_step.
  static absl::StatusOr<StepSeriesBuilder> Start(const loom::v1::GetStepSeriesRequest& request,
                                                 int64_t first_step, int64_t last_step);

  // The steps to read: the request's range, defaulted to the job's and
  // clipped to it. empty() when there is nothing to read.
  int64_t from() const { return from_; }
  int64_t to() const { return to_; }
  bool empty() const { return from_ > to_; }

  // Adds a step record. Records come in step order, and a step's records
  // in the order they were made; records outside [from, to] are ignored.
  void Add(const loom::v1::StepMetrics& step);
  // Adds the summary of steps after every step added so far, inside
  // [from, to]; it counts in the bucket of its first step.
  void AddSummary(const StepSummary& summary);
  // The response; the builder is spent.
  loom::v1::GetStepSeriesResponse Finish();

  // The series GetStepSeries knows, in the order they are listed.
  static std::vector<std::string> SeriesNames();

 private:
  StepSeriesBuilder() = default;
  int64_t BucketOf(int64_t step) const;
  void Commit();  // the pending step into its bucket

  std::vector<int> series_;  // indices into the series table
  int64_t job_first_ = 0, job_last_ = 0;
  int64_t from_ = 0, to_ = -1;
  int64_t buckets_ = 0;                              // effective: min(asked, steps in range)
  std::vector<int64_t> bucket_first_, bucket_last_;  // -1: empty
  std::vector<SeriesValue> values_;                  // [bucket * series + s]
  int64_t steps_ = 0;
  bool pending_ = false;
  int64_t pending_step_ = 0;
  std::vector<double> pending_values_;
  std::vector<bool> pending_set_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_STEP_SERIES_H_
