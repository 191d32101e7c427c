#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loom {
namespace metrics {

namespace internal {

void Die(const absl::Status& status) {
  std::fprintf(stderr, "loom::metrics: %s\n", status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal

namespace {

bool IsAsciiLetter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

// Lexicographic order on (name, value) pairs; the order of metrics within a
// family in Collect() and SerializeText().
bool LabelsLess(const std::vector<ClientMetric::Label>& a,
                const std::vector<ClientMetric::Label>& b) {
  return std::lexicographical_compare(
      a.begin(), a.end(), b.begin(), b.end(),
      [](const ClientMetric::Label& x, const ClientMetric::Label& y) {
        if (x.name != y.name) return x.name < y.name;
        return x.value < y.value;
      });
}

// Atomically adds `delta` (std::atomic<double>::fetch_add is C++20).
void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta,
                                       std::memory_order_relaxed)) {
  }
}

// Label values escape backslash, double quote and newline; HELP text escapes
// only backslash and newline.
void AppendEscaped(std::string* out, absl::string_view text,
                   bool escape_quote) {
  for (char c : text) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '"':
        if (escape_quote) {
          out->append("\\\"");
        } else {
          out->push_back(c);
        }
        break;
      default:
        out->push_back(c);
    }
  }
}

// Appends one sample line: name+suffix{labels[,le="..."]} value.
void AppendSample(std::string* out, const std::string& name,
                  absl::string_view suffix,
                  const std::vector<ClientMetric::Label>& labels,
                  const std::string* le, absl::string_view value) {
  absl::StrAppend(out, name, suffix);
  if (!labels.empty() || le != nullptr) {
    out->push_back('{');
    bool first = true;
    for (const ClientMetric::Label& label : labels) {
      if (!first) out->push_back(',');
      first = false;
      absl::StrAppend(out, label.name, "=\"");
      AppendEscaped(out, label.value, /*escape_quote=*/true);
      out->push_back('"');
    }
    if (le != nullptr) {
      if (!first) out->push_back(',');
      absl::StrAppend(out, "le=\"", *le, "\"");
    }
    out->push_back('}');
  }
  absl::StrAppend(out, " ", value, "\n");
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendMetric(std::string* out, const std::string& name, MetricType type,
                  const ClientMetric& metric) {
  switch (type) {
    case MetricType::kCounter:
      AppendSample(out, name, "", metric.label, nullptr,
                   FormatValue(metric.counter.value));
      return;
    case MetricType::kGauge:
      AppendSample(out, name, "", metric.label, nullptr,
                   FormatValue(metric.gauge.value));
      return;
    case MetricType::kHistogram:
      for (const ClientMetric::Bucket& bucket : metric.histogram.bucket) {
        const std::string le = FormatValue(bucket.upper_bound);
        AppendSample(out, name, "_bucket", metric.label, &le,
                     absl::StrCat(bucket.cumulative_count));
      }
      AppendSample(out, name, "_sum", metric.label, nullptr,
                   FormatValue(metric.histogram.sample_sum));
      AppendSample(out, name, "_count", metric.label, nullptr,
                   absl::StrCat(metric.histogram.sample_count));
      return;
  }
}

// Whether an existing metric can be returned for an Add() with `candidate`'s
// construction arguments.
bool SameShape(const Counter&, const Counter&) { return true; }
bool SameShape(const Gauge&, const Gauge&) { return true; }
bool SameShape(const Histogram& a, const Histogram& b) {
  return a.boundaries() == b.boundaries();
}

Histogram::BucketBoundaries DropTrailingInf(Histogram::BucketBoundaries b) {
  if (!b.empty() && b.back() == std::numeric_limits<double>::infinity()) {
    b.pop_back();
  }
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------
// Names and values.

absl::Status ValidateMetricName(const std::string& name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) {
    const char c = name[i];
    ok = IsAsciiLetter(c) || c == '_' || c == ':' ||
         (i > 0 && IsAsciiDigit(c));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid metric name \"", name,
                     "\": must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelName(const std::string& name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) {
    const char c = name[i];
    ok = IsAsciiLetter(c) || c == '_' || (i > 0 && IsAsciiDigit(c));
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid label name \"", name,
                     "\": must match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid label name \"", name, "\": names starting with \"__\" "
        "are reserved for Prometheus"));
  }
  return absl::OkStatus();
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // 2^53: beyond it not every integer is representable, and the shortest
  // round-trip form ("1e+20") is the clearer one.
  constexpr double kMaxExactInteger = 9007199254740992.0;
  if (value == std::trunc(value) && std::fabs(value) < kMaxExactInteger) {
    return absl::StrCat(static_cast<int64_t>(value));  // -0.0 prints as "0".
  }
  char buffer[32];  // The shortest round-trip form needs at most 24.
  const std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// ---------------------------------------------------------------------------
