#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Text(const Registry& registry) {
  return SerializeText(registry.Collect());
}

TEST(FormatValueTest, MatchesPrometheusSpelling) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(-2.5), "-2.5");
  EXPECT_EQ(FormatValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(kInf), "+Inf");
  EXPECT_EQ(FormatValue(-kInf), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  // Shortest form that reads back exactly.
  EXPECT_EQ(std::stod(FormatValue(0.1 + 0.2)), 0.1 + 0.2);
}

TEST(CounterTest, SerializesWithConstantAndVariableLabels) {
  Registry registry;
  auto& family = BuildCounter()
                     .Name("loom_worker_tokens_total")
                     .Help("Tokens processed.")
                     .Labels({{"worker", "w0"}})
                     .Register(registry);
  family.Add({{"phase", "train"}}).Increment(4096);
  family.Add({{"phase", "eval"}}).Increment();
  family.Add({{"phase", "eval"}}).Increment(0.5);

  EXPECT_EQ(Text(registry),
            "# HELP loom_worker_tokens_total Tokens processed.\n"
            "# TYPE loom_worker_tokens_total counter\n"
            "loom_worker_tokens_total{phase=\"eval\",worker=\"w0\"} 1.5\n"
            "loom_worker_tokens_total{phase=\"train\",worker=\"w0\"} 4096\n");
}

TEST(CounterTest, IgnoresNegativeAndNanIncrements) {
  Counter counter;
  counter.Increment(2);
  counter.Increment(-1);
  counter.Increment(std::nan(""));
  EXPECT_EQ(counter.Value(), 2);
}

TEST(GaugeTest, SetIncrementDecrementAndTime) {
  Registry registry;
  auto& family =
      BuildGauge().Name("loom_queue_depth").Help("Queued jobs.").Register(
          registry);
  Gauge& gauge = family.Add({});
  gauge.Set(10);
  gauge.Increment();
  gauge.Increment(4);
  gauge.Decrement(2.5);
  EXPECT_EQ(gauge.Value(), 12.5);
  EXPECT_EQ(Text(registry),
            "# HELP loom_queue_depth Queued jobs.\n"
            "# TYPE loom_queue_depth gauge\n"
            "loom_queue_depth 12.5\n");

  FakeClock clock(absl::FromUnixMillis(1700000000250));
  gauge.SetToCurrentTime(clock);
  EXPECT_EQ(gauge.Value(), 1700000000.25);

  gauge.Set(-kInf);
  EXPECT_THAT(Text(registry), HasSubstr("loom_queue_depth -Inf\n"));
  gauge.Set(std::nan(""));
  EXPECT_THAT(Text(registry), HasSubstr("loom_queue_depth NaN\n"));
}

TEST(HistogramTest, SerializesCumulativeBucketsSumAndCount) {
  Registry registry;
  auto& family = BuildHistogram()
                     .Name("loom_step_time_seconds")
                     .Help("Time per training step.")
                     .Register(registry);
  Histogram& histogram = family.Add({{"job", "a"}}, Histogram::BucketBoundaries{
                                                        0.1, 1, 10});
  // 0.1 sits exactly on a bound: "le" means less-or-equal.
  for (double v : {0.05, 0.1, 0.5, 5.0, 100.0}) histogram.Observe(v);

  EXPECT_EQ(Text(registry),
            "# HELP loom_step_time_seconds Time per training step.\n"
            "# TYPE loom_step_time_seconds histogram\n"
            "loom_step_time_seconds_bucket{job=\"a\",le=\"0.1\"} 2\n"
            "loom_step_time_seconds_bucket{job=\"a\",le=\"1\"} 3\n"
            "loom_step_time_seconds_bucket{job=\"a\",le=\"10\"} 4\n"
            "loom_step_time_seconds_bucket{job=\"a\",le=\"+Inf\"} 5\n"
            "loom_step_time_seconds_sum{job=\"a\"} 105.65\n"
            "loom_step_time_seconds_count{job=\"a\"} 5\n");
}

TEST(HistogramTest, UnlabelledEmptyHistogramHasOnlyInfBucket) {
  Registry registry;
  BuildHistogram().Name("h").Help("x").Register(registry).Add(
      {}, Histogram::BucketBoundaries{});
  EXPECT_EQ(Text(registry),
            "# HELP h x\n"
            "# TYPE h histogram\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\n"
            "h_count 0\n");
}

