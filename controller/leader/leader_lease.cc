#include "controller/leader/leader_lease.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::controller {

using Steady = std::chrono::steady_clock;

absl::Status Leadership::Admit(std::string* leader_address) const {
  std::unique_lock<std::mutex> lock(mu_);
  leader_address->clear();
  if (leader_ && Steady::now() >= valid_until_) {
    renewed_.wait_for(lock, kRenewalWait,
                      [this] { return !leader_ || Steady::now() < valid_until_; });
  }
  if (leader_ && Steady::now() < valid_until_) return absl::OkStatus();
  if (leader_) {
    return absl::UnavailableError(absl::StrCat(
        "this controller's leader lease (epoch ", epoch_,
        ") ran out before it could renew it; it is stepping down: retry in a few seconds, or "
        "at another controller"));
  }
  const bool someone = !seen_.holder.empty() && seen_.expires_unix_ms > seen_.now_unix_ms;
  if (!someone) {
    return absl::UnavailableError(
        "this controller is a standby and no controller leads at the moment (the last "
        "leader's lease ran out; one takes over within a second): retry shortly");
  }
  *leader_address = seen_.address;
  return absl::UnavailableError(absl::StrCat("this controller is a standby: the leader is ",
                                             seen_.holder, " at ", seen_.address, " (epoch ",
                                             seen_.epoch, "); send requests there"));
}

bool Leadership::LeadingNow() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_ && Steady::now() < valid_until_;
}

int64_t Leadership::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_ ? epoch_ : 0;
}

const char* Leadership::role() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_ ? "leader" : "standby";
}

void Leadership::BecomeLeader(int64_t epoch, SteadyTime valid_until) {
  std::lock_guard<std::mutex> lock(mu_);
  leader_ = true;
  epoch_ = epoch;
  valid_until_ = valid_until;
}

void Leadership::Renewed(SteadyTime valid_until) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    valid_until_ = std::max(valid_until_, valid_until);
  }
  renewed_.notify_all();
}

void Leadership::StepDown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_ = false;
    valid_until_ = SteadyTime{};
  }
  renewed_.notify_all();
}

std::string Leadership::leader_console_url() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (leader_ || seen_.holder.empty() || seen_.expires_unix_ms <= seen_.now_unix_ms) return "";
  return seen_.console_url;
}

std::string Leadership::last_seen_holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_.holder.empty() ? "" : absl::StrCat(seen_.holder, " (epoch ", seen_.epoch, ")");
}

void Leadership::SawLeader(const Store::Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  seen_ = lease;
}

LeaderElector::LeaderElector(Store* store, Leadership* leadership, LeaderElectorOptions options,
                             std::function<absl::Status(int64_t)> on_elected,
                             std::function<void(const std::string&)> on_lost)
    : store_(store),
      leadership_(leadership),
      options_(std::move(options)),
      on_elected_(std::move(on_elected)),
      on_lost_(std::move(on_lost)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (leadership_->epoch() != 0) {
    leadership_->StepDown();
    absl::Status released = store_->ReleaseLease(options_.holder);
    if (!released.ok()) {
      std::cerr << "loom-controller: releasing the leader lease: " << released.message()
                << std::endl;
    }
  }
}

void LeaderElector::Run() {
  for (;;) {
    const std::chrono::milliseconds wait = Round();
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, wait, [this] { return stop_; })) return;
    if (lost_) return;  // on_lost ran: the controller steps down
  }
}

std::chrono::milliseconds LeaderElector::Round() {
  const auto renew = std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.renew_interval));
  const auto lease = std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.lease));
  const int64_t epoch = leadership_->epoch();
  const Steady::time_point sent = Steady::now();
  absl::StatusOr<Store::Lease> row = store_->AcquireLease(
      options_.holder, options_.address, options_.lease, /*force=*/false, options_.console_url);
  auto lose = [&](const std::string& reason) {
    leadership_->StepDown();
    lost_ = true;
    on_lost_(reason);
    return renew;
  };
  if (epoch == 0) {  // standby
    if (!row.ok()) {
      std::cerr << "loom-controller: standby: cannot read the leader lease: "
                << row.status().message() << std::endl;
      return renew;
    }
    if (!row->held_by(options_.holder)) {
      leadership_->SawLeader(*row);
      // Try again just after the leader's lease would run out.
      const int64_t left_ms = row->expires_unix_ms - row->now_unix_ms;
      return std::clamp(std::chrono::milliseconds(left_ms + 5), std::chrono::milliseconds(10),
                        renew);
    }
    store_->SetFencingEpoch(row->epoch);
    if (absl::Status elected = on_elected_(row->epoch); !elected.ok()) {
      return lose(absl::StrCat("taking over as leader (epoch ", row->epoch,
                               ") failed: ", elected.message()));
    }
    leadership_->BecomeLeader(row->epoch, sent + lease);
    return std::chrono::milliseconds(0);  // renew at once: taking over took time
  }
  if (row.ok() && row->held_by(options_.holder) && row->epoch == epoch) {
    leadership_->Renewed(sent + lease);
    return renew;
  }
  if (row.ok()) {
    return lose(absl::StrCat("the leader lease of epoch ", epoch, " was taken by ", row->holder,
                             " at ", row->address, " (epoch ", row->epoch, ")"));
  }
  if (!leadership_->LeadingNow()) {
    return lose(absl::StrCat("no renewal of the leader lease (epoch ", epoch,
                             ") reached the database within ", absl::FormatDuration(options_.lease),
                             ": ", row.status().message()));
  }
  // Try again soon: the lease has time left.
  return std::min(renew, std::chrono::milliseconds(100));
}

}  // namespace loom::controller