// Counter, Gauge, Histogram.

void Counter::Increment(double value) {
  if (!(value >= 0.0)) return;  // Also rejects NaN.
  AtomicAdd(value_, value);
}

ClientMetric Counter::Collect() const {
  ClientMetric metric;
  metric.counter.value = Value();
  return metric;
}

void Gauge::Increment(double value) { AtomicAdd(value_, value); }

void Gauge::SetToCurrentTime(const Clock& clock) {
  // Whole seconds plus fraction: converting the full duration at once rounds
  // through nanoseconds as a double and is off by ~200ns at today's epoch.
  const absl::Time now = clock.Now();
  const int64_t seconds = absl::ToUnixSeconds(now);  // Floors.
  Set(static_cast<double>(seconds) +
      absl::ToDoubleSeconds(now - absl::FromUnixSeconds(seconds)));
}

ClientMetric Gauge::Collect() const {
  ClientMetric metric;
  metric.gauge.value = Value();
  return metric;
}

Histogram::Histogram(BucketBoundaries boundaries)
    : boundaries_(DropTrailingInf(std::move(boundaries))),
      bucket_counts_(boundaries_.size() + 1, 0) {
  absl::Status status = ValidateBoundaries(boundaries_);
  if (!status.ok()) internal::Die(status);
}

absl::Status Histogram::ValidateBoundaries(
    const BucketBoundaries& boundaries) {
  const BucketBoundaries finite = DropTrailingInf(boundaries);
  for (size_t i = 0; i < finite.size(); ++i) {
    if (!std::isfinite(finite[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram bucket boundary ", i, " is ",
                       FormatValue(finite[i]), "; bounds must be finite"));
    }
    if (i > 0 && !(finite[i - 1] < finite[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram bucket boundaries must be strictly increasing, but ",
          FormatValue(finite[i - 1]), " is followed by ",
          FormatValue(finite[i])));
    }
  }
  return absl::OkStatus();
}

void Histogram::Observe(double value) {
  // First bound >= value, i.e. the bucket whose "le" admits it. NaN compares
  // false with everything, so send it to +Inf explicitly.
  const size_t index =
      std::isnan(value)
          ? boundaries_.size()
          : std::lower_bound(boundaries_.begin(), boundaries_.end(), value) -
                boundaries_.begin();
  absl::MutexLock lock(&mu_);
  ++bucket_counts_[index];
  sum_ += value;
}

ClientMetric Histogram::Collect() const {
  ClientMetric metric;
  absl::MutexLock lock(&mu_);
  uint64_t cumulative = 0;
  metric.histogram.bucket.reserve(bucket_counts_.size());
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    cumulative += bucket_counts_[i];
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = i < boundaries_.size()
                             ? boundaries_[i]
                             : std::numeric_limits<double>::infinity();
    metric.histogram.bucket.push_back(bucket);
  }
  metric.histogram.sample_count = cumulative;
  metric.histogram.sample_sum = sum_;
  return metric;
}

Histogram::BucketBoundaries ExponentialBuckets(double start, double factor,
                                               int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    internal::Die(absl::InvalidArgumentError(absl::StrCat(
        "ExponentialBuckets needs start > 0, factor > 1, count >= 1; got ",
        start, ", ", factor, ", ", count)));
  }
  Histogram::BucketBoundaries bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

