#include "controller/console/console_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "controller/console/console_assets.h"
#include "controller/console/event_stream.h"
#include "controller/console/sessions.h"
#include "controller/leader/leader_lease.h"
#include "controller/store/store.h"

namespace loom::controller::console {
namespace {

// Headers every reply carries: nothing cached, no content sniffing; the
// Content-Security-Policy is set per reply (ContentSecurityPolicy).
constexpr const char* kSecurityHeaders[][2] = {
    {"Cache-Control", "no-store"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
};

// No script, style, image or connection from another origin, but
// connections to the peer consoles.
std::string ContentSecurityPolicy(const std::vector<std::string>& peers) {
  std::string connect = "'self'";
  for (const std::string& p : peers) absl::StrAppend(&connect, " ", p);
  return absl::StrCat(
      "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
      "connect-src ",
      connect, "; frame-ancestors 'none'; base-uri 'none'; form-action 'self'");
}

// The peer consoles' origins, read at most every 5 s (every reply needs
// them).
class PeerOrigins {
 public:
  explicit PeerOrigins(std::function<std::vector<std::string>()> load) : load_(std::move(load)) {}
  std::vector<std::string> Get() {
    if (!load_) return {};
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    if (now - loaded_ >= absl::Seconds(5)) {
      origins_.clear();
      for (const std::string& url : load_()) {
        // Once each: a controller restarted on the same port is listed again.
        if (std::string o = ConsoleOrigin(url);
            !o.empty() && std::find(origins_.begin(), origins_.end(), o) == origins_.end()) {
          origins_.push_back(std::move(o));
        }
      }
      loaded_ = now;
    }
    return origins_;
  }

 private:
  const std::function<std::vector<std::string>()> load_;
  std::mutex mu_;
  absl::Time loaded_ = absl::InfinitePast();
  std::vector<std::string> origins_;
};

std::string OpensslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

// The pages: /assets/<name> from the embedded assets; every page's path
// (a stable URL a person can paste) answers the one HTML shell, whose
// script draws the page the path names.
void ServePage(const httplib::Request& req, httplib::Response& res) {
  auto send = [&res](const ConsoleAsset& a) {
    res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
  };
  if (req.method != "GET" && req.method != "HEAD") {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    return;
  }
  absl::string_view path = req.path;
  if (path == "/") {
    res.status = 302;
    res.set_header("Location", "/jobs");
    return;
  }
  if (absl::ConsumePrefix(&path, "/assets/")) {
    for (const ConsoleAsset& a : ConsoleAssets()) {
      if (path == a.name) return send(a);
    }
  } else {
    static const char* const kPages[] = {"/login",  "/jobs",    "/compare",
                                         "/queues", "/workers", "/plan"};
    for (const char* page : kPages) {
      absl::string_view rest = req.path;
      if (absl::ConsumePrefix(&rest, page) && (rest.empty() || rest[0] == '/')) {
        for (const ConsoleAsset& a : ConsoleAssets()) {
          if (absl::string_view(a.name) == "index.html") return send(a);
        }
      }
    }
  }
  res.status = 404;
  res.set_content("No such page of Loom Console.\n", "text/plain; charset=utf-8");
}

}  // namespace

std::string ConsoleOrigin(absl::string_view url) {
  std::string u = absl::AsciiStrToLower(url);
  absl::string_view rest = u;
  absl::ConsumeSuffix(&rest, "/");
  std::string scheme, default_port;
  if (absl::ConsumePrefix(&rest, "https://")) {
    scheme = "https://";
    default_port = ":443";
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    scheme = "http://";
    default_port = ":80";
  } else {
    return "";
  }
  if (rest.empty()) return "";
  for (char c : rest) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != ':' && c != '[' && c != ']') {
      return "";
    }
  }
  absl::ConsumeSuffix(&rest, default_port);
  return absl::StrCat(scheme, rest);
}

