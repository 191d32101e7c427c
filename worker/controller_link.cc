#include "worker/controller_link.h"

#include <iostream>
#include <utility>

namespace loom::worker {
namespace {
constexpr char kLeaderMetadataKey[] = "loom-leader";  // controller/leader/leader_lease.h
}  // namespace

ControllerLink::ControllerLink(std::vector<std::string> addresses,
                               std::vector<std::shared_ptr<Stub>> stubs)
    : addresses_(std::move(addresses)), stubs_(std::move(stubs)) {}

ControllerLink::ControllerLink(std::shared_ptr<Stub> stub)
    : addresses_({""}), stubs_({std::move(stub)}) {}

ControllerLink::Target ControllerLink::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  return {stubs_[current_].get(), current_};
}

void ControllerLink::After(const Target& used, const grpc::Status& status,
                           const grpc::ClientContext& ctx) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return;
  }
  std::string hint;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderMetadataKey); it != trailers.end()) {
    hint.assign(it->second.data(), it->second.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  MoveOnLocked(used.index, hint);
}

bool ControllerLink::Accept(const Target& used, int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (epoch < newest_epoch_ && now - newest_heard_ > kEpochMemory) {
    std::cerr << "loom-worker: controller epoch " << epoch << " answers, and epoch "
              << newest_epoch_ << " has not for "
              << std::chrono::duration_cast<std::chrono::seconds>(now - newest_heard_).count()
              << " s: following epoch " << epoch << " (a new controller database?)" << std::endl;
    newest_epoch_ = epoch;
  }
  if (epoch >= newest_epoch_) {
    newest_heard_ = now;
    if (epoch > newest_epoch_ && newest_epoch_ > 0) {
      std::cerr << "loom-worker: controller leader epoch " << newest_epoch_ << " -> " << epoch
                << (addresses_.size() > 1 ? " at " + addresses_[used.index] : "") << std::endl;
    }
    newest_epoch_ = epoch;
    return true;
  }
  std::cerr << "loom-worker: refused an answer of controller epoch " << epoch
            << (addresses_.size() > 1 ? " at " + addresses_[used.index] : "") << ": epoch "
            << newest_epoch_ << " leads now" << std::endl;
  MoveOnLocked(used.index, "");
  return false;
}

int64_t ControllerLink::newest_epoch() {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_epoch_;
}

void ControllerLink::MoveOnLocked(int from, const std::string& hint) {
  if (from != current_ || addresses_.size() < 2) return;  // someone moved on already
  for (size_t i = 0; i < addresses_.size(); ++i) {
    if (!hint.empty() && addresses_[i] == hint && static_cast<int>(i) != from) {
      current_ = static_cast<int>(i);
      return;
    }
  }
  current_ = (from + 1) % static_cast<int>(addresses_.size());
}

}  // namespace loom::worker
