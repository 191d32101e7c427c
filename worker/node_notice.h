// NodeNoticeWatcher: learns that this worker's node is going away, before it
// goes, from what the platform says:
//   - a file that appears (--notice_file; a preStop hook, an operator or a
//     node agent writes it): empty, a count of seconds left, or an RFC 3339
//     time;
//   - an HTTP metadata endpoint polled every second (--notice_url), in the
//     shapes of AWS's spot `instance-action` (404 until a notice, then
//     {"action": "terminate", "time": "2026-12-07T08:22:00Z"}) and GCE's
//     `instance/preempted` ("FALSE", then "TRUE": about 30 s left);
//   - the worker's own SIGTERM (Raise, from worker_main).
// A file's or an endpoint's notice holds while it says so (the file exists,
// the endpoint answers one): taken back, it is withdrawn, and the worker's
// heartbeats stop carrying it. A raised one (SIGTERM) holds for good. The
// notice in force is the soonest of those. Thread-safe; the polling runs on
// its own thread until the watcher is destroyed.
#ifndef LOOM_WORKER_NODE_NOTICE_H_
#define LOOM_WORKER_NODE_NOTICE_H_

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "loom/v1/service.pb.h"

namespace loom::worker {

struct NodeNoticeOptions {
  std::string file;  // empty: no file watched
  std::string url;   // http://host[:port]/path; empty: nothing polled
  // What a notice that names no deadline leaves (a file that is empty, a
  // SIGTERM: Kubernetes' default grace is 30 s).
  absl::Duration default_notice = absl::Seconds(30);
  // How often the file is looked at, and the endpoint asked (AWS suggests
  // every 5 s; a notice gives 30 s to 2 minutes).
  absl::Duration poll_interval = absl::Milliseconds(250);
  absl::Duration url_interval = absl::Seconds(1);
};

class NodeNoticeWatcher {
 public:
  explicit NodeNoticeWatcher(NodeNoticeOptions options);
  ~NodeNoticeWatcher();
  NodeNoticeWatcher(const NodeNoticeWatcher&) = delete;
  NodeNoticeWatcher& operator=(const NodeNoticeWatcher&) = delete;

  // A notice from elsewhere (the worker's SIGTERM): it holds for good (a
  // sooner one replaces it).
  void Raise(loom::v1::NodeNotice notice);
  // The notice in force (the soonest deadline), if any.
  std::optional<loom::v1::NodeNotice> Current();

  // The notice a file's content gives, read at `now` (tests).
  static loom::v1::NodeNotice FromFile(const std::string& content, absl::Time now,
                                       absl::Duration default_notice);
  // The notice a metadata answer gives (HTTP `status` and `body`), or none.
  static std::optional<loom::v1::NodeNotice> FromMetadata(int status, const std::string& body,
                                                          absl::Time now);

 private:
  void Run();
  void CheckOnce();

  const NodeNoticeOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                           // guarded by mu_
  absl::Time next_url_ = absl::InfinitePast();  // when to ask the endpoint next (polling thread)
  // Each source's notice; the file's and the endpoint's first deadline is
  // kept while they go on saying so.
  std::optional<loom::v1::NodeNotice> raised_;  // guarded by mu_
  std::optional<loom::v1::NodeNotice> file_;    // guarded by mu_
  std::optional<loom::v1::NodeNotice> url_;     // guarded by mu_
  std::thread thread_;                          // last: started once the rest is built
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_NODE_NOTICE_H_
