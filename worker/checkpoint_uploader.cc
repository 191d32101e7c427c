#include "worker/checkpoint_uploader.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/checkpoint_retention.h"
#include "common/cpu_list.h"

namespace loom::worker {

std::optional<CheckpointUploader::RemoteTier> CheckpointUploader::RemoteTier::Of(
    const loom::v1::StartRank& start) {
  if (start.spec().checkpoint().remote().empty()) return std::nullopt;
  RemoteTier tier;
  tier.url =
      absl::StrCat(absl::StripSuffix(start.spec().checkpoint().remote(), "/"), "/", start.job_id());
  tier.retention.policy = RemoteRetentionPolicy(start.spec().checkpoint());
  tier.retention.rollback_window = RollbackWindowSteps(start.spec().recovery());
  tier.retention.held.insert(start.held_checkpoints().begin(), start.held_checkpoints().end());
  return tier;
}

CheckpointUploader::CheckpointUploader(Options options, Report report)
    : options_([&] {
        Options o = std::move(options);
        if (!o.config) {
          o.config = [] {
            return object_store::S3ConfigFromEnvironment(object_store::ProcessEnvironment());
          };
        }
        o.client.cancel = nullptr;  // set per upload below
        return o;
      }()),
      report_(std::move(report)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointUploader::~CheckpointUploader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointUploader::Enqueue(const std::string& job_id, int64_t generation,
                                 const loom::v1::CheckpointInfo& committed,
                                 const RemoteTier& remote) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto same = [&](const Item& i) {
      return i.job_id == job_id && i.committed.path() == committed.path();
    };
    if (std::any_of(queue_.begin(), queue_.end(), same) ||
        (busy_ && in_flight_ == std::make_pair(job_id, committed.path()))) {
      return;
    }
    queue_.push_back(Item{job_id, generation, committed, remote});
    // Newest step last: after an outage the newest checkpoint goes first.
    std::stable_sort(queue_.begin(), queue_.end(), [](const Item& a, const Item& b) {
      return a.committed.step() < b.committed.step();
    });
  }
  cv_.notify_all();
}

void CheckpointUploader::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return cancel_ || (DueLocked(absl::Now()) < 0 && !busy_); });
}

size_t CheckpointUploader::Backlog() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(
      std::count_if(queue_.begin(), queue_.end(), [](const Item& i) { return i.failures > 0; }));
}

int CheckpointUploader::DueLocked(absl::Time now) const {
  int newest = -1;
  for (int i = static_cast<int>(queue_.size()) - 1; i >= 0; --i) {
    const Item& item = queue_[i];
    if (item.failures > 0 && backlog_not_before_ > now) continue;
    if (newest < 0) newest = i;
    // One the store keeps for good by its step goes before the newest: the
    // rank holds its directory until it is settled (RetentionGuard::upload),
    // and the sooner it goes, the sooner the directory may let it go.
    const engine::RetentionPolicy& p = item.remote.retention.policy;
    if (!p.all && p.every > 0 && item.committed.step() % p.every == 0) return i;
  }
  return newest;
}

