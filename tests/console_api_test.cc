// The console's JSON API on a real loom-controller (TLS, a users file,
// --console_port=0), called over HTTPS with curl: the same callers get the
// same answers as from the gRPC services, in protobuf's JSON mapping, with
// the gRPC status mapped to one HTTP status.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/grpc_util.h"
#include "common/jobspec_parse.h"
#include "controller/service/access.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "loom/v1/service.grpc.pb.h"
#include "tests/test_util.h"
#include "tests/tls_controller.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

constexpr char kBin[] = LOOM_BIN_DIR;

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};

class ConsoleApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("loom_console_api_test");
    const absl::Status started = controller_.Start(
        kBin, dir_,
        absl::StrCat(controller::UsersFileLine("rita", controller::Role::kReader, "rita-token"),
                     controller::UsersFileLine("uma", controller::Role::kUser, "uma-token"),
                     controller::UsersFileLine("ulf", controller::Role::kUser, "ulf-token")),
        "--console_port=0 --data_root=" + dir_);
    ASSERT_TRUE(started.ok()) << started;
    tls_ = controller_.tls_dir();
    address_ = controller_.grpc_address();
    console_ = controller_.console_url();
    ASSERT_EQ(console_.rfind("https://127.0.0.1:", 0), 0u) << console_;
  }

  // One HTTPS request with curl, trusting only the cluster CA.
  // `curl_args`: more of curl's arguments (a cookie jar, headers).
  HttpReply Http(const std::string& method, const std::string& path, const std::string& token,
                 const std::string& body = "", const std::string& curl_args = "") {
    const std::string head = dir_ + "/reply.headers", out = dir_ + "/reply.body";
    unlink(head.c_str());
    unlink(out.c_str());
    std::string cmd = absl::StrCat("curl -sS --max-time 20 --cacert ", tls_, "/ca.pem -X ", method,
                                   " -D ", head, " -o ", out, " -w '%{http_code}'");
    if (!token.empty()) absl::StrAppend(&cmd, " -H 'Authorization: Bearer ", token, "'");
    if (!curl_args.empty()) absl::StrAppend(&cmd, " ", curl_args);
    if ((!body.empty() || method == "POST") && curl_args.find("--data") == std::string::npos) {
      EXPECT_TRUE(WritePrivateFile(dir_ + "/request.json", body.empty() ? "{}" : body).ok());
      absl::StrAppend(&cmd, " -H 'Content-Type: application/json' --data-binary @", dir_,
                      "/request.json");
    }
    absl::StrAppend(&cmd, " ", testing::ShellQuote(console_ + path));
    auto r = testing::RunCommand(cmd);
    HttpReply reply;
    reply.status = atoi(r.out.c_str());
    reply.headers = ReadFile(head).value_or("");
    reply.body = ReadFile(out).value_or("");
    return reply;
  }

  std::unique_ptr<v1::JobService::Stub> Stub() {
    auto creds = MakeChannelCredentials(true, tls_ + "/ca.pem", "", "");
    EXPECT_TRUE(creds.ok());
    return v1::JobService::NewStub(grpc::CreateChannel(address_, *creds));
  }

  static std::string Json(const google::protobuf::Message& m) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(m, &out, options).ok());
    return out;
  }

  // A SubmitJobRequest as JSON for a small job named `name`.
  std::string SubmitBody(const std::string& name) {
    auto spec = ParseJobSpec(absl::StrCat("name: ", name, R"(
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: [")",
                                          dir_, R"(/data-in/train_*.bin"]
optimizer:
  adamw: {lr: 0.003}
schedule: {total_steps: 100}
batch: {global_batch: 8, micro_batch: 4}
resources: {workers: 1, ranks: 1}
)"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    return Json(request);
  }

  // A browser's cookie jar for `who`, and its session's CSRF header.
  std::string Jar(const std::string& who) {
    const std::string jar = dir_ + "/" + who + ".cookies";
    return absl::StrCat("-b ", jar, " -c ", jar);
  }
  static std::string Csrf(const std::string& login_body) {
    google::protobuf::Struct s;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(login_body, &s).ok()) << login_body;
    return absl::StrCat("-H 'X-Loom-CSRF: ", s.fields().at("csrf_token").string_value(), "'");
  }
  HttpReply LogIn(const std::string& who, const std::string& token) {
    return Http("POST", "/api/v1/session", "", absl::StrCat(R"({"token": ")", token, R"("})"),
                Jar(who));
  }

  testing::TlsController controller_;
  std::string dir_, tls_, address_, console_;
};

