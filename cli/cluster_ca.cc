#include "cli/cluster_ca.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"

namespace loom::cli {
namespace {

// Runs openssl with `args`; its output goes to <dir>/openssl.log, which an
// error quotes.
absl::Status Openssl(const std::string& dir, std::vector<std::string> args) {
  const std::string log = dir + "/openssl.log";
  args.insert(args.begin(), "openssl");
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("openssl", argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::string output;
  if (auto text = ReadFile(log); text.ok()) output = std::string(absl::StripAsciiWhitespace(*text));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(
        "cannot run openssl (install Debian's openssl package: ./scripts/install-deps.sh)");
  }
  return absl::InternalError(
      absl::StrCat("openssl ", args[1], " failed: ", output.substr(0, 2000)));
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

bool IsIpAddress(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

absl::Status EnsureClusterCa(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", strerror(errno)));
  }
  if (Exists(dir + "/ca.pem") && Exists(dir + "/ca.key")) return absl::OkStatus();
  const mode_t old = umask(077);
  absl::Status s = Openssl(
      dir, {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "3650", "-subj", "/O=Loom/CN=Loom cluster CA", "-keyout", dir + "/ca.key.tmp",
            "-out", dir + "/ca.pem.tmp", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign"});
  umask(old);
  if (!s.ok()) return s;
  // The key first: a ca.pem without its key is never left behind.
  if (rename((dir + "/ca.key.tmp").c_str(), (dir + "/ca.key").c_str()) != 0 ||
      rename((dir + "/ca.pem.tmp").c_str(), (dir + "/ca.pem").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename in ", dir, ": ", strerror(errno)));
  }
  chmod((dir + "/ca.pem").c_str(), 0644);
  return absl::OkStatus();
}

absl::StatusOr<IssuedCertificate> IssueCertificate(const std::string& dir,
                                                   const std::string& file_stem,
                                                   const std::string& common_name, bool server,
                                                   const std::vector<std::string>& hosts) {
  IssuedCertificate out{absl::StrCat(dir, "/", file_stem, ".pem"),
                        absl::StrCat(dir, "/", file_stem, ".key")};
  // What the certificate says, and which CA signed it: unchanged means the
  // files on disk are still right.
  struct stat ca;
  if (stat((dir + "/ca.pem").c_str(), &ca) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("no cluster CA in ", dir));
  }
  std::vector<std::string> sans;
  for (const std::string& h : hosts) sans.push_back(absl::StrCat(IsIpAddress(h) ? "IP:" : "DNS:", h));
  const std::string names = absl::StrCat(common_name, "\n", server ? "server" : "client", "\n",
                                         absl::StrJoin(sans, ","), "\n", ca.st_ino, ".",
                                         ca.st_mtim.tv_sec, "\n");
  const std::string names_path = absl::StrCat(dir, "/", file_stem, ".names");
  if (auto had = ReadFile(names_path); had.ok() && *had == names && Exists(out.cert_path) &&
                                       Exists(out.key_path)) {
    return out;
  }
  std::string ext = absl::StrCat("basicConstraints=critical,CA:FALSE\n",
                                 "keyUsage=critical,digitalSignature,keyEncipherment\n",
                                 "extendedKeyUsage=", server ? "serverAuth" : "clientAuth", "\n");
  if (!sans.empty()) absl::StrAppend(&ext, "subjectAltName=", absl::StrJoin(sans, ","), "\n");
  const std::string ext_path = absl::StrCat(dir, "/", file_stem, ".ext");
  const std::string csr = absl::StrCat(dir, "/", file_stem, ".csr");
  if (absl::Status s = WritePrivateFile(ext_path, ext); !s.ok()) return s;
  const mode_t old = umask(077);
  absl::Status s = Openssl(dir, {"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                 "-nodes", "-subj", absl::StrCat("/O=Loom/CN=", common_name),
                                 "-keyout", out.key_path + ".tmp", "-out", csr});
  if (s.ok()) {
    s = Openssl(dir, {"x509", "-req", "-in", csr, "-CA", dir + "/ca.pem", "-CAkey",
                      dir + "/ca.key", "-CAcreateserial", "-days", "825", "-sha256", "-extfile",
                      ext_path, "-out", out.cert_path + ".tmp"});
  }
  umask(old);
  unlink(csr.c_str());
  unlink(ext_path.c_str());
  if (!s.ok()) return s;
  if (rename((out.key_path + ".tmp").c_str(), out.key_path.c_str()) != 0 ||
      rename((out.cert_path + ".tmp").c_str(), out.cert_path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename in ", dir, ": ", strerror(errno)));
  }
  chmod(out.cert_path.c_str(), 0644);
  if (absl::Status w = WritePrivateFile(names_path, names); !w.ok()) return w;
  return out;
}

}  // namespace loom::cli
