// loomctl: the Loom command-line client.
//
//   loomctl [global flags] COMMAND [args]
// Exit codes: 0 success; 1 the operation failed (one-line reason on stderr);
// 2 usage error. A followed/watched job that ends other than SUCCEEDED
// exits 1.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/cluster_ca.h"
#include "cli/help.h"
#include "cli/report.h"
#include "cli/local_cluster.h"
#include "cli/plan_command.h"
#include "controller/access.h"
#include "controller/diagnosis.h"
#include "controller/job_planning.h"
#include "controller/planner/topology_yaml.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "common/jobspec.h"
#include "common/status_macros.h"
#include "common/tokenizer.h"
#include "google/protobuf/util/json_util.h"
#include "loom/v1/service.grpc.pb.h"
#include "worker/engine/data.h"
#include "worker/engine/prepare_data.h"

namespace loom::cli {
namespace {


struct Globals {
  std::string home;
  std::string controller;
  std::string token_file;
  bool plaintext = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool json = false;
};

// Failure with a one-line reason and exit code 1.
int Fail(const absl::Status& s) {
  std::cerr << "loomctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message()
            << std::endl;
  return 1;
}
int Usage(const std::string& msg) {
  std::cerr << "loomctl: " << msg << "\n(run `loomctl help` or `loomctl COMMAND --help` for usage)"
            << std::endl;
  return 2;
}

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, n);
  return p.substr(0, p.rfind('/'));
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

std::string StateName(loom::v1::JobState s) {
  return s == loom::v1::JOB_STATE_UNSPECIFIED ? "-" : loom::v1::JobState_Name(s);
}

std::string KindName(loom::v1::RecoveryEvent::Kind k) {
  return loom::v1::RecoveryEvent::Kind_Name(k);
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  int64_t s = (absl::ToUnixMillis(absl::Now()) - unix_ms) / 1000;
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

// Prints rows as aligned columns.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const Globals& g) {
    std::string address = g.controller;
    if (address.empty()) {
      auto info = ReadReadyFile(g.home + "/run/controller.json");
      if (!info.ok() || !info->alive) {
        return absl::UnavailableError(absl::StrCat(
            "no controller address: no local cluster is up under ", g.home,
            " (run `loomctl local up`) and --controller was not given"));
      }
      address = info->grpc_address;
    }
    std::string token;
    if (g.tls_cert.empty() || !g.token_file.empty()) {
      auto read = ReadTokenFile(g.token_file.empty() ? g.home + "/token" : g.token_file);
      if (!read.ok()) return read.status();
      token = *read;
    }
    // TLS unless told otherwise; the local cluster's CA when there is one.
    std::string ca = g.tls_ca;
    if (ca.empty() && access((g.home + "/tls/ca.pem").c_str(), R_OK) == 0) {
      ca = g.home + "/tls/ca.pem";
    }
    auto creds = MakeChannelCredentials(!g.plaintext, ca, g.tls_cert, g.tls_key);
    if (!creds.ok()) return creds.status();
    auto c = std::make_unique<Client>();
    c->address = address;
    c->token = token;
    c->stub = loom::v1::JobService::NewStub(grpc::CreateChannel(address, *creds));
    return c;
  }
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    AttachToken(ctx.get(), token);
    if (timeout != absl::InfiniteDuration()) {
      ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    }
    return ctx;
  }
  // One unary call with a fresh context (token, 10 s deadline).
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (loom::v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                       const Request&, Response*),
                    const Request& request, Response* response) {
    auto ctx = Context();
    return Check(((*stub).*method)(ctx.get(), request, response));
  }
  absl::Status Check(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat("controller at ", address, " is unreachable: ", s.error_message()));
    }
    return FromGrpcStatus(s);
  }
  std::string address;
  std::string token;
  std::unique_ptr<loom::v1::JobService::Stub> stub;
};

// ------------------------------------------------------------------ watching

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
    std::cout << absl::StrFormat("  MFU              %.1f%% of the ranks' calibrated GEMM peak\n",
                                 100 * s.mfu());
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

int Watch(Client* client, const std::string& job_id, bool json) {
  bool tty = isatty(STDOUT_FILENO);
  for (int attempt = 0;; ++attempt) {
    loom::v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_include_history(true);
    auto ctx = client->Context(absl::InfiniteDuration());
    auto reader = client->stub->WatchJob(ctx.get(), req);
    loom::v1::JobEvent event;
    loom::v1::Job last;
    bool have_job = false;
    absl::Time last_print = absl::InfinitePast();
    int64_t printed_step = -1;
    while (reader->Read(&event)) {
      last = event.job();
      have_job = true;
      if (json) {
        std::string line;
        (void)google::protobuf::util::MessageToJsonString(event, &line);
        std::cout << line << std::endl;
        continue;
      }
      if (event.has_transition()) {
        if (tty) std::cout << "\r\033[K";
        const auto& t = event.transition();
        std::cout << absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(t.time_unix_ms()),
                                      absl::LocalTimeZone())
                  << "  " << StateName(t.to()) << "  " << t.reason() << std::endl;
      } else if (event.has_step()) {
        const auto& m = event.step();
        int64_t total = last.spec().schedule().total_steps();
        double eta = m.step_time_seconds() * static_cast<double>(total - m.step());
        std::string line = absl::StrFormat(
            "%s step %d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s",
            Bar(total > 0 ? static_cast<double>(m.step()) / total : 0, 24), m.step(), total,
            m.loss(), m.has_val_loss() ? absl::StrFormat("  val %.4f", m.val_loss()) : "",
            m.lr(), m.tokens_per_second(), FormatDuration(eta));
        if (tty) {
          std::cout << "\r\033[K" << line << std::flush;
          if (m.has_val_loss()) std::cout << std::endl;
        } else if (m.has_val_loss() || absl::Now() - last_print > absl::Seconds(5) ||
                   m.step() == total) {
          // Logs and pipes get a line now and then, not a redraw per step.
          std::cout << line << std::endl;
          last_print = absl::Now();
        }
        printed_step = m.step();
      } else if (event.has_recovery()) {
        if (tty) std::cout << "\r\033[K";
        std::cout << KindName(event.recovery().kind()) << ": " << event.recovery().message()
                  << std::endl;
      } else if (event.has_checkpoint()) {
        if (tty) std::cout << "\r\033[K";
        std::cout << "checkpoint step " << event.checkpoint().step() << " -> "
                  << event.checkpoint().path() << std::endl;
      }
    }
    (void)printed_step;
    grpc::Status s = reader->Finish();
    if (tty && !json) std::cout << std::endl;
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && attempt < 30) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;  // controller restarting: reconnect
      }
      return Fail(client->Check(s));
    }
    if (!have_job) return Fail(absl::InternalError("watch ended without any event"));
    if (!json) PrintSummary(last, client);
    if (last.state() == loom::v1::SUCCEEDED) return 0;
    std::cerr << "loomctl: job " << job_id << " ended " << StateName(last.state()) << ": "
              << last.reason() << std::endl;
    return 1;
  }
}

