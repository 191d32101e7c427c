// The job commands: submit, validate, list, status, cancel, events and
// rollback (cli/commands/commands.h). `watch` and `submit --follow` share
// the follower in cli/commands/watch.cc.
#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/commands/watch.h"
#include "common/jobspec.h"
#include "common/json_writer.h"
#include "controller/progress/data_ledger.h"
#include "controller/progress/goodput.h"
#include "controller/admission/job_planning.h"

namespace loom::cli {
namespace {

// "A:B" -> [A, B).
bool ParseSkipRange(const std::string& text, loom::v1::SkipRange* range) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  int64_t begin = 0, end = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &begin) ||
      !absl::SimpleAtoi(parts[1], &end)) {
    return false;
  }
  range->set_begin(begin);
  range->set_end(end);
  return true;
}

}  // namespace

int CmdSubmit(const Globals& g, const std::vector<std::string>& args) {
  std::string file;
  bool follow = false;
  for (const auto& a : args) {
    if (a == "--follow" || a == "-f") {
      follow = true;
    } else if (!a.empty() && a[0] == '-') {
      return Usage("submit: unknown flag " + a);
    } else if (file.empty()) {
      file = a;
    } else {
      return Usage("submit: one spec file at a time");
    }
  }
  if (file.empty()) return Usage("submit: missing FILE");
  auto spec = LoadJobSpecFile(file);
  if (!spec.ok()) return Fail(spec.status());
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = *spec;
  loom::v1::SubmitJobResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::SubmitJob, req, &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp.job()) << std::endl;
  } else {
    std::cout << "submitted " << resp.job().id() << std::endl;
  }
  if (follow) return Watch(client->get(), resp.job().id(), g.json);
  return 0;
}

int CmdValidate(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("validate: expected FILE");
  auto spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return Fail(spec.status());
  ApplyJobSpecDefaults(&*spec);
  absl::Status s = ValidateJobSpec(*spec);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(*spec) << std::endl;
  } else {
    std::cout << args[0] << ": valid" << std::endl;
  }
  return 0;
}

int CmdList(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::ListJobsRequest req;
  bool pending = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--pending") {
      pending = true;
      req.add_states(loom::v1::PENDING);
      req.add_states(loom::v1::PREEMPTED);
    } else if (args[i] == "--state" && i + 1 < args.size()) {
      loom::v1::JobState st;
      if (!loom::v1::JobState_Parse(args[++i], &st)) return Usage("list: unknown state " + args[i]);
      req.add_states(st);
    } else if (args[i] == "--queue" && i + 1 < args.size()) {
      req.set_queue(args[++i]);
    } else if (args[i] == "--user" && i + 1 < args.size()) {
      req.set_submitted_by(args[++i]);
    } else if (args[i] == "--name" && i + 1 < args.size()) {
      req.set_name_contains(args[++i]);
    } else {
      return Usage("list: unexpected " + args[i]);
    }
  }
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  // Page by page (summaries), so a long history never meets gRPC's 4 MiB.
  loom::v1::ListJobsResponse resp;
  req.set_page_size(500);
  do {
    loom::v1::ListJobsResponse page;
    absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListJobs, req, &page);
    if (!s.ok()) return Fail(s);
    for (auto& j : *page.mutable_jobs()) *resp.add_jobs() = std::move(j);
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  if (pending) {
    // The waiting jobs by queue, in the order they would start.
    std::vector<const loom::v1::Job*> waiting;
    for (const auto& j : resp.jobs()) waiting.push_back(&j);
    std::stable_sort(waiting.begin(), waiting.end(), [](const auto* a, const auto* b) {
      const std::string qa = a->spec().scheduling().queue(), qb = b->spec().scheduling().queue();
      if (qa != qb) return qa < qb;
      const int pa = a->queue_position() > 0 ? a->queue_position() : 1 << 30;
      const int pb = b->queue_position() > 0 ? b->queue_position() : 1 << 30;
      return pa < pb;
    });
    std::vector<std::vector<std::string>> rows = {
        {"ID", "QUEUE", "PRIORITY", "POSITION", "WAITS FOR", "RANKS", "AGE", "BY", "REASON"}};
    for (const loom::v1::Job* j : waiting) {
      const auto& sched = j->spec().scheduling();
      rows.push_back({j->id(), sched.queue().empty() ? "default" : sched.queue(),
                      sched.priority().empty() ? "0" : sched.priority(),
                      j->queue_position() > 0 ? absl::StrCat(j->queue_position()) : "-",
                      j->wait_reason().empty() ? "-" : j->wait_reason(),
                      absl::StrCat(j->spec().resources().ranks()), Ago(j->created_unix_ms()),
                      j->submitted_by().empty() ? "-" : j->submitted_by(),
                      j->reason().substr(0, 60)});
    }
    PrintTable(rows);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATE", "STEP", "LOSS", "VAL LOSS", "RANKS", "AGE", "BY", "REASON"}};
  for (const auto& j : resp.jobs()) {
    const auto& sum = j.summary();
    rows.push_back({j.id(), StateName(j.state()),
                    absl::StrCat(sum.last_step(), "/", j.spec().schedule().total_steps()),
                    sum.last_step() > 0 ? absl::StrFormat("%.4f", sum.last_loss()) : "-",
                    sum.has_val_loss() ? absl::StrFormat("%.4f", sum.last_val_loss()) : "-",
                    absl::StrCat(j.spec().resources().ranks()), Ago(j.created_unix_ms()),
                    j.submitted_by().empty() ? "-" : j.submitted_by(), j.reason().substr(0, 60)});
  }
  PrintTable(rows);
  return 0;
}

