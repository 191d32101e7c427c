#include "worker/log_shipper.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

namespace loom::worker {
namespace {

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Up to `n` bytes of `path` from `offset` (fewer at its end or on error).
std::string ReadAt(const std::string& path, int64_t offset, int64_t n) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  out.resize(static_cast<size_t>(n));
  int64_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, out.data() + got, static_cast<size_t>(n - got), offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += r;
  }
  close(fd);
  out.resize(static_cast<size_t>(got));
  return out;
}

}  // namespace

LogShipper::LogShipper(SendFn send, LogShipperOptions options)
    : send_(std::move(send)), options_(options) {}

void LogShipper::Started(const std::string& job_id, int rank, int64_t generation,
                         const std::string& path, int64_t begin) {
  std::lock_guard<std::mutex> lock(mu_);
  Log& log = logs_[{job_id, rank, generation}];
  log.path = path;
  log.begin = std::max<int64_t>(0, begin);
  log.end = -1;
  log.acked = 0;
}

void LogShipper::Exited(const std::string& job_id, int rank, int64_t generation, int64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = logs_.find({job_id, rank, generation});
  if (it == logs_.end()) return;
  Log& log = it->second;
  if (end < 0) end = FileSize(log.path);
  log.end = std::max(log.begin, end);
}

size_t LogShipper::tracked() {
  std::lock_guard<std::mutex> lock(mu_);
  return logs_.size();
}

grpc::Status LogShipper::ShipOnce() {
  loom::v1::AppendRankLogsRequest req;
  std::vector<Key> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t budget = options_.max_request_bytes;
    for (auto& [key, log] : logs_) {
      if (budget <= 0) break;
      const int64_t limit = log.end >= 0 ? log.end : FileSize(log.path);
      if (limit < 0) continue;  // the file is gone (work dir cleaned): nothing to send yet
      const int64_t from = log.begin + log.acked;
      const int64_t n = std::min({std::max<int64_t>(0, limit - from), options_.max_chunk_bytes,
                                  budget});
      const bool ends = log.end >= 0 && from + n >= log.end;
      if (n == 0 && !ends) continue;
      loom::v1::RankLogChunk* c = req.add_chunks();
      c->set_job_id(std::get<0>(key));
      c->set_rank(std::get<1>(key));
      c->set_generation(std::get<2>(key));
      c->set_offset(log.acked);
      if (n > 0) c->set_data(ReadAt(log.path, from, n));
      c->set_complete(ends && static_cast<int64_t>(c->data().size()) == n);
      budget -= static_cast<int64_t>(c->data().size());
      keys.push_back(key);
    }
  }
  if (keys.empty()) return grpc::Status::OK;
  loom::v1::AppendRankLogsResponse resp;
  grpc::Status s = send_(&req, &resp);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < req.chunks_size() && i < static_cast<int>(keys.size()); ++i) {
    auto it = logs_.find(keys[i]);
    if (it == logs_.end()) continue;
    if (i >= resp.next_offset_size() || resp.next_offset(i) < 0) {
      logs_.erase(it);  // refused: not ours to ship, or a job it forgot
      continue;
    }
    const loom::v1::RankLogChunk& c = req.chunks(i);
    const int64_t next = resp.next_offset(i);
    it->second.acked = next;
    if (c.complete() && next >= c.offset() + static_cast<int64_t>(c.data().size())) {
      logs_.erase(it);  // all of it is there
    }
  }
  return s;
}

}  // namespace loom::worker
