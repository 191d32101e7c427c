// `loomctl watch JOB`, and the job follower behind it that `submit --follow`
// shares (cli/commands/watch.h): progress lines as the job's events arrive,
// the summary at the end.
#include "cli/commands/watch.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "google/protobuf/util/json_util.h"

namespace loom::cli {
namespace {

std::string Bar(double frac, int width) {
  int filled = static_cast<int>(std::round(frac * width));
  std::string s = "[";
  for (int i = 0; i < width; ++i) s += i < filled ? "#" : (i == filled ? ">" : ".");
  return s + "]";
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

}  // namespace

void PrintSummary(const loom::v1::Job& job, Client* client) {
  const auto& s = job.summary();
  std::cout << "\njob " << job.id() << " " << StateName(job.state());
  if (!job.reason().empty()) std::cout << " (" << job.reason() << ")";
  std::cout << "\n";
  std::cout << absl::StrFormat("  steps            %d / %d\n", s.last_step(),
                               job.spec().schedule().total_steps());
  std::cout << absl::StrFormat("  train loss       %.4f -> %.4f\n", s.first_loss(), s.last_loss());
  if (s.has_val_loss()) {
    std::cout << absl::StrFormat("  validation loss  %.4f -> %.4f\n", s.first_val_loss(),
                                 s.last_val_loss());
  }
  std::cout << absl::StrFormat("  tokens/s         %.0f (mean over the run, all ranks; last step %.0f)\n",
                               s.tokens_per_second(), s.last_tokens_per_second());
  std::cout << absl::StrFormat("  tokens seen      %d\n", s.tokens_seen());
  if (s.mfu() > 0) {
    std::cout << absl::StrFormat(
        "  MFU              %.1f%% of the %s\n", 100 * s.mfu(),
        s.peak_flops_source().empty() ? "ranks' peak" : s.peak_flops_source());
  }
  if (s.energy_joules() > 0) {
    std::cout << absl::StrFormat("  energy           %.0f J (%.4f kWh, estimated)\n",
                                 s.energy_joules(), s.energy_joules() / 3.6e6);
  }
  std::cout << absl::StrFormat("  checkpoints      %d written%s\n", s.checkpoints_written(),
                               s.last_checkpoint().empty() ? "" : ", newest " + s.last_checkpoint());
  if (client != nullptr) {
    loom::v1::ListWorkersResponse workers;
    auto ctx = client->Context();
    if (client->stub->ListWorkers(ctx.get(), {}, &workers).ok()) {
      for (const auto& w : workers.workers()) {
        if (w.alive()) {
          std::cout << "  metrics          http://" << w.metrics_address() << "/metrics ("
                    << w.node() << ")\n";
        }
      }
    }
  }
}

absl::Status FollowJob(Client* client, const std::string& job_id,
                       std::optional<int64_t> after_seq,
                       const std::function<void(const loom::v1::JobEvent&)>& on_event,
                       loom::v1::Job* last_job) {
  const absl::Duration kReconnectFor = absl::Minutes(1);
  absl::Time give_up = absl::Now() + kReconnectFor;
  bool have_job = false;
  for (int attempt = 0;; ++attempt) {
    loom::v1::WatchJobRequest req;
    req.set_job_id(job_id);
    if (after_seq.has_value()) {
      req.set_after_seq(*after_seq);
    } else {
      req.set_include_history(true);
    }
    auto ctx = client->Context(absl::InfiniteDuration());
    auto reader = client->stub->WatchJob(ctx.get(), req);
    loom::v1::JobEvent event;
    while (reader->Read(&event)) {
      give_up = absl::Now() + kReconnectFor;  // it answers: a later loss gets a full minute
      if (event.seq() > 0) {
        if (after_seq.has_value() && event.seq() <= *after_seq) continue;  // (never sent)
        after_seq = event.seq();
      }
      *last_job = event.job();
      have_job = true;
      on_event(event);
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) {
      if (!have_job) return absl::InternalError("watch ended without any event");
      return absl::OkStatus();
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() >= give_up) {
      return client->Check(s);
    }
    // The controller restarts, or a standby takes over: follow the leader
    // the answer named (or the next controller), and resume.
    client->Follow(*ctx, attempt);
    absl::SleepFor(absl::Milliseconds(300));
  }
}

int Watch(Client* client, const std::string& job_id, bool json) {
  const bool tty = isatty(STDOUT_FILENO);
  absl::Time last_print = absl::InfinitePast();
  loom::v1::Job last;
  auto print = [&](const loom::v1::JobEvent& event) {
    if (json) {
      std::string line;
      (void)google::protobuf::util::MessageToJsonString(event, &line);
      std::cout << line << std::endl;
      return;
    }
    if (event.has_transition()) {
      if (tty) std::cout << "\r\033[K";
      const auto& t = event.transition();
      std::cout << absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(t.time_unix_ms()),
                                    absl::LocalTimeZone())
                << "  " << StateName(t.to()) << "  " << t.reason() << std::endl;
    } else if (event.has_step()) {
      const auto& m = event.step();
      int64_t total = event.job().spec().schedule().total_steps();
      double eta = m.step_time_seconds() * static_cast<double>(total - m.step());
      std::string line = absl::StrFormat(
          "%s step %d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s",
          Bar(total > 0 ? static_cast<double>(m.step()) / total : 0, 24), m.step(), total,
          m.loss(), m.has_val_loss() ? absl::StrFormat("  val %.4f", m.val_loss()) : "", m.lr(),
          m.tokens_per_second(), FormatDuration(eta));
      if (tty) {
        std::cout << "\r\033[K" << line << std::flush;
        if (m.has_val_loss()) std::cout << std::endl;
      } else if (m.has_val_loss() || absl::Now() - last_print > absl::Seconds(5) ||
                 m.step() == total) {
        // Logs and pipes get a line now and then, not a redraw per step.
        std::cout << line << std::endl;
        last_print = absl::Now();
      }
    } else if (event.has_recovery()) {
      if (tty) std::cout << "\r\033[K";
      std::cout << KindName(event.recovery().kind()) << ": " << event.recovery().message()
                << std::endl;
    } else if (event.has_checkpoint()) {
      if (tty) std::cout << "\r\033[K";
      if (event.checkpoint().status() == "uploaded") {
        std::cout << "checkpoint step " << event.checkpoint().step() << " uploaded -> "
                  << event.checkpoint().remote_url()
                  << (event.checkpoint().upload_note().empty()
                          ? ""
                          : " (" + event.checkpoint().upload_note() + ")")
                  << std::endl;
      } else {
        std::cout << "checkpoint step " << event.checkpoint().step() << " -> "
                  << event.checkpoint().path() << std::endl;
      }
      for (const loom::v1::PrunedCheckpoint& p : event.checkpoint().pruned()) {
        std::cout << "  pruned step " << p.step() << " (" << p.tier() << "): " << p.reason()
                  << std::endl;
      }
    }
  };
  absl::Status followed = FollowJob(client, job_id, std::nullopt, print, &last);
  if (tty && !json) std::cout << std::endl;
  if (!followed.ok()) return Fail(followed);
  if (!json) PrintSummary(last, client);
  if (last.state() == loom::v1::SUCCEEDED) return 0;
  std::cerr << "loomctl: job " << job_id << " ended " << StateName(last.state()) << ": "
            << last.reason() << std::endl;
  return 1;
}

int CmdWatch(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("watch: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  return Watch(client->get(), args[0], g.json);
}

}  // namespace loom::cli
