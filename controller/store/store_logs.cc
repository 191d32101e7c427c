// Store: rank logs (migration 5): fenced appends on the write connection,
// reads and searches on the reader.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "controller/store/store.h"

namespace loom::controller {
namespace {

using store::Blob;
using store::Int;
using store::Text;

// Rows a read takes at a time while it gathers enough bytes.
constexpr int64_t kChunkBatch = 64;

// The length of the valid UTF-8 sequence at s[i] (1 to 4), or 0.
size_t Utf8SequenceAt(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t min = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

Store::LogRow LogRowOf(const std::string& job_id, int rank, int64_t generation,
                       const store::SqlRow& row) {
  Store::LogRow r;
  r.job_id = job_id;
  r.rank = rank;
  r.generation = generation;
  r.first_kept = row[0].i;
  r.end = row[1].i;
  r.complete = row[2].i != 0;
  return r;
}

}  // namespace

std::string Store::LogSearchText(absl::string_view carry, absl::string_view data) {
  std::string out;
  out.reserve(carry.size() + data.size());
  for (absl::string_view part : {carry, data}) {
    for (size_t i = 0; i < part.size();) {
      const size_t n = Utf8SequenceAt(part, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD
        i += 1;
      } else if (n == 1 && part[i] == '\0') {
        out += ' ';
        i += 1;
      } else {
        out.append(part.data() + i, n);
        i += n;
      }
    }
  }
  return out;
}

absl::StatusOr<Store::LogRow> Store::AppendLog(const std::string& job_id, int rank,
                                               int64_t generation, int64_t offset,
                                               absl::string_view data, bool complete,
                                               int64_t max_bytes, bool start_anywhere) {
  LogRow out;
  out.job_id = job_id;
  out.rank = rank;
  out.generation = generation;
  WatchedLock lock(mu_, __func__);
  absl::Status s = WriteTransactionLocked([&]() -> absl::Status {
    auto read = conn_->Run(
        absl::StrCat("SELECT first_kept, end_offset, complete, carry FROM rank_logs WHERE job_id = ? "
                     "AND rank = ? AND generation = ?",
                     conn_->ForUpdate(), ";"),
        {Text(job_id), Int(rank), Int(generation)});
    if (!read.ok()) return read.status();
    std::string carry;
    if (!read->rows.empty()) {
      out = LogRowOf(job_id, rank, generation, read->rows[0]);
      carry = std::move(read->rows[0][3].s);
    } else if (start_anywhere) {
      out.first_kept = out.end = offset;
    }
    if (out.complete || offset > out.end) return absl::OkStatus();  // nothing taken
    // Bytes the log already has (a resent append) are skipped.
    const int64_t known = out.end - offset;
    absl::string_view fresh =
        known >= static_cast<int64_t>(data.size()) ? absl::string_view() : data.substr(known);
    if (fresh.empty() && !complete) return absl::OkStatus();
    if (!fresh.empty()) {
      const std::string text = LogSearchText(carry, fresh);
      auto put = conn_->Run(
          "INSERT INTO rank_log_chunks (job_id, rank, generation, start_offset, size, carried, "
          "data, lines) VALUES (?, ?, ?, ?, ?, ?, ?, ?);",
          {Text(job_id), Int(rank), Int(generation), Int(out.end),
           Int(static_cast<int64_t>(fresh.size())), Int(static_cast<int64_t>(carry.size())),
           Blob(fresh), Text(text)});
      if (!put.ok()) return put.status();
      const int64_t chunk_start = out.end;
      out.end += static_cast<int64_t>(fresh.size());
      // The partial line the next chunk continues (its tail, when long).
      const size_t newline = fresh.rfind('\n');
      if (newline == absl::string_view::npos) {
        carry.append(fresh.data(), fresh.size());
      } else {
        carry.assign(fresh.data() + newline + 1, fresh.size() - newline - 1);
      }
      if (static_cast<int64_t>(carry.size()) > kLogCarryMax) {
        carry.erase(0, carry.size() - static_cast<size_t>(kLogCarryMax));
      }
      if (out.end - out.first_kept > max_bytes) {
        // Whole chunks go from the start (never the newest) while more
        // than max_bytes would remain.
        const int64_t cut = std::min(out.end - max_bytes, chunk_start);
        auto dropped = conn_->Run(
            "DELETE FROM rank_log_chunks WHERE job_id = ? AND rank = ? AND generation = ? AND "
            "start_offset < ?;",
            {Text(job_id), Int(rank), Int(generation), Int(cut)});
        if (!dropped.ok()) return dropped.status();
        auto first = conn_->Run(
            "SELECT MIN(start_offset) FROM rank_log_chunks WHERE job_id = ? AND rank = ? AND "
            "generation = ?;",
            {Text(job_id), Int(rank), Int(generation)});
        if (!first.ok()) return first.status();
        out.first_kept = first->rows[0][0].i;
      }
    }
    out.complete = out.complete || complete;
    auto row = conn_->Run(
        "INSERT INTO rank_logs (job_id, rank, generation, first_kept, end_offset, complete, carry) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, rank, generation) DO UPDATE SET "
        "first_kept = excluded.first_kept, end_offset = excluded.end_offset, "
        "complete = excluded.complete, carry = excluded.carry;",
        {Text(job_id), Int(rank), Int(generation), Int(out.first_kept), Int(out.end),
         Int(out.complete ? 1 : 0), Blob(carry)});
    return row.status();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<Store::LogRow> Store::GetLog(const std::string& job_id, int rank,
                                            int64_t generation) {
  std::lock_guard<std::mutex> lock(read_mu_);
  auto r = reader_->Run(
      "SELECT first_kept, end_offset, complete FROM rank_logs WHERE job_id = ? AND rank = ? AND "
      "generation = ?;",
      {Text(job_id), Int(rank), Int(generation)});
  if (!r.ok()) return r.status();
  if (r->rows.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no log of rank ", rank, " attempt ", generation, " of ", job_id));
  }
  return LogRowOf(job_id, rank, generation, r->rows[0]);
}

absl::StatusOr<std::vector<Store::LogRow>> Store::ListLogs(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(read_mu_);
  auto r = reader_->Run(
      "SELECT first_kept, end_offset, complete, rank, generation FROM rank_logs WHERE job_id = ? "
      "ORDER BY rank, generation;",
      {Text(job_id)});
  if (!r.ok()) return r.status();
  std::vector<LogRow> out;
  for (const auto& row : r->rows) {
    out.push_back(LogRowOf(job_id, static_cast<int>(row[3].i), row[4].i, row));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> Store::LogJobs() {
  std::lock_guard<std::mutex> lock(read_mu_);
  auto r = reader_->Run("SELECT DISTINCT job_id FROM rank_logs ORDER BY job_id;", {});
  if (!r.ok()) return r.status();
  std::vector<std::string> out;
  for (auto& row : r->rows) out.push_back(std::move(row[0].s));
  return out;
}

absl::StatusOr<std::vector<Store::LogChunk>> Store::ReadLogForward(const std::string& job_id,
                                                                   int rank, int64_t generation,
                                                                   int64_t from,
                                                                   int64_t max_bytes) {
  std::lock_guard<std::mutex> lock(read_mu_);
  // The chunk that holds `from` starts at or before it.
  auto start = reader_->Run(
      "SELECT start_offset FROM rank_log_chunks WHERE job_id = ? AND rank = ? AND generation = ? "
      "AND start_offset <= ? ORDER BY start_offset DESC LIMIT 1;",
      {Text(job_id), Int(rank), Int(generation), Int(from)});
  if (!start.ok()) return start.status();
  int64_t at = start->rows.empty() ? std::numeric_limits<int64_t>::min() : start->rows[0][0].i;
  std::vector<LogChunk> out;
  int64_t held = 0;
  for (;;) {
    auto r = reader_->Run(
        "SELECT start_offset, data FROM rank_log_chunks WHERE job_id = ? AND rank = ? AND "
        "generation = ? AND start_offset >= ? ORDER BY start_offset LIMIT ?;",
        {Text(job_id), Int(rank), Int(generation), Int(at), Int(kChunkBatch)});
    if (!r.ok()) return r.status();
    for (auto& row : r->rows) {
      LogChunk c;
      c.offset = row[0].i;
      c.data = std::move(row[1].s);
      held += std::max<int64_t>(0, c.offset + static_cast<int64_t>(c.data.size()) -
                                       std::max(from, c.offset));
      at = c.offset + 1;
      out.push_back(std::move(c));
      if (held >= max_bytes) return out;
    }
    if (static_cast<int64_t>(r->rows.size()) < kChunkBatch) return out;
  }
}

absl::StatusOr<std::vector<Store::LogChunk>> Store::ReadLogBackward(const std::string& job_id,
                                                                    int rank, int64_t generation,
                                                                    int64_t before,
                                                                    int64_t max_bytes) {
  std::lock_guard<std::mutex> lock(read_mu_);
  std::vector<LogChunk> out;
  int64_t held = 0;
  int64_t below = before;
  for (;;) {
    auto r = reader_->Run(
        "SELECT start_offset, data FROM rank_log_chunks WHERE job_id = ? AND rank = ? AND "
        "generation = ? AND start_offset < ? ORDER BY start_offset DESC LIMIT ?;",
        {Text(job_id), Int(rank), Int(generation), Int(below), Int(kChunkBatch)});
    if (!r.ok()) return r.status();
    for (auto& row : r->rows) {
      LogChunk c;
      c.offset = row[0].i;
      c.data = std::move(row[1].s);
      held += std::min<int64_t>(static_cast<int64_t>(c.data.size()), before - c.offset);
      below = c.offset;
      out.push_back(std::move(c));
      if (held >= max_bytes) return out;
    }
    if (static_cast<int64_t>(r->rows.size()) < kChunkBatch) return out;
  }
}

absl::Status Store::RemoveLogs(const std::string& job_id) {
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    auto chunks = conn_->Run("DELETE FROM rank_log_chunks WHERE job_id = ?;", {Text(job_id)});
    if (!chunks.ok()) return chunks.status();
    return conn_->Run("DELETE FROM rank_logs WHERE job_id = ?;", {Text(job_id)}).status();
  });
}

absl::StatusOr<std::vector<Store::LogMatch>> Store::SearchLogs(const std::string& job_id,
                                                               absl::string_view needle,
                                                               int64_t limit) {
  const std::string text = LogSearchText("", needle);
  // Columns: rank, generation, start_offset, size, data, lines, the log's end,
  // the carried bytes.
  static constexpr char kColumns[] =
      "SELECT c.rank, c.generation, c.start_offset, c.size, c.data, c.lines, l.end_offset, "
      "c.carried ";
  static constexpr char kJoinLog[] =
      "JOIN rank_logs l ON l.job_id = c.job_id AND l.rank = c.rank AND "
      "l.generation = c.generation ";
  std::lock_guard<std::mutex> lock(read_mu_);
  absl::StatusOr<store::SqlResult> r;
  if (dialect_ == store::SqlDialect::kPostgres) {
    // LIKE '%...%' through the trigram index; \ escapes LIKE's own signs.
    std::string like = "%";
    for (char ch : text) {
      if (ch == '%' || ch == '_' || ch == '\\') like += '\\';
      like += ch;
    }
    like += '%';
    // The planner sees the text column's heap as small (its values are
    // TOASTed) and would scan it, or walk the job's btree index, reading
    // every chunk; only the trigram index's bitmap scan reads just the
    // chunks that may match (measured on ten million lines: 2.4 s against
    // a few ms; ./bench/run.sh logs). So, for this one statement: planned
    // for its pattern, by bitmap scans only, and with the job compared as
    // an expression that no btree index serves (a big job is every chunk;
    // before the table is analyzed the planner would take it for a few).
    // (No ORDER BY: the scan stops at the limit; the caller sorts what it
    // keeps.)
    if (absl::Status s = reader_->Exec(
            "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; "
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off;");
        !s.ok()) {
      reader_->Rollback();
      return s;
    }
    r = reader_->Run(absl::StrCat(kColumns, "FROM rank_log_chunks c ", kJoinLog,
                                  "WHERE (c.job_id || '') = ? AND c.lines LIKE ? ESCAPE '\\' "
                                  "LIMIT ?;"),
                     {Text(job_id), Text(like), Int(limit)});
    if (r.ok()) {
      if (absl::Status s = reader_->Commit(); !s.ok()) return s;
    } else {
      reader_->Rollback();
    }
  } else if (text.size() >= 3) {
    // An FTS5 phrase of the needle's trigrams: a substring match.
    std::string phrase = "\"";
    for (char ch : text) {
      if (ch == '"') phrase += '"';
      phrase += ch;
    }
    phrase += '"';
    r = reader_->Run(absl::StrCat(kColumns,
                                  "FROM rank_log_search s JOIN rank_log_chunks c ON c.id = s.rowid ",
                                  kJoinLog,
                                  "WHERE rank_log_search MATCH ? AND c.job_id = ? "
                                  "ORDER BY s.rowid LIMIT ?;"),
                     {Text(phrase), Text(job_id), Int(limit)});
  } else {
    // Too short for a trigram: every chunk of the job is read.
    r = reader_->Run(absl::StrCat(kColumns, "FROM rank_log_chunks c ", kJoinLog,
                                  "WHERE c.job_id = ? AND instr(c.lines, ?) > 0 "
                                  "ORDER BY c.id LIMIT ?;"),
                     {Text(job_id), Text(text), Int(limit)});
  }
  if (!r.ok()) return r.status();
  std::vector<LogMatch> out;
  out.reserve(r->rows.size());
  for (auto& row : r->rows) {
    LogMatch m;
    m.rank = static_cast<int>(row[0].i);
    m.generation = row[1].i;
    m.offset = row[2].i;
    m.last = row[2].i + row[3].i == row[6].i;
    m.data = std::move(row[4].s);
    m.text = std::move(row[5].s);
    m.carried = row[7].i;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace loom::controller