// ------------------------------------------------------------------ commands

int CmdSubmit(const Globals& g, const std::vector<std::string>& args) {
  std::string file;
  bool follow = false;
  for (const auto& a : args) {
    if (a == "--follow" || a == "-f") {
      follow = true;
    } else if (!a.empty() && a[0] == '-') {
      return Usage("submit: unknown flag " + a);
    } else if (file.empty()) {
      file = a;
    } else {
      return Usage("submit: one spec file at a time");
    }
  }
  if (file.empty()) return Usage("submit: missing FILE");
  auto spec = LoadJobSpecFile(file);
  if (!spec.ok()) return Fail(spec.status());
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = *spec;
  loom::v1::SubmitJobResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::SubmitJob, req, &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp.job()) << std::endl;
  } else {
    std::cout << "submitted " << resp.job().id() << std::endl;
  }
  if (follow) return Watch(client->get(), resp.job().id(), g.json);
  return 0;
}

int CmdValidate(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("validate: expected FILE");
  auto spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return Fail(spec.status());
  ApplyJobSpecDefaults(&*spec);
  absl::Status s = ValidateJobSpec(*spec);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(*spec) << std::endl;
  } else {
    std::cout << args[0] << ": valid" << std::endl;
  }
  return 0;
}

int CmdList(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::ListJobsRequest req;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--state" && i + 1 < args.size()) {
      loom::v1::JobState st;
      if (!loom::v1::JobState_Parse(args[++i], &st)) return Usage("list: unknown state " + args[i]);
      req.add_states(st);
    } else {
      return Usage("list: unexpected " + args[i]);
    }
  }
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  // Page by page (summaries), so a long history never meets gRPC's 4 MiB.
  loom::v1::ListJobsResponse resp;
  req.set_page_size(500);
  do {
    loom::v1::ListJobsResponse page;
    absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListJobs, req, &page);
    if (!s.ok()) return Fail(s);
    for (auto& j : *page.mutable_jobs()) *resp.add_jobs() = std::move(j);
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATE", "STEP", "LOSS", "VAL LOSS", "RANKS", "AGE", "BY", "REASON"}};
  for (const auto& j : resp.jobs()) {
    const auto& sum = j.summary();
    rows.push_back({j.id(), StateName(j.state()),
                    absl::StrCat(sum.last_step(), "/", j.spec().schedule().total_steps()),
                    sum.last_step() > 0 ? absl::StrFormat("%.4f", sum.last_loss()) : "-",
                    sum.has_val_loss() ? absl::StrFormat("%.4f", sum.last_val_loss()) : "-",
                    absl::StrCat(j.spec().resources().ranks()), Ago(j.created_unix_ms()),
                    j.submitted_by().empty() ? "-" : j.submitted_by(), j.reason().substr(0, 60)});
  }
  PrintTable(rows);
  return 0;
}

// Connects and reads one job.
absl::StatusOr<loom::v1::Job> FetchJob(const Globals& g, const std::string& job_id) {
  auto client = Client::Connect(g);
  if (!client.ok()) return client.status();
  loom::v1::GetJobRequest req;
  req.set_job_id(job_id);
  loom::v1::Job job;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::GetJob, req, &job);
  if (!s.ok()) return s;
  return job;
}

int CmdStatus(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("status: expected JOB");
  auto fetched = FetchJob(g, args[0]);
  if (!fetched.ok()) return Fail(fetched.status());
  const loom::v1::Job& job = *fetched;
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
    return 0;
  }
  std::cout << "job      " << job.id() << "\nstate    " << StateName(job.state())
            << "\nreason   " << job.reason() << "\nby       "
            << (job.submitted_by().empty() ? "(not recorded)" : job.submitted_by()) << "\n";
  if (job.spec().has_init_from()) {
    const loom::v1::InitFrom& from = job.spec().init_from();
    std::cout << "from     "
              << (from.job().empty() ? std::string()
                                     : absl::StrCat(from.job(), " step ", from.step(), ": "))
              << from.path() << (from.optimizer() ? " (weights and optimizer state)" : " (weights)")
              << "\n";
  }
  const auto& par = job.spec().parallelism();
  const bool layered = par.tensor() > 1 || par.pipeline() > 1;
  if (job.ranks_size() > 0 && !layered) {
    std::cout << "ranks   ";
    for (const auto& r : job.ranks()) std::cout << " " << r.rank() << "@" << r.node();
    std::cout << "\n";
  } else if (job.ranks_size() > 0) {
    // Tensor / pipeline layouts: where each rank sits (issue 11).
    std::cout << "layout   data " << par.data() << " x pipeline " << par.pipeline()
              << " x tensor " << par.tensor() << ", ZeRO-" << par.zero_stage()
              << "\nplacement\n";
    // The scheduler's placement (controller/scheduler.h): each TP group on
    // one worker, workers in rack order; RACK shows when workers carry labels.
    bool racks = false;
    for (const auto& r : job.ranks()) racks = racks || !r.rack().empty();
    std::vector<std::vector<std::string>> placement = {
        {"  RANK", "NODE", "WORKER", "DP", "PP (stage)", "TP"}};
    if (racks) placement[0].insert(placement[0].begin() + 1, "RACK");
    for (const auto& r : job.ranks()) {
      std::vector<std::string> row = {absl::StrCat("  ", r.rank()), r.node(), r.worker_id(),
                                      absl::StrCat(r.dp()), absl::StrCat(r.pp()),
                                      absl::StrCat(r.tp())};
      if (racks) row.insert(row.begin() + 1, r.rack().empty() ? "-" : r.rack());
      placement.push_back(std::move(row));
    }
    PrintTable(placement);
  }
  if (job.has_plan()) {
    std::cout << "\nplan\n" << controller::FormatJobPlan(job.plan());
  }
  std::cout << "\nhistory\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : job.history()) {
    rows.push_back({"  " + absl::FormatTime("%Y-%m-%d %H:%M:%S",
                                            absl::FromUnixMillis(t.time_unix_ms()),
                                            absl::LocalTimeZone()),
                    StateName(t.from()) + " -> " + StateName(t.to()), t.reason()});
  }
  PrintTable(rows);
  PrintSummary(job, nullptr);
  return 0;
}

