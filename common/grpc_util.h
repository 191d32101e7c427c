// Small gRPC glue shared by the daemons and the CLI: status conversion,
// bearer tokens on calls, token files, credentials. Only service adapters, clients
// and main.cc files include this.
#ifndef LOOM_COMMON_GRPC_UTIL_H_
#define LOOM_COMMON_GRPC_UTIL_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_util.h"

namespace loom {

// absl and gRPC share the canonical code space, so the mapping is 1:1.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// Adds "authorization: Bearer <token>" to an outgoing call (nothing if
// `token` is empty: a client certificate identifies the caller).
void AttachToken(grpc::ClientContext* context, const std::string& token);

// Reads a token file (whole file, whitespace trimmed). Accepts modes that
// give only the owner and, read-only, the file's group access (0600, 0400,
// 0640, 0440: a Kubernetes Secret mounted with fsGroup); refuses any access
// for others and group write/execute: PERMISSION_DENIED with a chmod hint.
// NOT_FOUND if missing, INVALID_ARGUMENT if empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// 64 hex characters from /dev/urandom.
absl::StatusOr<std::string> GenerateToken();

// Server credentials: TLS when cert and key are given, else insecure. With
// `client_ca` (mutual TLS), a client certificate, when sent, must chain to
// that CA (the handshake fails otherwise), and its names reach the
// handlers through the call's AuthContext; clients without one are let
// through to prove themselves with a bearer token.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& tls_cert, const std::string& tls_key, const std::string& client_ca = "");
// Channel credentials: TLS (trusting `tls_ca`, or the system roots if it is
// empty) when `use_tls`, else insecure; with `client_cert` and `client_key`
// (PEM files), the client presents that certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    bool use_tls, const std::string& tls_ca, const std::string& client_cert = "",
    const std::string& client_key = "");

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_UTIL_H_
