#include "controller/log_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace loom::controller {
namespace fs = std::filesystem;

absl::Status CheckLogJobId(absl::string_view job_id) {
  if (job_id.empty() || job_id.size() > 200 || job_id[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: \"", absl::CEscape(job_id.substr(0, 64)), "\" is not a job name"));
  }
  for (char c : job_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          absl::StrCat("job_id: \"", absl::CEscape(job_id.substr(0, 64)), "\" is not a job name"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckKey(const LogKey& key) {
  if (absl::Status s = CheckLogJobId(key.job_id); !s.ok()) return s;
  if (key.rank < 0) return absl::InvalidArgumentError("rank: must be >= 0");
  if (key.generation < 0) return absl::InvalidArgumentError("generation: must be >= 0");
  return absl::OkStatus();
}

// Appends all of `data` to `path`.
absl::Status AppendToFile(const std::string& path, absl::string_view data) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(err)));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (close(fd) != 0) {
    return absl::InternalError(absl::StrCat("close ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ReadFileAt(const std::string& path, int64_t offset, int64_t n, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(n));
  int64_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, out->data() + start + got, static_cast<size_t>(n - got), offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += r;
  }
  close(fd);
  out->resize(start + static_cast<size_t>(got));
  if (got < n) return absl::InternalError(absl::StrCat("short read of ", path));
  return absl::OkStatus();
}

absl::Status NoLog(const LogKey& key) {
  return absl::NotFoundError(absl::StrCat("no log of rank ", key.rank, " in attempt ",
                                          key.generation, " of job ", key.job_id));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LogStore>> LogStore::Open(LogStoreOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("log store: no directory");
  if (options.max_bytes_per_log < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log store: max_bytes_per_log ", options.max_bytes_per_log, " is below 4096"));
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("log store: creating ", options.dir, ": ", ec.message()));
  }
  return std::unique_ptr<LogStore>(new LogStore(std::move(options)));
}

std::string LogStore::LogDir(const LogKey& key) const {
  return absl::StrCat(options_.dir, "/", key.job_id, "/rank-", key.rank, "/attempt-",
                      key.generation);
}

std::string LogStore::SegmentPath(const LogKey& key, int64_t base) const {
  return absl::StrFormat("%s/%016d.log", LogDir(key), base);
}

LogStore::Log* LogStore::FindLocked(const LogKey& key, bool create) {
  auto it = logs_.find(key);
  if (it != logs_.end()) return &it->second;
  const std::string dir = LogDir(key);
  std::error_code ec;
  Log log;
  bool exists = fs::is_directory(dir, ec);
  if (exists) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name == "complete") {
        log.complete = true;
        continue;
      }
      absl::string_view stem = name;
      int64_t base = 0;
      if (!absl::ConsumeSuffix(&stem, ".log") || !absl::SimpleAtoi(stem, &base)) continue;
      std::error_code size_ec;
      const auto size = fs::file_size(entry.path(), size_ec);
      if (size_ec) continue;
      log.segments.push_back({base, static_cast<int64_t>(size)});
    }
    std::sort(log.segments.begin(), log.segments.end(),
              [](const Segment& a, const Segment& b) { return a.base < b.base; });
    // Segments follow one another; anything after a hole (a crash between
    // dropping and writing) is not trusted.
    for (size_t i = 1; i < log.segments.size(); ++i) {
      if (log.segments[i].base != log.segments[i - 1].base + log.segments[i - 1].size) {
        log.segments.resize(i);
        break;
      }
    }
  } else if (!create) {
    return nullptr;
  } else {
    fs::create_directories(dir, ec);
    if (ec) return nullptr;
  }
  return &logs_.emplace(key, std::move(log)).first->second;
}

LogInfo LogStore::InfoLocked(const LogKey& key, const Log& log) const {
  LogInfo info;
  info.key = key;
  info.end = log.end();
  info.first_kept = log.segments.empty() ? 0 : log.segments.front().base;
  info.complete = log.complete;
  return info;
}

absl::StatusOr<int64_t> LogStore::Append(const LogKey& key, int64_t offset, absl::string_view data,
                                         bool complete) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (offset < 0) return absl::InvalidArgumentError("offset: must be >= 0");
  std::lock_guard<std::mutex> lock(mu_);
  Log* log = FindLocked(key, /*create=*/true);
  if (log == nullptr) {
    return absl::InternalError(absl::StrCat("log store: cannot create ", LogDir(key)));
  }
  const int64_t end = log->end();
  if (log->complete || offset > end) return end;
  const int64_t skip = std::min<int64_t>(end - offset, static_cast<int64_t>(data.size()));
  data.remove_prefix(static_cast<size_t>(skip));
  const int64_t segment_bytes = options_.max_bytes_per_log / 4;
  while (!data.empty()) {
    if (log->segments.empty() || log->segments.back().size >= segment_bytes) {
      log->segments.push_back({log->end(), 0});
    }
    Segment& back = log->segments.back();
    const size_t n = static_cast<size_t>(
        std::min<int64_t>(segment_bytes - back.size, static_cast<int64_t>(data.size())));
    if (absl::Status s = AppendToFile(SegmentPath(key, back.base), data.substr(0, n)); !s.ok()) {
      logs_.erase(key);  // reloaded from what reached the disk
      return s;
    }
    back.size += static_cast<int64_t>(n);
    data.remove_prefix(n);
  }
  // Retention: the newest max_bytes_per_log, in whole segments.
  while (log->segments.size() > 1 &&
         log->end() - log->segments.front().base > options_.max_bytes_per_log) {
    std::error_code ec;
    fs::remove(SegmentPath(key, log->segments.front().base), ec);
    log->segments.erase(log->segments.begin());
  }
  if (complete) {
    // (offset <= end: the caller's bytes reach the end, and end the log.)
    if (absl::Status s = AppendToFile(LogDir(key) + "/complete", ""); !s.ok()) return s;
    log->complete = true;
  }
  return log->end();
}

