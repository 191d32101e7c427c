#include "controller/console/api_gateway.h"

#include <cstdlib>
#include <functional>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "controller/console/event_stream.h"
#include "controller/console/query_params.h"
#include "controller/console/sessions.h"
#include "controller/leader/leader_lease.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace loom::controller::console {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using Stub = loom::v1::JobService::Stub;

ApiReply ErrorReply(grpc::StatusCode code, const std::string& message) {
  google::protobuf::Struct error;
  (*error.mutable_fields())["code"].set_string_value(ApiGateway::CodeName(code));
  (*error.mutable_fields())["message"].set_string_value(message);
  ApiReply reply;
  reply.status = ApiGateway::HttpStatusOf(code);
  (void)google::protobuf::util::MessageToJsonString(error, &reply.body);
  return reply;
}

ApiReply BadRequest(const std::string& message) {
  return ErrorReply(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// What one route needs to call its RPC: the request message to fill, and
// the call, given the filled request and a context.
struct Call {
  std::unique_ptr<Message> request;
  std::function<grpc::Status(grpc::ClientContext*, std::unique_ptr<Message>* reply)> invoke;
};

template <typename Req, typename Resp>
Call MakeCall(Stub* stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*)) {
  Call call;
  call.request = std::make_unique<Req>();
  Req* req = static_cast<Req*>(call.request.get());
  call.invoke = [stub, method, req](grpc::ClientContext* ctx, std::unique_ptr<Message>* reply) {
    auto resp = std::make_unique<Resp>();
    grpc::Status s = (stub->*method)(ctx, *req, resp.get());
    *reply = std::move(resp);
    return s;
  };
  return call;
}

// Sets the string field `name` of `m` (the job id from the path).
void SetString(Message* m, const char* name, const std::string& value) {
  const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(name);
  if (f != nullptr && f->type() == FieldDescriptor::TYPE_STRING && !f->is_repeated()) {
    m->GetReflection()->SetString(m, f, value);
  }
}

// Equal strings, in time that does not depend on where they differ.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string JsonString(absl::string_view text) {
  google::protobuf::Value v;
  v.set_string_value(std::string(text));
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(v, &out);
  return out;
}

}  // namespace

ApiGateway::ApiGateway(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline)
    : ApiGateway(std::move(channel), GatewayOptions{deadline}) {}

ApiGateway::ApiGateway(std::shared_ptr<grpc::Channel> channel, GatewayOptions options)
    : stub_(loom::v1::JobService::NewStub(std::move(channel))), options_(std::move(options)) {}

std::string ApiGateway::CookieValue(absl::string_view header, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(header, ';')) {
    pair = absl::StripAsciiWhitespace(pair);
    if (absl::ConsumePrefix(&pair, name) && absl::ConsumePrefix(&pair, "=")) {
      return std::string(pair);
    }
  }
  return "";
}

const char* ApiGateway::CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c < 17 ? kNames[c] : "UNKNOWN";
}

bool ApiGateway::AddCredentials(const ApiRequest& request, bool changes, grpc::ClientContext* ctx,
                                ApiReply* error) const {
  if (!request.authorization.empty()) {
    ctx->AddMetadata("authorization", request.authorization);
    return true;
  }
  const std::string session = CookieValue(request.cookie, kSessionCookie);
  if (options_.sessions == nullptr || session.empty()) return true;  // the controller says 401
  // A page's request: anything that may change state must prove it came
  // from a page of this origin (which read the csrf_token at login).
  if (changes && !SameSecret(request.csrf, ConsoleSessions::CsrfTokenOf(session))) {
    *error = ErrorReply(grpc::StatusCode::PERMISSION_DENIED,
                        "X-Loom-CSRF: missing or not this session's csrf_token (the console's "
                        "pages send it; GET /api/v1/session answers it)");
    return false;
  }
  ctx->AddMetadata(kSessionMetadataKey, session);
  return true;
}

bool ApiGateway::IsStream(const ApiRequest& request) {
  absl::string_view path = request.path;
  return (request.method == "GET" || request.method == "HEAD") &&
         absl::ConsumePrefix(&path, "/api/v1/") && absl::EndsWith(path, "events:stream");
}