// `loomctl ca issue server|worker|user NAME [--host H]... [--dir DIR]`: the
// cluster CA (cli/cluster_ca.h), made on first use, issues a certificate:
// the controller's (server; --host names every address clients dial), a
// worker's (common name worker:NAME) or a user's (user:NAME).
int CmdCa(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() < 3 || args[0] != "issue") {
    return Usage("ca: expected issue server|worker|user NAME [--host H]... [--dir DIR]");
  }
  const std::string kind = args[1];
  const std::string name = args[2];
  std::string dir = g.home + "/tls";
  std::vector<std::string> hosts;
  for (size_t i = 3; i < args.size(); ++i) {
    if (args[i] == "--dir" && i + 1 < args.size()) {
      dir = args[++i];
    } else if (args[i] == "--host" && i + 1 < args.size() && kind == "server") {
      hosts.push_back(args[++i]);
    } else {
      return Usage("ca issue: unexpected argument " + args[i]);
    }
  }
  std::string cn, stem;
  if (kind == "server") {
    if (hosts.empty()) return Usage("ca issue server: give every address clients dial (--host)");
    cn = name;
    stem = name;
  } else if (kind == "worker" || kind == "user") {
    cn = kind + ":" + name;
    stem = kind + "-" + name;
  } else {
    return Usage("ca issue: expected server, worker or user, got " + kind);
  }
  if (absl::Status s = EnsureClusterCa(dir); !s.ok()) return Fail(s);
  auto issued = IssueCertificate(dir, stem, cn, kind == "server", hosts);
  if (!issued.ok()) return Fail(issued.status());
  std::cout << "CA " << dir << "/ca.pem\ncertificate " << issued->cert_path << " (" << cn
            << ")\nkey " << issued->key_path << "\n";
  return 0;
}

// `loomctl users add|remove|list`: edits the controller's users file
// (controller/access.h), which it re-reads on change. Run where that file
// is (the controller's host, or the Secret's source).
int CmdUsers(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("users: expected add, remove or list");
  const std::string verb = args[0];
  std::string path = g.home + "/users";
  std::string name;
  std::string role_text = "user";
  std::string token_out;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--users-file" && i + 1 < args.size()) {
      path = args[++i];
    } else if (args[i] == "--role" && i + 1 < args.size() && verb == "add") {
      role_text = args[++i];
    } else if (args[i] == "--token-out" && i + 1 < args.size() && verb == "add") {
      token_out = args[++i];
    } else if (name.empty() && verb != "list" && args[i].rfind("-", 0) != 0) {
      name = args[i];
    } else {
      return Usage("users: unexpected argument " + args[i]);
    }
  }
  if (verb != "add" && verb != "remove" && verb != "list") {
    return Usage("users: expected add, remove or list, got " + verb);
  }
  if (verb != "list" && name.empty()) return Usage("users " + verb + ": expected NAME");
  std::string text;
  if (access(path.c_str(), F_OK) == 0) {
    auto read = ReadFile(path);
    if (!read.ok()) return Fail(read.status());
    text = *read;
  } else if (verb != "add") {
    return Fail(absl::NotFoundError(absl::StrCat("users file ", path, " does not exist")));
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  auto first_field = [](const std::string& line) {
    std::vector<std::string> f = absl::StrSplit(line.substr(0, line.find('#')), ' ',
                                                absl::SkipWhitespace());
    return f.empty() ? std::string() : std::string(absl::StripAsciiWhitespace(f[0]));
  };
  if (verb == "list") {
    auto parsed = controller::Credentials::Parse(text, path, "");
    if (!parsed.ok()) return Fail(parsed.status());
    std::vector<std::vector<std::string>> rows = {{"NAME", "ROLE", "PROVES WITH"}};
    for (const std::string& line : lines) {
      std::vector<std::string> f = absl::StrSplit(line.substr(0, line.find('#')),
                                                  absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (f.size() < 2) continue;
      rows.push_back({f[0], f[1], f.size() == 3 ? "token or certificate" : "certificate"});
    }
    PrintTable(rows);
    return 0;
  }
  std::string token;
  if (verb == "add") {
    auto role = controller::ParseUserRole(role_text);
    if (!role.ok()) return Usage("users add: --role: " + std::string(role.status().message()));
    auto generated = GenerateToken();
    if (!generated.ok()) return Fail(generated.status());
    token = *generated;
    std::string line = controller::UsersFileLine(name, *role, token);
    line.pop_back();
    lines.push_back(line);
  } else {
    size_t before = lines.size();
    lines.erase(std::remove_if(lines.begin(), lines.end(),
                               [&](const std::string& l) { return first_field(l) == name; }),
                lines.end());
    if (lines.size() == before) {
      return Fail(absl::NotFoundError(absl::StrCat("no user '", name, "' in ", path)));
    }
  }
  std::string updated = absl::StrJoin(lines, "\n") + "\n";
  // The controller refuses a file that does not parse: so does this.
  auto parsed = controller::Credentials::Parse(updated, path, "");
  if (!parsed.ok()) return Fail(parsed.status());
  if (absl::Status w = WritePrivateFile(path, updated); !w.ok()) return Fail(w);
  if (verb == "remove") {
    std::cout << "removed user " << name << " from " << path
              << " (the controller stops accepting their token and certificate within a "
                 "second)\n";
    return 0;
  }
  if (!token_out.empty()) {
    if (absl::Status w = WritePrivateFile(token_out, token + "\n"); !w.ok()) return Fail(w);
    std::cout << "added user " << name << " (" << role_text << ") to " << path << "; token in "
              << token_out << "\n";
  } else {
    std::cout << "added user " << name << " (" << role_text << ") to " << path
              << "; their token (shown once, stored only hashed):\n"
              << token << "\n";
  }
  return 0;
}

int CmdWatch(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("watch: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  return Watch(client->get(), args[0], g.json);
}

int CmdCancel(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::CancelJobRequest req;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--reason" && i + 1 < args.size()) {
      req.set_reason(args[++i]);
    } else if (req.job_id().empty()) {
      req.set_job_id(args[i]);
    } else {
      return Usage("cancel: unexpected " + args[i]);
    }
  }
  if (req.job_id().empty()) return Usage("cancel: expected JOB");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::Job job;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::CancelJob, req, &job);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
  } else {
    std::cout << job.id() << " " << StateName(job.state()) << std::endl;
  }
  return 0;
}