Histogram::BucketBoundaries LinearBuckets(double start, double width,
                                          int count) {
  if (!(width > 0) || count < 1) {
    internal::Die(absl::InvalidArgumentError(absl::StrCat(
        "LinearBuckets needs width > 0, count >= 1; got ", width, ", ",
        count)));
  }
  Histogram::BucketBoundaries bounds;
  bounds.reserve(count);
  // start + i * width rather than repeated addition, so errors don't pile up.
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  return bounds;
}

// ---------------------------------------------------------------------------
// Family.

template <typename T>
Family<T>::Family(std::string name, std::string help, Labels constant_labels)
    : name_(std::move(name)),
      help_(std::move(help)),
      constant_labels_(std::move(constant_labels)) {}

template <typename T>
absl::StatusOr<T*> Family<T>::AddMetric(const Labels& labels,
                                        std::unique_ptr<T> candidate) {
  for (const auto& [label_name, value] : labels) {
    absl::Status status = ValidateLabelName(label_name);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": ", status.message()));
    }
    if (constant_labels_.count(label_name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": label \"", label_name,
                       "\" is already a constant label of the family"));
    }
    if (std::is_same_v<T, Histogram> && label_name == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": label \"le\" is reserved for histogram buckets"));
    }
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = metrics_.try_emplace(labels, nullptr);
  if (inserted) {
    it->second = std::move(candidate);
  } else if (!SameShape(*it->second, *candidate)) {
    return absl::AlreadyExistsError(absl::StrCat(
        name_, ": a metric with these labels exists with other buckets"));
  }
  return it->second.get();
}

template <typename T>
void Family<T>::Remove(T* metric) {
  absl::MutexLock lock(&mu_);
  for (auto it = metrics_.begin(); it != metrics_.end(); ++it) {
    if (it->second.get() == metric) {
      metrics_.erase(it);
      return;
    }
  }
}

template <typename T>
int Family<T>::RemoveMatching(const Labels& subset) {
  absl::MutexLock lock(&mu_);
  int removed = 0;
  for (auto it = metrics_.begin(); it != metrics_.end();) {
    const Labels& labels = it->first;
    const bool match = std::all_of(subset.begin(), subset.end(), [&](const auto& kv) {
      auto found = labels.find(kv.first);
      return found != labels.end() && found->second == kv.second;
    });
    if (match) {
      it = metrics_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
bool Family<T>::Has(const Labels& labels) const {
  absl::MutexLock lock(&mu_);
  return metrics_.count(labels) > 0;
}

template <typename T>
std::vector<MetricFamily> Family<T>::Collect() const {
  MetricFamily family;
  family.name = name_;
  family.help = help_;
  family.type = T::kType;
  {
    absl::MutexLock lock(&mu_);
    if (metrics_.empty()) return {};
    family.metric.reserve(metrics_.size());
    for (const auto& [labels, metric] : metrics_) {
      ClientMetric client = metric->Collect();
      Labels all = constant_labels_;
      all.insert(labels.begin(), labels.end());  // Disjoint, checked in Add.
      client.label.reserve(all.size());
      for (const auto& [label_name, value] : all) {
        client.label.push_back({label_name, value});
      }
      family.metric.push_back(std::move(client));
    }
  }
  std::sort(family.metric.begin(), family.metric.end(),
            [](const ClientMetric& a, const ClientMetric& b) {
              return LabelsLess(a.label, b.label);
            });
  std::vector<MetricFamily> result;
  result.push_back(std::move(family));
  return result;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------
// Registry.

struct Registry::Entry {
  MetricType type;
  std::string help;
  Labels constant_labels;
  std::unique_ptr<Collectable> family;  // A Family<T> with T::kType == type.
};

Registry::Registry() = default;
Registry::~Registry() = default;

template <typename T>
absl::StatusOr<Family<T>*> Registry::AddFamily(const std::string& name,
                                               const std::string& help,
                                               const Labels& constant_labels) {
  absl::Status status = ValidateMetricName(name);
  if (!status.ok()) return status;
  for (const auto& [label_name, value] : constant_labels) {
    status = ValidateLabelName(label_name);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", status.message()));
    }
    if (T::kType == MetricType::kHistogram && label_name == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": label \"le\" is reserved for histogram buckets"));
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const Entry& entry = *it->second;
    if (entry.type != T::kType || entry.help != help ||
        entry.constant_labels != constant_labels) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric family \"", name, "\" is already registered as a ",
          TypeName(entry.type), " with different help or constant labels"));
    }
    return static_cast<Family<T>*>(entry.family.get());
  }
  auto entry = std::make_unique<Entry>();
  entry->type = T::kType;
  entry->help = help;
  entry->constant_labels = constant_labels;
  auto family = std::make_unique<Family<T>>(name, help, constant_labels);
  Family<T>* result = family.get();
  entry->family = std::move(family);
  families_.emplace(name, std::move(entry));
  return result;
}

