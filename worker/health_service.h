// grpc.health.v1.Health for loom-worker: SERVING while the worker is
// registered with the controller, NOT_SERVING otherwise. Answers Check for
// the whole server (service "") only; Watch is not implemented (kubelet and
// loom-probe use Check).
//
// gRPC's default health service cannot be used here: a server whose only
// service is the built-in one has no frequently polled completion queue and
// ServerBuilder refuses to start it.
//
// Thread-safe: SetServing may be called from any thread.
#ifndef LOOM_WORKER_HEALTH_SERVICE_H_
#define LOOM_WORKER_HEALTH_SERVICE_H_

#include <atomic>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace loom::worker {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_.store(serving); }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

 private:
  std::atomic<bool> serving_{false};
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_HEALTH_SERVICE_H_
