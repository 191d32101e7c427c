// WorkerAgent: the queue of reports to the controller (rank events and
// exits), their delivery with retries across controller restarts, and
// whether everything queued has gone (Quiet).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "worker/worker_agent.h"

namespace loom::worker {

void WorkerAgent::Queue(const std::string& job_id, int64_t generation,
                        const loom::v1::RankEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  // While the controller is away the queue grows by a step report per
  // step; past the bound the oldest step reports go (checkpoint reports and
  // exits are kept).
  if (outgoing_.size() >= kMaxOutgoing) {
    auto oldest = std::find_if(outgoing_.begin(), outgoing_.end(),
                               [](const Outgoing& o) { return !o.is_exit && o.event.has_step(); });
    if (oldest != outgoing_.end()) outgoing_.erase(oldest);
  }
  Outgoing out;
  out.job_id = job_id;
  out.generation = generation;
  out.event = e;
  outgoing_.push_back(std::move(out));
  cv_.notify_all();
}

size_t WorkerAgent::RanksRunning() { return supervisor_->Running().size(); }

bool WorkerAgent::Quiet() {
  // The supervisor first: an exit it hands over lands in outgoing_ before
  // Unsettled() drops.
  if (supervisor_->Unsettled() > 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return outgoing_.empty() && !sending_;
}

grpc::Status WorkerAgent::Deliver(const std::function<grpc::Status(const std::string&)>& call) {
  grpc::Status s;
  for (int attempt = 0; !stop_.load(); ++attempt) {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = worker_id_;
    }
    s = call(id);
    // (RESOURCE_EXHAUSTED: the controller is at its RPC thread bound.)
    const bool unreachable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                             s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    // The controller does not know this worker (it restarted): wait for the
    // heartbeat loop to register again, then send under the new id.
    const bool unknown_worker = s.error_code() == grpc::StatusCode::NOT_FOUND &&
                                s.error_message().rfind("worker \"", 0) == 0;
    if (!unreachable && !unknown_worker) return s;
    // Backoff up to 1 s; a new registration (the controller is back) ends
    // the wait at once.
    const auto backoff = std::chrono::milliseconds(std::min(1000, 100 << std::min(attempt, 4)));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, backoff, [&] { return stop_.load() || worker_id_ != id; });
  }
  return s;
}

}  // namespace loom::worker
