// A fixture for the subsystems' own tests: the real pieces every subsystem
// acts through (a SQLite store in a temporary directory, the job table, the
// worker registry and its rank commands, the checkpoint catalog) and
// nothing else, so that a test of one subsystem needs no other and no
// gRPC. Time is a FakeClock the test moves. Test-only.
#ifndef LOOM_CONTROLLER_JOBS_JOBS_TEST_FIXTURE_H_
#define LOOM_CONTROLLER_JOBS_JOBS_TEST_FIXTURE_H_

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/jobs/job_table.h"
#include "controller/store/store.h"
#include "controller/workers/worker_rank_commands.h"
#include "controller/workers/worker_registry.h"
#include "gtest/gtest.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

// A spec the planner plans in no time: a 2-block GPT on 16 tokens, 10 steps
// over /data (never read: nothing trains), global batch 12 in micro-batches
// of 2; no resources.
inline loom::v1::JobSpec TinyGptSpec(const std::string& name) {
  loom::v1::JobSpec spec;
  spec.set_name(name);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_n_layer(2);
  gpt->set_n_head(2);
  gpt->set_d_model(32);
  gpt->set_seq_len(16);
  gpt->set_vocab_size(256);
  spec.mutable_data()->add_train("/data/train_*.bin");
  spec.mutable_optimizer()->mutable_adamw()->set_lr(1e-3);
  spec.mutable_schedule()->set_total_steps(10);
  spec.mutable_batch()->set_global_batch(12);
  spec.mutable_batch()->set_micro_batch(2);
  return spec;
}

class JobsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_subsystem_test_XXXXXX";
    dir_ = mkdtemp(tmpl);
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    jobs_ = std::make_unique<JobTable>(store_.get(), &clock_, &ranks_);
    catalog_ = std::make_unique<CheckpointCatalog>(store_.get(), nullptr);
  }
  void TearDown() override {
    catalog_.reset();
    jobs_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Registers a worker on `node` with `slots` rank slots; its id.
  std::string AddWorker(const std::string& node, int slots = 4) {
    loom::v1::RegisterWorkerRequest req;
    req.set_node(node);
    req.set_address(absl::StrCat(node, ":1"));
    req.set_slots(slots);
    req.set_cpus(4);
    WorkerRegistry::Worker& w = workers_.Add(req);
    w.rendezvous_port = 29500;
    return w.info.id();
  }

  // A stored job `id` with one rank on each of `workers` (holding its slot),
  // moved to `state` (PENDING, SCHEDULED or RUNNING) through the legal
  // transitions; `spec` as given (resources.ranks and .workers: one rank
  // per worker unless it says).
  JobRecord& AddJob(const std::string& id, loom::v1::JobState state,
                    const std::vector<std::string>& workers, loom::v1::JobSpec spec = {}) {
    JobRecord& rec = jobs_->Add(id);
    rec.job.set_id(id);
    if (spec.name().empty()) spec.set_name(id);
    if (spec.resources().ranks() == 0) {
      spec.mutable_resources()->set_ranks(static_cast<int>(workers.size()));
    }
    if (spec.resources().workers() == 0 && !workers.empty()) {
      spec.mutable_resources()->set_workers(static_cast<int>(workers.size()));
    }
    if (spec.checkpoint().dir().empty()) {
      spec.mutable_checkpoint()->set_dir(absl::StrCat(dir_, "/ckpt/", id));
    }
    *rec.job.mutable_spec() = spec;
    rec.job.set_resume_step(-1);
    jobs_->RecordTransition(rec, loom::v1::PENDING, "submitted");
    EXPECT_TRUE(jobs_->StoreNew(rec).ok());
    if (state == loom::v1::PENDING) return rec;
    for (size_t r = 0; r < workers.size(); ++r) {
      WorkerRegistry::Worker* w = workers_.Find(workers[r]);
      auto* a = rec.job.add_ranks();
      a->set_rank(static_cast<int>(r));
      a->set_worker_id(w->info.id());
      a->set_node(w->info.node());
      a->set_dp(static_cast<int>(r));
      workers_.HoldSlot(*w, {id, static_cast<int>(r), -1});
      rec.live.insert({w->info.id(), static_cast<int>(r)});
    }
    jobs_->Transition(rec, loom::v1::SCHEDULED, "placed");
    if (state == loom::v1::RUNNING) jobs_->Transition(rec, loom::v1::RUNNING, "started");
    return rec;
  }

  // The attempt reported steps up to `step`.
  static void Trained(JobRecord& rec, int64_t step) { rec.attempt_last_step = step; }

  // A checkpoint of rec's at `step`, on disk and committed in the catalog.
  void Commit(JobRecord& rec, int64_t step) {
    const std::string path = absl::StrCat(rec.job.spec().checkpoint().dir(), "/step_", step);
    std::filesystem::create_directories(path);
    loom::v1::CheckpointInfo info;
    info.set_step(step);
    info.set_path(path);
    info.set_generation(rec.job.generation());
    ASSERT_TRUE(catalog_->RecordCommitted(rec.job.id(), info).ok());
    rec.newest_checkpoint_step = step;
  }

  // Every rank of rec's exits (its worker reports it): the slots are free.
  void RanksExited(JobRecord& rec) {
    for (const auto& a : rec.job.ranks()) {
      if (WorkerRegistry::Worker* w = workers_.Find(a.worker_id())) {
        workers_.RankExited(*w, rec.job.id(), a.rank());
      }
    }
    rec.live.clear();
  }

  // The commands queued for `worker_id` since the last call.
  std::vector<loom::v1::WorkerCommand> TakeCommands(const std::string& worker_id) {
    WorkerRegistry::Worker* w = workers_.Find(worker_id);
    std::vector<loom::v1::WorkerCommand> out;
    if (w == nullptr) return out;
    out.swap(w->pending_commands);
    return out;
  }

  // The kinds of a job's recovery events, oldest first.
  static std::vector<loom::v1::RecoveryEvent::Kind> EventKinds(const loom::v1::Job& job) {
    std::vector<loom::v1::RecoveryEvent::Kind> out;
    for (const auto& e : job.events()) out.push_back(e.kind());
    return out;
  }
  static std::vector<loom::v1::RecoveryEvent::Kind> EventKinds(const JobRecord& rec) {
    return EventKinds(rec.job);
  }

  // The job as the store has it now (what a restarted controller reads).
  loom::v1::Job Stored(const std::string& id) {
    auto jobs = store_->LoadJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    for (loom::v1::Job& j : *jobs) {
      if (j.id() == id) return j;
    }
    ADD_FAILURE() << "job " << id << " is not stored";
    return {};
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  WorkerRegistry workers_{&clock_, WorkerRegistryOptions{}};
  WorkerRankCommands ranks_{&workers_};
  std::unique_ptr<JobTable> jobs_;
  std::unique_ptr<CheckpointCatalog> catalog_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_JOBS_JOBS_TEST_FIXTURE_H_