int CmdStatus(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("status: expected JOB");
  auto fetched = FetchJob(g, args[0]);
  if (!fetched.ok()) return Fail(fetched.status());
  const loom::v1::Job& job = *fetched;
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
    return 0;
  }
  std::cout << "job      " << job.id() << "\nstate    " << StateName(job.state())
            << "\nreason   " << job.reason() << "\nby       "
            << (job.submitted_by().empty() ? "(not recorded)" : job.submitted_by()) << "\n";
  if (job.spec().has_init_from()) {
    const loom::v1::InitFrom& from = job.spec().init_from();
    std::cout << "from     "
              << (from.job().empty() ? std::string()
                                     : absl::StrCat(from.job(), " step ", from.step(), ": "))
              << from.path() << (from.optimizer() ? " (weights and optimizer state)" : " (weights)")
              << "\n";
  }
  const auto& par = job.spec().parallelism();
  const bool layered = par.tensor() > 1 || par.pipeline() > 1;
  if (job.ranks_size() > 0 && !layered) {
    std::cout << "ranks   ";
    for (const auto& r : job.ranks()) std::cout << " " << r.rank() << "@" << r.node();
    std::cout << "\n";
  } else if (job.ranks_size() > 0) {
    // Tensor / pipeline layouts: where each rank sits.
    std::cout << "layout   data " << par.data() << " x pipeline " << par.pipeline()
              << " x tensor " << par.tensor() << ", ZeRO-" << par.zero_stage()
              << "\nplacement\n";
    // The scheduler's placement (controller/admission/scheduler.h): each TP group on
    // one worker, workers in rack order; RACK shows when workers carry labels.
    bool racks = false;
    for (const auto& r : job.ranks()) racks = racks || !r.rack().empty();
    std::vector<std::vector<std::string>> placement = {
        {"  RANK", "NODE", "WORKER", "DP", "PP (stage)", "TP"}};
    if (racks) placement[0].insert(placement[0].begin() + 1, "RACK");
    for (const auto& r : job.ranks()) {
      std::vector<std::string> row = {absl::StrCat("  ", r.rank()), r.node(), r.worker_id(),
                                      absl::StrCat(r.dp()), absl::StrCat(r.pp()),
                                      absl::StrCat(r.tp())};
      if (racks) row.insert(row.begin() + 1, r.rack().empty() ? "-" : r.rack());
      placement.push_back(std::move(row));
    }
    PrintTable(placement);
  }
  if (job.has_plan()) {
    std::cout << "\nplan\n" << controller::FormatJobPlan(job.plan());
  }
  std::cout << "\nhistory\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : job.history()) {
    rows.push_back({"  " + absl::FormatTime("%Y-%m-%d %H:%M:%S",
                                            absl::FromUnixMillis(t.time_unix_ms()),
                                            absl::LocalTimeZone()),
                    StateName(t.from()) + " -> " + StateName(t.to()), t.reason()});
  }
  PrintTable(rows);
  PrintSummary(job, nullptr);
  // Where its wall time went (controller/progress/goodput.h), from its step reports.
  auto client = Client::Connect(g);
  loom::v1::GetStepMetricsRequest steps_req;
  steps_req.set_job_id(job.id());
  loom::v1::GetStepMetricsResponse steps;
  absl::Status fetched_steps =
      client.ok() ? (*client)->Call(&loom::v1::JobService::Stub::GetStepMetrics, steps_req, &steps)
                  : client.status();
  if (!fetched_steps.ok()) {
    std::cout << "\ngoodput  unavailable: " << fetched_steps.message() << "\n";
    return 0;
  }
  const std::vector<loom::v1::StepMetrics> step_list(steps.steps().begin(), steps.steps().end());
  const controller::GoodputBuckets b = controller::ComputeGoodput(job, step_list, absl::Now());
  std::cout << absl::StrFormat(
      "\ngoodput  %.1f s productive of %.1f s (ETTR %.2f): queued %.1f, preempted waiting %.1f, "
      "recovery waiting %.1f, start-up %.1f, checkpoint restore %.1f, data stall %.1f, "
      "checkpoint stall %.1f, evaluation %.1f, redone %.1f, unaccounted %.1f\n",
      b.productive, b.wall, b.ettr(), b.queued, b.preempted_waiting, b.recovery_waiting, b.startup,
      b.checkpoint_restore, b.data_stall, b.checkpoint_stall, b.evaluation, b.redone,
      b.unaccounted);
  return 0;
}

