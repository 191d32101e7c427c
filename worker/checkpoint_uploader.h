// The worker's background upload of committed checkpoints to the object
// store (CheckpointSpec.remote): the remote tier. The worker that hosts a
// job's rank 0 hands each checkpoint that rank reports committed to this
// uploader; one thread uploads them, newest first (but one whose step the
// store's retention keeps for good before the others), below normal CPU
// priority and on the CPUs given (Options::cpus), so a save stalls training
// exactly as long as without a remote tier. No LibTorch.
//
// Outcomes are reported through `report` (on the upload thread):
//   "uploaded"       remote_url, bytes, upload_seconds set;
//   "upload_failed"  error names this worker, the object and the store's
//                    answer (after the client's bounded retries), or why no
//                    upload could start (no credentials, a bad location).
// A store that could not be reached (UNAVAILABLE) is tried again later: the
// outage's first failure of each job is reported (once, until the store
// answers again), and each checkpoint it keeps back joins a backlog, all of
// it retried after
// Options::backlog_retry (doubling up to 5 minutes), newest first, for as
// long as its directory is there, and "uploaded" follows when it goes
// through, its upload_note saying how long the backlog kept it. A refusal (credentials, a bad
// request) or a damaged local copy is not retried: the next checkpoint will say the same, and a
// retry loop against refused credentials helps no one. After each upload, the store's copies of
// that job are pruned by its remote retention (object_store::PruneRemoteCheckpoints); what went is
// reported with the "uploaded" outcome (CheckpointInfo.pruned, tier "remote"). A deletion that
// fails is tried again after the next upload. A checkpoint whose directory retention deleted before
// its upload began, or during an upload the store did not fail, is skipped without a report (it is
// on no tier to restore from).
#ifndef LOOM_WORKER_CHECKPOINT_UPLOADER_H_
#define LOOM_WORKER_CHECKPOINT_UPLOADER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/object_store/remote_checkpoints.h"
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_config.h"
#include "loom/v1/job.pb.h"

namespace loom::worker {

class CheckpointUploader {
 public:
  struct Options {
    object_store::TransferOptions transfer;
    object_store::S3ClientOptions client;
    // Who uploads, for messages ("worker w-3 on node-a").
    std::string uploader = "this worker";
    // The store's configuration; the default reads the process environment
    // (object_store::S3ConfigFromEnvironment). Asked at each upload, so a
    // fixed environment or credentials file is picked up without a restart.
    std::function<absl::StatusOr<object_store::S3Config>()> config;
    // When the backlog (checkpoints a store outage kept back) is tried
    // first; each further failure doubles it, up to kMaxBacklogRetry.
    absl::Duration backlog_retry = absl::Seconds(30);
    // The CPUs the upload runs on (its thread and the transfer threads it
    // starts), e.g. ones the ranks do not use; empty: any, at nice 10.
    std::vector<int> cpus;
  };
  static constexpr absl::Duration kMaxBacklogRetry = absl::Minutes(5);
  using Report = std::function<void(const std::string& job_id, int64_t generation,
                                    const loom::v1::CheckpointInfo& outcome)>;
  // Where a job's checkpoints go and what the store keeps of them.
  struct RemoteTier {
    std::string url;  // the job's location, "s3://bucket/prefix/<job>"
    object_store::RemoteRetention retention;
    // The tier of the job `start` (a rank 0's) places: the job's own place
    // under spec.checkpoint.remote, its remote retention, rollback window
    // and holds. None when the spec names no object store.
    static std::optional<RemoteTier> Of(const loom::v1::StartRank& start);
  };

  CheckpointUploader(Options options, Report report);
  // Cancels the upload in flight (its multipart upload is aborted) and drops
  // the queue.
  ~CheckpointUploader();

  // Queues the committed checkpoint at `committed.path` (a step directory)
  // of `job_id` for `remote`; one already queued or being uploaded is not
  // queued again.
  void Enqueue(const std::string& job_id, int64_t generation,
               const loom::v1::CheckpointInfo& committed, const RemoteTier& remote);

  // Waits until no checkpoint is due now and no upload runs (tests); the
  // backlog's later tries do not count.
  void WaitIdle();
  // The checkpoints kept back by an outage, waiting for a later try.
  size_t Backlog();

 private:
  struct Item {
    std::string job_id;
    int64_t generation = 0;
    loom::v1::CheckpointInfo committed;
    RemoteTier remote;
    int failures = 0;  // tries that found no store (> 0: in the backlog)
    absl::Time first_failure;
  };
  void Loop();
  // The index in queue_ of the item to upload next at `now` (the newest
  // due that the store keeps for good by its step, else the newest due),
  // or -1.
  int DueLocked(absl::Time now) const;
  // `*unreachable`: the store could not be reached; `*retry`: and the
  // checkpoint is still there (worth a later try).
  loom::v1::CheckpointInfo Upload(const Item& item, bool* skipped, bool* retry, bool* unreachable);

  const Options options_;
  const Report report_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> queue_;  // newest step last; the newest due is taken
  // The backlog's next try (every item with failures > 0 is due then), and
  // the tries since the store last answered.
  absl::Time backlog_not_before_ = absl::InfinitePast();
  int backlog_tries_ = 0;
  // Jobs whose failure in the current outage was reported (cleared when the
  // store answers again).
  std::set<std::string> outage_reported_;
  bool busy_ = false;
  std::pair<std::string, std::string> in_flight_;  // job, path: the upload running
  std::thread thread_;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_CHECKPOINT_UPLOADER_H_
