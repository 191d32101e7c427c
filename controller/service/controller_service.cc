#include "controller/service/controller_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"

namespace loom::controller {
namespace {

absl::Status RequireId(const std::string& id, const char* field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (id.size() > 256) return absl::InvalidArgumentError(absl::StrCat(field, ": too long"));
  return absl::OkStatus();
}

// Admins change any job, users the jobs they submitted (access.h).
absl::Status CheckJobChange(JobManager& manager, const Principal& caller, absl::string_view verb,
                            const std::string& job_id) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  absl::StatusOr<std::string> submitter = manager.Submitter(job_id);
  if (!submitter.ok()) return submitter.status();
  return AuthorizeJobChange(caller, verb, job_id, *submitter);
}

}  // namespace

namespace {
// When the RPC being handled on this thread started (RpcMetrics::Start).
absl::Time& RpcStartTime() {
  thread_local absl::Time start = absl::InfinitePast();
  return start;
}
}  // namespace

RpcMetrics::RpcMetrics(metrics::Registry& registry)
    : rpcs_(metrics::BuildCounter()
                .Name("loom_controller_rpcs_total")
                .Help("RPCs handled by the controller, by method and status code.")
                .Register(registry)),
      duration_(metrics::BuildHistogram()
                    .Name("loom_controller_rpc_duration_seconds")
                    .Help("Time to handle a unary RPC, by method (streams excluded).")
                    .Register(registry)) {}

void RpcMetrics::Start() { RpcStartTime() = absl::Now(); }

void RpcMetrics::Record(const std::string& method, const grpc::Status& status) {
  RecordSince(method, status, RpcStartTime());
  RpcStartTime() = absl::InfinitePast();
}

void RpcMetrics::RecordSince(const std::string& method, const grpc::Status& status,
                             absl::Time start) {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  int code = status.error_code();
  if (code < 0 || code > 16) code = 2;  // UNKNOWN
  // The series are looked up once per (method, code): building label sets
  // and a histogram's buckets on every RPC was a tenth of the controller's
  // time under load.
  metrics::Counter* counter = nullptr;
  metrics::Histogram* histogram = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& c = counters_[{method, code}];
    if (c == nullptr) c = &rpcs_.Add({{"method", method}, {"code", kCodes[code]}});
    counter = c;
    if (method != "WatchJob" && method != "WatchEvents") {  // streams: no duration
      auto& h = histograms_[method];
      if (h == nullptr) {
        h = &duration_.Add({{"method", method}}, metrics::ExponentialBuckets(0.0001, 4, 10));
      }
      histogram = h;
    }
  }
  counter->Increment();
  if (histogram != nullptr && start != absl::InfinitePast()) {
    histogram->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

// ------------------------------------------------------------------ JobService

absl::StatusOr<Principal> AdmitCaller(const grpc::ServerContextBase& ctx,
                                      const AccessControl& access, absl::string_view method,
                                      const SessionDirectory* sessions) {
  std::string certificate_name;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // Set only for a client certificate the handshake verified against the
    // cluster CA (--tls_client_ca).
    for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
      certificate_name.assign(cn.data(), cn.size());
    }
  }
  std::string bearer;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ") || value.empty()) {
      return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
    }
    bearer = std::string(value);
  }
  absl::StatusOr<Principal> caller;
  if (auto it = md.find(kSessionMetadataKey);
      sessions != nullptr && bearer.empty() && certificate_name.empty() && it != md.end()) {
    // A console page's session: the user of the token it was opened with,
    // if that token is still theirs.
    absl::StatusOr<std::string> token_hash =
        sessions->TokenHashOf(absl::string_view(it->second.data(), it->second.size()));
    if (!token_hash.ok()) return token_hash.status();
    caller = access.AuthenticateTokenHash(*token_hash);
    if (caller.ok()) caller->session = true;
  } else {
    caller = access.Authenticate(bearer, certificate_name);
  }
  if (!caller.ok()) return caller.status();
  if (absl::Status allowed = Authorize(*caller, method); !allowed.ok()) return allowed;
  return caller;
}