absl::StatusOr<std::unique_ptr<ConsoleServer>> ConsoleServer::Start(
    const ConsoleOptions& options, std::unique_ptr<ApiGateway> gateway) {
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (options.listen.empty() || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("console listen address \"", options.listen, "\" must be \"host:port\""));
  }
  const bool tls = !options.tls_cert_file.empty();
  if (tls != !options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("console TLS needs both a certificate and a key");
  }
  if (!options.advertised_url.empty() && ConsoleOrigin(options.advertised_url).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "console URL \"", options.advertised_url,
        "\" must be \"https://host[:port]\" (or http://), with no path: the pages call "
        "/api/v1/ at its root"));
  }
  if (options.threads < 1) return absl::InvalidArgumentError("console threads must be >= 1");
  if (options.max_streams < 0) return absl::InvalidArgumentError("console streams must be >= 0");

  std::unique_ptr<ConsoleServer> server(new ConsoleServer());
  server->gateway_ = std::move(gateway);
  server->tls_ = tls;
  server->advertised_url_ = ConsoleOrigin(options.advertised_url);
  std::string tls_error;
  if (tls) {
    auto https = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      // The certificate file may hold the chain after the certificate.
      if (SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION) != 1 ||
          SSL_CTX_use_certificate_chain_file(&ctx, options.tls_cert_file.c_str()) != 1 ||
          SSL_CTX_use_PrivateKey_file(&ctx, options.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
          SSL_CTX_check_private_key(&ctx) != 1) {
        tls_error = OpensslError();
        return false;
      }
      return true;
    });
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("console TLS: cannot use ",
                                                     options.tls_cert_file, " and ",
                                                     options.tls_key_file, ": ", tls_error));
    }
    server->http_ = std::move(https);
  } else {
    server->http_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& http = *server->http_;
  const int threads = options.threads + options.max_streams;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // A larger body is answered 413 before the handler runs.
  http.set_payload_max_length(ApiGateway::kMaxBodyBytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  // A reply goes out as headers then body: without TCP_NODELAY a small body
  // waits for the client's delayed ACK of the headers (40 ms on Linux).
  http.set_tcp_nodelay(true);
  // A page makes many requests over one connection: keep it open for 100
  // (cpp-httplib's default closes it after 5).
  http.set_keep_alive_max_count(100);
  httplib::Headers defaults;
  for (const auto& h : kSecurityHeaders) defaults.emplace(h[0], h[1]);
  http.set_default_headers(std::move(defaults));

  const ApiGateway* api = server->gateway_.get();
  auto handle = [api, leader_url = options.leader_url, streams = server->streams_,
                 max_streams = options.max_streams](const httplib::Request& req,
                                                    httplib::Response& res) {
    if (leader_url) {
      if (const std::string leader = leader_url(); !leader.empty()) {
        // A standby: the same request at the leader's console (307 keeps
        // the method and body).
        res.status = 307;
        res.set_header("Location", leader + req.target);
        res.set_header("X-Loom-Leader", leader);
        res.set_content(R"({"code":"UNAVAILABLE","message":"this controller stands by: the )"
                        R"(leader's console is at the Location"})",
                        "application/json; charset=utf-8");
        return;
      }
    }
    ApiRequest request;
    request.method = req.method;
    request.path = req.path;
    if (const size_t q = req.target.find('?'); q != std::string::npos) {
      request.query = req.target.substr(q + 1);
    }
    request.body = req.body;
    request.authorization = req.get_header_value("Authorization");
    request.cookie = req.get_header_value("Cookie");
    request.csrf = req.get_header_value("X-Loom-CSRF");
    request.content_type = req.get_header_value("Content-Type");
    request.last_event_id = req.get_header_value("Last-Event-ID");
    if (ApiGateway::IsStream(request)) {
      ApiReply refused;
      std::shared_ptr<EventStream> stream;
      if (streams->fetch_add(1) >= max_streams) {
        refused.status = 429;
        refused.body = absl::StrCat(
            R"({"code":"RESOURCE_EXHAUSTED","message":"this console has )", max_streams,
            R"( event streams open, its most: close a page, or retry later"})");
      } else {
        stream = api->OpenStream(request, &refused);
      }
      if (stream == nullptr) {
        streams->fetch_sub(1);
        res.status = refused.status;
        for (const auto& [name, value] : refused.headers) res.set_header(name, value);
        res.set_content(std::move(refused.body), "application/json; charset=utf-8");
        return;
      }
      // Proxies (nginx) must pass each event on at once.
      res.set_header("X-Accel-Buffering", "no");
      // Exactly "text/event-stream" (UTF-8 by definition): cpp-httplib
      // compresses any other text/* reply for a browser that accepts br or
      // gzip, and a compressor holds events back until its buffer fills.
      res.set_chunked_content_provider(
          "text/event-stream",
          [stream](size_t, httplib::DataSink& sink) {
            const std::string chunk = stream->Next(absl::Seconds(15));
            if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) return false;
            if (stream->ended()) sink.done();
            return true;
          },
          [stream, streams](bool) mutable {
            stream.reset();  // cancels the call
            streams->fetch_sub(1);
          });
      return;
    }
    if (!absl::StartsWith(req.path, "/api/")) {
      ServePage(req, res);
      return;
    }
    ApiReply reply = api->Handle(request);
    res.status = reply.status;
    for (const auto& [name, value] : reply.headers) res.set_header(name, value);
    res.set_content(std::move(reply.body), "application/json; charset=utf-8");
  };
  // Every reply: the policy, and CORS for a page of a peer console (its
  // own controller gone, it goes on here). Other origins get no CORS
  // headers, so browsers keep their pages out.
  auto peers = std::make_shared<PeerOrigins>(options.peer_origins);
  http.set_post_routing_handler([peers](const httplib::Request& req, httplib::Response& res) {
    const std::vector<std::string> origins = peers->Get();
    res.set_header("Content-Security-Policy", ContentSecurityPolicy(origins));
    res.set_header("Vary", "Origin");
    const std::string origin = ConsoleOrigin(req.get_header_value("Origin"));
    if (origin.empty() || std::find(origins.begin(), origins.end(), origin) == origins.end()) {
      return;
    }
    res.set_header("Access-Control-Allow-Origin", req.get_header_value("Origin"));
    res.set_header("Access-Control-Allow-Credentials", "true");
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE");
      res.set_header("Access-Control-Allow-Headers",
                     "Content-Type, Authorization, X-Loom-CSRF, Last-Event-ID");
      res.set_header("Access-Control-Max-Age", "600");
      res.status = 204;
    }
  });
  // A preflight: answered 204 with the CORS headers above for a peer's page,
  // 403 for any other origin.
  http.Options(".*", [](const httplib::Request&, httplib::Response& res) {
    res.status = 403;
    res.set_content(R"({"code":"PERMISSION_DENIED","message":"cross-origin requests are )"
                    R"(answered only for the pages of this store's other consoles"})",
                    "application/json; charset=utf-8");
  });
  http.Get(".*", handle);
  http.Post(".*", handle);
  http.Put(".*", handle);
  http.Patch(".*", handle);
  http.Delete(".*", handle);
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content(R"({"code":"INTERNAL","message":"the console failed this request"})",
                        "application/json; charset=utf-8");
      });

  const std::string host = options.listen.substr(0, colon);
  const int bound =
      port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               " for the console (in use, or not an address "
                                               "of this host)"));
  }
  server->host_ = host;
  server->port_ = bound;
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  return server;
}

