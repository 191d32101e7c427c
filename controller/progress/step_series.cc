#include "controller/progress/step_series.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"

namespace loom::controller {
namespace {

using loom::v1::StepMetrics;

struct SeriesDef {
  const char* name;
  // The step's value of the series, or nullopt when the step has none.
  std::optional<double> (*read)(const StepMetrics& m);
};

// clang-format off
const SeriesDef kSeries[] = {
    {"loss", [](const StepMetrics& m) -> std::optional<double> { return m.loss(); }},
    {"val_loss", [](const StepMetrics& m) -> std::optional<double> {
       if (!m.has_val_loss()) return std::nullopt;
       return m.val_loss();
     }},
    {"lr", [](const StepMetrics& m) -> std::optional<double> { return m.lr(); }},
    {"grad_norm", [](const StepMetrics& m) -> std::optional<double> { return m.grad_norm(); }},
    {"tokens_per_second",
     [](const StepMetrics& m) -> std::optional<double> { return m.tokens_per_second(); }},
    {"mfu", [](const StepMetrics& m) -> std::optional<double> { return m.mfu(); }},
    {"step_time_seconds",
     [](const StepMetrics& m) -> std::optional<double> { return m.step_time_seconds(); }},
    {"tokens_seen",
     [](const StepMetrics& m) -> std::optional<double> { return static_cast<double>(m.tokens_seen()); }},
    {"data_wait_seconds",
     [](const StepMetrics& m) -> std::optional<double> { return m.data_wait_seconds(); }},
    {"compute_seconds",
     [](const StepMetrics& m) -> std::optional<double> { return m.compute_seconds(); }},
    {"comm_seconds", [](const StepMetrics& m) -> std::optional<double> { return m.comm_seconds(); }},
    {"optimizer_seconds",
     [](const StepMetrics& m) -> std::optional<double> { return m.optimizer_seconds(); }},
    {"checkpoint_stall_seconds",
     [](const StepMetrics& m) -> std::optional<double> { return m.checkpoint_stall_seconds(); }},
    {"rss_bytes",
     [](const StepMetrics& m) -> std::optional<double> { return static_cast<double>(m.rss_bytes()); }},
    {"power_watts", [](const StepMetrics& m) -> std::optional<double> { return m.power_watts(); }},
    {"energy_joules",
     [](const StepMetrics& m) -> std::optional<double> { return m.energy_joules(); }},
    {"loss_scale", [](const StepMetrics& m) -> std::optional<double> { return m.loss_scale(); }},
};
// clang-format on
constexpr int kSeriesCount = sizeof(kSeries) / sizeof(kSeries[0]);
static_assert(kSeriesCount == kStepSeriesCount, "kStepSeriesCount is the table's length");

int FindSeries(const std::string& name) {
  for (int i = 0; i < kSeriesCount; ++i) {
    if (name == kSeries[i].name) return i;
  }
  return -1;
}

}  // namespace

void SeriesValue::Add(float v) {
  if (!set) {
    first = last = min = max = v;
    set = true;
    return;
  }
  last = v;
  min = std::min(min, v);
  max = std::max(max, v);
}

void SeriesValue::Merge(const SeriesValue& later) {
  if (!later.set) return;
  if (!set) {
    *this = later;
    return;
  }
  last = later.last;
  min = std::min(min, later.min);
  max = std::max(max, later.max);
}

void StepSummary::Add(const StepMetrics& step) {
  if (first_step < 0) first_step = step.step();
  last_step = step.step();
  ++steps;
  for (int i = 0; i < kSeriesCount; ++i) {
    if (const std::optional<double> v = kSeries[i].read(step)) {
      values[i].Add(static_cast<float>(*v));
    }
  }
}

std::vector<std::string> StepSeriesBuilder::SeriesNames() {
  std::vector<std::string> names;
  for (const SeriesDef& d : kSeries) names.push_back(d.name);
  return names;
}

absl::StatusOr<StepSeriesBuilder> StepSeriesBuilder::Start(
    const loom::v1::GetStepSeriesRequest& request, int64_t first_step, int64_t last_step) {
  if (request.from_step() < 0) return absl::InvalidArgumentError("from_step: must be >= 0");
  if (request.to_step() < 0) return absl::InvalidArgumentError("to_step: must be >= 0");
  if (request.to_step() > 0 && request.from_step() > request.to_step()) {
    return absl::InvalidArgumentError(
        absl::StrCat("from_step: ", request.from_step(), " is after to_step ", request.to_step()));
  }
  if (request.buckets() < 0 || request.buckets() > kMaxBuckets) {
    return absl::InvalidArgumentError(absl::StrCat("buckets: must be in [0, ", kMaxBuckets,
                                                   "] (0 = ", kDefaultBuckets, "), got ",
                                                   request.buckets()));
  }
  StepSeriesBuilder b;
  std::set<int> seen;
  for (const std::string& name : request.series()) {
    const int i = FindSeries(name);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("series: unknown series \"", name, "\" (known: see GetStepSeriesRequest)"));
    }
    if (!seen.insert(i).second) {
      return absl::InvalidArgumentError(absl::StrCat("series: \"", name, "\" asked twice"));
    }
    b.series_.push_back(i);
  }
  if (b.series_.empty()) {
    for (const char* name : {"loss", "val_loss", "tokens_per_second", "mfu"}) {
      b.series_.push_back(FindSeries(name));
    }
  }
  b.job_first_ = first_step;
  b.job_last_ = last_step;
  const bool any = last_step >= first_step;
  b.from_ = std::max(request.from_step() > 0 ? request.from_step() : first_step, first_step);
  b.to_ = std::min(request.to_step() > 0 ? request.to_step() : last_step, last_step);
  if (!any || b.from_ > b.to_) {
    b.from_ = 0;
    b.to_ = -1;
    return b;
  }
  const int64_t span = b.to_ - b.from_ + 1;
  const int64_t asked = request.buckets() > 0 ? request.buckets() : kDefaultBuckets;
  b.buckets_ = std::min(asked, span);
  b.bucket_first_.assign(b.buckets_, -1);
  b.bucket_last_.assign(b.buckets_, -1);
  b.values_.assign(b.buckets_ * b.series_.size(), SeriesValue());
  b.pending_values_.assign(b.series_.size(), 0);
  b.pending_set_.assign(b.series_.size(), false);
  return b;
}

