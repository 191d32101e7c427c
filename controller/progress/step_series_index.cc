#include "controller/progress/step_series_index.h"

#include <algorithm>

namespace loom::controller {

absl::Status StepSeriesIndex::Refresh(const std::string& job_id, JobBlocks* job, int64_t first_step,
                                      int64_t last_step, int64_t generation, int64_t resume_step) {
  if (job->generation != generation) {
    // Steps from the resume step on were (or will be) recorded again: their
    // blocks go. A first look (generation -1) keeps nothing.
    const int64_t keep_below = job->generation < 0 ? 0 : std::max<int64_t>(0, resume_step);
    const int64_t keep_blocks = keep_below / kBlockSteps - job->first_block;
    if (keep_blocks <= 0) {
      job->blocks.clear();
    } else if (keep_blocks < static_cast<int64_t>(job->blocks.size())) {
      job->blocks.resize(keep_blocks);
    }
    job->generation = generation;
  }
  if (job->blocks.empty()) job->first_block = first_step / kBlockSteps;
  // Complete blocks: those that end before the last recorded step.
  const int64_t complete_to = (last_step / kBlockSteps) * kBlockSteps;  // exclusive
  const int64_t from = job->indexed_to();
  if (from >= complete_to) return absl::OkStatus();
  StepSummary block;
  int64_t block_index = from / kBlockSteps;
  int64_t pending_step = -1;
  loom::v1::StepMetrics pending;
  auto flush_step = [&] {
    if (pending_step < 0) return;
    block.Add(pending);
    pending_step = -1;
  };
  auto close_blocks_before = [&](int64_t step) {
    // Closes the block being built, and any empty ones, up to `step`'s.
    while (block_index < step / kBlockSteps) {
      job->blocks.push_back(block);
      block = StepSummary();
      ++block_index;
    }
  };
  absl::Status s =
      store_->ScanStepMetrics(job_id, from, complete_to - 1, [&](const loom::v1::StepMetrics& m) {
        if (m.step() != pending_step) {
          flush_step();
          close_blocks_before(m.step());
        }
        // A step recorded again replaces its earlier record.
        pending = m;
        pending_step = m.step();
      });
  if (!s.ok()) {
    job->blocks.clear();  // half an update is no index
    return s;
  }
  flush_step();
  close_blocks_before(complete_to);
  return absl::OkStatus();
}

absl::StatusOr<loom::v1::GetStepSeriesResponse> StepSeriesIndex::Query(
    const loom::v1::GetStepSeriesRequest& request, int64_t generation, int64_t resume_step) {
  absl::StatusOr<std::pair<int64_t, int64_t>> bounds = store_->StepBounds(request.job_id());
  if (!bounds.ok()) return bounds.status();
  absl::StatusOr<StepSeriesBuilder> builder =
      StepSeriesBuilder::Start(request, bounds->first, bounds->second);
  if (!builder.ok()) return builder.status();
  if (builder->empty()) return builder->Finish();
  const int64_t from = builder->from(), to = builder->to();
  const int64_t buckets =
      request.buckets() > 0 ? request.buckets() : StepSeriesBuilder::kDefaultBuckets;
  auto add = [&](const loom::v1::StepMetrics& m) { builder->Add(m); };
  if ((to - from + 1) / buckets < 2 * kBlockSteps) {
    // Zoomed in: the steps themselves.
    absl::Status s = store_->ScanStepMetrics(request.job_id(), from, to, add);
    if (!s.ok()) return s;
    return builder->Finish();
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status s = EnsureKept(lock, request.job_id(), bounds->first, bounds->second, generation,
                                  resume_step);
      !s.ok()) {
    return s;
  }
  JobBlocks& job = jobs_[request.job_id()];
  job.last_used = ++uses_;
  if (absl::Status s =
          Refresh(request.job_id(), &job, bounds->first, bounds->second, generation, resume_step);
      !s.ok()) {
    jobs_.erase(request.job_id());
    return s;
  }
  // Whole blocks inside [from, to] from the index; the steps at the ends
  // that no whole block covers, from the store.
  const int64_t first_whole = std::max((from + kBlockSteps - 1) / kBlockSteps, job.first_block);
  const int64_t end_whole =
      std::min((to + 1) / kBlockSteps, job.first_block + static_cast<int64_t>(job.blocks.size()));
  if (first_whole >= end_whole) {
    absl::Status s = store_->ScanStepMetrics(request.job_id(), from, to, add);
    if (!s.ok()) return s;
  } else {
    absl::Status s =
        store_->ScanStepMetrics(request.job_id(), from, first_whole * kBlockSteps - 1, add);
    if (!s.ok()) return s;
    for (int64_t b = first_whole; b < end_whole; ++b) {
      builder->AddSummary(job.blocks[b - job.first_block]);
    }
    s = store_->ScanStepMetrics(request.job_id(), end_whole * kBlockSteps, to, add);
    if (!s.ok()) return s;
  }
  EvictLocked();
  return builder->Finish();
}

absl::StatusOr<StepSeriesIndex::JobBlocks> StepSeriesIndex::Build(const std::string& job_id,
                                                                  int64_t first_step,
                                                                  int64_t last_step,
                                                                  int64_t generation,
                                                                  int64_t resume_step) {
  JobBlocks job;
  if (absl::Status s = Refresh(job_id, &job, first_step, last_step, generation, resume_step);
      !s.ok()) {
    return s;
  }
  return job;
}

absl::Status StepSeriesIndex::EnsureKept(std::unique_lock<std::mutex>& lock,
                                         const std::string& job_id, int64_t first_step,
                                         int64_t last_step, int64_t generation,
                                         int64_t resume_step) {
  // One read per job: a second asker waits for the first's.
  built_.wait(lock, [&] { return building_.count(job_id) == 0; });
  if (jobs_.find(job_id) != jobs_.end()) return absl::OkStatus();
  // Read whole outside the lock, so that other jobs' charts are not held up
  // behind a long job's first read.
  building_.insert(job_id);
  lock.unlock();
  absl::StatusOr<JobBlocks> built = Build(job_id, first_step, last_step, generation, resume_step);
  lock.lock();
  building_.erase(job_id);
  built_.notify_all();
  if (!built.ok()) return built.status();
  jobs_.emplace(job_id, *std::move(built)).first->second.last_used = ++uses_;
  return absl::OkStatus();
}

absl::Status StepSeriesIndex::Warm(const std::string& job_id, int64_t generation,
                                   int64_t resume_step) {
  absl::StatusOr<std::pair<int64_t, int64_t>> bounds = store_->StepBounds(job_id);
  if (!bounds.ok()) return bounds.status();
  std::unique_lock<std::mutex> lock(mu_);
  absl::Status s = EnsureKept(lock, job_id, bounds->first, bounds->second, generation, resume_step);
  EvictLocked();
  return s;
}

void StepSeriesIndex::EvictLocked() {
  for (;;) {
    size_t blocks = 0;
    for (const auto& [id, kept] : jobs_) blocks += kept.blocks.size();
    if (jobs_.size() <= 1 || (jobs_.size() <= kMaxJobs && blocks <= kMaxBlocks)) break;
    auto oldest = std::min_element(jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    jobs_.erase(oldest);  // never the job used last
  }
}

size_t StepSeriesIndex::BlocksOf(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.blocks.size();
}

}  // namespace loom::controller