TEST_F(ConsoleApiTest, AnswersWhatTheGrpcServiceAnswersTheSameCaller) {
  // The queues, read both ways by the same reader: the same JSON.
  HttpReply queues = Http("GET", "/api/v1/queues", "rita-token");
  ASSERT_EQ(queues.status, 200) << queues.body;
  v1::ListQueuesResponse direct;
  grpc::ClientContext ctx;
  AttachToken(&ctx, "rita-token");
  ASSERT_TRUE(Stub()->ListQueues(&ctx, v1::ListQueuesRequest(), &direct).ok());
  EXPECT_EQ(queues.body, Json(direct));
  EXPECT_THAT(queues.headers, HasSubstr("Content-Type: application/json"));
  EXPECT_THAT(queues.headers, HasSubstr("Content-Security-Policy: default-src 'self'"));
  EXPECT_THAT(queues.headers, HasSubstr("X-Content-Type-Options: nosniff"));
  EXPECT_THAT(queues.headers, HasSubstr("Cache-Control: no-store"));

  // A user submits; the job reads back by id and in the list.
  HttpReply submitted = Http("POST", "/api/v1/jobs", "uma-token", SubmitBody("console-a"));
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  v1::SubmitJobResponse made;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(submitted.body, &made).ok());
  const std::string id = made.job().id();
  ASSERT_FALSE(id.empty()) << submitted.body;
  HttpReply job = Http("GET", "/api/v1/jobs/" + id, "rita-token");
  ASSERT_EQ(job.status, 200) << job.body;
  v1::Job got;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(job.body, &got).ok());
  EXPECT_EQ(got.id(), id);
  EXPECT_EQ(got.spec().name(), "console-a");
  HttpReply listed = Http("GET", "/api/v1/jobs?states=PENDING", "rita-token");
  ASSERT_EQ(listed.status, 200) << listed.body;
  EXPECT_THAT(listed.body, HasSubstr(absl::StrCat("\"id\":\"", id, "\"")));
  // Filtered by the controller: by submitter, queue and a piece of the name.
  for (const char* query : {"submitted_by=uma", "queue=default", "name_contains=sole-"}) {
    HttpReply found = Http("GET", std::string("/api/v1/jobs?") + query, "rita-token");
    EXPECT_THAT(found.body, HasSubstr(absl::StrCat("\"id\":\"", id, "\""))) << query;
  }
  for (const char* query : {"submitted_by=ulf", "queue=research", "name_contains=console-b"}) {
    HttpReply none = Http("GET", std::string("/api/v1/jobs?") + query, "rita-token");
    EXPECT_EQ(none.status, 200) << query;
    EXPECT_THAT(none.body, ::testing::Not(HasSubstr("\"id\""))) << query;
  }

  // Only its owner (or an admin) cancels it.
  HttpReply reader_cancel = Http("POST", "/api/v1/jobs/" + id + ":cancel", "rita-token");
  EXPECT_EQ(reader_cancel.status, 403) << reader_cancel.body;
  EXPECT_THAT(reader_cancel.body, HasSubstr("\"code\":\"PERMISSION_DENIED\""));
  HttpReply other_cancel = Http("POST", "/api/v1/jobs/" + id + ":cancel", "ulf-token");
  EXPECT_EQ(other_cancel.status, 403) << other_cancel.body;
  HttpReply cancel = Http("POST", "/api/v1/jobs/" + id + ":cancel", "uma-token");
  ASSERT_EQ(cancel.status, 200) << cancel.body;
  EXPECT_THAT(cancel.body, HasSubstr("\"state\":\"CANCELLED\""));
}

