// The cluster CA of `loomctl local up`: a private certificate
// authority under <home>/tls that issues the controller's server
// certificate and the client certificates that identify workers and users
// (controller/service/access.h: common names "worker:<node>" and "user:<name>").
// Made with the openssl command (Debian's openssl package); keys are
// ECDSA P-256, private files mode 0600.
//
//   <home>/tls/ca.pem, ca.key              the CA (10 years)
//   <home>/tls/<name>.pem, <name>.key      issued certificates (825 days)
#ifndef LOOM_CLI_CLUSTER_CA_H_
#define LOOM_CLI_CLUSTER_CA_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::cli {

struct IssuedCertificate {
  std::string cert_path;
  std::string key_path;
};

// Creates the CA in `dir` unless ca.pem and ca.key are there already.
absl::Status EnsureClusterCa(const std::string& dir);

// Issues (or re-issues, when the CA changed or the names differ)
// <dir>/<file_stem>.pem/.key for `common_name`. A server certificate
// (`server`) carries `hosts` as subject alternative names (IP addresses or
// DNS names) and is for serverAuth; a client one is for clientAuth. The
// error carries openssl's own message.
absl::StatusOr<IssuedCertificate> IssueCertificate(const std::string& dir,
                                                   const std::string& file_stem,
                                                   const std::string& common_name, bool server,
                                                   const std::vector<std::string>& hosts = {});

}  // namespace loom::cli

#endif  // LOOM_CLI_CLUSTER_CA_H_