int CmdEvents(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("events: expected JOB");
  auto fetched = FetchJob(g, args[0]);
  if (!fetched.ok()) return Fail(fetched.status());
  const loom::v1::Job& job = *fetched;
  if (g.json) {
    loom::v1::Job only;
    *only.mutable_events() = job.events();
    std::cout << ToJson(only) << std::endl;
    return 0;
  }
  if (job.events_size() == 0) {
    std::cout << "no recovery events for " << job.id() << " (restarts " << job.restarts()
              << ", rollbacks " << job.rollbacks() << ")" << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"TIME", "KIND", "CAUSE", "STEP", "LOST", "DETAIL"}};
  for (const auto& e : job.events()) {
    bool resumed = e.kind() == loom::v1::RecoveryEvent::ROLLBACK ||
                   e.kind() == loom::v1::RecoveryEvent::RESTART;
    rows.push_back({absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(e.time_unix_ms()),
                                     absl::LocalTimeZone()),
                    KindName(e.kind()), e.cause().empty() ? "-" : e.cause(),
                    e.step() > 0 ? absl::StrCat(e.step()) : "-",
                    resumed ? absl::StrCat(e.steps_lost()) : "-", e.message()});
  }
  PrintTable(rows);
  std::cout << "\nrestarts " << job.restarts() << ", rollbacks " << job.rollbacks()
            << ", operator rollbacks " << job.operator_rollbacks() << ", attempt "
            << job.generation() << std::endl;
  return 0;
}

bool IsFinished(loom::v1::JobState s) {
  return s == loom::v1::SUCCEEDED || s == loom::v1::FAILED || s == loom::v1::CANCELLED;
}

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
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--rank" && i + 1 < args.size()) {
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
  if (!job.has_diagnosis()) {
    std::cout << job.id() << ": no diagnosis yet (no training step with a time split has "
              << "been reported; state " << StateName(job.state()) << ")" << std::endl;
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
  return 0;
}

// `loomctl checkpoints JOB [--verify]`. Exit 0; with --verify, 1 when a
// checkpoint on disk failed its checks (so scripts can act on it).
int CmdCheckpoints(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  bool verify = false;
  for (const std::string& a : args) {
    if (a == "--verify") {
      verify = true;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("checkpoints: unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 1) return Usage("checkpoints: expected JOB [--verify]");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::ListCheckpointsRequest req;
  req.set_job_id(positional[0]);
  req.set_verify(verify);
  loom::v1::ListCheckpointsResponse resp;
  // Verifying reads every byte of every checkpoint: allow it time.
  auto ctx = (*client)->Context(verify ? absl::Minutes(30) : absl::Seconds(10));
  absl::Status s = (*client)->Check((*client)->stub->ListCheckpoints(ctx.get(), req, &resp));
  if (!s.ok()) return Fail(s);
  int corrupt = 0;
  for (const auto& c : resp.checkpoints()) corrupt += c.status() == "corrupt" ? 1 : 0;
  const int rc = verify && corrupt > 0 ? 1 : 0;
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return rc;
  }
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "ATTEMPT", "TIME", "SIZE", "WRITE S", "STALL S", "STATUS", "PATH"}};
  for (const auto& c : resp.checkpoints()) {
    rows.push_back({absl::StrCat(c.step()), absl::StrCat(c.generation()),
                    absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(c.time_unix_ms()),
                                     absl::LocalTimeZone()),
                    absl::StrFormat("%.1f MB", c.bytes() / 1e6),
                    c.write_seconds() > 0 ? absl::StrFormat("%.3f", c.write_seconds()) : "-",
                    c.stall_seconds() > 0 ? absl::StrFormat("%.3f", c.stall_seconds()) : "-",
                    c.status(), c.path()});
  }
  PrintTable(rows);
  for (const auto& c : resp.checkpoints()) {
    if (c.status() != "corrupt") continue;
    std::cout << "step " << c.step() << ": " << c.corrupt_file() << " failed its "
              << c.failed_check() << " check: " << c.error() << "\n";
  }
  if (verify) {
    std::cout << "verified: " << corrupt << " of " << resp.checkpoints_size()
              << " catalogued checkpoint(s) corrupt" << std::endl;
  }
  return rc;
}

// `loomctl plan SPEC` without --topology: the controller plans on the live
// cluster (its registered workers) through the Plan RPC.
int PlanOnController(const Globals& g, const loom::v1::JobSpec& spec, const PlanCommandOptions& o,
                     bool executable_only) {
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::PlanRequest req;
  *req.mutable_spec() = spec;
  req.set_top_k(o.top_k);
  req.set_executable_only(executable_only);
  loom::v1::PlanResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::Plan, req, &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    resp.clear_report();  // the structured fields say it all
    std::cout << ToJson(resp) << std::endl;
  } else {
    std::cout << resp.report();
  }
  return 0;
}

int CmdPlan(const Globals& g, const std::vector<std::string>& args) {
  std::string spec_path, topology_path;
  PlanCommandOptions o;
  o.json = g.json;
  bool executable_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--executable-only") {
      executable_only = true;
    } else if ((args[i] == "--topology" || args[i] == "--cluster") && i + 1 < args.size()) {
      // --cluster FILE: the cluster described by a topology file (issue 3's
      // spelling); without either flag the live cluster is asked.
      topology_path = args[++i];
    } else if (args[i] == "--top" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &o.top_k) || o.top_k < 1) return Usage("--top: expected >= 1");
    } else if (args[i] == "--tokens" && i + 1 < args.size()) {
      if (!absl::SimpleAtod(args[++i], &o.token_budget) || o.token_budget < 0) {
        return Usage("--tokens: expected a token count");
      }
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("plan: unknown flag " + args[i]);
    } else if (spec_path.empty()) {
      spec_path = args[i];
    } else {
      return Usage("plan: one spec at a time");
    }
  }
  if (spec_path.empty()) return Usage("plan: expected SPEC [--topology TOPOLOGY.yaml]");
  auto spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) return Fail(spec.status());
  if (topology_path.empty()) {
    if (o.token_budget > 0) return Usage("plan: --tokens needs --topology (offline planning)");
    return PlanOnController(g, *spec, o, executable_only);
  }
  if (executable_only) return Usage("plan: --executable-only applies to the live cluster only");
  const auto& par = spec->parallelism();
  o.evaluate_spec_layout =
      !par.auto_() && (par.data() > 0 || par.tensor() > 0 || par.pipeline() > 0);
  ApplyJobSpecDefaults(&*spec);
  // As the Plan RPC does: malformed values are errors with their field path,
  // but planning what the engine cannot run yet (UNIMPLEMENTED at submit:
  // ZeRO-3, sequence parallelism, interleaving, Llama-style models) is the
  // point of planning.
  if (absl::Status valid = ValidateJobSpec(*spec);
      !valid.ok() && valid.code() != absl::StatusCode::kUnimplemented) {
    return Fail(valid);
  }
  auto topology = planner::LoadTopologyFile(topology_path);
  if (!topology.ok()) {
    return Fail(absl::Status(topology.status().code(),
                             absl::StrCat(topology_path, ": ", topology.status().message())));
  }
  auto report = RunPlan(*spec, *topology, o);
  if (!report.ok()) return Fail(report.status());
  std::cout << *report;
  return 0;
}

