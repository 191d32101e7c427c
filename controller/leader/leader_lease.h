// Leadership of a controller among several sharing one database.
//
// Leadership: what this process knows about who leads, read by every RPC
// (Admit) and by the controller's ticker, written by the LeaderElector.
//
// LeaderElector: a thread that keeps this controller's claim on the lease
// row (Store::AcquireLease). A standby tries to take the lease as soon as
// the database says the leader's has run out; once it has it, every store
// write is fenced on its epoch and `on_elected` runs (the controller loads
// its catalogs and re-adopts running jobs there). A leader renews every
// `renew_interval`; it counts as leading only until `lease` after it *sent*
// its last successful renewal, by this machine's monotonic clock, so that
// it stops before any standby can have taken over (the database's clock
// starts the lease no earlier than that). When a renewal finds another
// holder, or no renewal succeeds in time, `on_lost` runs once: the
// controller steps down.
#ifndef LOOM_CONTROLLER_LEADER_LEADER_LEASE_H_
#define LOOM_CONTROLLER_LEADER_LEADER_LEASE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/store/store.h"

namespace loom::controller {

// Trailing metadata with which a standby names the leader's address.
inline constexpr char kLeaderMetadataKey[] = "loom-leader";

class Leadership {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  // A controller alone on its store (SQLite) leads from the start, for ever.
  static constexpr SteadyTime kForever = SteadyTime::max();

  // OK while this controller leads and its lease is valid by its own clock;
  // otherwise UNAVAILABLE saying who leads and where (or that nobody does
  // yet), with *leader_address set to that address ("" when unknown). A
  // leader whose lease ran out by its clock (this process was paused, or a
  // renewal is late) waits up to kRenewalWait for the elector's next
  // renewal before refusing: after a pause that nobody used to take over
  // (the lease row still names it, same epoch), it leads on without a
  // refused request, as a lone controller did before leases.
  absl::Status Admit(std::string* leader_address) const;
  static constexpr std::chrono::milliseconds kRenewalWait{1000};
  bool LeadingNow() const;
  // The epoch this controller leads under (0 when it does not lead).
  int64_t epoch() const;
  // "leader" or "standby" (for /metrics, status and logs).
  const char* role() const;

  void BecomeLeader(int64_t epoch, SteadyTime valid_until);
  void Renewed(SteadyTime valid_until);
  void StepDown();
  // What a standby last read of the lease.
  void SawLeader(const Store::Lease& lease);
  // The console URL of the leader a standby last saw ("" when this
  // controller leads, nobody does, or the leader serves no console).
  std::string leader_console_url() const;
  // The holder it last saw leading ("" if none): who a new leader took
  // over from.
  std::string last_seen_holder() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable renewed_;  // Renewed or StepDown happened
  bool leader_ = false;
  int64_t epoch_ = 0;
  SteadyTime valid_until_{};
  Store::Lease seen_;  // the row as a standby last read it
};

struct LeaderElectorOptions {
  std::string holder;   // unique per process: host, pid and a random suffix
  std::string address;  // where this controller serves gRPC (for clients)
  std::string console_url;  // where its console serves (for standbys' consoles); may be ""
  absl::Duration lease = absl::Seconds(2);
  absl::Duration renew_interval = absl::Milliseconds(500);
};

class LeaderElector {
 public:
  // `store` and `leadership` must outlive this. `on_elected(epoch)` runs on
  // the elector's thread after the lease is taken and the store fenced; an
  // error from it gives the lease back and is reported through `on_lost`.
  // `on_lost(reason)` runs at most once, on the elector's thread.
  LeaderElector(Store* store, Leadership* leadership, LeaderElectorOptions options,
                std::function<absl::Status(int64_t epoch)> on_elected,
                std::function<void(const std::string& reason)> on_lost);
  ~LeaderElector();  // Stop()
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void Start();
  // Ends the thread; a leader releases the lease so that a standby takes
  // over at once instead of after it expires.
  void Stop();

 private:
  void Run();
  // One round: returns how long to wait before the next.
  std::chrono::milliseconds Round();

  Store* const store_;
  Leadership* const leadership_;
  const LeaderElectorOptions options_;
  std::function<absl::Status(int64_t)> on_elected_;
  std::function<void(const std::string&)> on_lost_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  bool lost_ = false;  // on_lost ran (elector thread only)
  std::thread thread_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_LEADER_LEADER_LEASE_H_
