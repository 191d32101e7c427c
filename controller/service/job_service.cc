#include "controller/service/job_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"

namespace loom::controller {
namespace {

// Admins change any job, users the jobs they submitted (access.h).
absl::Status CheckJobChange(JobManager& manager, const Principal& caller, absl::string_view verb,
                            const std::string& job_id) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  absl::StatusOr<std::string> submitter = manager.Submitter(job_id);
  if (!submitter.ok()) return submitter.status();
  return AuthorizeJobChange(caller, verb, job_id, *submitter);
}

// "by user 'uma'", then ": <reason>" when one was given: an action's
// reason as the job's events record it.
std::string ByCaller(const Principal& caller, const std::string& reason) {
  return absl::StrCat("by ", caller.Describe(), reason.empty() ? "" : ": ", reason);
}
}  // namespace

JobServiceImpl::JobServiceImpl(JobManager* manager, const AccessControl* access,
                               RpcMetrics* metrics, const std::atomic<bool>* shutting_down,
                               LogStore* logs, const Leadership* leadership,
                               const SessionDirectory* sessions)
    : manager_(manager),
      access_(access),
      metrics_(metrics),
      shutting_down_(shutting_down),
      rank_logs_(
          logs,
          [manager](const std::string& job_id) { return manager->AttemptPlacements(job_id); }),
      series_(manager->store()),
      goodput_([manager](const std::string& job_id) { return manager->StepMetrics(job_id, 0); }),
      leadership_(leadership),
      sessions_(sessions),
      warmer_(
          &series_, [manager] { return manager->List({}, 0); },
          [leadership] { return leadership == nullptr || leadership->LeadingNow(); }) {}

grpc::Status JobServiceImpl::Finish(const char* method, const absl::Status& s) {
  grpc::Status g = ToGrpcStatus(s);
  metrics_->Record(method, g);
  return g;
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx,
                                       const loom::v1::SubmitJobRequest* req,
                                       loom::v1::SubmitJobResponse* resp) {
  LOOM_ADMIT("JobService", "SubmitJob");
  if (!req->has_spec()) return Finish("SubmitJob", absl::InvalidArgumentError("spec: required"));
  auto job = manager_->Submit(req->spec(), caller->name, RoleName(caller->role));
  if (job.ok()) *resp->mutable_job() = std::move(*job);
  return Finish("SubmitJob", job.status());
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const loom::v1::GetJobRequest* req,
                                    loom::v1::Job* resp) {
  LOOM_ADMIT("JobService", "GetJob");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("GetJob", s);
  auto job = manager_->Get(req->job_id());
  if (job.ok()) *resp = std::move(*job);
  return Finish("GetJob", job.status());
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx,
                                      const loom::v1::ListJobsRequest* req,
                                      loom::v1::ListJobsResponse* resp) {
  LOOM_ADMIT("JobService", "ListJobs");
  if (req->limit() < 0) {
    return Finish("ListJobs", absl::InvalidArgumentError("limit: must be >= 0"));
  }
  JobFilter filter{{}, req->queue(), req->submitted_by(), req->name_contains()};
  for (int s : req->states()) {
    if (!loom::v1::JobState_IsValid(s) || s == loom::v1::JOB_STATE_UNSPECIFIED) {
      return Finish("ListJobs",
                    absl::InvalidArgumentError(absl::StrCat("states: unknown state ", s)));
    }
    filter.states.insert(static_cast<loom::v1::JobState>(s));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string&>{"queue", req->queue()},
        {"submitted_by", req->submitted_by()},
        {"name_contains", req->name_contains()}}) {
    if (value.size() > 256) {
      return Finish("ListJobs", absl::InvalidArgumentError(absl::StrCat(
                                    field, ": at most 256 bytes, got ", value.size())));
    }
  }
  if (req->page_size() < 0 || req->page_size() > 1000) {
    return Finish("ListJobs",
                  absl::InvalidArgumentError(absl::StrCat(
                      "page_size: must be in [0, 1000] (0 = 100), got ", req->page_size())));
  }
  int64_t before = 0;
  if (!req->page_token().empty() &&
      (!absl::SimpleAtoi(req->page_token(), &before) || before <= 0)) {
    return Finish("ListJobs", absl::InvalidArgumentError(
                                  "page_token: not a token this controller gave (pass "
                                  "next_page_token from the previous page, or nothing)"));
  }
  int page = req->page_size() > 0 ? req->page_size() : 100;
  if (req->limit() > 0) page = std::min(page, req->limit());
  int64_t next = 0;
  for (auto& job : manager_->ListPage(filter, page, before, req->full(), &next)) {
    *resp->add_jobs() = std::move(job);
  }
  // `limit` caps the pages together: the caller counts what it has read.
  if (next > 0) resp->set_next_page_token(absl::StrCat(next));
  return Finish("ListJobs", absl::OkStatus());
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx,
                                       const loom::v1::CancelJobRequest* req, loom::v1::Job* resp) {
  LOOM_ADMIT("JobService", "CancelJob");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("CancelJob", s);
  s = CheckJobChange(*manager_, *caller, "cancel", req->job_id());
  if (!s.ok()) return Finish("CancelJob", s);
  // The event log says who did it (the console's page and loomctl alike).
  auto job = manager_->Cancel(req->job_id(), ByCaller(*caller, req->reason()));
  if (job.ok()) *resp = std::move(*job);
  return Finish("CancelJob", job.status());
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx,
                                      const loom::v1::WatchJobRequest* req,
                                      grpc::ServerWriter<loom::v1::JobEvent>* writer) {
  LOOM_ADMIT("JobService", "WatchJob");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("WatchJob", s);
  std::optional<int64_t> after;
  if (req->has_after_seq()) after = req->after_seq();
  auto watch = manager_->Watch(req->job_id(), req->include_history(), after);
  if (!watch.ok()) return Finish("WatchJob", watch.status());
  return Finish("WatchJob", StreamEvents(
                                *ctx, [&] { return (*watch)->Next(absl::Milliseconds(200)); },
                                [&] { return (*watch)->ended(); }, writer));
}