// "A:B" -> [A, B).
bool ParseSkipRange(const std::string& text, loom::v1::SkipRange* range) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  int64_t begin = 0, end = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &begin) ||
      !absl::SimpleAtoi(parts[1], &end)) {
    return false;
  }
  range->set_begin(begin);
  range->set_end(end);
  return true;
}

int CmdRollback(const Globals& g, const std::vector<std::string>& args) {
  loom::v1::RollbackJobRequest req;
  bool have_step = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--to-step" && i + 1 < args.size()) {
      int64_t step = 0;
      if (!absl::SimpleAtoi(args[++i], &step)) return Usage("--to-step: expected a step number");
      req.set_to_step(step);
      have_step = true;
    } else if (args[i] == "--skip" && i + 1 < args.size()) {
      if (!ParseSkipRange(args[++i], req.add_skip())) {
        return Usage("--skip: expected BEGIN:END data batch indices (half-open), e.g. 1200:1500");
      }
    } else if (args[i] == "--reason" && i + 1 < args.size()) {
      req.set_reason(args[++i]);
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("rollback: unknown flag " + args[i]);
    } else if (req.job_id().empty()) {
      req.set_job_id(args[i]);
    } else {
      return Usage("rollback: unexpected " + args[i]);
    }
  }
  if (req.job_id().empty() || !have_step) {
    return Usage("rollback: expected JOB --to-step S [--skip A:B]... [--reason TEXT]");
  }
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::Job job;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::RollbackJob, req, &job);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(job) << std::endl;
  } else if (job.events_size() > 0) {
    std::cout << job.id() << " " << StateName(job.state()) << ": "
              << job.events(job.events_size() - 1).message() << std::endl;
  }
  return 0;
}

int CmdWorkers(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("workers: takes no arguments");
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::ListWorkersResponse resp;
  absl::Status s = (*client)->Call(&loom::v1::JobService::Stub::ListWorkers, loom::v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return Fail(s);
  if (g.json) {
    std::cout << ToJson(resp) << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NODE", "ZONE", "RACK", "ALIVE", "SLOTS", "CPUS", "GPUS", "MEMORY", "GEMM/THREAD",
       "HEARTBEAT", "METRICS"}};
  for (const auto& w : resp.workers()) {
    rows.push_back({w.id(), w.node(), w.zone().empty() ? "-" : w.zone(),
                    w.rack().empty() ? "-" : w.rack(), w.alive() ? "yes" : "no",
                    absl::StrCat(w.slots_used(), "/", w.slots()), absl::StrCat(w.cpus()),
                    absl::StrCat(w.gpus()), absl::StrFormat("%.1f GiB", w.memory_bytes() / 1073741824.0),
                    w.gemm_flops_per_second_per_thread() > 0
                        ? absl::StrFormat("%.1f GFLOP/s", w.gemm_flops_per_second_per_thread() / 1e9)
                        : "-",
                    Ago(w.last_heartbeat_unix_ms()) + " ago", w.metrics_address()});
  }
  PrintTable(rows);
  return 0;
}

int CmdDataPrepare(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> inputs;
  std::string out;
  std::string tokenizer = "byte";
  int vocab_size = 4096;
  double val_fraction = 0.1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--val-fraction" && i + 1 < args.size()) {
      if (!absl::SimpleAtod(args[++i], &val_fraction)) {
        return Usage("--val-fraction: not a number: " + args[i]);
      }
    } else if (args[i] == "--tokenizer" && i + 1 < args.size()) {
      tokenizer = args[++i];
      if (tokenizer != "byte" && tokenizer != "bpe") {
        return Usage("--tokenizer: expected byte or bpe, got " + tokenizer);
      }
    } else if (args[i] == "--vocab-size" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &vocab_size)) {
        return Usage("--vocab-size: not a number: " + args[i]);
      }
    } else if (args[i] == "--input") {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) inputs.push_back(args[++i]);
    } else {
      return Usage("data prepare: unexpected " + args[i]);
    }
  }
  if (inputs.empty()) return Usage("data prepare: --input FILE... is required");
  if (out.empty()) return Usage("data prepare: --out DIR is required");
  absl::Status made = MakeDirs(out);
  if (!made.ok()) return Fail(made);
  absl::StatusOr<engine::PrepareResult> r;
  std::string model_line;
  if (tokenizer == "byte") {
    vocab_size = 256;
    r = engine::PrepareByteLevelData(inputs, out, val_fraction);
    // A BPE model from an earlier run no longer describes these shards.
    std::remove((out + "/tokenizer.model").c_str());
    std::remove((out + "/tokenizer.vocab").c_str());
  } else {
    // SentencePiece BPE trained on the train split (common/tokenizer.h),
    // written beside the shards as tokenizer.model.
    const std::string train_text = out + "/.tokenizer-train.txt";
    std::unique_ptr<Tokenizer> bpe;
    r = engine::PrepareEncodedData(
        inputs, out, val_fraction, vocab_size, train_text,
        [&](const std::string& text) -> absl::Status {
          absl::Status trained = TrainBpeTokenizer(text, out + "/tokenizer", vocab_size);
          std::remove(text.c_str());
          if (!trained.ok()) return trained;
          absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
              LoadBpeTokenizer(out + "/tokenizer.model");
          if (!loaded.ok()) return loaded.status();
          bpe = std::move(*loaded);
          return absl::OkStatus();
        },
        [&](std::string_view line) { return bpe->Encode(absl::string_view(line.data(), line.size())); });
    model_line = ", \"model\": \"tokenizer.model\"";
  }
  if (!r.ok()) return Fail(r.status());
  double bits = r->unigram_entropy_nats / std::log(2.0);
  std::string meta = absl::StrFormat(
      "{\"tokenizer\": \"%s\", \"vocab_size\": %d%s, \"train_tokens\": %d, "
      "\"val_tokens\": %d, \"unigram_entropy_nats\": %.6f}\n",
      tokenizer, vocab_size, model_line, r->train_tokens, r->val_tokens, r->unigram_entropy_nats);
  if (absl::Status s = WriteFileAtomically(out + "/meta.json", meta); !s.ok()) return Fail(s);
  if (g.json) {
    std::cout << meta;
  } else {
    std::cout << absl::StrFormat(
        "wrote %d train shard(s) (%d tokens) and %d validation shard(s) (%d tokens) to %s\n"
        "tokenizer: %s, vocabulary %d%s (set model.*.vocab_size >= %d)\n"
        "unigram entropy of the train split: %.4f nats/token (%.3f bits)\n",
        r->train_shards.size(), r->train_tokens, r->val_shards.size(), r->val_tokens, out,
        tokenizer == "bpe" ? "SentencePiece BPE" : "byte-level", vocab_size,
        tokenizer == "bpe" ? ", model " + out + "/tokenizer.model" : "", vocab_size,
        r->unigram_entropy_nats, bits);
  }
  return 0;
}

