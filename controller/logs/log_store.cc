#include "controller/logs/log_store.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

LogInfo InfoFrom(const Store::LogRow& row) {
  LogInfo info;
  info.key = {row.job_id, row.rank, row.generation};
  info.end = row.end;
  info.first_kept = row.first_kept;
  info.complete = row.complete;
  return info;
}

// "<prefix><digits>" -> the number, or -1.
int64_t NumberAfter(absl::string_view name, absl::string_view prefix) {
  int64_t n = -1;
  if (!absl::ConsumePrefix(&name, prefix) || !absl::SimpleAtoi(name, &n)) return -1;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LogStore>> LogStore::Open(Store* store, LogStoreOptions options) {
  if (options.max_bytes_per_log < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("max bytes per log: ", options.max_bytes_per_log,
                                                   " is below the least, 4096"));
  }
  return std::unique_ptr<LogStore>(new LogStore(store, options));
}

absl::StatusOr<int64_t> LogStore::Append(const LogKey& key, int64_t offset, absl::string_view data,
                                         bool complete) {
  return AppendChecked(key, offset, data, complete, /*start_anywhere=*/false);
}

absl::StatusOr<int64_t> LogStore::AppendChecked(const LogKey& key, int64_t offset,
                                                absl::string_view data, bool complete,
                                                bool start_anywhere) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (offset < 0) return absl::InvalidArgumentError("offset: must be >= 0");
  absl::StatusOr<Store::LogRow> row =
      store_->AppendLog(key.job_id, key.rank, key.generation, offset, data, complete,
                        options_.max_bytes_per_log, start_anywhere);
  if (!row.ok()) return row.status();
  return row->end;
}

absl::StatusOr<LogInfo> LogStore::InfoOf(const LogKey& key) {
  absl::StatusOr<Store::LogRow> row = store_->GetLog(key.job_id, key.rank, key.generation);
  if (!row.ok()) return row.status();
  return InfoFrom(*row);
}

absl::StatusOr<LogStore::Slice> LogStore::ReadLocked(const LogInfo& info, int64_t from,
                                                     int64_t max_bytes) {
  Slice slice;
  slice.info = info;
  from = std::clamp(from, info.first_kept, info.end);
  slice.offset = from;
  const int64_t until = std::min(info.end, from + std::max<int64_t>(0, max_bytes));
  if (until <= from) return slice;
  absl::StatusOr<std::vector<Store::LogChunk>> chunks = store_->ReadLogForward(
      info.key.job_id, info.key.rank, info.key.generation, from, until - from);
  if (!chunks.ok()) return chunks.status();
  for (const Store::LogChunk& c : *chunks) {
    const int64_t chunk_end = c.offset + static_cast<int64_t>(c.data.size());
    const int64_t a = std::max(from, c.offset);
    const int64_t b = std::min(until, chunk_end);
    if (b <= a) continue;
    // A chunk dropped under the read (the log rolled over): the bytes that
    // follow are still contiguous from where the slice starts.
    if (a != slice.offset + static_cast<int64_t>(slice.data.size())) {
      slice.offset = a;
      slice.data.clear();
    }
    slice.data.append(c.data, static_cast<size_t>(a - c.offset), static_cast<size_t>(b - a));
  }
  return slice;
}

absl::StatusOr<LogStore::Slice> LogStore::Read(const LogKey& key, int64_t offset,
                                               int64_t max_bytes) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::StatusOr<LogInfo> info = InfoOf(key);
  if (!info.ok()) return info.status();
  return ReadLocked(*info, offset, max_bytes);
}

absl::StatusOr<LogStore::Slice> LogStore::Tail(const LogKey& key, int lines, int64_t max_bytes) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::StatusOr<LogInfo> info = InfoOf(key);
  if (!info.ok()) return info.status();
  if (lines <= 0) return ReadLocked(*info, info->end, 0);
  absl::StatusOr<Slice> slice =
      ReadLocked(*info, info->end - std::max<int64_t>(0, max_bytes), max_bytes);
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

absl::StatusOr<std::vector<LogInfo>> LogStore::List(const std::string& job_id) {
  std::vector<LogInfo> out;
  if (!CheckLogJobId(job_id).ok()) return out;
  absl::StatusOr<std::vector<Store::LogRow>> rows = store_->ListLogs(job_id);
  if (!rows.ok()) return rows.status();
  for (const Store::LogRow& row : *rows) out.push_back(InfoFrom(row));
  return out;
}

absl::StatusOr<std::vector<std::string>> LogStore::Jobs() { return store_->LogJobs(); }

absl::Status LogStore::Remove(const std::string& job_id) {
  if (absl::Status s = CheckLogJobId(job_id); !s.ok()) return s;
  return store_->RemoveLogs(job_id);
}

absl::Status LogStore::RemoveExpired(const std::function<bool(const std::string&)>& expired) {
  absl::StatusOr<std::vector<std::string>> jobs = Jobs();
  if (!jobs.ok()) return jobs.status();
  absl::Status first;
  for (const std::string& job : *jobs) {
    if (expired(job)) first.Update(Remove(job));
  }
  return first;
}