std::unique_ptr<EventStream> ApiGateway::OpenStream(const ApiRequest& request,
                                                    ApiReply* error) const {
  absl::string_view path = request.path;
  absl::ConsumePrefix(&path, "/api/v1/");
  std::string job_id;
  if (path != "events:stream") {
    const std::vector<std::string> parts = absl::StrSplit(path, '/');
    if (parts.size() != 3 || parts[0] != "jobs" || parts[1].empty() ||
        parts[2] != "events:stream") {
      *error =
          ErrorReply(grpc::StatusCode::NOT_FOUND, absl::StrCat("no API route GET ", request.path,
                                                               " (streams: /api/v1/events:stream, "
                                                               "/api/v1/jobs/{id}/events:stream)"));
      return nullptr;
    }
    job_id = parts[1];
  }
  // Where to resume: Last-Event-ID (a browser reconnecting), else ?after_seq.
  std::optional<int64_t> after;
  loom::v1::WatchEventsRequest query;
  if (absl::Status q = ParseQueryParams(request.query, &query); !q.ok()) {
    *error = BadRequest(std::string(q.message()));
    return nullptr;
  }
  if (query.has_after_seq()) after = query.after_seq();
  if (!request.last_event_id.empty()) {
    int64_t seq = 0;
    if (!absl::SimpleAtoi(request.last_event_id, &seq) || seq < 0) {
      *error = BadRequest(
          absl::StrCat("Last-Event-ID: \"", request.last_event_id, "\" is not an event seq"));
      return nullptr;
    }
    after = seq;
  }
  // The caller, checked as any route's (and the job, found).
  grpc::ClientContext check;
  check.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  if (!AddCredentials(request, false, &check, error)) return nullptr;
  grpc::Status s;
  if (job_id.empty()) {
    loom::v1::WhoAmIResponse who;
    s = stub_->WhoAmI(&check, loom::v1::WhoAmIRequest(), &who);
  } else {
    loom::v1::GetJobRequest get;
    get.set_job_id(job_id);
    loom::v1::Job job;
    s = stub_->GetJob(&check, get, &job);
  }
  if (!s.ok()) {
    *error = ErrorReply(s.error_code(), s.error_message());
    return nullptr;
  }
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!AddCredentials(request, false, ctx.get(), error)) return nullptr;
  loom::v1::JobService::Stub* stub = stub_.get();
  if (job_id.empty()) {
    loom::v1::WatchEventsRequest watch;
    if (after.has_value()) watch.set_after_seq(*after);
    return std::make_unique<EventStream>(std::move(ctx), [stub, watch](grpc::ClientContext* c) {
      return std::unique_ptr<EventStream::Reader>(stub->WatchEvents(c, watch));
    });
  }
  loom::v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  if (after.has_value()) {
    watch.set_after_seq(*after);
  } else {
    watch.set_include_history(true);
  }
  return std::make_unique<EventStream>(std::move(ctx), [stub, watch](grpc::ClientContext* c) {
    return std::unique_ptr<EventStream::Reader>(stub->WatchJob(c, watch));
  });
}

ApiReply ApiGateway::WhoAmIReply(grpc::ClientContext* ctx, const std::string& session_id,
                                 absl::Time expires) const {
  loom::v1::WhoAmIResponse who;
  const grpc::Status s = stub_->WhoAmI(ctx, loom::v1::WhoAmIRequest(), &who);
  if (!s.ok()) return ErrorReply(s.error_code(), s.error_message());
  std::string consoles;
  if (options_.consoles) {
    for (const std::string& url : options_.consoles()) {
      absl::StrAppend(&consoles, consoles.empty() ? "" : ",", JsonString(url));
    }
  }
  ApiReply reply;
  reply.body =
      absl::StrCat("{\"name\":", JsonString(who.name()), ",\"role\":", JsonString(who.role()),
                   ",\"credential\":\"session\",\"csrf_token\":",
                   JsonString(ConsoleSessions::CsrfTokenOf(session_id)),
                   expires == absl::InfinitePast()
                       ? ""
                       : absl::StrCat(",\"expires_unix_ms\":", absl::ToUnixMillis(expires)),
                   ",\"consoles\":[", consoles, "]}");
  return reply;
}

