// Store: the leader lease row (migration 2), timed by the database's clock.
#include "absl/strings/str_cat.h"
#include "controller/store/store.h"

namespace loom::controller {
namespace {

using store::Int;
using store::Text;

Store::Lease LeaseOf(const store::SqlRow& row) {
  Store::Lease lease;
  lease.epoch = row[0].i;
  lease.holder = row[1].s;
  lease.address = row[2].s;
  lease.expires_unix_ms = row[3].i;
  lease.now_unix_ms = row[4].i;
  lease.console_url = row[5].s;
  return lease;
}

}  // namespace

template <typename F>
auto Store::WithLeaseConnection(const char* holder, F body) {
  if (lease_conn_ != nullptr) {
    WatchedLock lock(lease_mu_, holder);
    return body(*lease_conn_);
  }
  WatchedLock lock(mu_, holder);
  return body(*conn_);
}

absl::StatusOr<Store::Lease> Store::AcquireLease(const std::string& holder,
                                                 const std::string& address,
                                                 absl::Duration duration, bool force,
                                                 const std::string& console_url) {
  if (holder.empty()) return absl::InvalidArgumentError("lease holder: must not be empty");
  const int64_t duration_ms = absl::ToInt64Milliseconds(duration);
  if (duration_ms <= 0) return absl::InvalidArgumentError("lease duration: must be > 0");
  return WithLeaseConnection(__func__, [&](store::SqlConnection& conn) -> absl::StatusOr<Lease> {
    const std::string columns = absl::StrCat("epoch, holder, address, expires_unix_ms, ",
                                             conn.NowUnixMs(), ", console_url");
    // The holder renewing: one statement, no row lock taken first. On
    // PostgreSQL an UPDATE of non-key columns does not wait for the fenced
    // writes' key-share locks, so a renewal never queues behind a write.
    // (A renewal keeps the epoch, even one whose lease ran out while nobody
    // took it: no other controller led in between.)
    auto renewed = conn.Run(
        absl::StrCat("UPDATE leader SET expires_unix_ms = ", conn.NowUnixMs(),
                     " + ?, address = ?, console_url = ? WHERE id = 1 AND holder = ? RETURNING ",
                     columns, ";"),
        {Int(duration_ms), Text(address), Text(console_url), Text(holder)});
    if (!renewed.ok()) return renewed.status();
    if (renewed->rows.size() == 1) return LeaseOf(renewed->rows[0]);
    // Someone else's, or nobody's. A look without a lock first: a standby
    // polling a live leader's lease must not lock the row the leader's
    // writes share.
    auto seen = conn.Run(absl::StrCat("SELECT ", columns, " FROM leader WHERE id = 1;"), {});
    if (!seen.ok()) return seen.status();
    if (seen->rows.size() != 1) {
      return absl::DataLossError("store: the leader table has lost its row");
    }
    Lease lease = LeaseOf(seen->rows[0]);
    if (lease.holder != holder && lease.expires_unix_ms > lease.now_unix_ms && !force) {
      return lease;
    }
    // Taking it: under the row's lock, which waits for every fenced write of
    // the epoch before, and read again (it may have moved since the look).
    // Not fenced: this is the one write that may change the epoch.
    absl::Status s = conn.BeginWrite();
    if (!s.ok()) return s;
    auto fail = [&conn](absl::Status err) {
      conn.Rollback();
      return err;
    };
    auto read = conn.Run(
        absl::StrCat("SELECT ", columns, " FROM leader WHERE id = 1", conn.ForUpdate(), ";"), {});
    if (!read.ok()) return fail(read.status());
    if (read->rows.size() != 1) {
      return fail(absl::DataLossError("store: the leader table has lost its row"));
    }
    lease = LeaseOf(read->rows[0]);
    const bool mine = lease.holder == holder;
    const bool free = lease.expires_unix_ms <= lease.now_unix_ms;
    if (!mine && !free && !force) {
      absl::Status c = conn.Commit();
      if (!c.ok()) return c;
      return lease;
    }
    if (!mine) lease.epoch += 1;
    lease.holder = holder;
    lease.address = address;
    lease.console_url = console_url;
    lease.expires_unix_ms = lease.now_unix_ms + duration_ms;
    auto write = conn.Run(
        "UPDATE leader SET epoch = ?, holder = ?, address = ?, expires_unix_ms = ?, "
        "console_url = ? WHERE id = 1;",
        {Int(lease.epoch), Text(lease.holder), Text(lease.address), Int(lease.expires_unix_ms),
         Text(lease.console_url)});
    if (!write.ok()) return fail(write.status());
    s = conn.Commit();
    if (!s.ok()) return s;
    return lease;
  });
}

absl::Status Store::ReleaseLease(const std::string& holder) {
  return WithLeaseConnection(__func__, [&](store::SqlConnection& conn) {
    // The holder is cleared too, so that whoever takes it next (this
    // controller again included) starts a new epoch.
    return conn
        .Run("UPDATE leader SET expires_unix_ms = 0, holder = '' WHERE id = 1 AND holder = ?;",
             {Text(holder)})
        .status();
  });
}

absl::StatusOr<Store::Lease> Store::ReadLease() {
  return WithLeaseConnection(__func__, [&](store::SqlConnection& conn) -> absl::StatusOr<Lease> {
    auto r = conn.Run(absl::StrCat("SELECT epoch, holder, address, expires_unix_ms, ",
                                   conn.NowUnixMs(), ", console_url FROM leader WHERE id = 1;"),
                      {});
    if (!r.ok()) return r.status();
    if (r->rows.size() != 1) {
      return absl::DataLossError("store: the leader table has lost its row");
    }
    return LeaseOf(r->rows[0]);
  });
}

}  // namespace loom::controller
