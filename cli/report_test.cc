#include "cli/report.h"

#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

loom::v1::Job SampleJob() {
  loom::v1::Job job;
  job.set_id("llama-<x>-1");
  job.set_state(loom::v1::SUCCEEDED);
  job.set_submitted_by("alice");
  auto* m = job.mutable_spec()->mutable_model()->mutable_llama();
  m->set_n_layer(2);
  m->set_d_model(32);
  m->set_n_head(4);
  m->set_vocab_size(512);
  job.mutable_spec()->mutable_schedule()->set_total_steps(100);
  auto* e = job.add_events();
  e->set_kind(loom::v1::RecoveryEvent::ROLLBACK);
  e->set_step(40);
  e->set_message("loss spike <script>alert(1)</script>");
  e->mutable_skip()->set_begin(30);
  e->mutable_skip()->set_end(35);
  auto* r = job.add_ranks();
  r->set_rank(0);
  r->set_node("local-0");
  job.mutable_plan()->mutable_layout()->set_summary("tp 1 | pp 1 | dp 2");
  job.mutable_plan()->add_notes("fits & fast");
  return job;
}

std::vector<loom::v1::StepMetrics> SampleSteps(int n) {
  std::vector<loom::v1::StepMetrics> steps;
  for (int i = 1; i <= n; ++i) {
    loom::v1::StepMetrics m;
    m.set_step(i);
    m.set_loss(5.0 / i);
    m.set_data_batch(i - 1);
    m.set_tokens_per_second(1000 + i);
    m.set_mfu(0.1);
    m.set_rss_bytes(100000000);
    m.set_peak_rss_bytes(120000000);
    m.set_power_watts(30);
    m.set_energy_joules(10.0 * i);
    m.set_forward_seconds(0.01);
    m.set_backward_seconds(0.02);
    m.set_optimizer_seconds(0.003);
    m.set_time_unix_ms(1000 * i);
    if (i % 10 == 0) {
      m.set_has_val_loss(true);
      m.set_val_loss(5.5 / i);
    }
    steps.push_back(m);
  }
  return steps;
}

TEST(ReportTest, EveryChartHasDataAndThePageFetchesNothing) {
  loom::v1::CheckpointInfo c;
  c.set_step(50);
  c.set_status("committed");
  c.set_path("/ckpt/step-000000050");
  const std::string html = RenderJobReport(SampleJob(), SampleSteps(100), {c});
  std::smatch m;
  const std::regex chart("<svg class=\"chart\" id=\"(\\w+)\"");
  std::vector<std::string> ids;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), chart); it != std::sregex_iterator();
       ++it) {
    ids.push_back((*it)[1]);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"loss", "tokens", "mfu", "split", "memory", "power",
                                            "energy"}));
  EXPECT_THAT(html, HasSubstr("data-name=\"train loss\" data-points=\"100\""));
  EXPECT_THAT(html, HasSubstr("data-name=\"validation loss\" data-points=\"10\""));
  EXPECT_THAT(html, Not(HasSubstr("data-points=\"0\"")));
  EXPECT_THAT(html, Not(HasSubstr("no data")));
  // The rollback is a marker, its skipped batches a band.
  EXPECT_THAT(html, HasSubstr("class=\"marker\""));
  EXPECT_THAT(html, HasSubstr("data batches [30, 35) skipped"));
  // Self-contained: no URL is fetched.
  for (const char* fetch : {"src=", "href=", "@import", "url(", "http://", "https://"}) {
    EXPECT_THAT(html, Not(HasSubstr(fetch))) << fetch;
  }
  // Text from the job is escaped.
  EXPECT_THAT(html, Not(HasSubstr("<script>alert(1)")));
  EXPECT_THAT(html, HasSubstr("llama-&lt;x&gt;-1"));
  EXPECT_THAT(html, HasSubstr("fits &amp; fast"));
  EXPECT_THAT(html, HasSubstr("/ckpt/step-000000050"));
  // Where the wall time went: every goodput bucket, with ETTR.
  EXPECT_THAT(html, HasSubstr("<h2>Goodput</h2>"));
  EXPECT_THAT(html, HasSubstr("ETTR"));
  for (const char* bucket :
       {"queued", "preempted, waiting", "checkpoint restore", "productive steps", "data stall",
        "checkpoint-save stall", "evaluation", "redone", "unaccounted"}) {
    EXPECT_THAT(html, HasSubstr("<td>" + std::string(bucket))) << bucket;
  }
}

TEST(ReportTest, ReplayedStepsShowTheirLatestReportAndLongRunsAreThinned) {
  std::vector<loom::v1::StepMetrics> steps = SampleSteps(5000);
  loom::v1::StepMetrics replay = steps[10];  // step 11, reported again later
  replay.set_loss(42);
  replay.set_time_unix_ms(99999999);
  steps.push_back(replay);
  const std::string html = RenderJobReport(SampleJob(), steps, {});
  EXPECT_THAT(html, HasSubstr("data-name=\"train loss\" data-points=\"1200\""));
  EXPECT_THAT(html, HasSubstr("data-y1=\"44.1\""));  // 42 plus the 5% headroom
}

TEST(ReportTest, AJobWithoutStepsSaysNoData) {
  const std::string html = RenderJobReport(SampleJob(), {}, {});
  EXPECT_THAT(html, HasSubstr("no data"));
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
}

TEST(ReportTest, HtmlEscape) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
}

}  // namespace
}  // namespace loom::cli
