#include "controller/progress/series_warmer.h"

#include <algorithm>
#include <chrono>
#include <iostream>

namespace loom::controller {

SeriesWarmer::SeriesWarmer(StepSeriesIndex* index, std::function<std::vector<loom::v1::Job>()> jobs,
                           std::function<bool()> leading)
    : index_(index),
      jobs_(std::move(jobs)),
      leading_(std::move(leading)),
      thread_([this] { Run(); }) {}

SeriesWarmer::~SeriesWarmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool SeriesWarmer::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

void SeriesWarmer::Run() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !leading_()) cv_.wait_for(lock, std::chrono::milliseconds(500));
  }
  std::vector<loom::v1::Job> longest;
  if (!Stopping()) {
    for (loom::v1::Job& job : jobs_()) {
      if (job.summary().last_step() >= kMinSteps) longest.push_back(std::move(job));
    }
  }
  std::sort(longest.begin(), longest.end(), [](const auto& a, const auto& b) {
    return a.summary().last_step_unix_ms() > b.summary().last_step_unix_ms();
  });
  if (longest.size() > static_cast<size_t>(kMaxJobs)) longest.resize(kMaxJobs);
  for (const loom::v1::Job& job : longest) {
    if (Stopping()) break;
    // A failure only leaves the job for its first query to read.
    absl::Status s = index_->Warm(job.id(), job.generation(), job.resume_step());
    if (!s.ok()) {
      std::cerr << "loom-controller: could not read the chart series of " << job.id()
                << " ahead: " << s << std::endl;
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    warmed_.push_back(job.id());
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

void SeriesWarmer::WaitDone() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
}

std::vector<std::string> SeriesWarmer::warmed() {
  std::lock_guard<std::mutex> lock(mu_);
  return warmed_;
}

}  // namespace loom::controller
