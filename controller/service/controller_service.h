// gRPC adapters for the controller: translate request -> JobManager call ->
// status. The only controller code that touches grpc::ServerContext.
#ifndef LOOM_CONTROLLER_SERVICE_CONTROLLER_SERVICE_H_
#define LOOM_CONTROLLER_SERVICE_CONTROLLER_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/metrics.h"
#include "controller/job_manager.h"
#include "controller/leader/leader_lease.h"
#include "controller/logs/log_store.h"
#include "controller/logs/rank_logs.h"
#include "controller/progress/series_warmer.h"
#include "controller/progress/step_series_index.h"
#include "controller/service/access.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::controller {

// Counts RPCs by method and status code. Thread-safe.
class RpcMetrics {
 public:
  explicit RpcMetrics(metrics::Registry& registry);
  // Marks the start of an RPC on this thread (handlers run synchronously on
  // one thread each); Record() observes the time since then.
  static void Start();
  // Counts the RPC by method and status code and, except for streams
  // (WatchJob), observes its duration since Start() on this thread.
  void Record(const std::string& method, const grpc::Status& status);
  // The same for an RPC answered on another thread than the one that began
  // it: its duration is the time since `start`.
  void RecordSince(const std::string& method, const grpc::Status& status, absl::Time start);

 private:
  metrics::Family<metrics::Counter>& rpcs_;
  metrics::Family<metrics::Histogram>& duration_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, metrics::Counter*> counters_;  // guarded by mu_
  std::map<std::string, metrics::Histogram*> histograms_;             // guarded by mu_
};

class JobServiceImpl final : public loom::v1::JobService::Service {
 public:
  // `manager` and `metrics` must outlive the service. `shutting_down` ends
  // open watch streams when set.
  // Every call is authenticated and authorized by `access` (access.h),
  // which must outlive the service.
  // Rank logs are read from `logs`, which must outlive the service.
  // `leadership` (may be null: always leading) gates every RPC: while this
  // controller does not lead, RPCs are answered UNAVAILABLE naming the
  // leader, with its address in the trailing metadata kLeaderMetadataKey.
  // `sessions` (may be null: no console sessions) resolves the console's
  // "x-loom-session" metadata.
  // Once this controller leads, the longest jobs' chart series are read
  // ahead (SeriesWarmer).
  JobServiceImpl(JobManager* manager, const AccessControl* access, RpcMetrics* metrics,
                 const std::atomic<bool>* shutting_down, LogStore* logs,
                 const Leadership* leadership = nullptr,
                 const SessionDirectory* sessions = nullptr);

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const loom::v1::SubmitJobRequest* req,
                         loom::v1::SubmitJobResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const loom::v1::ListJobsRequest* req,
                        loom::v1::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const loom::v1::CancelJobRequest* req,
                         loom::v1::Job* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const loom::v1::WatchJobRequest* req,
                        grpc::ServerWriter<loom::v1::JobEvent>* writer) override;
  grpc::Status WatchEvents(grpc::ServerContext* ctx, const loom::v1::WatchEventsRequest* req,
                           grpc::ServerWriter<loom::v1::JobEvent>* writer) override;
  grpc::Status ListEvents(grpc::ServerContext* ctx, const loom::v1::ListEventsRequest* req,
                          loom::v1::ListEventsResponse* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const loom::v1::ListWorkersRequest* req,
                           loom::v1::ListWorkersResponse* resp) override;
  grpc::Status ListQueues(grpc::ServerContext* ctx, const loom::v1::ListQueuesRequest* req,
                          loom::v1::ListQueuesResponse* resp) override;
  grpc::Status GetStepMetrics(grpc::ServerContext* ctx,
                              const loom::v1::GetStepMetricsRequest* req,
                              loom::v1::GetStepMetricsResponse* resp) override;
  grpc::Status GetStepSeries(grpc::ServerContext* ctx, const loom::v1::GetStepSeriesRequest* req,
                             loom::v1::GetStepSeriesResponse* resp) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx,
                               const loom::v1::ListCheckpointsRequest* req,
                               loom::v1::ListCheckpointsResponse* resp) override;
  grpc::Status Plan(grpc::ServerContext* ctx, const loom::v1::PlanRequest* req,
                    loom::v1::PlanResponse* resp) override;
  grpc::Status RollbackJob(grpc::ServerContext* ctx, const loom::v1::RollbackJobRequest* req,
                           loom::v1::Job* resp) override;
  // INVALID_ARGUMENT for a negative rank, offset, tail_lines or max_bytes;
  // NOT_FOUND for an unknown job, or no log of that rank (attempt) yet.
  grpc::Status GetRankLog(grpc::ServerContext* ctx, const loom::v1::GetRankLogRequest* req,
                          loom::v1::GetRankLogResponse* resp) override;
  grpc::Status SearchRankLogs(grpc::ServerContext* ctx, const loom::v1::SearchRankLogsRequest* req,
                              loom::v1::SearchRankLogsResponse* resp) override;
  grpc::Status WhoAmI(grpc::ServerContext* ctx, const loom::v1::WhoAmIRequest* req,
                      loom::v1::WhoAmIResponse* resp) override;

 private:
  // Writes the events `next` returns (it waits a while for some) until
  // `ended`, the client leaves, or the controller shuts down (UNAVAILABLE);
  // UNAVAILABLE when the log cannot be read.
  absl::Status StreamEvents(
      const grpc::ServerContext& ctx,
      const std::function<absl::StatusOr<std::vector<loom::v1::JobEvent>>()>& next,
      const std::function<bool()>& ended, grpc::ServerWriter<loom::v1::JobEvent>* writer);
  grpc::Status Finish(const char* method, const absl::Status& s);
  JobManager* const manager_;
  const AccessControl* const access_;
  RpcMetrics* const metrics_;
  const std::atomic<bool>* const shutting_down_;
  RankLogs rank_logs_;  // over the LogStore and the manager's placements
  StepSeriesIndex series_;  // over the manager's store
  const Leadership* const leadership_;
  const SessionDirectory* const sessions_;
  SeriesWarmer warmer_;  // last: its thread starts when the rest is built
};

