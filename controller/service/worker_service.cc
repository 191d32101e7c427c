#include "controller/service/worker_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"

namespace loom::controller {

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
    return absl::PermissionDeniedError(absl::StrCat(caller.Describe(), " may not act for worker ",
                                                    worker_id, ", which is node '", *node, "'"));
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
  absl::StatusOr<Principal> caller = AdmitCaller(*ctx, *access_, "WorkerService.ReportStepMetrics");
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
