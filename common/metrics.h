// A small Prometheus client library: counters, gauges and histograms grouped
// into labelled families, held by a Registry and serialized in the Prometheus
// text exposition format 0.0.4.
//
// The interface follows prometheus-cpp (https://github.com/jupp0r/prometheus-cpp)
// closely so that switching to it later is mostly a namespace change:
//
//   auto registry = std::make_shared<loom::metrics::Registry>();
//   auto& tokens = loom::metrics::BuildCounter()
//                      .Name("loom_worker_tokens_total")
//                      .Help("Tokens processed by this worker.")
//                      .Labels({{"worker", "w0"}})   // constant labels
//                      .Register(*registry);
//   auto& train = tokens.Add({{"phase", "train"}});
//   train.Increment(4096);
//
// Differences from prometheus-cpp:
//  * Errors are not exceptions. Register() and Add() abort the process with a
//    message on programmer errors (invalid names, conflicting
//    re-registration); TryRegister() and TryAdd() return the same problems as
//    absl::Status for callers whose names or label sets come from input.
//  * No Summary or Info metric types, no timestamps.
//
// Naming rules (https://prometheus.io/docs/concepts/data_model/):
//  * metric names match [a-zA-Z_:][a-zA-Z0-9_:]*
//  * label names match [a-zA-Z_][a-zA-Z0-9_]* and must not start with "__"
//    (reserved for Prometheus itself); histograms may not use the label "le".
//  * label values are arbitrary UTF-8.
//
// Thread safety: every class in this file is safe for concurrent use, except
// the Builder, which is a value type meant to be used by one thread.
#ifndef LOOM_COMMON_METRICS_H_
#define LOOM_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace loom {
namespace metrics {

// A label set, ordered by label name.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

// ---------------------------------------------------------------------------
// Snapshot types: what Collect() returns and SerializeText() consumes. Field
// names match prometheus-cpp's ClientMetric / MetricFamily.

struct ClientMetric {
  struct Label {
    std::string name;
    std::string value;
    bool operator==(const Label& other) const {
      return name == other.name && value == other.value;
    }
  };
  // Sorted by name; includes the family's constant labels.
  std::vector<Label> label;

  struct Counter {
    double value = 0.0;
  };
  Counter counter;  // Set when the family type is kCounter.

  struct Gauge {
    double value = 0.0;
  };
  Gauge gauge;  // Set when the family type is kGauge.

  struct Bucket {
    uint64_t cumulative_count = 0;  // Observations <= upper_bound.
    double upper_bound = 0.0;       // The last bucket's bound is +Inf.
  };
  struct Histogram {
    uint64_t sample_count = 0;
    double sample_sum = 0.0;
    std::vector<Bucket> bucket;  // Ascending upper_bound, ending with +Inf.
  };
  Histogram histogram;  // Set when the family type is kHistogram.
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<ClientMetric> metric;  // Sorted by label set.
};

// Anything that can produce a snapshot of metric families: a Registry, or a
// fake in tests. Implementations must be safe for concurrent Collect() calls.
class Collectable {
 public:
  virtual ~Collectable() = default;
  virtual std::vector<MetricFamily> Collect() const = 0;
  // Removes every series whose variable labels include all of `subset`
  // (each name with the same value); returns how many. References to them
  // become dangling.
  virtual int RemoveMatching(const Labels& subset) = 0;
};

// ---------------------------------------------------------------------------
// Metric types. They are neither copyable nor movable: families hand out
// references that stay valid until the metric is removed.

// A monotonically increasing value, e.g. loom_worker_tokens_total.
// Lock-free; safe for concurrent use.
class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `value`. Counters only go up, so a negative or NaN `value` is
  // ignored (as in prometheus-cpp).
  void Increment(double value = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

  ClientMetric Collect() const;

 private:
  std::atomic<double> value_{0.0};
};

// A value that can go up and down, e.g. loom_worker_gpu_memory_bytes.
// Lock-free; safe for concurrent use.
class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;

