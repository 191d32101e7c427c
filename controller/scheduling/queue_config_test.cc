#include "controller/scheduling/queue_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& yaml) {
  auto config = ParseQueueConfig(yaml);
  EXPECT_FALSE(config.ok()) << yaml;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(QueueConfigTest, FullFileParses) {
  auto config = ParseQueueConfig(R"(
fair_share:
  half_life_seconds: 600
preemption:
  grace_seconds: 45
  min_run_time_seconds: 120
priority_classes:
  low: -10
  urgent: 1000
queues:
  - name: research
    cohort: shared
    nominal_quota: {slots: 16, gpus: 8}
    borrowing_limit: {slots: 8}
    weight: 2
  - name: prod
    cohort: shared
    nominal_quota: {slots: 8, gpus: 0}
    preemption: false
)");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->fair_share_half_life, absl::Seconds(600));
  EXPECT_EQ(config->preemption_grace, absl::Seconds(45));
  EXPECT_EQ(config->min_run_time, absl::Seconds(120));
  ASSERT_EQ(config->queues.size(), 3u);  // `default` added
  const QueueSpec* research = config->Find("research");
  ASSERT_NE(research, nullptr);
  EXPECT_EQ(research->cohort, "shared");
  EXPECT_EQ(research->nominal_quota, (Resources{16, 8}));
  EXPECT_EQ(research->borrowing_limit, (Resources{8, kUnlimited}));
  EXPECT_EQ(research->Limit(), (Resources{24, kUnlimited}));
  EXPECT_DOUBLE_EQ(research->weight, 2);
  EXPECT_TRUE(research->preemption);
  EXPECT_FALSE(config->Find("prod")->preemption);
  EXPECT_EQ(config->CohortCapacity("shared"), (Resources{24, 8}));
  const QueueSpec* def = config->Find("default");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->nominal_quota, Resources::Unlimited());
  EXPECT_TRUE(def->preemption);  // on by default, the local cluster's default queue included
  EXPECT_EQ(*config->ResolvePriority("urgent"), 1000);
  EXPECT_EQ(*config->ResolvePriority("-3"), -3);
  EXPECT_EQ(*config->ResolvePriority(""), 0);
  EXPECT_EQ((*config->ResolveQueue(""))->name, "default");
}

TEST(QueueConfigTest, DefaultsWithoutAFile) {
  auto config = ParseQueueConfig("");
  ASSERT_TRUE(config.ok());
  ASSERT_EQ(config->queues.size(), 1u);
  EXPECT_EQ(config->queues[0].name, "default");
  EXPECT_EQ(config->preemption_grace, absl::Seconds(30));
  EXPECT_GT(config->min_run_time, absl::ZeroDuration());
}

TEST(QueueConfigTest, DefaultQueueMayBeConfigured) {
  auto config = ParseQueueConfig("queues:\n  - name: default\n    nominal_quota: {slots: 4}\n");
  ASSERT_TRUE(config.ok());
  ASSERT_EQ(config->queues.size(), 1u);
  EXPECT_EQ(config->queues[0].nominal_quota, (Resources{4, kUnlimited}));
}

TEST(QueueConfigTest, ErrorsNameTheFieldPath) {
  EXPECT_EQ(ErrorOf("queues:\n  - name: a\n  - name: b\n  - name: c\n"
                    "    nominal_quota: {slots: -1}\n"),
            "queues[2].nominal_quota.slots: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf("queues:\n  - name: a\n    nominal_quota: {slots: many}\n"),
            "queues[0].nominal_quota.slots: expected an integer, got \"many\"");
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    weight: 0\n"),
              HasSubstr("queues[0].weight: must be > 0"));
  EXPECT_EQ(ErrorOf("queues:\n  - cohort: x\n"), "queues[0].name: required");
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n  - name: a\n"),
              HasSubstr("queues[1].name: queue \"a\" is defined more than once"));
  EXPECT_THAT(ErrorOf("queues:\n  - name: Bad Name\n"), HasSubstr("queues[0].name: \"Bad Name\""));
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    borrowing_limit: {slots: 2}\n"),
              HasSubstr("queues[0].borrowing_limit: needs a cohort"));
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    preemption: maybe\n"),
              HasSubstr("queues[0].preemption: expected true or false"));
  EXPECT_THAT(ErrorOf("fair_share:\n  half_life_seconds: 0\n"),
              HasSubstr("fair_share.half_life_seconds: must be > 0"));
  EXPECT_THAT(ErrorOf("preemption:\n  grace_seconds: -1\n"),
              HasSubstr("preemption.grace_seconds: must be >= 0"));
  EXPECT_THAT(ErrorOf("priority_classes:\n  high: soon\n"),
              HasSubstr("priority_classes.high: expected an integer"));
  EXPECT_THAT(ErrorOf("queues: {name: a}\n"), HasSubstr("queues: expected a list"));
  EXPECT_THAT(ErrorOf("queues: [\n"), HasSubstr("queue config: invalid YAML"));
}

TEST(QueueConfigTest, UnknownAndRepeatedKeysAreErrors) {
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    nominal_quota: {slot: 4}\n"),
              HasSubstr("queues[0].nominal_quota.slot: unknown field (known: slots, gpus)"));
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    wieght: 2\n"),
              HasSubstr("queues[0].wieght: unknown field"));
  EXPECT_THAT(ErrorOf("fairshare:\n  half_life_seconds: 10\n"),
              HasSubstr("fairshare: unknown field"));
  EXPECT_THAT(ErrorOf("queues:\n  - name: a\n    weight: 1\n    weight: 2\n"),
              HasSubstr("queues[0].weight: given more than once"));
}

TEST(QueueConfigTest, JobFieldsResolveWithTheirPath) {
  auto config = ParseQueueConfig("priority_classes: {low: 0, high: 10}\nqueues: [{name: a}]\n");
  ASSERT_TRUE(config.ok());
  auto bad_queue = config->ResolveQueue("b");
  EXPECT_EQ(bad_queue.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_queue.status().message(),
            "scheduling.queue: unknown queue \"b\" (queues: a, default)");
  auto bad_priority = config->ResolvePriority("urgent");
  EXPECT_EQ(bad_priority.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_priority.status().message(),
              HasSubstr("scheduling.priority: \"urgent\" is neither an integer nor a priority "
                        "class (classes: high, low)"));
}

TEST(QueueConfigTest, SubmitRolesNameWhoMaySubmit) {
  absl::StatusOr<QueueConfig> config = ParseQueueConfig(
      "queues:\n  - name: prod\n    submit_roles: [admin]\n  - name: research\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->Find("prod")->AcceptsRole("admin"));
  EXPECT_FALSE(config->Find("prod")->AcceptsRole("user"));
  EXPECT_TRUE(config->Find("research")->AcceptsRole("user"));
  EXPECT_TRUE(config->Find("default")->AcceptsRole("user"));
  EXPECT_EQ(ParseQueueConfig("queues:\n  - name: a\n    submit_roles: [reader]\n").status().message(),
            "queues[0].submit_roles[0]: expected user or admin (the roles that may submit), got "
            "\"reader\"");
  EXPECT_EQ(ParseQueueConfig("queues:\n  - name: a\n    submit_roles: []\n").status().message(),
            "queues[0].submit_roles: expected a list of roles (user, admin), got a list");
}

}  // namespace
}  // namespace loom::scheduling
