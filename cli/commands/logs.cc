// `loomctl logs` (a rank's log, followed across attempts) and `loomctl
// diagnose` (the controller's verdict on a job's step times): the commands
// that explain what a job did (cli/commands/commands.h).
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "controller/progress/diagnosis.h"

namespace loom::cli {
namespace {

bool IsFinished(loom::v1::JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

}  // namespace

// `loomctl logs JOB [--rank R] [--attempt G] [--tail N] [-f]`: a rank's log
// as its worker shipped it to the controller (GetRankLog). Without -f it
// prints what the controller holds and ends; with -f it then follows the
// log, into the rank's next attempt when the job restarts, until the job
// ends and the log is whole.
int CmdLogs(const Globals& g, const std::vector<std::string>& args) {
  std::string job;
  int rank = 0;
  int64_t attempt = -1;
  int tail = -1;
  bool follow = false;
  std::optional<std::string> grep;
  int max_lines = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--grep" && i + 1 < args.size()) {
      grep = args[++i];
      if (grep->empty()) return Usage("--grep: a string to look for");
    } else if (a == "--max" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &max_lines) || max_lines < 1 || max_lines > 10000) {
        return Usage("--max: lines in [1, 10000]");
      }
    } else if (a == "--rank" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &rank) || rank < 0) return Usage("--rank: a rank >= 0");
    } else if (a == "--attempt" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &attempt) || attempt < 0) {
        return Usage("--attempt: an attempt >= 0 (the job's generation; `loomctl events JOB`)");
      }
    } else if (a == "--tail" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &tail) || tail < 0) return Usage("--tail: lines >= 0");
    } else if (a == "-f" || a == "--follow") {
      follow = true;
    } else if (!a.empty() && a[0] == '-') {
      return Usage("logs: unknown flag " + a);
    } else if (job.empty()) {
      job = a;
    } else {
      return Usage("logs: one job at a time");
    }
  }
  if (job.empty()) return Usage("logs: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  if (grep.has_value()) {
    // Every rank and attempt, through the controller's search index.
    if (follow) return Usage("logs: --grep searches what is there; it does not follow (-f)");
    loom::v1::SearchRankLogsRequest req;
    req.set_job_id(job);
    req.set_pattern(*grep);
    req.set_max_lines(max_lines);
    loom::v1::SearchRankLogsResponse found;
    absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::SearchRankLogs, req, &found);
    if (!s.ok()) return Fail(s);
    if (g.json) {
      std::cout << ToJson(found) << std::endl;
      return 0;
    }
    for (const loom::v1::RankLogLine& l : found.lines()) {
      std::cout << "rank " << l.rank() << " attempt " << l.generation()
                << (l.node().empty() ? "" : " on " + l.node()) << " @" << l.offset() << ": "
                << l.text() << "\n";
    }
    std::cout << std::flush;
    if (found.truncated()) {
      std::cerr << "loomctl: more lines match than the " << found.lines_size()
                << " shown; narrow the string, or raise --max (at most 10000)" << std::endl;
    }
    return found.lines_size() > 0 ? 0 : 1;  // as grep: 1 when nothing matched
  }
  auto get = [&](int64_t generation, std::optional<int64_t> offset,
                 loom::v1::GetRankLogResponse* resp) {
    loom::v1::GetRankLogRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    if (generation >= 0) req.set_generation(generation);
    if (offset) {
      req.set_offset(*offset);
    } else {
      req.set_tail_lines(tail);
    }
    resp->Clear();
    return (*client)->Call(&loom::v1::JobService::Stub::GetRankLog, req, resp);
  };
  auto job_finished = [&]() {
    auto j = FetchJob(g, job);
    return !j.ok() || IsFinished(j->state());
  };
  loom::v1::GetRankLogResponse resp;
  if (g.json) {
    // The catalog of logs: which ranks and attempts the controller holds.
    absl::Status s = get(attempt, int64_t{0}, &resp);
    if (!s.ok() && !absl::IsNotFound(s)) return Fail(s);
    loom::v1::GetRankLogResponse listing;
    *listing.mutable_logs() = resp.logs();
    std::cout << ToJson(listing) << std::endl;
    return 0;
  }
  // The first read: the whole log kept, or its last `tail` lines; with -f,
  // wait for a log that has not reached the controller yet.
  bool waited = false;
  while (true) {
    absl::Status s = tail >= 0 ? get(attempt, std::nullopt, &resp) : get(attempt, 0, &resp);
    if (s.ok()) break;
    if (!absl::IsNotFound(s) || !follow || job_finished()) return Fail(s);
    if (!waited) {
      std::cerr << "loomctl: waiting for rank " << rank << "'s log of " << job << " ("
                << s.message() << ")" << std::endl;
      waited = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  int64_t generation = resp.log().generation();
  absl::Time last_progress = absl::Now();
  absl::Time last_job_check = absl::InfinitePast();
  absl::Time finished_seen = absl::InfinitePast();  // when the job was first seen ended
  while (true) {
    std::cout.write(resp.data().data(), static_cast<std::streamsize>(resp.data().size()));
    std::cout.flush();
    if (!resp.data().empty()) last_progress = absl::Now();
    const int64_t next = resp.next_offset();
    const bool more_now = next < resp.log().end();
    if (!more_now && !follow) return 0;
    if (!more_now) {
      // Caught up. A complete log may be followed by the rank's next attempt.
      int64_t newer = -1;
      for (const auto& l : resp.logs()) {
        if (l.rank() == rank && l.generation() > generation &&
            (newer < 0 || l.generation() < newer)) {
          newer = l.generation();
        }
      }
      if (resp.log().complete() && attempt < 0 && newer >= 0) {
        std::cerr << "--- loomctl: rank " << rank << ", attempt " << newer << " ---" << std::endl;
        generation = newer;
        absl::Status s = get(generation, 0, &resp);
        if (!s.ok()) return Fail(s);
        continue;
      }
      // Done: the job ended and the log is whole, or no byte came for 5 s
      // after the job was seen ended (the worker that held the rest is
      // gone). The grace counts from the end of the job, not from the last
      // byte: a worker ships a rank's last lines on its own clock, after
      // the exit that ended the job, and a rank that trained quietly for
      // minutes has still to be waited for.
      if (absl::Now() - last_job_check > absl::Seconds(1)) {
        last_job_check = absl::Now();
        if (finished_seen == absl::InfinitePast() && job_finished()) finished_seen = absl::Now();
        if (finished_seen != absl::InfinitePast() &&
            (resp.log().complete() ||
             absl::Now() - std::max(finished_seen, last_progress) > absl::Seconds(5))) {
          return 0;
        }
        if (resp.log().complete() && attempt >= 0) return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    const int64_t before = next;
    absl::Status s = get(generation, next, &resp);
    if (!s.ok()) return Fail(s);
    if (resp.offset() > before) {
      std::cerr << "--- loomctl: " << resp.offset() - before
                << " bytes dropped by the controller's --log_max_bytes ---" << std::endl;
    }
  }
}

int CmdDiagnose(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("diagnose: expected JOB");
  auto fetched = FetchJob(g, args[0]);
  if (!fetched.ok()) return Fail(fetched.status());
  const loom::v1::Job& job = *fetched;
  if (g.json) {
    std::cout << ToJson(job.diagnosis()) << std::endl;
    return 0;
  }
  // Slow ranks the controller named (SLOW_RANK events), newest first.
  std::vector<const loom::v1::RecoveryEvent*> slow;
  for (const auto& e : job.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::SLOW_RANK) slow.push_back(&e);
  }
  std::reverse(slow.begin(), slow.end());
  auto print_slow = [&] {
    if (slow.empty()) return;
    std::cout << "slow ranks (" << slow.size() << ")\n";
    for (size_t i = 0; i < slow.size() && i < 5; ++i) {
      const loom::v1::RecoveryEvent& e = *slow[i];
      std::cout << "  - attempt " << e.generation() << ", step " << e.step() << ": " << e.message()
                << "\n";
    }
  };
  if (!job.has_diagnosis()) {
    std::cout << job.id() << ": no diagnosis yet (no training step with a time split has "
              << "been reported; state " << StateName(job.state()) << ")" << std::endl;
    print_slow();
    return 0;
  }
  const loom::v1::Diagnosis& d = job.diagnosis();
  std::cout << "job       " << job.id() << " (" << StateName(job.state()) << ")\n"
            << "verdict   " << controller::VerdictName(d.verdict()) << "\n"
            << "summary   " << d.summary() << "\n";
  if (!d.intervention().empty()) std::cout << "do        " << d.intervention() << "\n";
  if (d.evidence_size() > 0) {
    std::cout << "evidence\n";
    for (const auto& e : d.evidence()) std::cout << "  - " << e << "\n";
  }
  std::cout << "as of step " << d.step() << " (" << d.steps_considered() << " steps considered)"
            << std::endl;
  print_slow();
  std::cout << std::flush;
  return 0;
}

}  // namespace loom::cli
