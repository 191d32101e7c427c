// An S3-compatible store of a test's (or a benchmark's) own: Ceph's RADOS
// Gateway on a throw-away single-host Ceph cluster (one monitor, manager and
// OSD, BlueStore on a sparse file) that tests/object_store/radosgw.sh starts
// in a fresh temporary directory on free loopback ports, and stops and
// removes with this object. It checks every request's SigV4 signature and
// payload hash, as AWS does. About 9 s to start on a 2-core machine, and
// ~420 MiB while it runs: start one per test suite, with a bucket per test.
// If the test process dies, the script and its daemons get SIGKILL too
// (parent-death signals), so no cluster outlives a crashed test.
#ifndef LOOM_COMMON_OBJECT_STORE_S3_TEST_SERVER_H_
#define LOOM_COMMON_OBJECT_STORE_S3_TEST_SERVER_H_

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/object_store/s3_config.h"

namespace loom::object_store {

class S3TestServer {
 public:
  struct Options {
    // The store's daemons run at this CPU priority (0-19): a benchmark that
    // stands in for a store on other machines keeps it from competing with
    // what it measures.
    int nice = 0;
    // A command the script runs under, e.g. {"ip", "netns", "exec", NS} (the
    // store in a network namespace of the test's) or {"taskset", "-c", "1"}
    // (the store on a CPU of its own).
    std::vector<std::string> prefix;
    // The address the gateway binds: with `prefix` putting it in a namespace,
    // that namespace's own address, which the caller must be able to reach.
    std::string address = "127.0.0.1";
  };
  // Starts the store and makes `bucket` there. FAILED_PRECONDITION naming
  // the install script when Ceph's packages are missing.
  static absl::StatusOr<std::unique_ptr<S3TestServer>> Start(const std::string& bucket,
                                                             const Options& options);
  static absl::StatusOr<std::unique_ptr<S3TestServer>> Start(const std::string& bucket) {
    return Start(bucket, Options());
  }
  ~S3TestServer();

  std::string endpoint() const { return endpoint_; }  // http://ADDRESS:PORT
  int port() const { return port_; }
  const std::string& access_key() const { return key_; }
  const std::string& secret_key() const { return secret_; }
  // A configuration for this store: its endpoint, path style, its user.
  S3Config Config() const;
  // The environment variables the AWS tools and Loom's daemons read for it
  // (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), "NAME=value" each.
  std::vector<std::string> Environment() const;
  // Makes another bucket (a test's own).
  absl::Status CreateBucket(const std::string& bucket);

  // Stops the gateway (SIGKILL: a store that vanishes), and starts it again
  // on the same port and objects.
  absl::Status Kill();
  absl::Status Restart();

 private:
  S3TestServer() = default;
  // The script's next stdout line that starts with `prefix` (within
  // `seconds`), or an error with the end of its log.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix, int seconds);

  std::string tmp_;  // holds cluster/ (the script's) and script.log
  std::string address_, endpoint_, key_, secret_;
  int port_ = 0;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;  // the script's stdout
};

}  // namespace loom::object_store

#endif  // LOOM_COMMON_OBJECT_STORE_S3_TEST_SERVER_H_