TEST_F(ConsoleApiTest, ErrorsCarryTheGrpcCodeAndItsHttpStatus) {
  HttpReply none = Http("GET", "/api/v1/jobs", "");
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_THAT(none.body, HasSubstr("\"code\":\"UNAUTHENTICATED\""));
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "not-a-token").status, 401);

  HttpReply missing = Http("GET", "/api/v1/jobs/no-such-job-7", "rita-token");
  EXPECT_EQ(missing.status, 404) << missing.body;
  EXPECT_THAT(missing.body, HasSubstr("\"code\":\"NOT_FOUND\""));

  // A spec the controller rejects names the field.
  HttpReply invalid = Http("POST", "/api/v1/jobs", "uma-token", R"({"spec": {"name": "x"}})");
  EXPECT_EQ(invalid.status, 400) << invalid.body;
  EXPECT_THAT(invalid.body, HasSubstr("\"code\":\"INVALID_ARGUMENT\""));

  HttpReply long_name =
      Http("GET", "/api/v1/jobs?name_contains=" + std::string(300, 'x'), "rita-token");
  EXPECT_EQ(long_name.status, 400) << long_name.body;
  EXPECT_THAT(long_name.body, HasSubstr("name_contains: at most 256 bytes"));

  HttpReply query = Http("GET", "/api/v1/jobs?colour=red", "rita-token");
  EXPECT_EQ(query.status, 400) << query.body;
  EXPECT_THAT(query.body, HasSubstr("colour"));

  HttpReply method = Http("DELETE", "/api/v1/jobs", "uma-token");
  EXPECT_EQ(method.status, 405) << method.body;
  EXPECT_THAT(method.headers, HasSubstr("Allow: GET, POST"));

  EXPECT_EQ(Http("GET", "/api/v2/jobs", "rita-token").status, 404);
}

