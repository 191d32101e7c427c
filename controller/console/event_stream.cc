#include "controller/console/event_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/console/api_gateway.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace loom::controller::console {
namespace {

const char* KindOf(const loom::v1::JobEvent& event) {
  switch (event.event_case()) {
    case loom::v1::JobEvent::kTransition:
      return "transition";
    case loom::v1::JobEvent::kStep:
      return "step";
    case loom::v1::JobEvent::kCheckpoint:
      return "checkpoint";
    case loom::v1::JobEvent::kRecovery:
      return "recovery";
    default:
      return "job";
  }
}

}  // namespace

EventStream::EventStream(std::unique_ptr<grpc::ClientContext> ctx,
                         std::function<std::unique_ptr<Reader>(grpc::ClientContext*)> start)
    : ctx_(std::move(ctx)) {
  reader_ = std::thread([this, start = std::move(start)] { Read(start); });
}

EventStream::~EventStream() {
  ctx_->TryCancel();
  if (reader_.joinable()) reader_.join();
}

std::string EventStream::Format(const loom::v1::JobEvent& event) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (event.has_step() && event.has_job()) {
    // A step comes ten times a second: it carries the job's id, state,
    // generation and summary, not its spec, plan and history (a few KB,
    // sent again with every other kind of event).
    loom::v1::JobEvent slim = event;
    loom::v1::Job* job = slim.mutable_job();
    loom::v1::Job kept;
    kept.set_id(job->id());
    kept.set_state(job->state());
    kept.set_generation(job->generation());
    *kept.mutable_summary() = job->summary();
    *job = std::move(kept);
    (void)google::protobuf::util::MessageToJsonString(slim, &json, options);
  } else {
    (void)google::protobuf::util::MessageToJsonString(event, &json, options);
  }
  // Protobuf's JSON has no raw line breaks (they are escaped in strings),
  // so one data line carries it.
  return absl::StrCat(event.seq() > 0 ? absl::StrCat("id: ", event.seq(), "\n") : "",
                      "event: ", KindOf(event), "\ndata: ", json, "\n\n");
}

void EventStream::Read(std::function<std::unique_ptr<Reader>(grpc::ClientContext*)> start) {
  std::unique_ptr<Reader> reader = start(ctx_.get());
  loom::v1::JobEvent event;
  bool overflow = false;
  while (reader->Read(&event)) {
    std::string text = Format(event);
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_.size() >= kMaxQueued) {
      overflow = true;
      ctx_->TryCancel();
      break;
    }
    queued_.push_back(std::move(text));
    cv_.notify_one();
  }
  const grpc::Status status = reader->Finish();
  google::protobuf::Value message;
  message.set_string_value(overflow ? absl::StrCat("more than ", kMaxQueued,
                                                   " events waited for this page: reconnect with "
                                                   "Last-Event-ID")
                                    : status.error_message());
  std::string message_json;
  (void)google::protobuf::util::MessageToJsonString(message, &message_json);
  const std::string json = absl::StrCat(
      "{\"code\":\"", overflow ? "RESOURCE_EXHAUSTED" : ApiGateway::CodeName(status.error_code()),
      "\",\"message\":", message_json, "}");
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back(absl::StrCat("event: end\ndata: ", json, "\n\n"));
  done_ = true;
  cv_.notify_one();
}

std::string EventStream::Next(absl::Duration idle) {
  std::unique_lock<std::mutex> lock(mu_);
  std::string out;
  if (!started_) {
    started_ = true;
    out = "retry: 2000\n\n";
  }
  if (out.empty()) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(idle),
                 [this] { return !queued_.empty() || done_; });
  }
  while (!queued_.empty()) {
    out += queued_.front();
    queued_.pop_front();
  }
  if (out.empty() && !done_) out = ": idle\n\n";
  return out;
}

bool EventStream::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && queued_.empty();
}

}  // namespace loom::controller::console