absl::StatusOr<LogStore::Slice> LogStore::ReadLocked(const LogKey& key, const Log& log,
                                                     int64_t offset, int64_t max_bytes) {
  Slice slice;
  slice.info = InfoLocked(key, log);
  offset = std::clamp(offset, slice.info.first_kept, slice.info.end);
  slice.offset = offset;
  int64_t want = std::min(max_bytes, slice.info.end - offset);
  for (const Segment& seg : log.segments) {
    if (want <= 0) break;
    if (offset >= seg.base + seg.size) continue;
    const int64_t from = offset - seg.base;
    const int64_t n = std::min(want, seg.size - from);
    if (absl::Status s = ReadFileAt(SegmentPath(key, seg.base), from, n, &slice.data); !s.ok()) {
      return s;
    }
    offset += n;
    want -= n;
  }
  return slice;
}

absl::StatusOr<LogStore::Slice> LogStore::Read(const LogKey& key, int64_t offset,
                                               int64_t max_bytes) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  Log* log = FindLocked(key, /*create=*/false);
  if (log == nullptr) return NoLog(key);
  return ReadLocked(key, *log, offset, std::max<int64_t>(0, max_bytes));
}

absl::StatusOr<LogStore::Slice> LogStore::Tail(const LogKey& key, int lines, int64_t max_bytes) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  Log* log = FindLocked(key, /*create=*/false);
  if (log == nullptr) return NoLog(key);
  const int64_t end = log->end();
  if (lines <= 0) return ReadLocked(key, *log, end, 0);
  absl::StatusOr<Slice> slice = ReadLocked(key, *log, end - std::max<int64_t>(0, max_bytes),
                                           max_bytes);
  if (!slice.ok()) return slice;
  // Back from the end over `lines` line breaks (a final one ends the last
  // line rather than starting an empty one).
  const std::string& d = slice->data;
  size_t cut = d.size();
  if (cut > 0 && d[cut - 1] == '\n') --cut;
  int found = 0;
  size_t start = 0;
  while (cut > 0) {
    const size_t nl = d.rfind('\n', cut - 1);
    if (nl == std::string::npos) break;
    if (++found == lines) {
      start = nl + 1;
      break;
    }
    cut = nl;
  }
  slice->offset += static_cast<int64_t>(start);
  slice->data.erase(0, start);
  return slice;
}

std::vector<LogInfo> LogStore::List(const std::string& job_id) {
  std::vector<LogInfo> out;
  if (!CheckLogJobId(job_id).ok()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  const std::string job_dir = absl::StrCat(options_.dir, "/", job_id);
  if (!fs::is_directory(job_dir, ec)) return out;
  for (const auto& rank_dir : fs::directory_iterator(job_dir, ec)) {
    absl::string_view r = rank_dir.path().filename().native();
    int rank = 0;
    if (!absl::ConsumePrefix(&r, "rank-") || !absl::SimpleAtoi(r, &rank) || rank < 0) continue;
    std::error_code inner;
    for (const auto& attempt_dir : fs::directory_iterator(rank_dir.path(), inner)) {
      absl::string_view g = attempt_dir.path().filename().native();
      int64_t generation = 0;
      if (!absl::ConsumePrefix(&g, "attempt-") || !absl::SimpleAtoi(g, &generation) ||
          generation < 0) {
        continue;
      }
      const LogKey key{job_id, rank, generation};
      if (const Log* log = FindLocked(key, /*create=*/false)) out.push_back(InfoLocked(key, *log));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const LogInfo& a, const LogInfo& b) { return a.key < b.key; });
  return out;
}

std::vector<std::string> LogStore::Jobs() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    if (entry.is_directory(ec)) out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status LogStore::Remove(const std::string& job_id) {
  if (absl::Status s = CheckLogJobId(job_id); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = logs_.begin(); it != logs_.end();) {
    it = it->first.job_id == job_id ? logs_.erase(it) : std::next(it);
  }
  std::error_code ec;
  fs::remove_all(absl::StrCat(options_.dir, "/", job_id), ec);
  if (ec) return absl::InternalError(absl::StrCat("removing logs of ", job_id, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace loom::controller
