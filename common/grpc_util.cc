#include "common/grpc_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::Status CheckBearerToken(const grpc::ServerContext& context, const std::string& token) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "missing cluster token: send 'authorization: Bearer <token>' (loomctl reads it from "
        "~/.loom/token or --token-file)");
  }
  std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!absl::StartsWith(value, kPrefix)) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  absl::string_view got = absl::string_view(value).substr(kPrefix.size());
  // Constant-time comparison: no early exit on the first differing byte.
  unsigned char diff = got.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(token[i] ^ (i < got.size() ? got[i] : 0));
  }
  if (diff != 0) return absl::UnauthenticatedError("wrong cluster token");
  return absl::OkStatus();
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  context->AddMetadata("authorization", "Bearer " + token);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("token file ", path,
                                            " does not exist (run `loomctl local up`, or pass "
                                            "--token-file)"));
  }
  // Group read is allowed: Kubernetes mounts a Secret with fsGroup as
  // root:<fsGroup> mode 0440 (defaultMode), readable only by the pod's group.
  // Any access for others, and group write or execute, is refused.
  if (st.st_mode & (S_IRWXO | S_IWGRP | S_IXGRP)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "token file %s has mode %04o: others may read or change it; run: chmod 600 %s "
        "(0640 or 0440 for a group-shared secret)",
        path, st.st_mode & 07777, path));
  }
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

absl::StatusOr<std::string> GenerateToken() {
  unsigned char bytes[32];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError("cannot open /dev/urandom");
  ssize_t n = read(fd, bytes, sizeof(bytes));
  close(fd);
  if (n != sizeof(bytes)) return absl::InternalError("short read from /dev/urandom");
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& tls_cert, const std::string& tls_key) {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  if (tls_cert.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadFile(tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(tls_key);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    bool use_tls, const std::string& tls_ca) {
  if (!use_tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!tls_ca.empty()) {
    auto ca = ReadFile(tls_ca);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  return grpc::SslCredentials(opts);
}

}  // namespace loom
