#include "controller/console/sessions.h"

#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/sha256.h"

namespace loom::controller::console {

ConsoleSessions::ConsoleSessions(Store* store, absl::Duration lifetime,
                                 std::function<absl::Time()> now)
    : store_(store), lifetime_(lifetime), now_(std::move(now)) {}

bool ConsoleSessions::WellFormed(absl::string_view id) {
  return id.size() == 64 && absl::c_all_of(id, [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

std::string ConsoleSessions::CsrfTokenOf(absl::string_view id) {
  // The id is a 256-bit secret: a hash of it under a fixed label is as
  // unguessable, and says nothing about the id.
  return Sha256Hex(absl::StrCat("loom console csrf\n", id));
}

absl::StatusOr<ConsoleSessions::Opened> ConsoleSessions::Open(const std::string& user,
                                                              absl::string_view token) {
  absl::StatusOr<std::string> id = GenerateToken();
  if (!id.ok()) return id.status();
  const absl::Time now = now_();
  Store::SessionRow row;
  row.id_sha256 = Sha256Hex(*id);
  row.user = user;
  row.token_sha256 = Sha256Hex(token);
  row.created_unix_ms = absl::ToUnixMillis(now);
  row.expires_unix_ms = absl::ToUnixMillis(now + lifetime_);
  if (absl::Status s = store_->PutSession(row); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot record the console session: ", s.message()));
  }
  return Opened{*id, CsrfTokenOf(*id), absl::FromUnixMillis(row.expires_unix_ms)};
}

absl::Status ConsoleSessions::End(absl::string_view id) {
  if (!WellFormed(id)) return absl::OkStatus();
  const std::string key = Sha256Hex(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.erase(key);
  }
  return store_->DeleteSession(key);
}

absl::StatusOr<std::string> ConsoleSessions::TokenHashOf(absl::string_view id) const {
  constexpr const char* kLogIn = "log in again";
  if (!WellFormed(id)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the console session id is malformed: ", kLogIn));
  }
  const std::string key = Sha256Hex(id);
  const absl::Time now = now_();
  Cached found;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end() && now - it->second.fetched < kCacheFor) {
      found = it->second;
      cached = true;
    }
  }
  if (!cached) {
    absl::StatusOr<Store::SessionRow> row = store_->GetSession(key);
    if (absl::IsNotFound(row.status())) {
      return absl::UnauthenticatedError(
          absl::StrCat("no such console session (logged out, or expired): ", kLogIn));
    }
    if (!row.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot read the console session: ", row.status().message()));
    }
    found = {row->token_sha256, absl::FromUnixMillis(row->expires_unix_ms), now};
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.size() >= kMaxCached) cache_.clear();
    cache_[key] = found;
  }
  if (now >= found.expires) {
    return absl::UnauthenticatedError(
        absl::StrCat("the console session expired at ",
                     absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", found.expires, absl::UTCTimeZone()),
                     ": ", kLogIn));
  }
  return found.token_sha256;
}

}  // namespace loom::controller::console