int Registry::RemoveMatching(const Labels& subset) {
  absl::MutexLock lock(&mu_);
  int removed = 0;
  for (auto& [name, entry] : families_) removed += entry->family->RemoveMatching(subset);
  return removed;
}

std::vector<MetricFamily> Registry::Collect() const {
  std::vector<MetricFamily> result;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : families_) {
    for (MetricFamily& family : entry->family->Collect()) {
      result.push_back(std::move(family));
    }
  }
  return result;
}

// ---------------------------------------------------------------------------
// Builder.

template <typename T>
Builder<T>& Builder<T>::Name(const std::string& name) {
  name_ = name;
  return *this;
}

template <typename T>
Builder<T>& Builder<T>::Help(const std::string& help) {
  help_ = help;
  return *this;
}

template <typename T>
Builder<T>& Builder<T>::Labels(
    const std::map<std::string, std::string>& labels) {
  labels_ = labels;
  return *this;
}

template <typename T>
Family<T>& Builder<T>::Register(Registry& registry) {
  absl::StatusOr<Family<T>*> family = TryRegister(registry);
  if (!family.ok()) internal::Die(family.status());
  return **family;
}

template <typename T>
absl::StatusOr<Family<T>*> Builder<T>::TryRegister(Registry& registry) {
  return registry.AddFamily<T>(name_, help_, labels_);
}

template class Builder<Counter>;
template class Builder<Gauge>;
template class Builder<Histogram>;

Builder<Counter> BuildCounter() { return {}; }
Builder<Gauge> BuildGauge() { return {}; }
Builder<Histogram> BuildHistogram() { return {}; }

// ---------------------------------------------------------------------------
// Text format.

std::string SerializeText(const std::vector<MetricFamily>& families) {
  // Group by name; the first family of a name fixes type and help.
  struct Group {
    const MetricFamily* first;
    std::vector<const ClientMetric*> metrics;
  };
  std::map<std::string, Group> groups;
  for (const MetricFamily& family : families) {
    auto [it, inserted] = groups.try_emplace(family.name, Group{&family, {}});
    if (!inserted && it->second.first->type != family.type) continue;
    for (const ClientMetric& metric : family.metric) {
      it->second.metrics.push_back(&metric);
    }
  }

  std::string out;
  for (auto& [name, group] : groups) {
    if (group.metrics.empty()) continue;
    std::stable_sort(group.metrics.begin(), group.metrics.end(),
                     [](const ClientMetric* a, const ClientMetric* b) {
                       return LabelsLess(a->label, b->label);
                     });
    const MetricFamily& family = *group.first;
    if (!family.help.empty()) {
      absl::StrAppend(&out, "# HELP ", name, " ");
      AppendEscaped(&out, family.help, /*escape_quote=*/false);
      out.push_back('\n');
    }
    absl::StrAppend(&out, "# TYPE ", name, " ", TypeName(family.type), "\n");
    for (const ClientMetric* metric : group.metrics) {
      AppendMetric(&out, name, family.type, *metric);
    }
  }
  return out;
}

}  // namespace metrics
}  // namespace loom
