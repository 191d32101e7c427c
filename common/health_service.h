// grpc.health.v1.Health on a plaintext listener of its own, for kubelet
// probes and image HEALTHCHECKs (which speak no TLS and hold no
// credentials): loom-worker is SERVING while registered with the
// controller, loom-controller while it serves. Answers Check for the whole
// server (service "") only; Watch is not implemented (kubelet and
// loom-probe use Check).
//
// gRPC's default health service cannot be used here: a server whose only
// service is the built-in one has no frequently polled completion queue and
// ServerBuilder refuses to start it.
//
// Thread-safe: SetServing may be called from any thread.
#ifndef LOOM_COMMON_HEALTH_SERVICE_H_
#define LOOM_COMMON_HEALTH_SERVICE_H_

#include <atomic>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace loom {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_.store(serving); }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

 private:
  std::atomic<bool> serving_{false};
};

}  // namespace loom

#endif  // LOOM_COMMON_HEALTH_SERVICE_H_
