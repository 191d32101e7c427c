// The shared helpers of loomctl's commands (cli/commands/common.h).
#include "cli/commands/common.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/grpc_util.h"
#include "google/protobuf/util/json_util.h"

namespace loom::cli {

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

std::string ToJsonLine(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
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

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const Globals& g) {
  std::vector<std::string> addresses = absl::StrSplit(g.controller, ',', absl::SkipWhitespace());
  if (addresses.empty()) {
    // The local cluster's controller, or its controllers (`local up --ha`).
    for (const DaemonInfo& d : LocalStatus(g.home)) {
      if (absl::StartsWith(d.name, "controller") && d.alive && !d.grpc_address.empty()) {
        addresses.push_back(d.grpc_address);
      }
    }
    if (addresses.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "no controller address: no local cluster is up under ", g.home,
          " (run `loomctl local up`) and --controller was not given"));
    }
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
  c->token = token;
  c->addresses = addresses;
  for (const std::string& address : addresses) {
    c->stubs.push_back(loom::v1::JobService::NewStub(grpc::CreateChannel(address, *creds)));
  }
  c->address = addresses[0];
  c->stub = c->stubs[0].get();
  if (c->stubs.size() > 1) {
    // Which one leads: a job id no controller has (a leader answers
    // NOT_FOUND or INVALID_ARGUMENT, a standby UNAVAILABLE naming it).
    loom::v1::GetJobRequest probe;
    probe.set_job_id("loomctl-leader-probe-0");
    loom::v1::Job ignored;
    for (size_t i = 0; i < 2 * c->stubs.size(); ++i) {
      auto ctx = c->Context(absl::Seconds(2));
      grpc::Status s = c->stub->GetJob(ctx.get(), probe, &ignored);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
      c->Follow(*ctx, static_cast<int>(i));
    }
  }
  return c;
}

bool Client::FromStandby(const grpc::Status& s) {
  // The messages of controller/leader/leader_lease.cc (Leadership::Admit).
  const std::string& m = s.error_message();
  return absl::StrContains(m, "this controller is a standby") ||
         absl::StrContains(m, "leader lease (epoch");
}

void Client::Follow(const grpc::ClientContext& ctx, int attempt) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  size_t next = (current + 1) % stubs.size();
  if (auto it = trailers.find("loom-leader"); it != trailers.end()) {
    const std::string leader(it->second.data(), it->second.size());
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (addresses[i] == leader) next = i;
    }
  }
  // A whole round without a leader: one is being chosen.
  if (attempt > 0 && next <= current) absl::SleepFor(absl::Milliseconds(200));
  current = next;
  address = addresses[current];
  stub = stubs[current].get();
}

std::unique_ptr<grpc::ClientContext> Client::Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AttachToken(ctx.get(), token);
  if (timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  }
  return ctx;
}

absl::Status Client::Check(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(
        absl::StrCat("controller at ", address, " is unreachable: ", s.error_message()));
  }
  return FromGrpcStatus(s);
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

}  // namespace loom::cli