absl::Status JobServiceImpl::StreamEvents(
    const grpc::ServerContext& ctx,
    const std::function<absl::StatusOr<std::vector<loom::v1::JobEvent>>()>& next,
    const std::function<bool()>& ended, grpc::ServerWriter<loom::v1::JobEvent>* writer) {
  while (!ctx.IsCancelled() && !ended()) {
    if (shutting_down_->load()) return absl::UnavailableError("controller is shutting down");
    absl::StatusOr<std::vector<loom::v1::JobEvent>> events = next();
    if (!events.ok()) {
      return absl::UnavailableError(
          absl::StrCat("reading the event log: ", events.status().message()));
    }
    for (const loom::v1::JobEvent& e : *events) {
      if (!writer->Write(e)) return absl::OkStatus();  // the client went away
    }
  }
  return absl::OkStatus();
}

grpc::Status JobServiceImpl::WatchEvents(grpc::ServerContext* ctx,
                                         const loom::v1::WatchEventsRequest* req,
                                         grpc::ServerWriter<loom::v1::JobEvent>* writer) {
  LOOM_ADMIT("JobService", "WatchEvents");
  if (req->has_after_seq() && req->after_seq() < 0) {
    return Finish("WatchEvents", absl::InvalidArgumentError("after_seq: must be >= 0"));
  }
  auto cursor = manager_->events().Subscribe("", req->has_after_seq() ? req->after_seq() : -1);
  if (!cursor.ok()) return Finish("WatchEvents", cursor.status());
  return Finish("WatchEvents", StreamEvents(
                                   *ctx, [&] { return (*cursor)->Next(absl::Milliseconds(200)); },
                                   [] { return false; }, writer));
}

grpc::Status JobServiceImpl::ListEvents(grpc::ServerContext* ctx,
                                        const loom::v1::ListEventsRequest* req,
                                        loom::v1::ListEventsResponse* resp) {
  LOOM_ADMIT("JobService", "ListEvents");
  if (req->after_seq() < 0) {
    return Finish("ListEvents", absl::InvalidArgumentError("after_seq: must be >= 0"));
  }
  if (req->page_size() < 0 || req->page_size() > 5000) {
    return Finish("ListEvents", absl::InvalidArgumentError(absl::StrCat(
                                    "page_size: ", req->page_size(),
                                    " is out of range (0 for the default 500, at most 5000)")));
  }
  if (!req->job_id().empty()) {
    if (auto job = manager_->Get(req->job_id()); !job.ok())
      return Finish("ListEvents", job.status());
  }
  auto page = manager_->events().Read(req->job_id(), req->after_seq(),
                                      req->page_size() == 0 ? 500 : req->page_size());
  if (!page.ok()) {
    return Finish("ListEvents", absl::UnavailableError(absl::StrCat("reading the event log: ",
                                                                    page.status().message())));
  }
  for (loom::v1::JobEvent& e : page->events) *resp->add_events() = std::move(e);
  resp->set_last_seq(page->last_seq);
  resp->set_more(page->more);
  return Finish("ListEvents", absl::OkStatus());
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* ctx,
                                         const loom::v1::ListWorkersRequest*,
                                         loom::v1::ListWorkersResponse* resp) {
  LOOM_ADMIT("JobService", "ListWorkers");
  for (auto& w : manager_->ListWorkers()) *resp->add_workers() = std::move(w);
  return Finish("ListWorkers", absl::OkStatus());
}