int CmdLocal(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("local: expected up, down, restart or status");
  const std::string& sub = args[0];
  if (sub == "up") {
    LocalClusterOptions o;
    o.home = g.home;
    o.bin_dir = SelfDir();
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--workers" && i + 1 < args.size()) {
        if (!absl::SimpleAtoi(args[++i], &o.workers)) return Usage("--workers: not a number");
      } else if (args[i] == "--slots" && i + 1 < args.size()) {
        if (!absl::SimpleAtoi(args[++i], &o.slots_per_worker)) return Usage("--slots: not a number");
      } else if (args[i] == "--memory" && i + 1 < args.size()) {
        double gib = 0;
        if (!absl::SimpleAtod(args[++i], &gib) || !(gib > 0)) {
          return Usage("--memory: GiB per worker, > 0");
        }
        o.memory_bytes_per_worker = static_cast<uint64_t>(gib * (uint64_t{1} << 30));
      } else if (args[i] == "--gpus" && i + 1 < args.size()) {
        o.gpus_per_worker = args[++i];
        int count = 0;
        if (o.gpus_per_worker != "auto" &&
            (!absl::SimpleAtoi(o.gpus_per_worker, &count) || count < 0)) {
          return Usage("--gpus: a count or auto");
        }
      } else if (args[i] == "--worker-timeout" && i + 1 < args.size()) {
        if (!absl::SimpleAtod(args[++i], &o.worker_timeout_s)) {
          return Usage("--worker-timeout: not a number");
        }
      } else if (args[i] == "--data-root" && i + 1 < args.size()) {
        std::error_code ec;
        o.data_roots.push_back(std::filesystem::absolute(args[++i], ec).string());
      } else {
        return Usage("local up: unexpected " + args[i]);
      }
    }
    auto daemons = LocalUp(o);
    if (!daemons.ok()) return Fail(daemons.status());
    // Wait until every worker has registered, so a submit right after runs.
    auto client = Client::Connect(g);
    if (!client.ok()) return Fail(client.status());
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    int alive = 0;
    while (absl::Now() < deadline) {
      loom::v1::ListWorkersResponse resp;
      auto ctx = (*client)->Context();
      alive = 0;
      if ((*client)->stub->ListWorkers(ctx.get(), {}, &resp).ok()) {
        for (const auto& w : resp.workers()) alive += w.alive() ? 1 : 0;
      }
      if (alive >= o.workers) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (alive < o.workers) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          alive, " of ", o.workers, " workers registered; see ", g.home, "/logs")));
    }
    for (const auto& d : *daemons) {
      std::cout << absl::StrFormat("%-12s pid %-7d %s%s\n", d.name, d.pid,
                                   d.grpc_address.empty() ? "" : "grpc " + d.grpc_address + "  ",
                                   "metrics http://" + d.metrics_address + "/metrics");
    }
    std::cout << "local cluster up: state in " << g.home << ", token in " << g.home << "/token"
              << std::endl;
    return 0;
  }
  if (sub == "restart") {
    // loomctl local restart controller|worker-<i> [--kill]
    if (args.size() < 2) return Usage("local restart: expected controller or worker-<i>");
    bool kill_first = false;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--kill") {
        kill_first = true;
      } else {
        return Usage("local restart: unexpected " + args[i]);
      }
    }
    auto d = LocalRestart(g.home, args[1], kill_first);
    if (!d.ok()) return Fail(d.status());
    std::cout << absl::StrFormat("%-12s pid %-7d %s%s\n", d->name, d->pid,
                                 d->grpc_address.empty() ? "" : "grpc " + d->grpc_address + "  ",
                                 "metrics http://" + d->metrics_address + "/metrics");
    std::cout << "restarted " << d->name << std::endl;
    return 0;
  }
  if (sub == "down") {
    absl::Status s = LocalDown(g.home);
    if (!s.ok()) return Fail(s);
    std::cout << "local cluster down" << std::endl;
    return 0;
  }
  if (sub == "status") {
    auto daemons = LocalStatus(g.home);
    if (daemons.empty()) {
      std::cout << "no local cluster under " << g.home << std::endl;
      return 1;
    }
    std::vector<std::vector<std::string>> rows = {{"DAEMON", "PID", "ALIVE", "GRPC", "METRICS"}};
    bool all = true;
    for (const auto& d : daemons) {
      all &= d.alive;
      rows.push_back({d.name, absl::StrCat(d.pid), d.alive ? "yes" : "no",
                      d.grpc_address.empty() ? "-" : d.grpc_address, d.metrics_address});
    }
    PrintTable(rows);
    return all ? 0 : 1;
  }
  return Usage("local: unknown subcommand " + sub);
}

