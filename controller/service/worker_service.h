// The gRPC service workers call: registration, heartbeats, step reports,
// rank exits and rank logs, translated into JobManager calls.
#ifndef LOOM_CONTROLLER_SERVICE_WORKER_SERVICE_H_
#define LOOM_CONTROLLER_SERVICE_WORKER_SERVICE_H_

#include <string>

#include "controller/job_manager.h"
#include "controller/leader/leader_lease.h"
#include "controller/logs/log_store.h"
#include "controller/logs/rank_logs.h"
#include "controller/service/access.h"
#include "controller/service/rpc_admission.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::controller {

// Heartbeat and ReportStepMetrics, the RPCs every worker makes every
// period and every rank every few steps (10,000 and 1,000 a second in bench
// control-plane), are served through gRPC's callback API: they run on
// gRPC's own threads, without the synchronous server's hand-off to a
// thread of its pool and back. Neither blocks one: a step report is
// answered from the store's committer thread once its write is durable
// (JobManager::ReportEventsAsync). The rarer others stay synchronous.
class WorkerServiceImpl final : public loom::v1::WorkerService::WithCallbackMethod_Heartbeat<
                                    loom::v1::WorkerService::WithCallbackMethod_ReportStepMetrics<
                                        loom::v1::WorkerService::Service>> {
 public:
  // Only workers (access.h) may call; a worker with a certificate acts only
  // as the worker of the node it names.
  // Shipped rank logs go to `logs`, which must outlive the service.
  // `leadership` as for JobServiceImpl; answers to workers carry its epoch
  // (controller_epoch).
  WorkerServiceImpl(JobManager* manager, const AccessControl* access, RpcMetrics* metrics,
                    LogStore* logs, const Leadership* leadership = nullptr);

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const loom::v1::RegisterWorkerRequest* req,
                              loom::v1::RegisterWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const loom::v1::HeartbeatRequest* req,
                                      loom::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportStepMetrics(grpc::CallbackServerContext* ctx,
                                              const loom::v1::ReportStepMetricsRequest* req,
                                              loom::v1::ReportStepMetricsResponse* resp) override;
  grpc::Status ReportRankExit(grpc::ServerContext* ctx, const loom::v1::ReportRankExitRequest* req,
                              loom::v1::ReportRankExitResponse* resp) override;
  // Takes each chunk of a rank this worker's node ran (in an attempt this
  // controller placed or re-adopted); answers -1 for the others.
  // INVALID_ARGUMENT for a negative rank, generation or offset, or a bad
  // job id, naming the chunk.
  grpc::Status AppendRankLogs(grpc::ServerContext* ctx, const loom::v1::AppendRankLogsRequest* req,
                              loom::v1::AppendRankLogsResponse* resp) override;

 private:
  grpc::Status Finish(const char* method, const absl::Status& s);
  grpc::Status HandleHeartbeat(grpc::ServerContextBase* ctx, const loom::v1::HeartbeatRequest* req,
                               loom::v1::HeartbeatResponse* resp);
  // OK if a certificate worker `caller` is the worker `worker_id` (its
  // node); token workers are not bound to a node.
  absl::Status CheckWorker(const Principal& caller, const std::string& worker_id);
  JobManager* const manager_;
  const AccessControl* const access_;
  RpcMetrics* const metrics_;
  RankLogs rank_logs_;  // over the LogStore and the manager's placements
  const Leadership* const leadership_;
  // Workers hold no console sessions (LOOM_ADMIT reads this).
  const SessionDirectory* const sessions_ = nullptr;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SERVICE_WORKER_SERVICE_H_
