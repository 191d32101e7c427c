#include "controller/logs/rank_logs.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::controller {

absl::StatusOr<loom::v1::GetRankLogResponse> RankLogs::Get(
    const loom::v1::GetRankLogRequest& req) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: must not be empty");
  if (req.job_id().size() > 256) return absl::InvalidArgumentError("job_id: too long");
  if (req.rank() < 0) return absl::InvalidArgumentError("rank: must be >= 0");
  if (req.has_generation() && req.generation() < 0) {
    return absl::InvalidArgumentError("generation: must be >= 0");
  }
  if (req.has_offset() && req.offset() < 0) {
    return absl::InvalidArgumentError("offset: must be >= 0");
  }
  if (req.tail_lines() < 0) return absl::InvalidArgumentError("tail_lines: must be >= 0");
  if (req.max_bytes() < 0 || req.max_bytes() > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_bytes: must be in [0, ", kMaxBytes, "]"));
  }
  absl::StatusOr<Placements> placements = placements_(req.job_id());
  if (!placements.ok()) return placements.status();
  loom::v1::GetRankLogResponse resp;
  auto describe = [&](const LogInfo& info, loom::v1::RankLogInfo* out) {
    out->set_rank(info.key.rank);
    out->set_generation(info.key.generation);
    out->set_end(info.end);
    out->set_first_kept(info.first_kept);
    out->set_complete(info.complete);
    auto attempt = placements->find(info.key.generation);
    if (attempt != placements->end()) {
      auto node = attempt->second.find(info.key.rank);
      if (node != attempt->second.end()) out->set_node(node->second);
    }
  };
  std::set<int> ranks_with_logs;
  int64_t generation = -1;
  absl::StatusOr<std::vector<LogInfo>> listed = logs_->List(req.job_id());
  if (!listed.ok()) return listed.status();
  for (const LogInfo& info : *listed) {
    describe(info, resp.add_logs());
    ranks_with_logs.insert(info.key.rank);
    if (info.key.rank != req.rank()) continue;
    if (req.has_generation() ? info.key.generation == req.generation()
                             : info.key.generation > generation) {
      generation = info.key.generation;
    }
  }
  if (generation < 0) {
    return absl::NotFoundError(absl::StrCat(
        "no log of rank ", req.rank(),
        req.has_generation() ? absl::StrCat(" in attempt ", req.generation()) : "", " of job ",
        req.job_id(), " yet",
        ranks_with_logs.empty()
            ? " (no rank's log has reached the controller: a rank's log follows it within "
              "about a second once it starts)"
            : absl::StrCat(" (ranks with logs: ", absl::StrJoin(ranks_with_logs, ", "), ")")));
  }
  const LogKey key{req.job_id(), req.rank(), generation};
  const int64_t max_bytes = req.max_bytes() > 0 ? req.max_bytes() : int64_t{1} << 20;
  absl::StatusOr<LogStore::Slice> slice = req.has_offset()
                                              ? logs_->Read(key, req.offset(), max_bytes)
                                              : logs_->Tail(key, req.tail_lines(), max_bytes);
  if (!slice.ok()) return slice.status();
  describe(slice->info, resp.mutable_log());
  resp.set_offset(slice->offset);
  resp.set_next_offset(slice->offset + static_cast<int64_t>(slice->data.size()));
  resp.set_data(std::move(slice->data));
  return resp;
}

absl::StatusOr<loom::v1::SearchRankLogsResponse> RankLogs::Search(
    const loom::v1::SearchRankLogsRequest& req) {
  if (absl::Status s = CheckLogJobId(req.job_id()); !s.ok()) return s;
  if (req.pattern().empty()) return absl::InvalidArgumentError("pattern: must not be empty");
  if (req.pattern().size() > 1024) {
    return absl::InvalidArgumentError("pattern: longer than 1024 bytes");
  }
  if (req.max_lines() < 0 || req.max_lines() > 10000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_lines: ", req.max_lines(), " is out of range (0 for the default 1000, at most 10000)"));
  }
  absl::StatusOr<Placements> placements = placements_(req.job_id());
  if (!placements.ok()) return placements.status();
  absl::StatusOr<LogStore::Found> found =
      logs_->Search(req.job_id(), req.pattern(), req.max_lines() == 0 ? 1000 : req.max_lines());
  if (!found.ok()) return found.status();
  loom::v1::SearchRankLogsResponse resp;
  for (LogStore::Line& line : found->lines) {
    loom::v1::RankLogLine* out = resp.add_lines();
    out->set_rank(line.key.rank);
    out->set_generation(line.key.generation);
    out->set_offset(line.offset);
    out->set_text(std::move(line.text));
    auto attempt = placements->find(line.key.generation);
    if (attempt != placements->end()) {
      auto node = attempt->second.find(line.key.rank);
      if (node != attempt->second.end()) out->set_node(node->second);
    }
  }
  resp.set_truncated(found->truncated);
  return resp;
}

absl::Status RankLogs::ValidateAppend(const loom::v1::AppendRankLogsRequest& req) {
  for (int i = 0; i < req.chunks_size(); ++i) {
    const loom::v1::RankLogChunk& c = req.chunks(i);
    if (absl::Status s = CheckLogJobId(c.job_id()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "].", s.message()));
    }
    if (c.rank() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "].rank: must be >= 0"));
    }
    if (c.generation() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "].generation: must be >= 0"));
    }
    if (c.offset() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "].offset: must be >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<loom::v1::AppendRankLogsResponse> RankLogs::Append(
    const loom::v1::AppendRankLogsRequest& req, const std::string& node) {
  if (absl::Status s = ValidateAppend(req); !s.ok()) return s;
  loom::v1::AppendRankLogsResponse resp;
  // Placements of each job the request names, looked up once.
  std::map<std::string, absl::StatusOr<Placements>> placements;
  for (const loom::v1::RankLogChunk& c : req.chunks()) {
    auto it = placements.find(c.job_id());
    if (it == placements.end()) it = placements.emplace(c.job_id(), placements_(c.job_id())).first;
    bool ours = false;
    if (it->second.ok()) {
      auto attempt = it->second->find(c.generation());
      if (attempt != it->second->end()) {
        auto rank = attempt->second.find(c.rank());
        ours = rank != attempt->second.end() && rank->second == node;
      }
    }
    if (!ours) {
      resp.add_next_offset(-1);
      continue;
    }
    absl::StatusOr<int64_t> end =
        logs_->Append({c.job_id(), c.rank(), c.generation()}, c.offset(), c.data(), c.complete());
    if (!end.ok()) return end.status();
    resp.add_next_offset(*end);
  }
  return resp;
}

}  // namespace loom::controller
