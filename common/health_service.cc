#include "common/health_service.h"

namespace loom {

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) {
  // The protocol: an unknown service name is NOT_FOUND.
  bool serving = serving_.load();
  if (!request->service().empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = services_.find(request->service());
    if (it == services_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no health status for service \"" + request->service() + "\"");
    }
    serving = serving && it->second;
  }
  response->set_status(serving ? grpc::health::v1::HealthCheckResponse::SERVING
                               : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

}  // namespace loom
