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

absl::StatusOr<Store::Lease> Store::AcquireLease(const std::string& holder,
                                                 const std::string& address,
                                                 absl::Duration duration, bool force,
                                                 const std::string& console_url) {
  if (holder.empty()) return absl::InvalidArgumentError("lease holder: must not be empty");
  const int64_t duration_ms = absl::ToInt64Milliseconds(duration);
  if (duration_ms <= 0) return absl::InvalidArgumentError("lease duration: must be > 0");
  WatchedLock lock(mu_, __func__);
  // Not fenced: this is the one write that may change the epoch.
  absl::Status s = conn_->BeginWrite();
  if (!s.ok()) return s;
  auto fail = [this](absl::Status err) {
    conn_->Rollback();
    return err;
  };
  auto read = conn_->Run(
      absl::StrCat("SELECT epoch, holder, address, expires_unix_ms, ", conn_->NowUnixMs(),
                   ", console_url FROM leader WHERE id = 1", conn_->ForUpdate(), ";"),
      {});
  if (!read.ok()) return fail(read.status());
  if (read->rows.size() != 1) {
    return fail(absl::DataLossError("store: the leader table has lost its row"));
  }
  Lease lease = LeaseOf(read->rows[0]);
  const bool mine = lease.holder == holder;
  const bool free = lease.expires_unix_ms <= lease.now_unix_ms;
  if (!mine && !free && !force) {
    absl::Status c = conn_->Commit();
    if (!c.ok()) return c;
    return lease;
  }
  // A holder renewing keeps its epoch, even one whose lease ran out while
  // nobody took it: no other controller led in between.
  if (!mine) lease.epoch += 1;
  lease.holder = holder;
  lease.address = address;
  lease.console_url = console_url;
  lease.expires_unix_ms = lease.now_unix_ms + duration_ms;
  auto write = conn_->Run(
      "UPDATE leader SET epoch = ?, holder = ?, address = ?, expires_unix_ms = ?, console_url = ? "
      "WHERE id = 1;",
      {Int(lease.epoch), Text(lease.holder), Text(lease.address), Int(lease.expires_unix_ms),
       Text(lease.console_url)});
  if (!write.ok()) return fail(write.status());
  s = conn_->Commit();
  if (!s.ok()) return s;
  return lease;
}

absl::Status Store::ReleaseLease(const std::string& holder) {
  WatchedLock lock(mu_, __func__);
  // The holder is cleared too, so that whoever takes it next (this
  // controller again included) starts a new epoch.
  auto r =
      conn_->Run("UPDATE leader SET expires_unix_ms = 0, holder = '' WHERE id = 1 AND holder = ?;",
                 {Text(holder)});
  return r.status();
}

absl::StatusOr<Store::Lease> Store::ReadLease() {
  WatchedLock lock(mu_, __func__);
  auto r = conn_->Run(absl::StrCat("SELECT epoch, holder, address, expires_unix_ms, ",
                                   conn_->NowUnixMs(), ", console_url FROM leader WHERE id = 1;"),
                      {});
  if (!r.ok()) return r.status();
  if (r->rows.size() != 1) return absl::DataLossError("store: the leader table has lost its row");
  return LeaseOf(r->rows[0]);
}

}  // namespace loom::controller