int64_t StepSeriesBuilder::BucketOf(int64_t step) const {
  const __int128 offset = step - from_;
  return static_cast<int64_t>(offset * buckets_ / static_cast<__int128>(to_ - from_ + 1));
}

void StepSeriesBuilder::Commit() {
  if (!pending_) return;
  pending_ = false;
  const int64_t bucket = BucketOf(pending_step_);
  if (bucket_first_[bucket] < 0) bucket_first_[bucket] = pending_step_;
  bucket_last_[bucket] = pending_step_;
  ++steps_;
  for (size_t s = 0; s < series_.size(); ++s) {
    if (pending_set_[s]) {
      values_[bucket * series_.size() + s].Add(static_cast<float>(pending_values_[s]));
    }
  }
}

void StepSeriesBuilder::AddSummary(const StepSummary& summary) {
  Commit();
  if (empty() || summary.steps == 0 || summary.first_step < from_ || summary.last_step > to_) {
    return;
  }
  const int64_t bucket = BucketOf(summary.first_step);
  if (bucket_first_[bucket] < 0) bucket_first_[bucket] = summary.first_step;
  bucket_last_[bucket] = summary.last_step;
  steps_ += summary.steps;
  for (size_t s = 0; s < series_.size(); ++s) {
    values_[bucket * series_.size() + s].Merge(summary.values[series_[s]]);
  }
}

void StepSeriesBuilder::Add(const StepMetrics& step) {
  if (empty() || step.step() < from_ || step.step() > to_) return;
  if (pending_ && step.step() != pending_step_) Commit();
  // A record of the pending step replaces it (the latest training counts).
  pending_ = true;
  pending_step_ = step.step();
  for (size_t s = 0; s < series_.size(); ++s) {
    const std::optional<double> v = kSeries[series_[s]].read(step);
    pending_set_[s] = v.has_value();
    pending_values_[s] = v.value_or(0);
  }
}

loom::v1::GetStepSeriesResponse StepSeriesBuilder::Finish() {
  Commit();
  loom::v1::GetStepSeriesResponse out;
  if (job_last_ >= job_first_) {
    out.set_first_step(job_first_);
    out.set_last_step(job_last_);
  }
  out.set_steps(steps_);
  std::vector<loom::v1::StepSeries*> series;
  for (int i : series_) {
    loom::v1::StepSeries* s = out.add_series();
    s->set_name(kSeries[i].name);
    series.push_back(s);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t b = 0; b < buckets_; ++b) {
    if (bucket_first_[b] < 0) continue;
    out.add_bucket_first_step(bucket_first_[b]);
    out.add_bucket_last_step(bucket_last_[b]);
    for (size_t s = 0; s < series.size(); ++s) {
      const SeriesValue& v = values_[b * series.size() + s];
      series[s]->add_first(v.set ? v.first : nan);
      series[s]->add_last(v.set ? v.last : nan);
      series[s]->add_min(v.set ? v.min : nan);
      series[s]->add_max(v.set ? v.max : nan);
    }
  }
  return out;
}

}  // namespace loom::controller