int CmdCancel(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::CancelJobRequest req;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--reason" && i + 1 < args.size()) {
      req.set_reason(args[++i]);
    } else if (req.job_id().empty()) {
      req.set_job_id(args[i]);
    } else {
      return Usage("cancel: unexpected " + args[i]);
    }
  }
  if (req.job_id().empty()) return Usage("cancel: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::Job job;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::CancelJob, req, &job);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
  } else {
    std::cout << job.id() << " " << StateName(job.state()) << std::endl;
  }
  return 0;
}

// `loomctl steps JOB [--last N]`: the job's per-step records.
int CmdSteps(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::GetStepMetricsRequest req;
  bool ledger = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--ledger") {
      ledger = true;
    } else if (args[i] == "--last" && i + 1 < args.size()) {
      int last = 0;
      if (!absl::SimpleAtoi(args[++i], &last) || last < 1) {
        return Usage("steps: --last takes a count >= 1, got " + args[i]);
      }
      req.set_limit(last);
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("steps: unknown flag " + args[i]);
    } else if (req.job_id().empty()) {
      req.set_job_id(args[i]);
    } else {
      return Usage("steps: one job at a time");
    }
  }
  if (req.job_id().empty()) return Usage("steps: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::GetStepMetricsResponse resp;
  if (absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::GetStepMetrics, req, &resp);
      !s.ok()) {
    return Fail(s);
  }
  if (ledger) {
    if (req.limit() > 0) return Usage("steps: --ledger reads every record; drop --last");
    absl::StatusOr<loom::v1::Job> job = FetchJob(g, req.job_id());
    if (!job.ok()) return Fail(job.status());
    const controller::DataLedger l = controller::ComputeDataLedger(
        std::vector<loom::v1::StepMetrics>(resp.steps().begin(), resp.steps().end()),
        std::vector<loom::v1::SkipRange>(job->skip_batches().begin(), job->skip_batches().end()));
    if (g.json) {
      JsonWriter w;
      w.BeginObject();
      w.Field("steps", l.steps);
      w.Field("first_batch", l.first_batch);
      w.Field("last_batch", l.last_batch);
      w.Field("skipped", l.skipped);
      w.Field("duplicated", l.duplicated);
      w.Field("replayed", l.replayed);
      w.Field("missing_steps", l.missing_steps);
      w.Field("layout_generations", l.layout_generations);
      w.EndObject();
      std::cout << w.Finish();
    } else {
      std::cout << absl::StrFormat(
                       "data ledger of %s: %d committed step(s) trained data batches %d..%d "
                       "under %d layout(s): %d skipped, %d duplicated; %d step record(s) "
                       "replayed by a later attempt%s",
                       req.job_id(), l.steps, l.first_batch, l.last_batch, l.layout_generations,
                       l.skipped, l.duplicated, l.replayed,
                       l.missing_steps > 0
                           ? absl::StrCat("; ", l.missing_steps,
                                          " step(s) without a record (log_interval > 1): "
                                          "skips not checked")
                           : "")
                << std::endl;
    }
    return l.skipped == 0 && l.duplicated == 0 ? 0 : 1;
  }
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "LOSS", "VAL LOSS", "GRAD NORM", "TOKENS/S", "ATTEMPT", "LAYOUT"}};
  for (const loom::v1::StepMetrics& m : resp.steps()) {
    rows.push_back({absl::StrCat(m.step()), absl::StrFormat("%.4f", m.loss()),
                    m.has_val_loss() ? absl::StrFormat("%.4f", m.val_loss()) : "-",
                    absl::StrFormat("%.3f", m.grad_norm()),
                    absl::StrFormat("%.0f", m.tokens_per_second()), absl::StrCat(m.generation()),
                    absl::StrCat(m.layout_generation())});
  }
  PrintTable(rows);
  return 0;
}

