// EventStream: one Server-Sent Events stream of Loom Console, read from a
// WatchJob or WatchEvents call to this controller (in process, with the
// caller's credentials, like every console route).
//
//   GET /api/v1/events:stream             WatchEvents: every job's logged events
//   GET /api/v1/jobs/{id}/events:stream   WatchJob: the job's logged events and,
//                                         live, its steps
//
// Where it starts: after the Last-Event-ID header's seq (what a browser's
// EventSource sends when it reconnects), or the after_seq query parameter:
// every logged event after it, then live, so a page that reconnects (to
// this controller or, across a failover, to the next leader) misses no
// logged event and gets none twice. Without either: the job's history (its
// logged events and newest 200 steps) then live; every job's events from
// now on.
//
// The stream's text: "retry: 2000" first (a dropped page reconnects within
// 2 s); then per event "id: <seq>" (logged events only: a step is not
// logged and has none, so a reconnect resumes after the last logged event),
// "event: transition|step|checkpoint|recovery|job" and "data: <the
// JobEvent in protobuf's JSON mapping, proto field names>", a step's `job`
// cut to its id, state, generation and summary; a comment line
// when nothing was sent for a while, which keeps proxies from closing the
// stream and finds a page that went away. When the call ends (a job's
// stream ends with the job; the controller stops or steps down) the last
// event is "event: end" with {"code", "message"}.
//
// Thread-safe: Next runs on the HTTP thread; the call is read on a thread
// of this object's own.
#ifndef LOOM_CONTROLLER_CONSOLE_EVENT_STREAM_H_
#define LOOM_CONTROLLER_CONSOLE_EVENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "loom/v1/service.grpc.pb.h"

namespace loom::controller::console {

class EventStream {
 public:
  using Reader = grpc::ClientReaderInterface<loom::v1::JobEvent>;
  // Events held for a page that reads slower than they come; past it the
  // stream ends (the page reconnects and resumes from its last seq).
  static constexpr size_t kMaxQueued = 10000;

  // Starts reading: `start` begins the call on `ctx` (which carries the
  // credentials) and returns its reader.
  EventStream(std::unique_ptr<grpc::ClientContext> ctx,
              std::function<std::unique_ptr<Reader>(grpc::ClientContext*)> start);
  // Cancels the call and waits for the reading thread.
  ~EventStream();
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;

  // What to send next: every event queued, as SSE text; after `idle` with
  // none, a comment line. "" once the stream has ended and all of it was
  // taken (ended() is then true).
  std::string Next(absl::Duration idle);
  bool ended() const;

  // One event as SSE text.
  static std::string Format(const loom::v1::JobEvent& event);

 private:
  void Read(std::function<std::unique_ptr<Reader>(grpc::ClientContext*)> start);

  std::unique_ptr<grpc::ClientContext> ctx_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queued_;  // guarded by mu_
  bool done_ = false;               // guarded by mu_: the call ended
  bool started_ = false;            // guarded by mu_: "retry:" sent
  std::thread reader_;
};

}  // namespace loom::controller::console

#endif  // LOOM_CONTROLLER_CONSOLE_EVENT_STREAM_H_