absl::StatusOr<LogStore::Found> LogStore::Search(const std::string& job_id,
                                                 absl::string_view needle, int max_lines) {
  if (absl::Status s = CheckLogJobId(job_id); !s.ok()) return s;
  if (needle.empty()) return absl::InvalidArgumentError("pattern: must not be empty");
  if (needle.find('\n') != absl::string_view::npos) {
    return absl::InvalidArgumentError("pattern: must be on one line");
  }
  max_lines = std::max(1, max_lines);
  // A chunk holds many lines: a few chunks more than lines asked for find
  // them, unless the needle is in nearly every chunk (then truncated).
  const int64_t chunk_limit = std::max<int64_t>(64, 2 * static_cast<int64_t>(max_lines));
  absl::StatusOr<std::vector<Store::LogMatch>> matches =
      store_->SearchLogs(job_id, needle, chunk_limit);
  if (!matches.ok()) return matches.status();
  const std::string want = Store::LogSearchText("", needle);
  Found found;
  for (const Store::LogMatch& m : *matches) {
    // Text segment k ends at the data's k-th line break (the carried part
    // has none), so line starts come from the raw bytes.
    int64_t start = m.offset - m.carried;
    size_t text_at = 0, data_at = 0;
    for (;;) {
      const size_t text_nl = m.text.find('\n', text_at);
      const size_t data_nl = m.data.find('\n', data_at);
      const bool whole = text_nl != std::string::npos;
      if (!whole && !m.last) break;  // a partial line: matched in the chunk that ends it
      absl::string_view line(m.text.data() + text_at,
                             (whole ? text_nl : m.text.size()) - text_at);
      if (!line.empty() && line.find(want) != absl::string_view::npos) {
        found.lines.push_back({{job_id, m.rank, m.generation}, start, std::string(line)});
      }
      if (!whole || data_nl == std::string::npos) break;
      start = m.offset + static_cast<int64_t>(data_nl) + 1;
      text_at = text_nl + 1;
      data_at = data_nl + 1;
    }
  }
  std::sort(found.lines.begin(), found.lines.end(), [](const Line& a, const Line& b) {
    return std::tie(a.key.rank, a.key.generation, a.offset) <
           std::tie(b.key.rank, b.key.generation, b.offset);
  });
  found.truncated = static_cast<int64_t>(matches->size()) >= chunk_limit ||
                    static_cast<int>(found.lines.size()) > max_lines;
  if (static_cast<int>(found.lines.size()) > max_lines) found.lines.resize(max_lines);
  return found;
}

absl::StatusOr<int> LogStore::ImportFiles(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  int logs = 0;
  for (const auto& job_dir : fs::directory_iterator(dir, ec)) {
    const std::string job = job_dir.path().filename().string();
    if (!CheckLogJobId(job).ok() || !job_dir.is_directory()) continue;
    for (const auto& rank_dir : fs::directory_iterator(job_dir.path(), ec)) {
      const int64_t rank = NumberAfter(rank_dir.path().filename().string(), "rank-");
      if (rank < 0) continue;
      for (const auto& attempt_dir : fs::directory_iterator(rank_dir.path(), ec)) {
        const int64_t generation = NumberAfter(attempt_dir.path().filename().string(), "attempt-");
        if (generation < 0) continue;
        // Segments are named by their 16-digit start offset: in name order.
        std::vector<std::pair<int64_t, fs::path>> segments;
        for (const auto& f : fs::directory_iterator(attempt_dir.path(), ec)) {
          std::string name = f.path().filename().string();
          if (!absl::EndsWith(name, ".log")) continue;
          int64_t base = 0;
          if (absl::SimpleAtoi(name.substr(0, name.size() - 4), &base)) {
            segments.emplace_back(base, f.path());
          }
        }
        std::sort(segments.begin(), segments.end());
        const LogKey key{job, static_cast<int>(rank), generation};
        const bool complete = fs::exists(attempt_dir.path() / "complete", ec);
        for (size_t i = 0; i < segments.size(); ++i) {
          std::ifstream in(segments[i].second, std::ios::binary);
          std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          // The oldest kept segment may start after 0 (the cap dropped what
          // was before it): the log starts there, at the same offsets, so a
          // rank still running goes on appending where it was.
          absl::StatusOr<int64_t> end =
              AppendChecked(key, segments[i].first, data, complete && i + 1 == segments.size(),
                            /*start_anywhere=*/i == 0);
          if (!end.ok()) return end.status();
        }
        logs += segments.empty() ? 0 : 1;
      }
    }
  }
  fs::rename(dir, dir + ".imported", ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("rank logs imported from ", dir,
                                            ", but it could not be renamed: ", ec.message()));
  }
  std::cerr << "loom-controller: " << logs << " rank log(s) of an earlier version were moved from "
            << dir << " into the store (the files stay in " << dir << ".imported)" << std::endl;
  return logs;
}

}  // namespace loom::controller
