// Ships the ranks' logs to the controller (WorkerService.AppendRankLogs), so
// that `loomctl logs` reads them without a shell on this worker, and after
// it is gone.
//
// The worker tells it where each attempt's output lies (Started: the rank's
// log file and the byte its output starts at; Exited: where it ended).
// Each ShipOnce sends what is new of every tracked log, from the offset the
// controller last acknowledged, in one request: a lost request or answer is
// sent again (the controller skips bytes it has), and nothing is buffered
// here but offsets (the files are the buffer). A log is forgotten once the
// controller has all of it, or refuses it.
//
// Thread-safe.
#ifndef LOOM_WORKER_LOG_SHIPPER_H_
#define LOOM_WORKER_LOG_SHIPPER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "loom/v1/service.pb.h"

namespace loom::worker {

struct LogShipperOptions {
  int64_t max_chunk_bytes = 256 << 10;    // of one log per request
  int64_t max_request_bytes = 2 << 20;    // of all logs together (gRPC's limit is 4 MiB)
};

class LogShipper {
 public:
  // `send` delivers one request (the worker fills in its id) and its answer.
  using SendFn = std::function<grpc::Status(loom::v1::AppendRankLogsRequest*,
                                            loom::v1::AppendRankLogsResponse*)>;
  explicit LogShipper(SendFn send, LogShipperOptions options = {});

  // Attempt `generation` of rank `rank` of `job_id` writes to `path` from
  // byte `begin` on.
  void Started(const std::string& job_id, int rank, int64_t generation, const std::string& path,
               int64_t begin);
  // ... and its output ended at byte `end` of that file (-1: not known; the
  // file's size now is taken).
  void Exited(const std::string& job_id, int rank, int64_t generation, int64_t end);

  // One round (see above). OK when there was nothing to send; the RPC's
  // status otherwise (tracked logs are kept on failure).
  grpc::Status ShipOnce();
  // Logs not yet wholly delivered.
  size_t tracked();

 private:
  using Key = std::tuple<std::string, int, int64_t>;
  struct Log {
    std::string path;
    int64_t begin = 0;
    int64_t end = -1;     // file offset where the output ended; -1 = still running
    int64_t acked = 0;    // bytes of the output the controller has
  };
  const SendFn send_;
  const LogShipperOptions options_;
  std::mutex mu_;
  std::map<Key, Log> logs_;  // guarded by mu_
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_LOG_SHIPPER_H_
