// Store: Loom Console's sessions and URLs (migration 6).
#include "absl/strings/str_cat.h"
#include "controller/store/store.h"

namespace loom::controller {
namespace {

using store::Int;
using store::Text;

}  // namespace

absl::Status Store::PutSession(const SessionRow& session) {
  if (session.id_sha256.empty() || session.user.empty() || session.token_sha256.empty()) {
    return absl::InvalidArgumentError("console session: id, user and token hash are required");
  }
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    // The sessions that ended by the time this one starts go with it, so the
    // table holds live sessions only (and their number stays small).
    auto pruned = conn_->Run("DELETE FROM console_sessions WHERE expires_unix_ms <= ?;",
                             {Int(session.created_unix_ms)});
    if (!pruned.ok()) return pruned.status();
    return conn_
        ->Run(
            "INSERT INTO console_sessions (id_sha256, user_name, token_sha256, created_unix_ms, "
            "expires_unix_ms) VALUES (?, ?, ?, ?, ?);",
            {Text(session.id_sha256), Text(session.user), Text(session.token_sha256),
             Int(session.created_unix_ms), Int(session.expires_unix_ms)})
        .status();
  });
}

absl::StatusOr<Store::SessionRow> Store::GetSession(const std::string& id_sha256) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT id_sha256, user_name, token_sha256, created_unix_ms, expires_unix_ms "
      "FROM console_sessions WHERE id_sha256 = ?;",
      {Text(id_sha256)});
  if (!r.ok()) return r.status();
  if (r->rows.empty()) return absl::NotFoundError("no such console session");
  const store::SqlRow& row = r->rows[0];
  return SessionRow{row[0].s, row[1].s, row[2].s, row[3].i, row[4].i};
}

absl::Status Store::DeleteSession(const std::string& id_sha256) {
  WatchedLock lock(mu_, __func__);
  return WriteTransactionLocked([&]() -> absl::Status {
    return conn_->Run("DELETE FROM console_sessions WHERE id_sha256 = ?;", {Text(id_sha256)})
        .status();
  });
}

absl::Status Store::PutConsole(const std::string& holder, const std::string& url,
                               int64_t seen_unix_ms) {
  if (holder.empty() || url.empty()) {
    return absl::InvalidArgumentError("console: holder and url are required");
  }
  WatchedLock lock(mu_, __func__);
  // Not fenced: a standby records its own console too.
  absl::Status s = conn_->BeginWrite();
  if (!s.ok()) return s;
  auto r = conn_->Run(
      "INSERT INTO consoles (holder, url, seen_unix_ms) VALUES (?, ?, ?) "
      "ON CONFLICT (holder) DO UPDATE SET url = excluded.url, seen_unix_ms = "
      "excluded.seen_unix_ms;",
      {Text(holder), Text(url), Int(seen_unix_ms)});
  if (!r.ok()) {
    conn_->Rollback();
    return r.status();
  }
  return conn_->Commit();
}

absl::StatusOr<std::vector<std::string>> Store::LoadConsoles(int64_t seen_after_unix_ms) {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(
      "SELECT url FROM consoles WHERE seen_unix_ms > ? ORDER BY seen_unix_ms DESC, holder;",
      {Int(seen_after_unix_ms)});
  if (!r.ok()) return r.status();
  std::vector<std::string> urls;
  for (const store::SqlRow& row : r->rows) urls.push_back(row[0].s);
  return urls;
}

}  // namespace loom::controller
