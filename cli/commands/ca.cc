// `loomctl ca issue`: certificates from the cluster CA (cli/cluster_ca.h);
// needs no controller (cli/commands/commands.h).
#include <iostream>

#include "cli/cluster_ca.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"

namespace loom::cli {

// `loomctl ca issue server|worker|user NAME [--host H]... [--dir DIR]`: the
// cluster CA (cli/cluster_ca.h), made on first use, issues a certificate:
// the controller's (server; --host names every address clients dial), a
// worker's (common name worker:NAME) or a user's (user:NAME).
int CmdCa(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() < 3 || args[0] != "issue") {
    return Usage("ca: expected issue server|worker|user NAME [--host H]... [--dir DIR]");
  }
  const std::string kind = args[1];
  const std::string name = args[2];
  std::string dir = g.home + "/tls";
  std::vector<std::string> hosts;
  for (size_t i = 3; i < args.size(); ++i) {
    if (args[i] == "--dir" && i + 1 < args.size()) {
      dir = args[++i];
    } else if (args[i] == "--host" && i + 1 < args.size() && kind == "server") {
      hosts.push_back(args[++i]);
    } else {
      return Usage("ca issue: unexpected argument " + args[i]);
    }
  }
  std::string cn, stem;
  if (kind == "server") {
    if (hosts.empty()) return Usage("ca issue server: give every address clients dial (--host)");
    cn = name;
    stem = name;
  } else if (kind == "worker" || kind == "user") {
    cn = kind + ":" + name;
    stem = kind + "-" + name;
  } else {
    return Usage("ca issue: expected server, worker or user, got " + kind);
  }
  if (absl::Status s = EnsureClusterCa(dir); !s.ok()) return Fail(s);
  auto issued = IssueCertificate(dir, stem, cn, kind == "server", hosts);
  if (!issued.ok()) return Fail(issued.status());
  std::cout << "CA " << dir << "/ca.pem\ncertificate " << issued->cert_path << " (" << cn
            << ")\nkey " << issued->key_path << "\n";
  return 0;
}

}  // namespace loom::cli