  Gauge() = default;
  explicit Gauge(double initial) : value_(initial) {}
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double value = 1.0);
  void Decrement(double value = 1.0) { Increment(-value); }
  // Sets the gauge to the current Unix time in seconds (with fraction).
  void SetToCurrentTime(const Clock& clock = *RealClock::Get());
  double Value() const { return value_.load(std::memory_order_relaxed); }

  ClientMetric Collect() const;

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets by upper bound ("le", less-or-equal) and
// tracks their count and sum, e.g. loom_worker_step_time_seconds.
// Observe() takes a per-histogram mutex so that a snapshot's buckets, count
// and sum are always consistent with each other.
class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;
  // Finite upper bounds, strictly increasing. The +Inf bucket is implicit; a
  // trailing +Inf in the list is accepted and dropped.
  using BucketBoundaries = std::vector<double>;

  // Aborts if `boundaries` is invalid (see ValidateBoundaries); boundaries
  // are expected to be constants chosen by the programmer.
  explicit Histogram(BucketBoundaries boundaries);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // OK iff every bound is finite (except a trailing +Inf) and the bounds are
  // strictly increasing. An empty list is valid: only the +Inf bucket.
  static absl::Status ValidateBoundaries(const BucketBoundaries& boundaries);

  // Records one observation. NaN lands only in the +Inf bucket (and makes the
  // sum NaN), matching the Go client.
  void Observe(double value);

  // The finite upper bounds, without the implicit +Inf.
  const BucketBoundaries& boundaries() const { return boundaries_; }

  ClientMetric Collect() const;

 private:
  const BucketBoundaries boundaries_;
  mutable absl::Mutex mu_;
  // bucket_counts_[i] counts observations in (boundaries_[i-1],
  // boundaries_[i]]; the last entry is the +Inf bucket. Not cumulative.
  std::vector<uint64_t> bucket_counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

// {start, start*factor, ..., start*factor^(count-1)}. Aborts unless
// start > 0, factor > 1 and count >= 1.
Histogram::BucketBoundaries ExponentialBuckets(double start, double factor,
                                               int count);
// {start, start+width, ..., start+width*(count-1)}. Aborts unless width > 0
// and count >= 1.
Histogram::BucketBoundaries LinearBuckets(double start, double width,
                                          int count);

// ---------------------------------------------------------------------------

// Metrics of one type sharing a name and help text, told apart by labels.
// Owned by a Registry; references to it are valid as long as the registry.
// Thread-safe: Add, Remove and Collect may race freely.
template <typename T>
class Family final : public Collectable {
 public:
  // Use BuildCounter() and friends; this is public only for the Registry.
  Family(std::string name, std::string help, Labels constant_labels);
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // Returns the metric with exactly these variable labels, creating it from
  // `args` (Histogram: its BucketBoundaries) on first use. The same labels
  // always return the same object until it is Remove()d. Aborts where
  // TryAdd would return an error. Add allocates and takes a lock: look
  // metrics up once and keep the reference on hot paths.
  template <typename... Args>
  T& Add(const Labels& labels, Args&&... args);

  // As Add, but returns:
  //  INVALID_ARGUMENT for an invalid label name, a label that repeats a
  //    constant label, or "le" on a histogram;
  //  ALREADY_EXISTS if these labels exist with different histogram buckets.
  // Invalid histogram buckets still abort (see Histogram's constructor).
  template <typename... Args>
  absl::StatusOr<T*> TryAdd(const Labels& labels, Args&&... args);

  // Removes and destroys `metric`; references to it become dangling. A
  // pointer that is not in this family (or nullptr) is ignored.
  void Remove(T* metric);

  bool Has(const Labels& labels) const;
  int RemoveMatching(const Labels& subset) override;
  const std::string& GetName() const { return name_; }
  const Labels& GetConstantLabels() const { return constant_labels_; }

  // One MetricFamily with every metric, or nothing if the family is empty.
  std::vector<MetricFamily> Collect() const override;

