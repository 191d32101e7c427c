#include "worker/checkpoint_uploader.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace loom::worker {

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
                                 const std::string& remote) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  cv_.wait(lock, [&] { return cancel_ || (queue_.empty() && !busy_); });
}

void CheckpointUploader::Loop() {
  // Below the ranks' priority: the upload takes the CPU training leaves.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();
      cv_.wait(lock, [&] { return cancel_ || !queue_.empty(); });
      if (cancel_) return;
      item = std::move(queue_.back());
      queue_.pop_back();
      busy_ = true;
    }
    bool skipped = false;
    loom::v1::CheckpointInfo outcome = Upload(item, &skipped);
    if (cancel_) return;
    if (skipped) continue;
    if (outcome.status() == "uploaded") {
      std::cerr << "loom-worker: checkpoint of " << item.job_id << " at step " << outcome.step()
                << " uploaded to " << outcome.remote_url() << " (" << outcome.bytes()
                << " bytes in " << outcome.upload_seconds() << " s)" << std::endl;
    } else {
      std::cerr << "loom-worker: checkpoint of " << item.job_id << " at step " << outcome.step()
                << " was not uploaded: " << outcome.error() << std::endl;
    }
    report_(item.job_id, item.generation, outcome);
  }
}

loom::v1::CheckpointInfo CheckpointUploader::Upload(const Item& item, bool* skipped) {
  loom::v1::CheckpointInfo out;
  out.set_step(item.committed.step());
  out.set_path(item.committed.path());
  out.set_generation(item.committed.generation());
  auto failed = [&](const absl::Status& s) {
    out.set_status("upload_failed");
    out.set_error(absl::StrCat(options_.uploader, ": ", s.message()));
    return out;
  };
  absl::StatusOr<object_store::S3Location> job = object_store::ParseS3Url(item.remote);
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
    if (!std::filesystem::exists(item.committed.path(), ec)) {
      *skipped = true;  // deleted by retention during the upload
      return out;
    }
    return failed(r.status());
  }
  out.set_status("uploaded");
  out.set_remote_url(r->url);
  out.set_bytes(r->bytes);
  out.set_upload_seconds(r->seconds);
  return out;
}

}  // namespace loom::worker