// A page logs in with a token and then holds only an HttpOnly cookie; what
// changes state needs the session's CSRF token too; the session is the
// user's (roles and ownership as for the token), and ends on logout or
// when the token is revoked.
TEST_F(ConsoleApiTest, SessionsStandForTheirTokenWithCsrfOnEveryChange) {
  HttpReply uma = LogIn("uma", "uma-token");
  ASSERT_EQ(uma.status, 200) << uma.body;
  EXPECT_THAT(uma.body, HasSubstr(R"("name":"uma","role":"user","credential":"session")"));
  EXPECT_THAT(uma.body, HasSubstr(absl::StrCat(R"("consoles":[")", console_, R"("])")));
  EXPECT_THAT(uma.headers, HasSubstr("Set-Cookie: loom_session="));
  EXPECT_THAT(uma.headers, HasSubstr("; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age="));
  EXPECT_THAT(uma.body, ::testing::Not(HasSubstr("uma-token")));

  // Reads need the cookie alone; a change needs X-Loom-CSRF as well.
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "", "", Jar("uma")).status, 200);
  HttpReply who = Http("GET", "/api/v1/session", "", "", Jar("uma"));
  ASSERT_EQ(who.status, 200) << who.body;
  EXPECT_EQ(Csrf(who.body), Csrf(uma.body));
  HttpReply forged = Http("POST", "/api/v1/jobs", "", SubmitBody("console-s"), Jar("uma"));
  EXPECT_EQ(forged.status, 403) << forged.body;
  EXPECT_THAT(forged.body, HasSubstr("X-Loom-CSRF"));
  HttpReply wrong = Http("POST", "/api/v1/jobs", "", SubmitBody("console-s"),
                         Jar("uma") + " -H 'X-Loom-CSRF: " + std::string(64, '0') + "'");
  EXPECT_EQ(wrong.status, 403) << wrong.body;
  HttpReply submitted =
      Http("POST", "/api/v1/jobs", "", SubmitBody("console-s"), Jar("uma") + " " + Csrf(uma.body));
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  v1::SubmitJobResponse made;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(submitted.body, &made).ok());
  const std::string cancel = "/api/v1/jobs/" + made.job().id() + ":cancel";

  // Another user's session may not cancel it; its owner's may.
  HttpReply ulf = LogIn("ulf", "ulf-token");
  ASSERT_EQ(ulf.status, 200) << ulf.body;
  HttpReply refused = Http("POST", cancel, "", "", Jar("ulf") + " " + Csrf(ulf.body));
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_THAT(refused.body, HasSubstr("PERMISSION_DENIED"));
  HttpReply cancelled = Http("POST", cancel, "", "", Jar("uma") + " " + Csrf(uma.body));
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_THAT(cancelled.body, HasSubstr(R"("state":"CANCELLED")"));
  // The job records who cancelled it: the session's user.
  HttpReply events = Http("GET", "/api/v1/jobs/" + made.job().id() + "/events", "", "", Jar("uma"));
  EXPECT_THAT(events.body, HasSubstr("uma"));

  // Logging out ends the session (and needs the CSRF token too).
  EXPECT_EQ(Http("DELETE", "/api/v1/session", "", "", Jar("uma")).status, 403);
  HttpReply out = Http("DELETE", "/api/v1/session", "", "", Jar("uma") + " " + Csrf(uma.body));
  ASSERT_EQ(out.status, 200) << out.body;
  EXPECT_THAT(out.headers, HasSubstr("Max-Age=0"));
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "", "", Jar("uma")).status, 401);

  // Revoking the token (the users file without ulf) ends ulf's session.
  ASSERT_EQ(Http("GET", "/api/v1/jobs", "", "", Jar("ulf")).status, 200);
  ASSERT_TRUE(
      WritePrivateFile(dir_ + "/users",
                       controller::UsersFileLine("rita", controller::Role::kReader, "rita-token"))
          .ok());
  int status = 0;
  for (int i = 0;
       i < 100 && (status = Http("GET", "/api/v1/jobs", "", "", Jar("ulf")).status) == 200; ++i) {
    usleep(100 * 1000);
  }
  EXPECT_EQ(status, 401);
  HttpReply gone = Http("GET", "/api/v1/session", "", "", Jar("ulf"));
  EXPECT_EQ(gone.status, 401);
  EXPECT_THAT(gone.body, HasSubstr("log in again"));
}

TEST_F(ConsoleApiTest, LoginRefusesWhatIsNotAPersonsToken) {
  EXPECT_EQ(LogIn("x", "not-a-token").status, 401);
  HttpReply worker = LogIn("w", "the-workers-token");
  EXPECT_EQ(worker.status, 403) << worker.body;
  EXPECT_THAT(worker.headers, ::testing::Not(HasSubstr("Set-Cookie")));
  EXPECT_EQ(Http("POST", "/api/v1/session", "", "{}", Jar("x")).status, 400);
  // A form post from another site cannot carry JSON's content type.
  HttpReply form = Http("POST", "/api/v1/session", "", "",
                        absl::StrCat(Jar("x"), " -H 'Content-Type: text/plain' --data-binary ",
                                     testing::ShellQuote(R"({"token": "rita-token"})")));
  EXPECT_EQ(form.status, 415) << form.body;
  EXPECT_EQ(Http("GET", "/api/v1/session", "", "", Jar("x")).status, 401);
  // A made-up cookie is no session.
  HttpReply made_up =
      Http("GET", "/api/v1/jobs", "", "", "-H 'Cookie: loom_session=" + std::string(64, 'a') + "'");
  EXPECT_EQ(made_up.status, 401) << made_up.body;
}