TEST(HistogramTest, SnapshotIsCumulative) {
  Histogram histogram({1, 2, 3});
  histogram.Observe(2);
  histogram.Observe(2);
  histogram.Observe(3);
  histogram.Observe(std::nan(""));  // +Inf bucket only.
  ClientMetric::Histogram h = histogram.Collect().histogram;
  ASSERT_EQ(h.bucket.size(), 4u);
  EXPECT_EQ(h.bucket[0].cumulative_count, 0u);
  EXPECT_EQ(h.bucket[1].cumulative_count, 2u);
  EXPECT_EQ(h.bucket[2].cumulative_count, 3u);
  EXPECT_EQ(h.bucket[3].cumulative_count, 4u);
  EXPECT_EQ(h.bucket[3].upper_bound, kInf);
  EXPECT_EQ(h.sample_count, 4u);
  EXPECT_TRUE(std::isnan(h.sample_sum));
}

TEST(HistogramTest, BoundariesValidation) {
  EXPECT_TRUE(Histogram::ValidateBoundaries({}).ok());
  EXPECT_TRUE(Histogram::ValidateBoundaries({-1, 0, 1}).ok());
  EXPECT_TRUE(Histogram::ValidateBoundaries({1, kInf}).ok());
  EXPECT_EQ(Histogram::ValidateBoundaries({1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBoundaries({2, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBoundaries({std::nan(""), 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBoundaries({-kInf, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  // A trailing +Inf is dropped: it is the implicit last bucket.
  EXPECT_THAT(Histogram({1, kInf}).boundaries(), ElementsAre(1));
}

TEST(HistogramTest, BucketHelpers) {
  EXPECT_THAT(ExponentialBuckets(0.5, 2, 4), ElementsAre(0.5, 1, 2, 4));
  EXPECT_THAT(LinearBuckets(-1, 0.5, 3), ElementsAre(-1, -0.5, 0));
}

TEST(EscapingTest, LabelValuesEscapeBackslashQuoteNewline) {
  Registry registry;
  BuildGauge()
      .Name("g")
      .Help("Help with \\ backslash,\nnewline and \"quotes\".")
      .Register(registry)
      .Add({{"path", "C:\\dir \"x\"\nnext"}})
      .Set(1);
  EXPECT_EQ(Text(registry),
            "# HELP g Help with \\\\ backslash,\\nnewline and \"quotes\".\n"
            "# TYPE g gauge\n"
            "g{path=\"C:\\\\dir \\\"x\\\"\\nnext\"} 1\n");
}

TEST(FamilyTest, SameLabelsReturnSameObject) {
  Registry registry;
  auto& family = BuildCounter().Name("c_total").Help("c").Register(registry);
  Counter& a = family.Add({{"x", "1"}, {"y", "2"}});
  Counter& b = family.Add({{"y", "2"}, {"x", "1"}});
  Counter& c = family.Add({{"x", "1"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  a.Increment(3);
  EXPECT_EQ(b.Value(), 3);
  EXPECT_TRUE(family.Has({{"x", "1"}}));
}

TEST(FamilyTest, RemoveDropsMetricAndAddRecreatesIt) {
  Registry registry;
  auto& family = BuildCounter().Name("c_total").Help("c").Register(registry);
  Counter& keep = family.Add({{"x", "keep"}});
  Counter& gone = family.Add({{"x", "gone"}});
  keep.Increment();
  gone.Increment(7);
  family.Remove(&gone);
  family.Remove(nullptr);  // Ignored.
  EXPECT_FALSE(family.Has({{"x", "gone"}}));
  EXPECT_EQ(Text(registry),
            "# HELP c_total c\n"
            "# TYPE c_total counter\n"
            "c_total{x=\"keep\"} 1\n");
  EXPECT_EQ(family.Add({{"x", "gone"}}).Value(), 0);

  // A family whose last metric is removed disappears from the output.
  family.Remove(&keep);
  family.Remove(&family.Add({{"x", "gone"}}));
  EXPECT_EQ(Text(registry), "");
}

// An ended rank's series go in one call, whatever other labels they carry;
// other ranks' and jobs' series stay.
TEST(RegistryTest, RemoveMatchingDropsEverySeriesWithTheLabels) {
  Registry registry;
  auto& phase = BuildGauge().Name("phase_seconds").Help("p").Register(registry);
  auto& tokens = BuildCounter().Name("tokens_total").Help("t").Register(registry);
  auto& jobs = BuildGauge().Name("job_gauge").Help("j").Register(registry);
  for (const char* p : {"forward", "backward", "pipeline_wait"}) {
    phase.Add({{"job_id", "a"}, {"rank", "0"}, {"phase", p}}).Set(1);
    phase.Add({{"job_id", "a"}, {"rank", "1"}, {"phase", p}}).Set(1);
  }
  tokens.Add({{"job_id", "a"}, {"rank", "0"}}).Increment();
  tokens.Add({{"job_id", "b"}, {"rank", "0"}}).Increment();
  jobs.Add({{"job_id", "a"}}).Set(3);
  EXPECT_EQ(registry.RemoveMatching({{"job_id", "a"}, {"rank", "0"}}), 4);
  EXPECT_FALSE(phase.Has({{"job_id", "a"}, {"rank", "0"}, {"phase", "pipeline_wait"}}));
  EXPECT_TRUE(phase.Has({{"job_id", "a"}, {"rank", "1"}, {"phase", "pipeline_wait"}}));
  EXPECT_FALSE(tokens.Has({{"job_id", "a"}, {"rank", "0"}}));
  EXPECT_TRUE(tokens.Has({{"job_id", "b"}, {"rank", "0"}}));
  EXPECT_TRUE(jobs.Has({{"job_id", "a"}}));  // has no rank label
  EXPECT_EQ(jobs.RemoveMatching({{"job_id", "a"}}), 1);
  EXPECT_EQ(registry.RemoveMatching({{"job_id", "zzz"}}), 0);
  // The empty subset matches everything.
  EXPECT_EQ(registry.RemoveMatching({}), 4);
  EXPECT_EQ(Text(registry), "");
}

TEST(FamilyTest, HistogramWithSameLabelsButOtherBucketsIsAnError) {
  Registry registry;
  auto& family = BuildHistogram().Name("h").Help("h").Register(registry);
  Histogram& first = family.Add({}, Histogram::BucketBoundaries{1, 2});
  absl::StatusOr<Histogram*> same =
      family.TryAdd({}, Histogram::BucketBoundaries{1, 2});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, &first);
  EXPECT_EQ(family.TryAdd({}, Histogram::BucketBoundaries{1, 3}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(FamilyTest, InvalidLabelsAreRejected) {
  Registry registry;
  auto& counters = BuildCounter()
                       .Name("c_total")
                       .Help("c")
                       .Labels({{"worker", "w0"}})
                       .Register(registry);
  EXPECT_EQ(counters.TryAdd({{"bad-name", "v"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(counters.TryAdd({{"0x", "v"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(counters.TryAdd({{"__reserved", "v"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(counters.TryAdd({{"worker", "w1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(counters.TryAdd({{"le", "ok on a counter"}}).ok());
  // Label values are free-form.
  EXPECT_TRUE(counters.TryAdd({{"_x9", "any thing: \xc3\xa9"}}).ok());

  auto& histograms = BuildHistogram().Name("h").Help("h").Register(registry);
  EXPECT_EQ(histograms.TryAdd({{"le", "1"}}, Histogram::BucketBoundaries{1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, ValidatesNames) {
  Registry registry;
  for (const char* bad : {"", "1abc", "a-b", "a b", "caf\xc3\xa9"}) {
    EXPECT_EQ(BuildCounter().Name(bad).Help("x").TryRegister(registry)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  for (const char* good : {"a", "_a", ":a", "loom:rule:rate5m", "a_1"}) {
    EXPECT_TRUE(BuildGauge().Name(good).Help("x").TryRegister(registry).ok())
        << good;
  }
  EXPECT_EQ(BuildGauge()
                .Name("g2")
                .Labels({{"__name__", "x"}})
                .TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildHistogram()
                .Name("h2")
                .Labels({{"le", "x"}})
                .TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, ReRegistrationMergesOnlyIdenticalFamilies) {
  Registry registry;
  auto& first = BuildCounter().Name("c_total").Help("c").Register(registry);
  auto& again = BuildCounter().Name("c_total").Help("c").Register(registry);
  EXPECT_EQ(&first, &again);
  EXPECT_EQ(BuildGauge().Name("c_total").Help("c").TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(BuildCounter().Name("c_total").Help("other").TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(BuildCounter()
                .Name("c_total")
                .Help("c")
                .Labels({{"a", "b"}})
                .TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(RegistryTest, OutputIsSortedAndSkipsEmptyFamiliesAndEmptyHelp) {
  Registry registry;
  BuildGauge().Name("zeta").Help("z").Register(registry).Add({}).Set(1);
  BuildGauge().Name("empty").Help("never used").Register(registry);
  auto& alpha = BuildCounter().Name("alpha_total").Register(registry);
  alpha.Add({{"k", "b"}}).Increment(2);
  alpha.Add({{"k", "a"}}).Increment(1);
  alpha.Add({}).Increment(3);
  EXPECT_EQ(Text(registry),
            "# TYPE alpha_total counter\n"
            "alpha_total 3\n"
            "alpha_total{k=\"a\"} 1\n"
            "alpha_total{k=\"b\"} 2\n"
            "# HELP zeta z\n"
            "# TYPE zeta gauge\n"
            "zeta 1\n");
}

TEST(SerializeTextTest, MergesSameNameFamiliesAndDropsTypeConflicts) {
  Registry a;
  Registry b;
  BuildCounter().Name("x_total").Help("from a").Register(a).Add({{"r", "a"}})
      .Increment();
  BuildCounter().Name("x_total").Help("from b").Register(b).Add({{"r", "0"}})
      .Increment(2);
  BuildGauge().Name("y").Help("gauge in a").Register(a).Add({}).Set(1);
  BuildCounter().Name("y").Help("counter in b").Register(b).Add({}).Increment();

  std::vector<MetricFamily> families = a.Collect();
  for (MetricFamily& family : b.Collect()) families.push_back(family);
  EXPECT_EQ(SerializeText(families),
            "# HELP x_total from a\n"
            "# TYPE x_total counter\n"
            "x_total{r=\"0\"} 2\n"
            "x_total{r=\"a\"} 1\n"
            "# HELP y gauge in a\n"
            "# TYPE y gauge\n"
            "y 1\n");
}

TEST(ConcurrencyTest, ParallelUpdatesAreExact) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  Registry registry;
  auto& counters = BuildCounter().Name("c_total").Help("c").Register(registry);
  auto& gauges = BuildGauge().Name("g").Help("g").Register(registry);
  auto& histograms = BuildHistogram().Name("h").Help("h").Register(registry);

  std::vector<Counter*> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Every thread races to create the same metrics.
      Counter& counter = counters.Add({{"k", "shared"}});
      Gauge& gauge = gauges.Add({{"k", "shared"}});
      Histogram& histogram =
          histograms.Add({{"k", "shared"}}, Histogram::BucketBoundaries{0.5});
      seen[t] = &counter;
      for (int i = 0; i < kIterations; ++i) {
        counter.Increment();
        gauge.Increment(2);
        gauge.Decrement();
        histogram.Observe(i % 2);  // Half in le=0.5, half above.
        if (i % 1000 == 0) registry.Collect();  // Scrapes race with writes.
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  for (Counter* counter : seen) EXPECT_EQ(counter, seen[0]);
  constexpr double kTotal = double{kThreads} * kIterations;
  EXPECT_EQ(counters.Add({{"k", "shared"}}).Value(), kTotal);
  EXPECT_EQ(gauges.Add({{"k", "shared"}}).Value(), kTotal);
  ClientMetric::Histogram h =
      histograms.Add({{"k", "shared"}}, Histogram::BucketBoundaries{0.5})
          .Collect()
          .histogram;
  EXPECT_EQ(h.sample_count, kThreads * kIterations);
  EXPECT_EQ(h.bucket[0].cumulative_count, kThreads * kIterations / 2);
  EXPECT_EQ(h.sample_sum, kTotal / 2);
}

TEST(MetricsDeathTest, ProgrammerErrorsAbortWithAMessage) {
  Registry registry;
  EXPECT_DEATH(BuildCounter().Name("bad name").Register(registry),
               "invalid metric name \"bad name\"");
  auto& family = BuildCounter().Name("c_total").Register(registry);
  EXPECT_DEATH(family.Add({{"bad-label", "v"}}),
               "invalid label name \"bad-label\"");
  EXPECT_DEATH(Histogram({2, 1}), "strictly increasing");
  EXPECT_DEATH(ExponentialBuckets(0, 2, 3), "ExponentialBuckets");
}

}  // namespace
}  // namespace metrics
}  // namespace loom
