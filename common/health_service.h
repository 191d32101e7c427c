// grpc.health.v1.Health on a plaintext listener of its own, for kubelet
// probes and image HEALTHCHECKs (which speak no TLS and hold no
// credentials): loom-worker is SERVING while registered with the
// controller, loom-controller while it serves. Answers Check for the whole
// server (service "") and for the services given a status with
// SetServing(service, ...) (loom-controller's "loom.leader": SERVING only
// while it leads, for a readiness probe that sends a Service's traffic to
// the leader alone); NOT_FOUND for any other. Watch is not implemented
// (kubelet and loom-probe use Check).
//
// gRPC's default health service cannot be used here: a server whose only
// service is the built-in one has no frequently polled completion queue and
// ServerBuilder refuses to start it.
//
// Thread-safe: SetServing may be called from any thread.
#ifndef LOOM_COMMON_HEALTH_SERVICE_H_
#define LOOM_COMMON_HEALTH_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace loom {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_.store(serving); }
  void SetServing(const std::string& service, bool serving) {
    std::lock_guard<std::mutex> lock(mu_);
    services_[service] = serving;
  }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

 private:
  std::atomic<bool> serving_{false};
  std::mutex mu_;
  std::map<std::string, bool> services_;  // guarded by mu_
};

}  // namespace loom

#endif  // LOOM_COMMON_HEALTH_SERVICE_H_