// The pages: every page's stable URL answers the HTML shell, the assets are
// served from the binary with their types, under the strict CSP; anything
// else is 404.
TEST_F(ConsoleApiTest, ServesThePagesFromTheBinary) {
  HttpReply jobs = Http("GET", "/jobs", "");
  ASSERT_EQ(jobs.status, 200) << jobs.body;
  EXPECT_THAT(jobs.headers, HasSubstr("Content-Type: text/html"));
  EXPECT_THAT(jobs.headers,
              HasSubstr("Content-Security-Policy: default-src 'self'; script-src 'self'"));
  EXPECT_THAT(jobs.body, HasSubstr(R"(<script type="module" src="/assets/console.js"></script>)"));
  for (const char* page : {"/jobs/gpt-1", "/compare", "/queues", "/workers", "/plan", "/login"}) {
    HttpReply p = Http("GET", page, "");
    EXPECT_EQ(p.status, 200) << page;
    EXPECT_EQ(p.body, jobs.body) << page;
  }
  HttpReply js = Http("GET", "/assets/console.js", "");
  ASSERT_EQ(js.status, 200);
  EXPECT_THAT(js.headers, HasSubstr("Content-Type: text/javascript"));
  EXPECT_THAT(js.body, HasSubstr("from './core.js'"));
  // Every module the page loads is served, and none writes HTML from strings.
  for (const char* module : {"console.js", "core.js", "chart.js", "job_page.js"}) {
    HttpReply m = Http("GET", std::string("/assets/") + module, "");
    EXPECT_EQ(m.status, 200) << module;
    EXPECT_THAT(m.body, ::testing::Not(HasSubstr("innerHTML"))) << module;
  }
  EXPECT_EQ(Http("GET", "/assets/console.css", "").status, 200);
  EXPECT_EQ(Http("GET", "/assets/nope.js", "").status, 404);
  EXPECT_EQ(Http("GET", "/jobsx", "").status, 404);
  EXPECT_EQ(Http("POST", "/jobs", "").status, 405);
  HttpReply root = Http("GET", "/", "");
  EXPECT_EQ(root.status, 302);
  EXPECT_THAT(root.headers, HasSubstr("Location: /jobs"));
}

// Cross-origin calls: answered (CORS with credentials) only for the pages of
// the consoles recorded in the store, which a page follows when its own
// controller dies; any other origin gets no CORS header and its preflight
// is refused. Each page may connect to exactly those origins.
TEST_F(ConsoleApiTest, CrossOriginCallsOnlyFromTheStoresConsoles) {
  // This controller's own console is the one the store records.
  HttpReply peer = Http("OPTIONS", "/api/v1/jobs", "", "",
                        "-H " + testing::ShellQuote("Origin: " + console_) +
                            " -H 'Access-Control-Request-Method: POST'"
                            " -H 'Access-Control-Request-Headers: content-type,x-loom-csrf'");
  EXPECT_EQ(peer.status, 204) << peer.headers << peer.body;
  EXPECT_THAT(peer.headers, HasSubstr("Access-Control-Allow-Origin: " + console_ + "\r\n"));
  EXPECT_THAT(peer.headers, HasSubstr("Access-Control-Allow-Credentials: true"));
  EXPECT_THAT(peer.headers, HasSubstr("X-Loom-CSRF"));
  HttpReply peer_get = Http("GET", "/api/v1/jobs", "rita-token", "",
                            "-H " + testing::ShellQuote("Origin: " + console_));
  EXPECT_EQ(peer_get.status, 200);
  EXPECT_THAT(peer_get.headers, HasSubstr("Access-Control-Allow-Origin: " + console_));
  EXPECT_THAT(peer_get.headers, HasSubstr("connect-src 'self' " + console_ + ";"));

  const std::string evil = "-H 'Origin: https://evil.example'";
  HttpReply preflight =
      Http("OPTIONS", "/api/v1/jobs", "", "", evil + " -H 'Access-Control-Request-Method: POST'");
  EXPECT_EQ(preflight.status, 403) << preflight.body;
  EXPECT_THAT(preflight.headers, ::testing::Not(HasSubstr("Access-Control-Allow")));
  HttpReply get = Http("GET", "/api/v1/jobs", "rita-token", "", evil);
  EXPECT_EQ(get.status, 200);  // the browser, not the server, keeps the reply from the page
  EXPECT_THAT(get.headers, ::testing::Not(HasSubstr("Access-Control-Allow")));
  EXPECT_THAT(get.headers, HasSubstr("Vary: Origin"));
  // An origin that only starts like the console's is another origin.
  HttpReply longer = Http("GET", "/api/v1/jobs", "rita-token", "",
                          "-H " + testing::ShellQuote("Origin: " + console_ + "0"));
  EXPECT_THAT(longer.headers, ::testing::Not(HasSubstr("Access-Control-Allow")));
}