grpc::Status JobServiceImpl::ListQueues(grpc::ServerContext* ctx,
                                        const loom::v1::ListQueuesRequest*,
                                        loom::v1::ListQueuesResponse* resp) {
  LOOM_ADMIT("JobService", "ListQueues");
  *resp = manager_->ListQueues();
  return Finish("ListQueues", absl::OkStatus());
}

grpc::Status JobServiceImpl::GetStepMetrics(grpc::ServerContext* ctx,
                                            const loom::v1::GetStepMetricsRequest* req,
                                            loom::v1::GetStepMetricsResponse* resp) {
  LOOM_ADMIT("JobService", "GetStepMetrics");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (s.ok() && req->limit() < 0) s = absl::InvalidArgumentError("limit: must be >= 0");
  if (!s.ok()) return Finish("GetStepMetrics", s);
  auto steps = manager_->StepMetrics(req->job_id(), req->limit());
  if (steps.ok()) {
    for (auto& m : *steps) *resp->add_steps() = std::move(m);
  }
  return Finish("GetStepMetrics", steps.status());
}

grpc::Status JobServiceImpl::GetStepSeries(grpc::ServerContext* ctx,
                                           const loom::v1::GetStepSeriesRequest* req,
                                           loom::v1::GetStepSeriesResponse* resp) {
  LOOM_ADMIT("JobService", "GetStepSeries");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("GetStepSeries", s);
  // The job's attempt says which of its steps were recorded again.
  absl::StatusOr<loom::v1::Job> job = manager_->Get(req->job_id());
  if (!job.ok()) return Finish("GetStepSeries", job.status());
  auto series = series_.Query(*req, job->generation(), job->resume_step());
  if (series.ok()) *resp = std::move(*series);
  return Finish("GetStepSeries", series.status());
}

grpc::Status JobServiceImpl::ListCheckpoints(grpc::ServerContext* ctx,
                                             const loom::v1::ListCheckpointsRequest* req,
                                             loom::v1::ListCheckpointsResponse* resp) {
  LOOM_ADMIT("JobService", "ListCheckpoints");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("ListCheckpoints", s);
  auto list = manager_->Checkpoints(req->job_id(), req->verify());
  if (list.ok()) {
    for (auto& c : *list) *resp->add_checkpoints() = std::move(c);
  }
  return Finish("ListCheckpoints", list.status());
}

grpc::Status JobServiceImpl::PlanCheckpointRetention(
    grpc::ServerContext* ctx, const loom::v1::PlanCheckpointRetentionRequest* req,
    loom::v1::PlanCheckpointRetentionResponse* resp) {
  LOOM_ADMIT("JobService", "PlanCheckpointRetention");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("PlanCheckpointRetention", s);
  absl::StatusOr<loom::v1::Job> job = manager_->Get(req->job_id());
  if (!job.ok()) return Finish("PlanCheckpointRetention", job.status());
  // Which of its checkpoints other jobs' init_from hold: the unfinished
  // jobs are enough (an ended job holds nothing).
  std::vector<loom::v1::Job> jobs = manager_->List(
      {loom::v1::PENDING, loom::v1::SCHEDULED, loom::v1::RUNNING, loom::v1::PREEMPTED},
      /*limit=*/0);
  std::vector<const loom::v1::Job*> unfinished;
  for (const loom::v1::Job& j : jobs) unfinished.push_back(&j);
  *resp = retention_.Plan(*job, CheckpointHolds(*job, unfinished));
  return Finish("PlanCheckpointRetention", absl::OkStatus());
}

grpc::Status JobServiceImpl::Plan(grpc::ServerContext* ctx, const loom::v1::PlanRequest* req,
                                  loom::v1::PlanResponse* resp) {
  LOOM_ADMIT("JobService", "Plan");
  if (!req->has_spec()) return Finish("Plan", absl::InvalidArgumentError("spec: required"));
  if (req->topology_yaml().size() > (1 << 20)) {
    return Finish("Plan", absl::InvalidArgumentError("topology_yaml: larger than 1 MiB"));
  }
  auto plan = manager_->Plan(*req);
  if (plan.ok()) *resp = std::move(*plan);
  return Finish("Plan", plan.status());
}