namespace {

// One event as a row: SEQ TIME EVENT CAUSE STEP LOST DETAIL.
std::vector<std::string> EventRow(const loom::v1::JobEvent& e);

// The event's row, then one CHECKPOINT_PRUNED row per checkpoint that
// retention deleted after it (a commit prunes the directory, an upload the
// object store), with the tier and the reason.
std::vector<std::vector<std::string>> EventRows(const loom::v1::JobEvent& e) {
  std::vector<std::vector<std::string>> rows = {EventRow(e)};
  if (!e.has_checkpoint()) return rows;
  for (const loom::v1::PrunedCheckpoint& p : e.checkpoint().pruned()) {
    rows.push_back({rows[0][0], rows[0][1], "CHECKPOINT_PRUNED", p.tier(), absl::StrCat(p.step()),
                    "-", absl::StrCat(p.path(), ": ", p.reason())});
  }
  return rows;
}

std::vector<std::string> EventRow(const loom::v1::JobEvent& e) {
  const std::string seq = absl::StrCat(e.seq());
  const std::string time = absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(e.time_unix_ms()),
                                            absl::LocalTimeZone());
  if (e.has_transition()) {
    return {seq, time, StateName(e.transition().to()), "-", "-", "-", e.transition().reason()};
  }
  if (e.has_checkpoint()) {
    const bool uploaded = e.checkpoint().status() == "uploaded";
    return {
        seq,
        time,
        uploaded ? "CHECKPOINT_UPLOADED" : "CHECKPOINT",
        "-",
        absl::StrCat(e.checkpoint().step()),
        "-",
        !uploaded ? e.checkpoint().path()
        : e.checkpoint().upload_note().empty()
            ? e.checkpoint().remote_url()
            : absl::StrCat(e.checkpoint().remote_url(), " (", e.checkpoint().upload_note(), ")")};
  }
  const loom::v1::RecoveryEvent& r = e.recovery();
  const bool resumed = r.kind() == loom::v1::RecoveryEvent::ROLLBACK ||
                       r.kind() == loom::v1::RecoveryEvent::RESTART ||
                       r.kind() == loom::v1::RecoveryEvent::PREEMPTED ||
                       r.kind() == loom::v1::RecoveryEvent::REPLANNED;
  return {seq, time, KindName(r.kind()), r.cause().empty() ? "-" : r.cause(),
          r.step() > 0 ? absl::StrCat(r.step()) : "-",
          resumed ? absl::StrCat(r.steps_lost()) : "-", r.message()};
}

}  // namespace