void CheckpointUploader::Loop() {
  // Below the ranks' priority: the upload takes the CPU training leaves; and
  // on the CPUs it was given, if any. The transfer threads inherit both.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  if (!options_.cpus.empty()) {
    if (absl::Status pinned = PinThisThread(options_.cpus); !pinned.ok()) {
      std::cerr << "loom-worker: object-store uploads: " << pinned.message()
                << "; they run on any CPU\n";
    }
  }
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();
      while (!cancel_ && DueLocked(absl::Now()) < 0) {
        // Until something is queued, or the backlog's next try is due.
        const absl::Time next = queue_.empty() ? absl::InfiniteFuture() : backlog_not_before_;
        if (next == absl::InfiniteFuture()) {
          cv_.wait(lock);
        } else {
          cv_.wait_for(
              lock, absl::ToChronoNanoseconds(std::max(absl::Milliseconds(1), next - absl::Now())));
        }
      }
      if (cancel_) return;
      const int due = DueLocked(absl::Now());
      item = std::move(queue_[due]);
      queue_.erase(queue_.begin() + due);
      busy_ = true;
      in_flight_ = {item.job_id, item.committed.path()};
    }
    bool skipped = false, retry = false, unreachable = false;
    loom::v1::CheckpointInfo outcome = Upload(item, &skipped, &retry, &unreachable);
    if (cancel_) return;
    if (skipped) continue;
    // Settled (in the store, or refused for good): the rank's pruner may
    // now delete the directory (RetentionGuard::upload).
    if (!retry) engine::MarkUploadSettled(item.committed.path());
    if (outcome.status() == "uploaded") {
      if (item.failures > 0) {
        outcome.set_upload_note(
            absl::StrFormat("from the backlog after %d failed %s over %.0f s", item.failures,
                            item.failures == 1 ? "try" : "tries",
                            absl::ToDoubleSeconds(absl::Now() - item.first_failure)));
      }
      std::cerr << "loom-worker: checkpoint of " << item.job_id << " at step " << outcome.step()
                << " uploaded to " << outcome.remote_url() << " (" << outcome.bytes()
                << " bytes in " << outcome.upload_seconds() << " s"
                << (item.failures > 0 ? ", " + outcome.upload_note() : "") << ")" << std::endl;
      {
        // The store answers: the rest of the backlog goes now, newest first,
        // and a later outage is reported again.
        std::lock_guard<std::mutex> lock(mu_);
        backlog_tries_ = 0;
        backlog_not_before_ = absl::InfinitePast();
        outage_reported_.clear();
      }
      report_(item.job_id, item.generation, outcome);
      continue;
    }
    std::cerr << "loom-worker: checkpoint of " << item.job_id << " at step " << outcome.step()
              << " was not uploaded: " << outcome.error()
              << (retry ? " (kept in the backlog for a later try)" : "") << std::endl;
    // Once an outage: its first failure of each job says so; the others
    // join the backlog in silence.
    bool report = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (unreachable) report = outage_reported_.insert(item.job_id).second;
    }
    if (item.failures == 0 && report) report_(item.job_id, item.generation, outcome);
    if (retry) {
      if (item.failures++ == 0) item.first_failure = absl::Now();
      std::lock_guard<std::mutex> lock(mu_);
      // One clock for the whole backlog: when it is due, every checkpoint in
      // it is, and the newest goes first.
      absl::Duration wait = options_.backlog_retry;
      for (int i = 0; i < backlog_tries_ && wait < kMaxBacklogRetry; ++i) wait *= 2;
      ++backlog_tries_;
      backlog_not_before_ = absl::Now() + std::min(wait, kMaxBacklogRetry);
      queue_.push_back(std::move(item));
      std::stable_sort(queue_.begin(), queue_.end(), [](const Item& a, const Item& b) {
        return a.committed.step() < b.committed.step();
      });
    }
  }
}

loom::v1::CheckpointInfo CheckpointUploader::Upload(const Item& item, bool* skipped, bool* retry,
                                                    bool* unreachable_out) {
  loom::v1::CheckpointInfo out;
  out.set_step(item.committed.step());
  out.set_path(item.committed.path());
  out.set_generation(item.committed.generation());
  auto failed = [&](const absl::Status& s) {
    out.set_status("upload_failed");
    out.set_error(absl::StrCat(options_.uploader, ": ", s.message()));
    return out;
  };
  absl::StatusOr<object_store::S3Location> job = object_store::ParseS3Url(item.remote.url);
  if (!job.ok()) return failed(job.status());
  absl::StatusOr<object_store::S3Config> config = options_.config();
  if (!config.ok()) return failed(config.status());
  std::error_code ec;
  if (!std::filesystem::exists(item.committed.path(), ec)) {
    *skipped = true;  // retention deleted it first
    return out;
  }
  object_store::S3ClientOptions client_options = options_.client;
  client_options.cancel = &cancel_;
  object_store::S3Client client(*config, client_options);
  absl::StatusOr<object_store::TransferReport> r =
      object_store::UploadCheckpoint(client, *job, item.committed.path(), options_.transfer);
  if (!r.ok()) {
    const bool unreachable =
        absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status());
    const bool gone = !std::filesystem::exists(item.committed.path(), ec);
    // Retention deleted it during the upload: nothing to retry. That is no
    // failure of the store's, unless the store failed too (an outage is
    // still one, even while retention outruns the client's retries).
    if (gone && !unreachable) {
      *skipped = true;
      return out;
    }
    *retry = unreachable && !gone;
    *unreachable_out = unreachable;
    return failed(r.status());
  }
  out.set_status("uploaded");
  out.set_remote_url(r->url);
  out.set_bytes(r->bytes);
  out.set_upload_seconds(r->seconds);
  if (item.remote.retention.policy.all) return out;
  // Retention on the store, now that the newest copy is there. A listing
  // or deletion that fails is tried again after the next upload.
  absl::StatusOr<std::vector<engine::RetentionVerdict>> verdicts =
      object_store::PruneRemoteCheckpoints(client, *job, item.remote.retention, /*apply=*/true);
  if (!verdicts.ok()) {
    std::cerr << "loom-worker: retention of " << item.remote.url
              << " in the object store did not run: " << verdicts.status().message() << std::endl;
    return out;
  }
  for (const engine::RetentionVerdict& v : *verdicts) {
    if (!v.error.empty()) {
      std::cerr << "loom-worker: retention could not delete " << v.checkpoint.name << " ("
                << v.reason << "): " << v.error << std::endl;
    }
    if (v.keep) continue;
    loom::v1::PrunedCheckpoint* p = out.add_pruned();
    p->set_path(v.checkpoint.name);
    p->set_step(v.checkpoint.step);
    p->set_tier("remote");
    p->set_reason(v.reason);
  }
  return out;
}

}  // namespace loom::worker