grpc::Status JobServiceImpl::RollbackJob(grpc::ServerContext* ctx,
                                         const loom::v1::RollbackJobRequest* req,
                                         loom::v1::Job* resp) {
  LOOM_ADMIT("JobService", "RollbackJob");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (s.ok() && req->skip_size() > 1000)
    s = absl::InvalidArgumentError("skip: at most 1000 ranges");
  if (s.ok() && req->reason().size() > 1024) s = absl::InvalidArgumentError("reason: too long");
  if (!s.ok()) return Finish("RollbackJob", s);
  s = CheckJobChange(*manager_, *caller, "roll back", req->job_id());
  if (!s.ok()) return Finish("RollbackJob", s);
  loom::v1::RollbackJobRequest by = *req;
  by.set_reason(ByCaller(*caller, req->reason()));
  auto job = manager_->Rollback(by);
  if (job.ok()) *resp = std::move(*job);
  return Finish("RollbackJob", job.status());
}

grpc::Status JobServiceImpl::GetRankLog(grpc::ServerContext* ctx,
                                        const loom::v1::GetRankLogRequest* req,
                                        loom::v1::GetRankLogResponse* resp) {
  LOOM_ADMIT("JobService", "GetRankLog");
  absl::StatusOr<loom::v1::GetRankLogResponse> got = rank_logs_.Get(*req);
  if (got.ok()) *resp = *std::move(got);
  return Finish("GetRankLog", got.status());
}

grpc::Status JobServiceImpl::SearchRankLogs(grpc::ServerContext* ctx,
                                            const loom::v1::SearchRankLogsRequest* req,
                                            loom::v1::SearchRankLogsResponse* resp) {
  LOOM_ADMIT("JobService", "SearchRankLogs");
  absl::StatusOr<loom::v1::SearchRankLogsResponse> found = rank_logs_.Search(*req);
  if (found.ok()) *resp = std::move(*found);
  return Finish("SearchRankLogs", found.status());
}

grpc::Status JobServiceImpl::WhoAmI(grpc::ServerContext* ctx, const loom::v1::WhoAmIRequest*,
                                    loom::v1::WhoAmIResponse* resp) {
  LOOM_ADMIT("JobService", "WhoAmI");
  resp->set_name(caller->name);
  resp->set_role(RoleName(caller->role));
  resp->set_credential(caller->session ? "session" : caller->certificate ? "certificate" : "token");
  return Finish("WhoAmI", absl::OkStatus());
}

grpc::Status JobServiceImpl::GetGoodput(grpc::ServerContext* ctx,
                                        const loom::v1::GetGoodputRequest* req,
                                        loom::v1::GetGoodputResponse* resp) {
  LOOM_ADMIT("JobService", "GetGoodput");
  absl::Status s = RequireId(req->job_id(), "job_id");
  if (!s.ok()) return Finish("GetGoodput", s);
  absl::StatusOr<loom::v1::Job> job = manager_->Get(req->job_id());
  if (!job.ok()) return Finish("GetGoodput", job.status());
  absl::StatusOr<loom::v1::GetGoodputResponse> figures = goodput_.Get(*job, absl::Now());
  if (figures.ok()) *resp = std::move(*figures);
  return Finish("GetGoodput", figures.status());
}

grpc::Status JobServiceImpl::CordonNode(grpc::ServerContext* ctx,
                                        const loom::v1::CordonNodeRequest* req,
                                        loom::v1::CordonNodeResponse* resp) {
  LOOM_ADMIT("JobService", "CordonNode");
  auto r = manager_->Cordon(*req, caller->Describe());
  if (r.ok()) *resp = std::move(*r);
  return Finish("CordonNode", r.status());
}

grpc::Status JobServiceImpl::UncordonNode(grpc::ServerContext* ctx,
                                          const loom::v1::UncordonNodeRequest* req,
                                          loom::v1::CordonNodeResponse* resp) {
  LOOM_ADMIT("JobService", "UncordonNode");
  auto r = manager_->Uncordon(*req, caller->Describe());
  if (r.ok()) *resp = std::move(*r);
  return Finish("UncordonNode", r.status());
}

grpc::Status JobServiceImpl::DrainNode(grpc::ServerContext* ctx,
                                       const loom::v1::DrainNodeRequest* req,
                                       loom::v1::DrainNodeResponse* resp) {
  LOOM_ADMIT("JobService", "DrainNode");
  auto r = manager_->Drain(*req, caller->Describe());
  if (r.ok()) *resp = std::move(*r);
  return Finish("DrainNode", r.status());
}

}  // namespace loom::controller