ConsoleServer::~ConsoleServer() {
  if (http_ != nullptr) http_->stop();
  if (listener_.joinable()) listener_.join();
}

std::string ConsoleServer::address() const { return absl::StrCat(host_, ":", port_); }

std::string ConsoleServer::url() const {
  if (!advertised_url_.empty()) return advertised_url_;
  return absl::StrCat(tls_ ? "https://" : "http://", host_ == "0.0.0.0" ? "127.0.0.1" : host_, ":",
                      port_);
}

absl::StatusOr<std::unique_ptr<ConsoleServer>> StartControllerConsole(
    const std::string& listen, const std::string& advertised_url, const std::string& cert,
    const std::string& key, grpc::Server* server, Store* store, ConsoleSessions* sessions,
    const Leadership* leadership, const std::string& holder) {
  if (sessions->lifetime() <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--console_session_lifetime: must be > 0");
  }
  GatewayOptions gateway;
  gateway.sessions = sessions;
  gateway.secure_cookies = !cert.empty();
  // Consoles seen in the last week: a page tries them in turn when its own
  // controller stops answering.
  auto consoles = [store] {
    auto urls = store->LoadConsoles(absl::ToUnixMillis(absl::Now() - absl::Hours(24 * 7)));
    return urls.ok() ? *std::move(urls) : std::vector<std::string>();
  };
  gateway.consoles = consoles;
  ConsoleOptions options;
  options.listen = listen;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  options.leader_url = [leadership] { return leadership->leader_console_url(); };
  options.advertised_url = advertised_url;
  options.peer_origins = consoles;
  auto started = ConsoleServer::Start(
      options, std::make_unique<ApiGateway>(server->InProcessChannel(grpc::ChannelArguments()),
                                            std::move(gateway)));
  if (!started.ok()) return started.status();
  if (absl::Status s =
          store->PutConsole(holder, (*started)->url(), absl::ToUnixMillis(absl::Now()));
      !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot record the console's URL in the store: ", s.message()));
  }
  return started;
}

}  // namespace loom::controller::console