// A job's committed checkpoint (step S, or the newest when S < 0) and its
// data directory (where `data prepare` put the tokenizer), from the
// controller.
struct JobCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string data_dir;
};
absl::StatusOr<JobCheckpoint> ResolveCheckpoint(const Globals& g, const std::string& job,
                                                int64_t step) {
  absl::StatusOr<loom::v1::Job> got = FetchJob(g, job);
  if (!got.ok()) return got.status();
  if (got->spec().data().train_size() == 0) {
    return absl::FailedPreconditionError("the job's spec names no training data");
  }
  JobCheckpoint out;
  out.data_dir = std::filesystem::path(got->spec().data().train(0)).parent_path().string();
  auto client = Client::Connect(g);
  if (!client.ok()) return client.status();
  loom::v1::ListCheckpointsRequest list;
  list.set_job_id(job);
  loom::v1::ListCheckpointsResponse listed;
  RETURN_IF_ERROR((*client)->Call(&loom::v1::JobService::Stub::ListCheckpoints, list, &listed));
  const loom::v1::CheckpointInfo* chosen = nullptr;
  std::vector<std::string> committed;
  for (const auto& c : listed.checkpoints()) {
    if (c.status() != "committed") continue;
    committed.push_back(absl::StrCat(c.step()));
    if (step >= 0 ? c.step() == step : (chosen == nullptr || c.step() > chosen->step())) {
      chosen = &c;
    }
  }
  if (chosen == nullptr) {
    return absl::NotFoundError(
        committed.empty()
            ? absl::StrCat("job ", job, " has no committed checkpoint yet")
            : absl::StrCat("job ", job, " has no committed checkpoint at step ", step,
                           "; committed: ", absl::StrJoin(committed, ", ")));
  }
  out.step = chosen->step();
  out.path = chosen->path();
  return out;
}

// Replaces loomctl with loom-ckpt (built beside it) running `args`.
int ExecCheckpointTool(std::vector<std::string> args) {
  args.insert(args.begin(), SelfDir() + "/loom-ckpt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  return Fail(absl::FailedPreconditionError(absl::StrCat(
      "cannot run ", argv[0], ": ", strerror(errno), " (loom-ckpt is built beside loomctl)")));
}

// `loomctl sample JOB [--step S] --prompt TEXT [--tokens N] [--temperature T]
// [--top-k K] [--seed X]`: runs `loom-ckpt sample` on the job's newest
// committed checkpoint (or step S) with its data's tokenizer. The
// checkpoint and data must be readable here: a local cluster, or a worker
// pod.
int CmdSample(const Globals& g, const std::vector<std::string>& args) {
  std::string job;
  int64_t step = -1;
  std::vector<std::string> pass;  // flags for loom-ckpt sample
  bool have_prompt = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--step" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &step) || step < 0) return Usage("--step: a step >= 0");
    } else if ((a == "--prompt" || a == "--tokens" || a == "--temperature" || a == "--top-k" ||
                a == "--seed") &&
               i + 1 < args.size()) {
      have_prompt = have_prompt || a == "--prompt";
      pass.push_back(a);
      pass.push_back(args[++i]);
    } else if (!a.empty() && a[0] == '-') {
      return Usage("sample: unknown flag " + a);
    } else if (job.empty()) {
      job = a;
    } else {
      return Usage("sample: one job at a time");
    }
  }
  if (job.empty() || !have_prompt) return Usage("sample: expected JOB --prompt TEXT");
  absl::StatusOr<JobCheckpoint> c = ResolveCheckpoint(g, job, step);
  if (!c.ok()) return Fail(c.status());
  std::cerr << "sampling " << job << " at step " << c->step << " (" << c->path << ")" << std::endl;
  std::vector<std::string> tool = {"sample", c->path, "--tokenizer", c->data_dir};
  tool.insert(tool.end(), pass.begin(), pass.end());
  return ExecCheckpointTool(tool);
}

// `loomctl export JOB [--step S] --out DIR`: the job's newest committed
// checkpoint (or step S) in Hugging Face's layout, by `loom-ckpt export`.
int CmdExport(const Globals& g, const std::vector<std::string>& args) {
  std::string job, out;
  int64_t step = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--step" && i + 1 < args.size()) {
      if (!absl::SimpleAtoi(args[++i], &step) || step < 0) return Usage("--step: a step >= 0");
    } else if (a == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (!a.empty() && a[0] == '-') {
      return Usage("export: unknown flag " + a);
    } else if (job.empty()) {
      job = a;
    } else {
      return Usage("export: one job at a time");
    }
  }
  if (job.empty() || out.empty()) return Usage("export: expected JOB --out DIR");
  absl::StatusOr<JobCheckpoint> c = ResolveCheckpoint(g, job, step);
  if (!c.ok()) return Fail(c.status());
  return ExecCheckpointTool({"export", c->path, "--tokenizer", c->data_dir, "--out", out});
}

// `loomctl report JOB --out FILE`: the job as one self-contained HTML page
// (cli/report.h).
int CmdReport(const Globals& g, const std::vector<std::string>& args) {
  std::string job, out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (!args[i].empty() && args[i][0] == '-') {
      return Usage("report: unknown flag " + args[i]);
    } else if (job.empty()) {
      job = args[i];
    } else {
      return Usage("report: one job at a time");
    }
  }
  if (job.empty() || out.empty()) return Usage("report: expected JOB --out FILE");
  absl::StatusOr<loom::v1::Job> got = FetchJob(g, job);
  if (!got.ok()) return Fail(got.status());
  auto client = Client::Connect(g);
  if (!client.ok()) return Fail(client.status());
  loom::v1::GetStepMetricsRequest steps_req;
  steps_req.set_job_id(job);
  loom::v1::GetStepMetricsResponse steps;
  if (absl::Status s =
          (*client)->Call(&loom::v1::JobService::Stub::GetStepMetrics, steps_req, &steps);
      !s.ok()) {
    return Fail(s);
  }
  loom::v1::ListCheckpointsRequest ckpt_req;
  ckpt_req.set_job_id(job);
  loom::v1::ListCheckpointsResponse ckpts;
  if (absl::Status s =
          (*client)->Call(&loom::v1::JobService::Stub::ListCheckpoints, ckpt_req, &ckpts);
      !s.ok()) {
    return Fail(s);
  }
  const std::string html = RenderJobReport(
      *got, std::vector<loom::v1::StepMetrics>(steps.steps().begin(), steps.steps().end()),
      std::vector<loom::v1::CheckpointInfo>(ckpts.checkpoints().begin(), ckpts.checkpoints().end()));
  if (absl::Status s = WriteFileAtomically(out, html); !s.ok()) return Fail(s);
  std::cout << "wrote " << out << " (" << html.size() / 1024 << " KiB, " << steps.steps_size()
            << " step reports, " << got->events_size() << " events, " << ckpts.checkpoints_size()
            << " checkpoints); open it in a browser, it needs no network" << std::endl;
  return 0;
}