ApiReply ApiGateway::HandleSession(const ApiRequest& request) const {
  if (options_.sessions == nullptr) {
    return ErrorReply(grpc::StatusCode::UNIMPLEMENTED,
                      "this console has no sessions: send Authorization: Bearer <token>");
  }
  const std::string cookie = CookieValue(request.cookie, kSessionCookie);
  std::string cookie_flags = absl::StrCat("; Path=/; HttpOnly; SameSite=Strict",
                                          options_.secure_cookies ? "; Secure" : "");
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  if (request.method == "POST") {
    if (!absl::StartsWith(absl::AsciiStrToLower(request.content_type), "application/json")) {
      ApiReply reply = BadRequest("log in with Content-Type: application/json");
      reply.status = 415;
      return reply;
    }
    google::protobuf::Struct body;
    if (!google::protobuf::util::JsonStringToMessage(request.body, &body).ok() ||
        !body.fields().contains("token") ||
        body.fields().at("token").kind_case() != google::protobuf::Value::kStringValue ||
        body.fields().at("token").string_value().empty()) {
      return BadRequest("body: must be {\"token\": \"<a Loom token>\"}");
    }
    const std::string& token = body.fields().at("token").string_value();
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    // Who the token is, asked of the controller itself (and refused there
    // for a worker token or an unknown one).
    loom::v1::WhoAmIResponse who;
    const grpc::Status s = stub_->WhoAmI(&ctx, loom::v1::WhoAmIRequest(), &who);
    if (!s.ok()) return ErrorReply(s.error_code(), s.error_message());
    absl::StatusOr<ConsoleSessions::Opened> opened = options_.sessions->Open(who.name(), token);
    if (!opened.ok()) {
      return ErrorReply(grpc::StatusCode::UNAVAILABLE, std::string(opened.status().message()));
    }
    grpc::ClientContext again;
    again.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
    again.AddMetadata(kSessionMetadataKey, opened->id);
    ApiReply reply = WhoAmIReply(&again, opened->id, opened->expires);
    if (reply.status == 200) {
      reply.headers.emplace_back(
          "Set-Cookie", absl::StrCat(kSessionCookie, "=", opened->id, cookie_flags, "; Max-Age=",
                                     absl::ToInt64Seconds(options_.sessions->lifetime())));
    }
    return reply;
  }
  if (cookie.empty()) {
    return ErrorReply(grpc::StatusCode::UNAUTHENTICATED,
                      "not logged in: POST /api/v1/session with {\"token\": ...}");
  }
  if (request.method == "GET" || request.method == "HEAD") {
    ctx.AddMetadata(kSessionMetadataKey, cookie);
    return WhoAmIReply(&ctx, cookie, absl::InfinitePast());
  }
  if (request.method == "DELETE") {
    if (!SameSecret(request.csrf, ConsoleSessions::CsrfTokenOf(cookie))) {
      return ErrorReply(grpc::StatusCode::PERMISSION_DENIED,
                        "X-Loom-CSRF: missing or not this session's csrf_token");
    }
    if (absl::Status s = options_.sessions->End(cookie); !s.ok()) {
      return ErrorReply(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("cannot end the session: ", s.message()));
    }
    ApiReply reply;
    reply.body = "{}";
    reply.headers.emplace_back("Set-Cookie",
                               absl::StrCat(kSessionCookie, "=", cookie_flags, "; Max-Age=0"));
    return reply;
  }
  ApiReply reply = ErrorReply(grpc::StatusCode::UNIMPLEMENTED,
                              absl::StrCat(request.method, " is not allowed on /api/v1/session"));
  reply.status = 405;
  reply.headers.emplace_back("Allow", "GET, POST, DELETE");
  return reply;
}

int ApiGateway::HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

