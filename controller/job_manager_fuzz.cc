// libFuzzer target: JobManager's handling of arbitrary requests. The first
// byte picks an RPC, the rest is decoded as its request message (inputs
// that do not decode are skipped) and handed to the manager, whose state
// carries over from input to input, as a controller's does from RPC to RPC:
// workers registered, jobs submitted, heartbeats, reports and exits in any
// order. The store is real (SQLite in a temporary directory); the clock is
// a fake one that moves a little with every input, so leases expire and
// the periodic checks (Tick) run. Paths are confined to the temporary
// directory. Built only in the fuzz build.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <memory>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/job_manager.h"
#include "controller/store/store.h"
#include "loom/v1/service.pb.h"

namespace {

struct Harness {
  Harness() {
    char tmpl[] = "/tmp/loom_job_manager_fuzz_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) abort();
    dir = tmpl;
    auto opened = loom::controller::Store::Open(dir);
    if (!opened.ok()) {
      std::cerr << opened.status() << std::endl;
      abort();
    }
    store = std::move(*opened);
    loom::controller::JobManagerOptions options;
    options.worker_timeout = absl::Seconds(5);
    options.checkpoint_root = dir + "/checkpoints";
    options.data_roots = {dir + "/data"};
    manager = std::make_unique<loom::controller::JobManager>(store.get(), &clock, options);
  }
  std::string dir;
  loom::FakeClock clock;
  std::unique_ptr<loom::controller::Store> store;
  std::unique_ptr<loom::controller::JobManager> manager;
};

template <typename Message>
bool Decode(const uint8_t* data, size_t size, Message* message) {
  return message->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();
  if (size == 0) return 0;
  const uint8_t op = data[0] % 15;
  ++data;
  --size;
  h->clock.Advance(absl::Milliseconds(250));
  loom::controller::JobManager& m = *h->manager;
  switch (op) {
    case 0: {
      loom::v1::RegisterWorkerRequest req;
      if (Decode(data, size, &req)) (void)m.RegisterWorker(req).ok();
      break;
    }
    case 1: {
      loom::v1::HeartbeatRequest req;
      if (Decode(data, size, &req)) (void)m.Heartbeat(req).ok();
      break;
    }
    case 2: {
      loom::v1::ReportStepMetricsRequest req;
      if (Decode(data, size, &req)) (void)m.ReportEvents(req).ok();
      break;
    }
    case 3: {
      loom::v1::ReportRankExitRequest req;
      if (Decode(data, size, &req)) (void)m.ReportRankExit(req).ok();
      break;
    }
    case 4: {
      loom::v1::SubmitJobRequest req;
      if (Decode(data, size, &req)) (void)m.Submit(req.spec()).ok();
      break;
    }
    case 5: {
      loom::v1::RollbackJobRequest req;
      if (Decode(data, size, &req)) (void)m.Rollback(req).ok();
      break;
    }
    case 6: {
      loom::v1::CancelJobRequest req;
      if (Decode(data, size, &req)) (void)m.Cancel(req.job_id(), req.reason()).ok();
      break;
    }
    case 7: {
      loom::v1::PlanRequest req;
      if (Decode(data, size, &req)) (void)m.Plan(req).ok();
      break;
    }
    case 8: {
      loom::v1::WatchJobRequest req;
      if (Decode(data, size, &req)) {
        std::optional<int64_t> after;
        if (req.has_after_seq()) after = req.after_seq();
        (void)m.Watch(req.job_id(), req.include_history(), after).ok();
      }
      break;
    }
    case 9: {
      loom::v1::ListJobsRequest req;
      if (Decode(data, size, &req)) {
        loom::controller::JobFilter filter{
            {}, req.queue(), req.submitted_by(), req.name_contains()};
        for (int s : req.states()) filter.states.insert(static_cast<loom::v1::JobState>(s));
        int64_t next = 0;
        (void)m.ListPage(filter, 1 + static_cast<int>(req.page_size() & 0xff),
                         static_cast<int64_t>(size), req.full(), &next);
      }
      break;
    }
    case 10: {
      loom::v1::GetStepMetricsRequest req;
      if (Decode(data, size, &req)) (void)m.StepMetrics(req.job_id(), req.limit()).ok();
      break;
    }
    case 12: {
      loom::v1::CordonNodeRequest req;
      if (Decode(data, size, &req)) (void)m.Cordon(req, "user 'fuzz'").ok();
      break;
    }
    case 13: {
      loom::v1::UncordonNodeRequest req;
      if (Decode(data, size, &req)) (void)m.Uncordon(req, "user 'fuzz'").ok();
      break;
    }
    case 14: {
      loom::v1::DrainNodeRequest req;
      if (Decode(data, size, &req)) (void)m.Drain(req, "user 'fuzz'").ok();
      break;
    }
    default:  // 11
      m.Tick();
      break;
  }
  return 0;
}