 private:
  absl::StatusOr<T*> AddMetric(const Labels& labels,
                               std::unique_ptr<T> candidate);

  const std::string name_;
  const std::string help_;
  const Labels constant_labels_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> metrics_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families. Thread-safe. Families live as long as the registry;
// the usual ownership is a shared_ptr, with a weak_ptr given to the Exposer.
class Registry final : public Collectable {
 public:
  Registry();
  ~Registry() override;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Snapshot of every non-empty family, sorted by name.
  std::vector<MetricFamily> Collect() const override;
  // Over every family: e.g. {job_id, rank} drops all of an ended rank's
  // series, whatever other labels they carry, without listing them.
  int RemoveMatching(const Labels& subset) override;

 private:
  template <typename T>
  friend class Builder;

  // Registering a name again with the same type, help and constant labels
  // returns the existing family (prometheus-cpp's InsertBehavior::Merge);
  // any other reuse of the name is ALREADY_EXISTS. Invalid names are
  // INVALID_ARGUMENT.
  template <typename T>
  absl::StatusOr<Family<T>*> AddFamily(const std::string& name,
                                       const std::string& help,
                                       const Labels& constant_labels);

  struct Entry;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> families_ ABSL_GUARDED_BY(mu_);
};

// Collects the settings of one family; obtain through BuildCounter(),
// BuildGauge() or BuildHistogram(). Not thread-safe (a value type).
template <typename T>
class Builder {
 public:
  Builder& Name(const std::string& name);
  Builder& Help(const std::string& help);
  // Constant labels, attached to every metric of the family.
  Builder& Labels(const std::map<std::string, std::string>& labels);

  // Aborts with a message where TryRegister would return an error.
  Family<T>& Register(Registry& registry);
  // See Registry::AddFamily for the errors.
  absl::StatusOr<Family<T>*> TryRegister(Registry& registry);

 private:
  std::string name_;
  std::string help_;
  std::map<std::string, std::string> labels_;
};

Builder<Counter> BuildCounter();
Builder<Gauge> BuildGauge();
Builder<Histogram> BuildHistogram();

// ---------------------------------------------------------------------------
// Text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).

// The Content-Type to serve SerializeText's output with.
inline constexpr char kTextContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// Renders `families` as text. Output is deterministic: families sorted by
// name, metrics by label set. Families that share a name (e.g. from two
// registries) are merged when their types agree, keeping the first help
// text; a family whose type conflicts with an earlier one of the same name
// is dropped, because the format allows one TYPE per name. Families without
// metrics are omitted; a family with empty help has no "# HELP" line.
std::string SerializeText(const std::vector<MetricFamily>& families);

// How values are written: integral values below 2^53 in magnitude as plain
// integers ("1000000"), others in the shortest form that reads back to the
// same double ("0.25", "1e+300"), and "+Inf", "-Inf", "NaN".
std::string FormatValue(double value);

// Validation used by the registry, exposed for callers that take names from
// input. Both return INVALID_ARGUMENT naming the offending name.
absl::Status ValidateMetricName(const std::string& name);
absl::Status ValidateLabelName(const std::string& name);

// ---------------------------------------------------------------------------
// Implementation details of the templates above.

namespace internal {
// Prints "loom::metrics: <status>" to stderr and aborts.
[[noreturn]] void Die(const absl::Status& status);
}  // namespace internal

template <typename T>
template <typename... Args>
T& Family<T>::Add(const Labels& labels, Args&&... args) {
  absl::StatusOr<T*> metric = TryAdd(labels, std::forward<Args>(args)...);
  if (!metric.ok()) internal::Die(metric.status());
  return **metric;
}

template <typename T>
template <typename... Args>
absl::StatusOr<T*> Family<T>::TryAdd(const Labels& labels, Args&&... args) {
  return AddMetric(labels, std::make_unique<T>(std::forward<Args>(args)...));
}

}  // namespace metrics
}  // namespace loom

#endif  // LOOM_COMMON_METRICS_H_