// `loomctl completion bash`: the completion script (cli/help.h).
int CmdCompletion(const Globals&, const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] != "bash") return Usage("completion: expected `completion bash`");
  std::cout << BashCompletion();
  return 0;
}

// `loomctl help [COMMAND]`.
int CmdHelp(const Globals&, const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cout << MainUsage();
    return 0;
  }
  if (args[0] == "-h" || args[0] == "--help") {
    std::cout << CommandUsage(*FindCommand("help"));
    return 0;
  }
  const CommandHelp* c = FindCommand(args[0]);
  if (c == nullptr) return Usage("help: unknown command " + args[0]);
  std::cout << CommandUsage(*c);
  return 0;
}

// `loomctl __jobs`: job ids, one per line, for the completion script
// (silent and exit 1 when the controller cannot be asked).
int CmdJobIds(const Globals& g, const std::vector<std::string>&) {
  auto client = Client::Connect(g);
  if (!client.ok()) return 1;
  loom::v1::ListJobsRequest req;
  req.set_page_size(500);
  loom::v1::ListJobsResponse resp;
  auto ctx = (*client)->Context(absl::Seconds(2));
  if (!(*client)->stub->ListJobs(ctx.get(), req, &resp).ok()) return 1;
  for (const auto& j : resp.jobs()) std::cout << j.id() << "\n";
  return 0;
}

int CmdData(const Globals& g, const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "prepare") return Usage("data: expected `data prepare`");
  return CmdDataPrepare(g, std::vector<std::string>(args.begin() + 1, args.end()));
}

using Runner = int (*)(const Globals&, const std::vector<std::string>&);

// The runner of every command of Commands() (cli/help.h), by name.
const std::map<std::string, Runner>& Runners() {
  static const auto* runners = new std::map<std::string, Runner>{
      {"local", CmdLocal},           {"users", CmdUsers},
      {"ca", CmdCa},                 {"submit", CmdSubmit},
      {"validate", CmdValidate},     {"list", CmdList},
      {"status", CmdStatus},         {"watch", CmdWatch},
      {"cancel", CmdCancel},         {"workers", CmdWorkers},
      {"events", CmdEvents},         {"plan", CmdPlan},
      {"rollback", CmdRollback},     {"checkpoints", CmdCheckpoints},
      {"diagnose", CmdDiagnose},     {"data", CmdData},
      {"completion", CmdCompletion}, {"help", CmdHelp},
      {"sample", CmdSample},         {"export", CmdExport},
      {"report", CmdReport},         {"logs", CmdLogs},
  };
  return *runners;
}

// Every runner has its help and every help its runner: a command added to
// one and not the other stops loomctl with this message (the CLI tests run
// loomctl, so they fail on it).
bool RunnersMatchHelp() {
  bool ok = true;
  for (const auto& [name, runner] : Runners()) {
    if (FindCommand(name) == nullptr) {
      std::cerr << "loomctl: internal error: command " << name << " has no help (cli/help.cc)\n";
      ok = false;
    }
  }
  for (const CommandHelp& c : Commands()) {
    if (Runners().count(c.name) == 0) {
      std::cerr << "loomctl: internal error: help for " << c.name << " but no such command\n";
      ok = false;
    }
  }
  return ok;
}

}  // namespace
}  // namespace loom::cli

int main(int argc, char** argv) {
  using namespace loom::cli;
  Globals g;
  const char* env_home = getenv("LOOM_HOME");
  const char* user_home = getenv("HOME");
  g.home = env_home ? env_home : std::string(user_home ? user_home : "/tmp") + "/.loom";
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (!rest.empty()) {
      // Global output flag may also follow the command.
      if (a == "-o") {
        std::string v;
        if (!value(&v)) return Usage("-o needs a value");
        g.json = v == "json";
        if (v != "json" && v != "table") return Usage("-o: expected table or json");
        continue;
      }
      rest.push_back(a);
      continue;
    }
    if (a == "--home") {
      if (!value(&g.home)) return Usage("--home needs a value");
    } else if (a == "--controller") {
      if (!value(&g.controller)) return Usage("--controller needs a value");
    } else if (a == "--token-file") {
      if (!value(&g.token_file)) return Usage("--token-file needs a value");
    } else if (a == "--tls") {
      // TLS is the default; kept so that older command lines still work.
    } else if (a == "--plaintext") {
      g.plaintext = true;
    } else if (a == "--tls-ca") {
      if (!value(&g.tls_ca)) return Usage("--tls-ca needs a value");
    } else if (a == "--tls-cert") {
      if (!value(&g.tls_cert)) return Usage("--tls-cert needs a value");
    } else if (a == "--tls-key") {
      if (!value(&g.tls_key)) return Usage("--tls-key needs a value");
    } else if (a == "-o") {
      std::string v;
      if (!value(&v)) return Usage("-o needs a value");
      if (v != "json" && v != "table") return Usage("-o: expected table or json");
      g.json = v == "json";
    } else if (a == "-h" || a == "--help") {
      std::cout << MainUsage();
      return 0;
    } else if (a.rfind("-", 0) == 0) {
      return Usage("unknown flag " + a);
    } else {
      rest.push_back(a);
    }
  }
  if (!RunnersMatchHelp()) return 70;
  if (rest.empty()) {
    std::cerr << MainUsage();
    return 2;
  }
  std::string cmd = rest[0];
  std::vector<std::string> args(rest.begin() + 1, rest.end());
  if (g.plaintext && (!g.tls_ca.empty() || !g.tls_cert.empty())) {
    return Usage("--plaintext cannot go with --tls-ca or --tls-cert");
  }
  if (g.tls_cert.empty() != g.tls_key.empty()) {
    return Usage("--tls-cert and --tls-key go together");
  }
  if (cmd == "__jobs") return CmdJobIds(g, args);
  auto runner = Runners().find(cmd);
  if (runner == Runners().end()) return Usage("unknown command " + cmd);
  if (cmd != "help" && WantsHelp(args)) {
    std::cout << CommandUsage(*FindCommand(cmd));
    return 0;
  }
  return runner->second(g, args);
}