namespace {
// "by user 'uma'", then ": <reason>" when one was given: an action's
// reason as the job's events record it.
std::string ByCaller(const Principal& caller, const std::string& reason) {
  return absl::StrCat("by ", caller.Describe(), reason.empty() ? "" : ": ", reason);
}
}  // namespace

absl::Status AdmitLeader(grpc::ServerContextBase* ctx, const Leadership* leadership) {
  if (leadership == nullptr) return absl::OkStatus();
  std::string leader_address;
  absl::Status s = leadership->Admit(&leader_address);
  if (!s.ok() && !leader_address.empty()) {
    ctx->AddTrailingMetadata(kLeaderMetadataKey, leader_address);
  }
  return s;
}

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

// Declares `caller`, the authenticated and authorized Principal, or answers
// the RPC with why not.
#define LOOM_ADMIT(service, method)                                                              \
  RpcMetrics::Start();                                                                           \
  absl::StatusOr<Principal> caller = AdmitCaller(*ctx, *access_, service "." method, sessions_); \
  if (!caller.ok()) return Finish(method, caller.status());                                      \
  if (absl::Status led = AdmitLeader(ctx, leadership_); !led.ok()) return Finish(method, led)

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
    return Finish("ListJobs", absl::InvalidArgumentError(absl::StrCat(
                                  "page_size: must be in [0, 1000] (0 = 100), got ",
                                  req->page_size())));
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
                                       const loom::v1::CancelJobRequest* req,
                                       loom::v1::Job* resp) {
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
  return Finish("WatchJob",
                StreamEvents(*ctx, [&] { return (*watch)->Next(absl::Milliseconds(200)); },
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
  return Finish("WatchEvents",
                StreamEvents(*ctx, [&] { return (*cursor)->Next(absl::Milliseconds(200)); },
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
    if (auto job = manager_->Get(req->job_id()); !job.ok()) return Finish("ListEvents", job.status());
  }
  auto page = manager_->events().Read(req->job_id(), req->after_seq(),
                                      req->page_size() == 0 ? 500 : req->page_size());
  if (!page.ok()) {
    return Finish("ListEvents", absl::UnavailableError(absl::StrCat(
                                    "reading the event log: ", page.status().message())));
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
  if (s.ok() && req->skip_size() > 1000) s = absl::InvalidArgumentError("skip: at most 1000 ranges");
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

// --------------------------------------------------------------- WorkerService

WorkerServiceImpl::WorkerServiceImpl(JobManager* manager, const AccessControl* access,
                                     RpcMetrics* metrics, LogStore* logs,
                                     const Leadership* leadership)
    : manager_(manager),
      access_(access),
      metrics_(metrics),
      rank_logs_(
          logs,
          [manager](const std::string& job_id) { return manager->AttemptPlacements(job_id); }),
      leadership_(leadership) {}

absl::Status WorkerServiceImpl::CheckWorker(const Principal& caller, const std::string& worker_id) {
  if (caller.name.empty()) return absl::OkStatus();  // the shared worker token
  absl::StatusOr<std::string> node = manager_->WorkerNode(worker_id);
  if (!node.ok()) return node.status();
  if (*node != caller.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        caller.Describe(), " may not act for worker ", worker_id, ", which is node '", *node, "'"));
  }
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::Finish(const char* method, const absl::Status& s) {
  grpc::Status g = ToGrpcStatus(s);
  metrics_->Record(method, g);
  return g;
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* ctx,
                                               const loom::v1::RegisterWorkerRequest* req,
                                               loom::v1::RegisterWorkerResponse* resp) {
  LOOM_ADMIT("WorkerService", "RegisterWorker");
  if (!caller->name.empty() && req->node() != caller->name) {
    return Finish("RegisterWorker",
                  absl::PermissionDeniedError(absl::StrCat(
                      caller->Describe(), " may register only as node '", caller->name,
                      "', not as '", req->node(), "' (its certificate names the node)")));
  }
  auto r = manager_->RegisterWorker(*req);
  if (r.ok()) *resp = std::move(*r);
  resp->set_controller_epoch(leadership_ != nullptr ? leadership_->epoch() : 0);
  return Finish("RegisterWorker", r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const loom::v1::HeartbeatRequest* req,
                                                       loom::v1::HeartbeatResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(HandleHeartbeat(ctx, req, resp));
  return reactor;
}

grpc::Status WorkerServiceImpl::HandleHeartbeat(grpc::ServerContextBase* ctx,
                                                const loom::v1::HeartbeatRequest* req,
                                                loom::v1::HeartbeatResponse* resp) {
  LOOM_ADMIT("WorkerService", "Heartbeat");
  absl::Status s = RequireId(req->worker_id(), "worker_id");
  if (s.ok()) s = CheckWorker(*caller, req->worker_id());
  if (!s.ok()) return Finish("Heartbeat", s);
  auto r = manager_->Heartbeat(*req);
  if (r.ok()) *resp = std::move(*r);
  resp->set_controller_epoch(leadership_ != nullptr ? leadership_->epoch() : 0);
  return Finish("Heartbeat", r.status());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportStepMetrics(
    grpc::CallbackServerContext* ctx, const loom::v1::ReportStepMetricsRequest* req,
    loom::v1::ReportStepMetricsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  auto answer = [this, reactor, start](const absl::Status& s) {
    grpc::Status g = ToGrpcStatus(s);
    metrics_->RecordSince("ReportStepMetrics", g, start);
    reactor->Finish(g);
  };
  absl::StatusOr<Principal> caller =
      AdmitCaller(*ctx, *access_, "WorkerService.ReportStepMetrics");
  absl::Status s = caller.status();
  if (s.ok()) s = AdmitLeader(ctx, leadership_);
  if (s.ok()) s = RequireId(req->worker_id(), "worker_id");
  if (s.ok()) s = RequireId(req->job_id(), "job_id");
  if (s.ok()) s = CheckWorker(*caller, req->worker_id());
  if (!s.ok()) {
    answer(s);
    return reactor;
  }
  const int64_t epoch = leadership_ != nullptr ? leadership_->epoch() : 0;
  // `resp` stays valid until the reactor is finished.
  manager_->ReportEventsAsync(
      *req, [resp, answer, epoch](absl::StatusOr<loom::v1::ReportStepMetricsResponse> r) {
        if (r.ok()) *resp = std::move(*r);
        resp->set_controller_epoch(epoch);
        answer(r.status());
      });
  return reactor;
}

grpc::Status WorkerServiceImpl::ReportRankExit(grpc::ServerContext* ctx,
                                               const loom::v1::ReportRankExitRequest* req,
                                               loom::v1::ReportRankExitResponse*) {
  LOOM_ADMIT("WorkerService", "ReportRankExit");
  absl::Status s = RequireId(req->worker_id(), "worker_id");
  if (s.ok()) s = RequireId(req->job_id(), "job_id");
  if (s.ok() && req->rank() < 0) s = absl::InvalidArgumentError("rank: must be >= 0");
  if (s.ok()) s = CheckWorker(*caller, req->worker_id());
  if (!s.ok()) return Finish("ReportRankExit", s);
  return Finish("ReportRankExit", manager_->ReportRankExit(*req));
}

grpc::Status WorkerServiceImpl::AppendRankLogs(grpc::ServerContext* ctx,
                                               const loom::v1::AppendRankLogsRequest* req,
                                               loom::v1::AppendRankLogsResponse* resp) {
  LOOM_ADMIT("WorkerService", "AppendRankLogs");
  absl::Status s = RequireId(req->worker_id(), "worker_id");
  if (s.ok()) s = RankLogs::ValidateAppend(*req);
  if (s.ok()) s = CheckWorker(*caller, req->worker_id());
  absl::StatusOr<std::string> node = s.ok() ? manager_->WorkerNode(req->worker_id()) : s;
  if (!node.ok()) return Finish("AppendRankLogs", node.status());
  absl::StatusOr<loom::v1::AppendRankLogsResponse> appended = rank_logs_.Append(*req, *node);
  if (appended.ok()) *resp = *std::move(appended);
  return Finish("AppendRankLogs", appended.status());
}

}  // namespace loom::controller
