// ApiGateway: the console's JSON API, answered by the controller's own
// gRPC JobService.
//
// Each route under /api/v1/ is one JobService RPC. The gateway builds the
// request message from the path, the query string and (for POST) the JSON
// body, calls the RPC over a channel to this same controller (in-process),
// passing the caller's `Authorization: Bearer <token>` on as gRPC metadata,
// and answers the reply in protobuf's JSON mapping with proto field names,
// as `loomctl -o json` prints it. So validation, access checks, leadership
// and the handler itself are the gRPC ones: the console and loomctl cannot
// disagree.
//
//   GET  /api/v1/jobs                       ListJobs (query: its fields)
//   POST /api/v1/jobs                       SubmitJob (body: SubmitJobRequest)
//   GET  /api/v1/jobs/{id}                  GetJob
//   POST /api/v1/jobs/{id}:cancel           CancelJob (body: CancelJobRequest)
//   POST /api/v1/jobs/{id}:rollback         RollbackJob (body: RollbackJobRequest)
//   GET  /api/v1/jobs/{id}/steps            GetStepMetrics
//   GET  /api/v1/jobs/{id}/series           GetStepSeries (downsampled for charts)
//   GET  /api/v1/jobs/{id}/checkpoints      ListCheckpoints
//   GET  /api/v1/jobs/{id}/events           ListEvents (of the job)
//   GET  /api/v1/jobs/{id}/logs             GetRankLog
//   GET  /api/v1/jobs/{id}/logs:search      SearchRankLogs
//   GET  /api/v1/events                     ListEvents (every job)
//   GET  /api/v1/workers                    ListWorkers
//   GET  /api/v1/queues                     ListQueues
//   POST /api/v1/plan                       Plan (body: PlanRequest)
//   GET  /api/v1/whoami                     WhoAmI
//
// Sessions (with ConsoleSessions; sessions.h says what they promise):
//   POST   /api/v1/session   log in: body {"token": "<a Loom token>"}, sent
//                            as Content-Type: application/json (which a page
//                            on another origin cannot send without a CORS
//                            preflight, which this server never grants).
//                            Sets the loom_session cookie (HttpOnly,
//                            SameSite=Strict, Secure over TLS, Path=/) and
//                            answers the user, role, csrf_token, expiry and
//                            every controller's console URL.
//   GET    /api/v1/session   the same for the cookie's session (401 without)
//   DELETE /api/v1/session   log out: ends the session, clears the cookie
// A request with an Authorization header is that token's, with no CSRF
// check (a script's). Otherwise the loom_session cookie's session is passed
// on as "x-loom-session" metadata, and every request but GET and HEAD must
// carry X-Loom-CSRF equal to the session's csrf_token (403 otherwise).
//
// Query parameters name the request message's scalar fields (proto or JSON
// name; a repeated field may be given more than once); the path's job id
// wins over one in the query or body. Errors answer
// {"code": "<gRPC code name>", "message": "..."} with the HTTP status of
// HttpStatusOf; a standby's UNAVAILABLE also carries the leader's address in
// the X-Loom-Leader header.
//
// Thread-safe: Handle may run on many threads at once.
#ifndef LOOM_CONTROLLER_CONSOLE_API_GATEWAY_H_
#define LOOM_CONTROLLER_CONSOLE_API_GATEWAY_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::controller::console {

struct ApiRequest {
  std::string method;         // "GET", "POST", ...
  std::string path;           // "/api/v1/jobs/gpt-1", %-escapes decoded
  std::string query;          // "state=RUNNING&name=a%20b", not decoded
  std::string body;           // a JSON object for POST; may be empty
  std::string authorization;  // the Authorization header as sent; may be empty
  std::string cookie;         // the Cookie header as sent; may be empty
  std::string csrf;           // the X-Loom-CSRF header; may be empty
  std::string content_type;   // the Content-Type header; may be empty
  std::string last_event_id;  // the Last-Event-ID header (an SSE reconnect); may be empty
};

struct ApiReply {
  int status = 200;
  std::string body;                                          // JSON
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type
};

class ConsoleSessions;
class EventStream;

struct GatewayOptions {
  // Bounds each call to the controller.
  absl::Duration deadline = absl::Seconds(30);
  // Null: no login (the API takes bearer tokens only).
  ConsoleSessions* sessions = nullptr;
  // The console serves HTTPS: cookies are marked Secure.
  bool secure_cookies = false;
  // Every controller's console URL (for a page whose controller dies); may
  // be empty.
  std::function<std::vector<std::string>()> consoles;
};

class ApiGateway {
 public:
  // The largest body Handle accepts (a job spec with its data paths is a
  // few KiB; a plan request's topology a few more).
  static constexpr size_t kMaxBodyBytes = 1 << 20;

  // `channel` reaches this controller's JobService; `deadline` bounds each
  // call.
  ApiGateway(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline);
  ApiGateway(std::shared_ptr<grpc::Channel> channel, GatewayOptions options);

  // The session cookie's name.
  static constexpr const char* kSessionCookie = "loom_session";

  ApiReply Handle(const ApiRequest& request) const;

  // INVALID_ARGUMENT/OUT_OF_RANGE 400, UNAUTHENTICATED 401,
  // PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS/FAILED_PRECONDITION/
  // ABORTED 409, RESOURCE_EXHAUSTED 429, UNIMPLEMENTED 501, UNAVAILABLE 503,
  // DEADLINE_EXCEEDED 504, OK 200, the rest 500.
  static int HttpStatusOf(grpc::StatusCode code);

  // The value of cookie `name` in a Cookie header ("" when absent).
  static std::string CookieValue(absl::string_view header, absl::string_view name);
  // "NOT_FOUND" for NOT_FOUND, and so on.
  static const char* CodeName(grpc::StatusCode code);

  // True for the routes answered with a stream of events (event_stream.h):
  // GET /api/v1/events:stream and GET /api/v1/jobs/{id}/events:stream.
  static bool IsStream(const ApiRequest& request);
  // Starts the stream of such a route, after checking the caller (and that
  // the job exists) with a unary call, so a refused caller gets the status
  // of any route (401, 403, 404) instead of a stream. Null, with *error
  // set, when it does not start.
  std::unique_ptr<EventStream> OpenStream(const ApiRequest& request, ApiReply* error) const;

 private:
  // Puts the request's credentials on `ctx`: its Authorization header, else
  // its session cookie's session, which must prove the request came from a
  // console page (X-Loom-CSRF) when it `changes` anything. False, with
  // *error set, when it must not go on.
  bool AddCredentials(const ApiRequest& request, bool changes, grpc::ClientContext* ctx,
                      ApiReply* error) const;
  ApiReply HandleSession(const ApiRequest& request) const;
  // WhoAmI with `ctx`'s credentials, as the session routes answer it.
  ApiReply WhoAmIReply(grpc::ClientContext* ctx, const std::string& session_id,
                       absl::Time expires) const;

  std::unique_ptr<loom::v1::JobService::Stub> stub_;
  const GatewayOptions options_;
};

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_API_GATEWAY_H_
