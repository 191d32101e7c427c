// Serves registered metrics over HTTP for Prometheus to scrape, like
// prometheus-cpp's Exposer. Backed by civetweb.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Exposer> exposer,
//                    Exposer::Start("0.0.0.0:9400"));
//   exposer->RegisterCollectable(registry);  // std::shared_ptr<Registry>
//
// GET (or HEAD) /metrics answers 200 with the text exposition format of every
// registered collectable (see SerializeText for how they are merged) and
// Content-Type kTextContentType. Other paths answer 404; other methods on
// /metrics answer 405.
#ifndef LOOM_COMMON_METRICS_SERVER_H_
#define LOOM_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

struct mg_connection;
struct mg_context;

namespace loom {
namespace metrics {

// Thread-safe: RegisterCollectable and RemoveCollectable may be called while
// scrapes run on civetweb's worker threads. The destructor stops the server
// and waits for in-flight requests; after it returns, no collectable is
// touched again.
class Exposer {
 public:
  // Server threads when not given: enough for Prometheus plus a curl.
  static constexpr int kDefaultNumThreads = 2;

  // Listens on `bind_address`: "ipv4:port" ("127.0.0.1:9400") or just
  // "port" for every interface. IPv4 only: Debian's civetweb is built
  // without IPv6. Port 0 picks a free port; read it back with port().
  // Returns INVALID_ARGUMENT for a malformed address, one listing several
  // ports (civetweb's "a,b" syntax) or num_threads < 1, and UNAVAILABLE with
  // civetweb's reason when the socket cannot be bound (most often: the port
  // is already in use).
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(
      const std::string& bind_address, int num_threads = kDefaultNumThreads);

  ~Exposer();
  Exposer(const Exposer&) = delete;
  Exposer& operator=(const Exposer&) = delete;

  // Adds `collectable` to what /metrics serves. The Exposer does not keep it
  // alive: once the owner drops it, it is skipped and forgotten. A
  // std::weak_ptr<Registry> converts implicitly.
  void RegisterCollectable(std::weak_ptr<Collectable> collectable);
  // Stops serving `collectable` (compared by owner); unknown ones are ignored.
  void RemoveCollectable(const std::weak_ptr<Collectable>& collectable);

  // The port actually bound, as reported by civetweb (never 0).
  int port() const { return port_; }
  // "host:port" with the bound port, e.g. "127.0.0.1:39211"; host is
  // "0.0.0.0" when bind_address named only a port.
  std::string address() const;

 private:
  Exposer() = default;

  // civetweb's begin_request callback; `user_data` is the Exposer.
  static int HandleRequest(mg_connection* connection);
  // Serializes every live collectable, pruning expired ones.
  std::string Scrape();

  // Set by Start() before the Exposer is returned, constant afterwards.
  // civetweb's threads use only mu_ and collectables_.
  mg_context* context_ = nullptr;  // Owned; mg_stop() in the destructor.
  std::string host_;
  int port_ = 0;

  absl::Mutex mu_;
  std::vector<std::weak_ptr<Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace metrics
}  // namespace loom

#endif  // LOOM_COMMON_METRICS_SERVER_H_