int CmdEvents(const Globals& g, const std::vector<std::string>& args) {
  std::string job_id;
  int64_t since = 0;
  bool follow = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--since" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &since) || since < 0) {
        return Usage("--since: expected an event number >= 0 (the SEQ column)");
      }
    } else if (args[i] == "--follow" || args[i] == "-f") {
      follow = true;
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("events: unknown flag " + args[i]);
    } else if (job_id.empty()) {
      job_id = args[i];
    } else {
      return Usage("events: unexpected " + args[i]);
    }
  }
  if (job_id.empty()) return Usage("events: expected JOB [--since SEQ] [--follow]");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  // The log so far, a page at a time.
  loom::v1::ListEventsResponse all;
  for (int64_t after = since;;) {
    loom::v1::ListEventsRequest req;
    req.set_job_id(job_id);
    req.set_after_seq(after);
    req.set_page_size(5000);
    loom::v1::ListEventsResponse page;
    absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListEvents, req, &page);
    if (!s.ok()) return Fail(s);
    for (auto& e : *page.mutable_events()) *all.add_events() = std::move(e);
    all.set_last_seq(page.last_seq());
    if (!page.more() || page.events_size() == 0) break;
    after = all.events(all.events_size() - 1).seq();
  }
  const std::vector<std::string> header = {"SEQ", "TIME", "EVENT", "CAUSE", "STEP", "LOST", "DETAIL"};
  if (!follow) {
    if (g.json) {
      std::cout << ToJson(all) << std::endl;
      return 0;
    }
    auto job = FetchJob(g, job_id);
    if (!job.ok()) return Fail(job.status());
    if (all.events_size() == 0) {
      std::cout << "no events for " << job_id << (since > 0 ? absl::StrCat(" after ", since) : "")
                << std::endl;
    } else {
      std::vector<std::vector<std::string>> rows = {header};
      for (const auto& e : all.events()) {
        for (auto& row : EventRows(e)) rows.push_back(std::move(row));
      }
      PrintTable(rows);
    }
    std::cout << "\nrestarts " << job->restarts() << ", rollbacks " << job->rollbacks()
              << ", operator rollbacks " << job->operator_rollbacks() << ", preemptions "
              << job->preemptions() << ", attempt " << job->generation() << std::endl;
    return 0;
  }
  // --follow: the events so far, then each as it is logged, once, until the
  // job ends (across a controller failover too).
  auto print = [&g](const loom::v1::JobEvent& e) {
    if (e.seq() == 0) return;  // steps, and the job's own end notice
    if (g.json) {
      loom::v1::JobEvent bare = e;
      bare.clear_job();
      std::cout << ToJsonLine(bare) << std::endl;
    } else {
      for (const auto& row : EventRows(e)) std::cout << absl::StrJoin(row, "  ") << std::endl;
    }
  };
  if (!g.json) std::cout << absl::StrJoin(header, "  ") << std::endl;
  int64_t after = since;
  for (const auto& e : all.events()) {
    print(e);
    after = e.seq();
  }
  after = std::max(after, all.last_seq());  // this job has nothing in between
  loom::v1::Job last;
  absl::Status followed = FollowJob(client->get(), job_id, after, print, &last);
  if (!followed.ok()) return Fail(followed);
  return 0;
}

int CmdRollback(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::RollbackJobRequest req;
  bool have_step = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--to-step" && i + 1 < args.size()) {
      int64_t step = 0;
      if (!absl::SimpleAtoi(args[++i], &step)) return Usage("--to-step: expected a step number");
      req.set_to_step(step);
      have_step = true;
    } else if (args[i] == "--skip" && i + 1 < args.size()) {
      if (!ParseSkipRange(args[++i], req.add_skip())) {
        return Usage("--skip: expected BEGIN:END data batch indices (half-open), e.g. 1200:1500");
      }
    } else if (args[i] == "--reason" && i + 1 < args.size()) {
      req.set_reason(args[++i]);
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("rollback: unknown flag " + args[i]);
    } else if (req.job_id().empty()) {
      req.set_job_id(args[i]);
    } else {
      return Usage("rollback: unexpected " + args[i]);
    }
  }
  if (req.job_id().empty() || !have_step) {
    return Usage("rollback: expected JOB --to-step S [--skip A:B]... [--reason TEXT]");
  }
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::Job job;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::RollbackJob, req, &job);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
  } else if (job.events_size() > 0) {
    std::cout << job.id() << " " << StateName(job.state()) << ": "
              << job.events(job.events_size() - 1).message() << std::endl;
  }
  return 0;
}

}  // namespace loom::cli
