// ConsoleSessions: the logged-in pages of Loom Console, kept in the store.
//
// A page logs in with a Loom token; the console checks it (WhoAmI, as the
// user) and opens a session: a random 256-bit id, sent back as an HttpOnly
// cookie. The store keeps only the SHA-256 of the id and of the token
// (Store::SessionRow), so whoever reads the database can take over
// neither, and every controller of an installation knows every session:
// a page logged in at one leader stays logged in at the next.
//
// A session stands for its token and is checked again on every call
// (AdmitCaller): it ends when it expires (`lifetime` after it opened), when
// the page logs out, or when its token stops being a user's (the user is
// removed or given a new token), whichever comes first. Its role is the
// user's role now, not at login.
//
// CSRF: every state-changing console request must carry X-Loom-CSRF equal
// to CsrfTokenOf(session id), which the login answer gives the page. It is
// derived from the id (a keyed hash), so any controller checks it without
// state, and a page on another origin can neither read the cookie nor
// compute the token.
//
// Thread-safe.
#ifndef LOOM_CONTROLLER_CONSOLE_SESSIONS_H_
#define LOOM_CONTROLLER_CONSOLE_SESSIONS_H_

#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/service/access.h"
#include "controller/store/store.h"

namespace loom::controller::console {

class ConsoleSessions : public SessionDirectory {
 public:
  struct Opened {
    std::string id;    // the cookie's value: 64 hex digits
    std::string csrf;  // CsrfTokenOf(id)
    absl::Time expires;
  };

  // `store` must outlive this. `now` is the clock (tests pass their own).
  ConsoleSessions(
      Store* store, absl::Duration lifetime,
      std::function<absl::Time()> now = [] { return absl::Now(); });

  // Opens a session for `user`, who proved it with `token` (the caller has
  // checked it). UNAVAILABLE when the store cannot record it.
  absl::StatusOr<Opened> Open(const std::string& user, absl::string_view token);
  // Ends session `id` (logout); OK for one already gone.
  absl::Status End(absl::string_view id);
  // SessionDirectory: the token hash of a live session; UNAUTHENTICATED
  // saying to log in again for an unknown, ended or expired one.
  absl::StatusOr<std::string> TokenHashOf(absl::string_view id) const override;

  // The CSRF token of session `id`: 64 hex digits.
  static std::string CsrfTokenOf(absl::string_view id);
  // True when `id` looks like a session id (64 hex digits): anything else
  // is refused before the store is asked.
  static bool WellFormed(absl::string_view id);

  absl::Duration lifetime() const { return lifetime_; }

 private:
  struct Cached {
    std::string token_sha256;
    absl::Time expires;
    absl::Time fetched;
  };
  // How long a session read from the store is trusted before it is read
  // again (a logout at another controller takes this long to reach this
  // one; a logout here, none).
  static constexpr absl::Duration kCacheFor = absl::Seconds(5);
  static constexpr size_t kMaxCached = 4096;

  Store* const store_;
  const absl::Duration lifetime_;
  const std::function<absl::Time()> now_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Cached> cache_;  // by id's SHA-256; guarded by mu_
};

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_SESSIONS_H_
