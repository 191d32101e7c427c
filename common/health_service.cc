#include "common/health_service.h"

namespace loom {

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) {
  // The protocol: an unknown service name is NOT_FOUND.
  if (!request->service().empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "this server reports health for the whole server only (service \"\")");
  }
  response->set_status(serving_.load() ? grpc::health::v1::HealthCheckResponse::SERVING
                                       : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

}  // namespace loom
