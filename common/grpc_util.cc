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

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  if (token.empty()) return;  // a client certificate identifies the caller
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
    const std::string& tls_cert, const std::string& tls_key, const std::string& client_ca) {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (tls_cert.empty() && !client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key: client certificates are checked only "
        "over TLS");
  }
  if (tls_cert.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadFile(tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(tls_key);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  if (!client_ca.empty()) {
    auto ca = ReadFile(client_ca);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
    // A certificate, when sent, must chain to the CA; a client without one
    // may still prove itself with a bearer token.
    opts.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    bool use_tls, const std::string& tls_ca, const std::string& client_cert,
    const std::string& client_key) {
  if (client_cert.empty() != client_key.empty()) {
    return absl::InvalidArgumentError("a client certificate and its key must be given together");
  }
  if (!use_tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!tls_ca.empty()) {
    auto ca = ReadFile(tls_ca);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
  }
  if (!client_cert.empty()) {
    auto cert = ReadFile(client_cert);
    if (!cert.ok()) return cert.status();
    auto key = ReadFile(client_key);
    if (!key.ok()) return key.status();
    opts.pem_cert_chain = *cert;
    opts.pem_private_key = *key;
  }
  return grpc::SslCredentials(opts);
}

}  // namespace loom