ApiReply ApiGateway::Handle(const ApiRequest& request) const {
  absl::string_view path = request.path;
  if (!absl::ConsumePrefix(&path, "/api/v1/")) {
    return ErrorReply(grpc::StatusCode::NOT_FOUND, "not an API path: they start with /api/v1/");
  }
  if (path == "session") return HandleSession(request);
  const std::vector<std::string> parts = absl::StrSplit(path, '/');
  std::string job_id;
  std::string node;  // from /api/v1/nodes/{node}:verb
  Stub* stub = stub_.get();
  Call call;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  std::string allow;  // the methods the path takes, when the method is not one
  auto route = [&](bool method_ok, const char* methods, Call c) {
    if (!method_ok) {
      allow = methods;
      return;
    }
    call = std::move(c);
  };
  if (parts.size() == 1 && parts[0] == "jobs") {
    if (get) {
      route(true, "GET, POST", MakeCall(stub, &Stub::ListJobs));
    } else {
      route(post, "GET, POST", MakeCall(stub, &Stub::SubmitJob));
    }
  } else if (parts.size() == 1 && parts[0] == "events") {
    route(get, "GET", MakeCall(stub, &Stub::ListEvents));
  } else if (parts.size() == 1 && parts[0] == "workers") {
    route(get, "GET", MakeCall(stub, &Stub::ListWorkers));
  } else if (parts.size() == 1 && parts[0] == "queues") {
    route(get, "GET", MakeCall(stub, &Stub::ListQueues));
  } else if (parts.size() == 1 && parts[0] == "plan") {
    route(post, "POST", MakeCall(stub, &Stub::Plan));
  } else if (parts.size() == 1 && parts[0] == "whoami") {
    route(get, "GET", MakeCall(stub, &Stub::WhoAmI));
  } else if (parts.size() == 2 && parts[0] == "nodes" && !parts[1].empty()) {
    // /api/v1/nodes/{node}:cordon, :uncordon, :drain (the node in the body).
    const size_t colon = parts[1].rfind(':');
    const std::string verb = colon == std::string::npos ? "" : parts[1].substr(colon + 1);
    node = parts[1].substr(0, colon);
    if (verb == "cordon") {
      route(post, "POST", MakeCall(stub, &Stub::CordonNode));
    } else if (verb == "uncordon") {
      route(post, "POST", MakeCall(stub, &Stub::UncordonNode));
    } else if (verb == "drain") {
      route(post, "POST", MakeCall(stub, &Stub::DrainNode));
    }
  } else if ((parts.size() == 2 || parts.size() == 3) && parts[0] == "jobs" && !parts[1].empty()) {
    std::string id = parts[1];
    std::string verb;
    if (parts.size() == 2) {
      if (const size_t colon = id.rfind(':'); colon != std::string::npos) {
        verb = id.substr(colon + 1);
        id = id.substr(0, colon);
      }
    }
    job_id = id;
    if (job_id.empty()) return BadRequest(absl::StrCat("path: \"", parts[1], "\" has no job id"));
    const std::string sub = parts.size() == 3 ? parts[2] : "";
    if (parts.size() == 2 && verb.empty()) {
      route(get, "GET", MakeCall(stub, &Stub::GetJob));
    } else if (verb == "cancel") {
      route(post, "POST", MakeCall(stub, &Stub::CancelJob));
    } else if (verb == "rollback") {
      route(post, "POST", MakeCall(stub, &Stub::RollbackJob));
    } else if (sub == "steps") {
      route(get, "GET", MakeCall(stub, &Stub::GetStepMetrics));
    } else if (sub == "series") {
      route(get, "GET", MakeCall(stub, &Stub::GetStepSeries));
    } else if (sub == "checkpoints") {
      route(get, "GET", MakeCall(stub, &Stub::ListCheckpoints));
    } else if (sub == "events") {
      route(get, "GET", MakeCall(stub, &Stub::ListEvents));
    } else if (sub == "logs") {
      route(get, "GET", MakeCall(stub, &Stub::GetRankLog));
    } else if (sub == "logs:search") {
      route(get, "GET", MakeCall(stub, &Stub::SearchRankLogs));
    } else if (sub == "goodput") {
      route(get, "GET", MakeCall(stub, &Stub::GetGoodput));
    }
  }
  if (!allow.empty()) {
    ApiReply reply = ErrorReply(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat(request.method, " is not allowed on ", request.path, ": use ", allow));
    reply.status = 405;
    reply.headers.emplace_back("Allow", allow);
    return reply;
  }
  if (call.request == nullptr) {
    return ErrorReply(grpc::StatusCode::NOT_FOUND,
                      absl::StrCat("no API route ", request.method, " ", request.path,
                                   " (the routes are listed in docs/console.md)"));
  }

  Message* req = call.request.get();
  if (absl::Status q = ParseQueryParams(request.query, req); !q.ok()) {
    return BadRequest(std::string(q.message()));
  }
  if (post && !absl::StripAsciiWhitespace(request.body).empty()) {
    if (request.body.size() > kMaxBodyBytes) {
      ApiReply reply = BadRequest(absl::StrCat(
          "body: ", request.body.size(), " bytes, more than the ", kMaxBodyBytes, " allowed"));
      reply.status = 413;
      return reply;
    }
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    if (auto s = google::protobuf::util::JsonStringToMessage(request.body, req, options); !s.ok()) {
      return BadRequest(absl::StrCat("body: not a ", req->GetDescriptor()->name(),
                                     " in JSON: ", std::string(s.message())));
    }
  }
  if (!job_id.empty()) SetString(req, "job_id", job_id);
  if (!node.empty()) SetString(req, "node", node);

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  if (ApiReply refused; !AddCredentials(request, !get, &ctx, &refused)) return refused;
  std::unique_ptr<Message> resp;
  const grpc::Status s = call.invoke(&ctx, &resp);
  if (!s.ok()) {
    ApiReply reply = ErrorReply(s.error_code(), s.error_message());
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      const auto& trailers = ctx.GetServerTrailingMetadata();
      if (auto it = trailers.find(kLeaderMetadataKey); it != trailers.end()) {
        reply.headers.emplace_back("X-Loom-Leader",
                                   std::string(it->second.data(), it->second.size()));
      }
    }
    return reply;
  }
  ApiReply reply;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (auto p = google::protobuf::util::MessageToJsonString(*resp, &reply.body, options); !p.ok()) {
    return ErrorReply(grpc::StatusCode::INTERNAL,
                      absl::StrCat("the reply did not print as JSON: ", std::string(p.message())));
  }
  return reply;
}

}  // namespace loom::controller::console
