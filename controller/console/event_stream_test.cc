#include "controller/console/event_stream.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller::console {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

loom::v1::Job FullJob() {
  loom::v1::Job job;
  job.set_id("gpt-1");
  job.set_state(loom::v1::RUNNING);
  job.set_generation(2);
  job.mutable_spec()->set_name("gpt");
  job.mutable_summary()->set_last_step(41);
  job.add_history()->set_reason("submitted");
  return job;
}

// A logged event carries its seq as the SSE id and the whole job; a step
// has no id (it is not logged) and a job cut to what a page updates.
TEST(EventStreamTest, FormatsLoggedEventsWithTheirSeqAndStepsSlim) {
  loom::v1::JobEvent transition;
  transition.set_seq(7);
  transition.set_job_id("gpt-1");
  transition.mutable_transition()->set_to(loom::v1::RUNNING);
  *transition.mutable_job() = FullJob();
  const std::string t = EventStream::Format(transition);
  EXPECT_EQ(t.rfind("id: 7\nevent: transition\ndata: {", 0), 0u) << t;
  EXPECT_THAT(t, HasSubstr(R"("spec":{"name":"gpt")"));
  EXPECT_EQ(t.substr(t.size() - 2), "\n\n");
  EXPECT_EQ(t.find('\n', t.find("data: ")), t.size() - 2) << "one data line";

  loom::v1::JobEvent step;
  step.mutable_step()->set_step(42);
  step.mutable_step()->set_loss(2.5);
  *step.mutable_job() = FullJob();
  const std::string s = EventStream::Format(step);
  EXPECT_EQ(s.rfind("event: step\ndata: {", 0), 0u) << s;
  EXPECT_THAT(s, HasSubstr(R"("summary":{"last_step":"41"})"));
  EXPECT_THAT(s, HasSubstr(R"("generation":"2")"));
  EXPECT_THAT(s, Not(HasSubstr("spec")));
  EXPECT_THAT(s, Not(HasSubstr("history")));
}

}  // namespace
}  // namespace loom::controller::console