// Heartbeat and ReportStepMetrics, the RPCs every worker makes every
// period and every rank every few steps (10,000 and 1,000 a second in bench
// control-plane), are served through gRPC's callback API: they run on
// gRPC's own threads, without the synchronous server's hand-off to a
// thread of its pool and back. Neither blocks one: a step report is
// answered from the store's committer thread once its write is durable
// (JobManager::ReportEventsAsync). The rarer others stay synchronous.
class WorkerServiceImpl final
    : public loom::v1::WorkerService::WithCallbackMethod_Heartbeat<
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

  grpc::Status RegisterWorker(grpc::ServerContext* ctx,
                              const loom::v1::RegisterWorkerRequest* req,
                              loom::v1::RegisterWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const loom::v1::HeartbeatRequest* req,
                                      loom::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportStepMetrics(grpc::CallbackServerContext* ctx,
                                              const loom::v1::ReportStepMetricsRequest* req,
                                              loom::v1::ReportStepMetricsResponse* resp) override;
  grpc::Status ReportRankExit(grpc::ServerContext* ctx,
                              const loom::v1::ReportRankExitRequest* req,
                              loom::v1::ReportRankExitResponse* resp) override;
  // Takes each chunk of a rank this worker's node ran (in an attempt this
  // controller placed or re-adopted); answers -1 for the others.
  // INVALID_ARGUMENT for a negative rank, generation or offset, or a bad
  // job id, naming the chunk.
  grpc::Status AppendRankLogs(grpc::ServerContext* ctx,
                              const loom::v1::AppendRankLogsRequest* req,
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

// OK when `leadership` is null or this controller leads now; otherwise
// UNAVAILABLE naming the leader, whose address goes into `ctx`'s trailing
// metadata (kLeaderMetadataKey) for clients that follow it.
absl::Status AdmitLeader(grpc::ServerContextBase* ctx, const Leadership* leadership);

// The caller of `ctx`: its verified client certificate's common name, else
// its bearer token, else (with `sessions`) its console session, through
// `access`; then authorized for `method` ("JobService.GetJob").
// UNAUTHENTICATED / PERMISSION_DENIED otherwise.
absl::StatusOr<Principal> AdmitCaller(const grpc::ServerContextBase& ctx,
                                      const AccessControl& access, absl::string_view method,
                                      const SessionDirectory* sessions = nullptr);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SERVICE_CONTROLLER_SERVICE_H_
