#include "controller/jobs/job_state_machine.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using loom::v1::JobState;

// The whole table, pair by pair: what the header promises, and nothing else.
TEST(JobStateMachineTest, EveryPairOfStatesIsLegalExactlyWhenTheTableSaysSo) {
  const std::set<std::pair<JobState, JobState>> want = {
      {loom::v1::JOB_STATE_UNSPECIFIED, loom::v1::PENDING},
      {loom::v1::PENDING, loom::v1::SCHEDULED},     {loom::v1::PENDING, loom::v1::PENDING},
      {loom::v1::PENDING, loom::v1::FAILED},        {loom::v1::PENDING, loom::v1::CANCELLED},
      {loom::v1::PREEMPTED, loom::v1::SCHEDULED},   {loom::v1::PREEMPTED, loom::v1::PENDING},
      {loom::v1::PREEMPTED, loom::v1::FAILED},      {loom::v1::PREEMPTED, loom::v1::CANCELLED},
      {loom::v1::SCHEDULED, loom::v1::RUNNING},     {loom::v1::SCHEDULED, loom::v1::PENDING},
      {loom::v1::SCHEDULED, loom::v1::PREEMPTED},   {loom::v1::SCHEDULED, loom::v1::SUCCEEDED},
      {loom::v1::SCHEDULED, loom::v1::FAILED},      {loom::v1::SCHEDULED, loom::v1::CANCELLED},
      {loom::v1::RUNNING, loom::v1::PENDING},       {loom::v1::RUNNING, loom::v1::PREEMPTED},
      {loom::v1::RUNNING, loom::v1::SUCCEEDED},     {loom::v1::RUNNING, loom::v1::FAILED},
      {loom::v1::RUNNING, loom::v1::CANCELLED},
  };
  const auto* states = loom::v1::JobState_descriptor();
  int pairs = 0;
  for (int i = 0; i < states->value_count(); ++i) {
    for (int j = 0; j < states->value_count(); ++j) {
      const auto from = static_cast<JobState>(states->value(i)->number());
      const auto to = static_cast<JobState>(states->value(j)->number());
      EXPECT_EQ(IsLegalTransition(from, to), want.count({from, to}) == 1)
          << loom::v1::JobState_Name(from) << " -> " << loom::v1::JobState_Name(to);
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, states->value_count() * states->value_count());
  const auto legal = LegalTransitions();
  const std::set<std::pair<JobState, JobState>> listed(legal.begin(), legal.end());
  EXPECT_EQ(listed, want);
}

TEST(JobStateMachineTest, AnEndedJobGoesNowhere) {
  for (JobState ended : {loom::v1::SUCCEEDED, loom::v1::FAILED, loom::v1::CANCELLED}) {
    for (const auto& [from, to] : LegalTransitions()) EXPECT_NE(from, ended);
  }
  EXPECT_EQ(DescribeIllegalTransition(loom::v1::SUCCEEDED, loom::v1::PENDING),
            "SUCCEEDED -> PENDING is not a transition a job makes (from SUCCEEDED: none, it "
            "has ended)");
  EXPECT_EQ(DescribeIllegalTransition(loom::v1::RUNNING, loom::v1::SCHEDULED),
            "RUNNING -> SCHEDULED is not a transition a job makes (from RUNNING: PENDING, "
            "SUCCEEDED, FAILED, CANCELLED, PREEMPTED)");
}

}  // namespace
}  // namespace loom::controller