// The event streams (Server-Sent Events over WatchJob / WatchEvents): a
// job's stream carries its logged events with their seq as the SSE id and
// ends with the job; a reconnect with Last-Event-ID gets only what came
// after; a caller refused or a job unknown gets the status, not a stream.
TEST_F(ConsoleApiTest, EventStreamsResumeFromLastEventId) {
  HttpReply submitted = Http("POST", "/api/v1/jobs", "uma-token", SubmitBody("console-e"));
  ASSERT_EQ(submitted.status, 200) << submitted.body;
  v1::SubmitJobResponse made;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(submitted.body, &made).ok());
  const std::string id = made.job().id();
  const std::string stream = "/api/v1/jobs/" + id + "/events:stream";

  // Follows the job until it ends (the cancel below), at most 30 s.
  auto follower = std::async(std::launch::async, [&] {
    return testing::RunCommand(absl::StrCat("curl -sS -N --max-time 30 --cacert ", tls_,
                                            "/ca.pem -H 'Authorization: Bearer ", "rita-token' ",
                                            testing::ShellQuote(console_ + stream)));
  });
  // The stream is open once the controller counts a watcher; then cancel.
  usleep(1500 * 1000);
  ASSERT_EQ(Http("POST", "/api/v1/jobs/" + id + ":cancel", "uma-token").status, 200);
  ASSERT_EQ(follower.wait_for(std::chrono::seconds(40)), std::future_status::ready);
  const testing::CommandResult followed = follower.get();
  EXPECT_EQ(followed.exit_code, 0) << followed.err;  // it ended with the job
  const std::string& text = followed.out;
  EXPECT_EQ(text.rfind("retry: 2000\n\n", 0), 0u) << text;
  EXPECT_THAT(text, HasSubstr("id: 1\nevent: transition\ndata: {"));
  EXPECT_THAT(text, HasSubstr(R"("to":"PENDING")"));
  EXPECT_THAT(text, HasSubstr("id: 2\nevent: transition\ndata: {"));
  EXPECT_THAT(text, HasSubstr(R"("to":"CANCELLED")"));
  EXPECT_THAT(text, HasSubstr("event: end\ndata: {\"code\":\"OK\""));

  // A reconnect after seq 1 gets seq 2 and not seq 1. Asked as a browser
  // asks (it accepts compressed replies), the stream comes uncompressed: a
  // compressor would hold events back.
  HttpReply resumed = Http("GET", stream, "rita-token", "",
                           "-N -H 'Last-Event-ID: 1' -H 'Accept-Encoding: gzip, deflate, br'");
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_THAT(resumed.headers, HasSubstr("Content-Type: text/event-stream"));
  EXPECT_THAT(resumed.headers, ::testing::Not(HasSubstr("Content-Encoding")));
  EXPECT_THAT(resumed.body, ::testing::Not(HasSubstr("id: 1\n")));
  EXPECT_THAT(resumed.body, HasSubstr("id: 2\nevent: transition"));

  // Every job's events after seq 1 (it never ends: curl stops it after 2 s).
  HttpReply mine =
      Http("GET", "/api/v1/events:stream?after_seq=1", "rita-token", "", "-N --max-time 2");
  EXPECT_THAT(mine.body, HasSubstr("id: 2\n"));
  EXPECT_THAT(mine.body, ::testing::Not(HasSubstr("id: 1\n")));

  EXPECT_EQ(Http("GET", stream, "").status, 401);
  EXPECT_EQ(Http("GET", "/api/v1/jobs/no-such-3/events:stream", "rita-token").status, 404);
  EXPECT_EQ(Http("GET", stream, "rita-token", "", "-H 'Last-Event-ID: x'").status, 400);
}

}  // namespace
}  // namespace loom
