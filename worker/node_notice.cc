#include "worker/node_notice.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "httplib.h"

namespace loom::worker {
namespace {

constexpr size_t kMaxDetail = 512;

std::string Clip(std::string s) {
  if (s.size() > kMaxDetail) s.resize(kMaxDetail);
  return s;
}

}  // namespace

NodeNoticeWatcher::NodeNoticeWatcher(NodeNoticeOptions options) : options_(std::move(options)) {
  if (!options_.file.empty() || !options_.url.empty()) thread_ = std::thread([this] { Run(); });
}

NodeNoticeWatcher::~NodeNoticeWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

// Keeps `*held` while a notice goes on (its first deadline, or a sooner
// one); `now_says` empty withdraws it.
void Hold(std::optional<loom::v1::NodeNotice>* held, std::optional<loom::v1::NodeNotice> now_says) {
  if (!now_says) {
    held->reset();
  } else if (!*held || now_says->deadline_unix_ms() < (*held)->deadline_unix_ms()) {
    *held = std::move(now_says);
  }
}

}  // namespace

void NodeNoticeWatcher::Raise(loom::v1::NodeNotice notice) {
  std::lock_guard<std::mutex> lock(mu_);
  Hold(&raised_, std::move(notice));
}

std::optional<loom::v1::NodeNotice> NodeNoticeWatcher::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<loom::v1::NodeNotice> out;
  for (const auto* n : {&raised_, &file_, &url_}) {
    if (*n && (!out || (*n)->deadline_unix_ms() < out->deadline_unix_ms())) out = **n;
  }
  return out;
}

loom::v1::NodeNotice NodeNoticeWatcher::FromFile(const std::string& content, absl::Time now,
                                                 absl::Duration default_notice) {
  loom::v1::NodeNotice n;
  n.set_source("file");
  const std::string text(absl::StripAsciiWhitespace(content));
  absl::Time deadline = now + default_notice;
  int64_t seconds = 0;
  absl::Time at;
  std::string err;
  if (absl::SimpleAtoi(text, &seconds) && seconds >= 0) {
    deadline = now + absl::Seconds(seconds);
  } else if (!text.empty() && absl::ParseTime(absl::RFC3339_full, text, &at, &err)) {
    deadline = at;
  }
  n.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  n.set_detail(Clip(text.empty() ? "the notice file appeared"
                                 : absl::StrCat("the notice file says ", text)));
  return n;
}

std::optional<loom::v1::NodeNotice> NodeNoticeWatcher::FromMetadata(int status,
                                                                    const std::string& body,
                                                                    absl::Time now) {
  if (status != 200) return std::nullopt;  // AWS: 404 until there is a notice
  const std::string text(absl::StripAsciiWhitespace(body));
  loom::v1::NodeNotice n;
  if (absl::EqualsIgnoreCase(text, "TRUE")) {
    // GCE's preemption: about 30 s from the flag to the stop.
    n.set_source("gce-preemption");
    n.set_deadline_unix_ms(absl::ToUnixMillis(now + absl::Seconds(30)));
    n.set_detail("instance/preempted is TRUE");
    return n;
  }
  if (absl::EqualsIgnoreCase(text, "FALSE") || text.empty()) return std::nullopt;
  google::protobuf::Struct json;
  if (!google::protobuf::util::JsonStringToMessage(text, &json).ok()) return std::nullopt;
  const auto& f = json.fields();
  auto action = f.find("action");
  auto time = f.find("time");
  if (action == f.end() || time == f.end()) return std::nullopt;
  absl::Time at;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, time->second.string_value(), &at, &err)) {
    return std::nullopt;
  }
  n.set_source("aws-spot");
  n.set_deadline_unix_ms(absl::ToUnixMillis(at));
  n.set_detail(Clip(absl::StrCat("spot instance-action ", action->second.string_value(), " at ",
                                 time->second.string_value())));
  return n;
}

void NodeNoticeWatcher::CheckOnce() {
  const absl::Time now = absl::Now();
  if (!options_.file.empty()) {
    std::optional<loom::v1::NodeNotice> says;
    if (std::ifstream in(options_.file); in) {
      std::stringstream content;
      content << in.rdbuf();
      says = FromFile(content.str(), now, options_.default_notice);
    }
    std::lock_guard<std::mutex> lock(mu_);
    Hold(&file_, std::move(says));
  }
  if (!options_.url.empty() && now >= next_url_) {
    next_url_ = now + options_.url_interval;
    // http://host[:port]/path
    absl::string_view url = options_.url;
    if (!absl::ConsumePrefix(&url, "http://")) return;
    const size_t slash = url.find('/');
    const std::string host(url.substr(0, slash));
    const std::string path(slash == absl::string_view::npos ? "/" : url.substr(slash));
    httplib::Client client(absl::StrCat("http://", host));
    client.set_connection_timeout(1, 0);
    client.set_read_timeout(1, 0);
    // GCE answers only requests that carry this header; AWS ignores it.
    httplib::Result r = client.Get(path, {{"Metadata-Flavor", "Google"}});
    if (!r) return;  // unreachable: the last answer stands
    std::optional<loom::v1::NodeNotice> says = FromMetadata(r->status, r->body, now);
    std::lock_guard<std::mutex> lock(mu_);
    Hold(&url_, std::move(says));
  }
}

void NodeNoticeWatcher::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    CheckOnce();
    lock.lock();
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.poll_interval),
                 [this] { return stop_; });
  }
}

}  // namespace loom::worker
