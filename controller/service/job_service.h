// The gRPC service people and the console call (loom.v1.JobService):
// each handler admits the caller, validates the request and translates it
// into a JobManager call and a status. The only controller code besides
// worker_service.h that touches grpc::ServerContext.
#ifndef LOOM_CONTROLLER_SERVICE_JOB_SERVICE_H_
#define LOOM_CONTROLLER_SERVICE_JOB_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "controller/checkpoints/retention_planner.h"
#include "controller/job_manager.h"
#include "controller/leader/leader_lease.h"
#include "controller/logs/log_store.h"
#include "controller/logs/rank_logs.h"
#include "controller/progress/goodput_board.h"
#include "controller/progress/series_warmer.h"
#include "controller/progress/step_series_index.h"
#include "controller/service/access.h"
#include "controller/service/rpc_admission.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::controller {

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
  grpc::Status GetStepMetrics(grpc::ServerContext* ctx, const loom::v1::GetStepMetricsRequest* req,
                              loom::v1::GetStepMetricsResponse* resp) override;
  grpc::Status GetStepSeries(grpc::ServerContext* ctx, const loom::v1::GetStepSeriesRequest* req,
                             loom::v1::GetStepSeriesResponse* resp) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx,
                               const loom::v1::ListCheckpointsRequest* req,
                               loom::v1::ListCheckpointsResponse* resp) override;
  // NOT_FOUND for an unknown job; the tiers are read without the lock.
  grpc::Status PlanCheckpointRetention(grpc::ServerContext* ctx,
                                       const loom::v1::PlanCheckpointRetentionRequest* req,
                                       loom::v1::PlanCheckpointRetentionResponse* resp) override;
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
  grpc::Status GetGoodput(grpc::ServerContext* ctx, const loom::v1::GetGoodputRequest* req,
                          loom::v1::GetGoodputResponse* resp) override;
  grpc::Status CordonNode(grpc::ServerContext* ctx, const loom::v1::CordonNodeRequest* req,
                          loom::v1::CordonNodeResponse* resp) override;
  grpc::Status UncordonNode(grpc::ServerContext* ctx, const loom::v1::UncordonNodeRequest* req,
                            loom::v1::CordonNodeResponse* resp) override;
  grpc::Status DrainNode(grpc::ServerContext* ctx, const loom::v1::DrainNodeRequest* req,
                         loom::v1::DrainNodeResponse* resp) override;

  // Every job's newest goodput figures, which GetGoodput answers; the
  // controller's Prometheus refresh reads them through it too.
  GoodputBoard& goodput() { return goodput_; }

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
  RankLogs rank_logs_;      // over the LogStore and the manager's placements
  StepSeriesIndex series_;  // over the manager's store
  GoodputBoard goodput_;    // over the manager's step reports
  RetentionPlanner retention_;
  const Leadership* const leadership_;
  const SessionDirectory* const sessions_;
  SeriesWarmer warmer_;  // last: its thread starts when the rest is built
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SERVICE_JOB_SERVICE_H_
