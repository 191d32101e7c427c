#include "common/object_store/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace loom::object_store {

struct S3Client::Request {
  const char* method = "GET";
  std::string bucket;
  std::string key;  // empty: the bucket itself
  // Query parameters, unencoded; sorted and encoded when sent.
  std::vector<std::pair<std::string, std::string>> query;
  absl::string_view body;
  std::string content_type;
  // GET: where the body goes (else it is kept in the response).
  const std::function<absl::Status(absl::string_view)>* sink = nullptr;
  // Statuses that count as success besides 2xx (DeleteObject's 404).
  std::vector<long> also_ok;
  std::string range;  // GET: "bytes=FIRST-LAST", or empty for the whole object
};

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  const std::function<absl::Status(absl::string_view)>* sink = nullptr;
  CURL* curl = nullptr;
  std::string body;  // the response body (errors, XML), unless sunk
  std::string etag;
  uint64_t content_length = 0;
  bool sank = false;  // the sink got bytes: no retry
  absl::Status sink_error;
  const std::atomic<bool>* cancel = nullptr;
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  absl::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (name == "etag") {
      t->etag = std::string(absl::StripSuffix(absl::StripPrefix(value, "\""), "\""));
    } else if (name == "content-length") {
      uint64_t v = 0;
      if (absl::SimpleAtoi(value, &v)) t->content_length = v;
    }
  }
  return size * n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return (t->cancel != nullptr && t->cancel->load()) ? 1 : 0;
}

std::string ErrorDetail(long status, absl::string_view body) {
  std::string code = XmlValue(body, "Code");
  std::string message = XmlValue(body, "Message");
  std::string out = absl::StrCat("HTTP ", status);
  if (!code.empty()) absl::StrAppend(&out, " ", code);
  if (!message.empty()) absl::StrAppend(&out, ": ", message);
  return out;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  absl::string_view piece(data, size * n);
  if (t->sink != nullptr && status >= 200 && status < 300) {
    t->sank = true;
    absl::Status s = (*t->sink)(piece);
    if (!s.ok()) {
      t->sink_error = s;
      return 0;  // ends the transfer
    }
    return piece.size();
  }
  // An error body is small XML; bound it anyway.
  if (t->body.size() < (1 << 20)) t->body.append(piece.data(), piece.size());
  return piece.size();
}

}  // namespace

std::string UriEncode(absl::string_view s, bool encode_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && !encode_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::vector<absl::string_view> XmlBlocks(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> out;
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  size_t pos = 0;
  while (true) {
    const size_t b = xml.find(open, pos);
    if (b == absl::string_view::npos) break;
    const size_t e = xml.find(close, b + open.size());
    if (e == absl::string_view::npos) break;
    out.push_back(xml.substr(b + open.size(), e - b - open.size()));
    pos = e + close.size();
  }
  return out;
}

std::string XmlValue(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> blocks = XmlBlocks(xml, tag);
  if (blocks.empty()) return "";
  return absl::StrReplaceAll(blocks.front(), {{"&lt;", "<"},
                                              {"&gt;", ">"},
                                              {"&quot;", "\""},
                                              {"&apos;", "'"},
                                              {"&#34;", "\""},
                                              {"&amp;", "&"}});
}

S3Client::S3Client(S3Config config, S3ClientOptions options)
    : config_(std::move(config)), options_(options) {
  GlobalInit();
}

std::string S3Client::Url(const std::string& bucket, const std::string& key,
                          const std::string& query) const {
  std::string url;
  if (config_.path_style) {
    url = absl::StrCat(config_.endpoint, "/", bucket);
    if (!key.empty()) absl::StrAppend(&url, "/", UriEncode(key, false));
  } else {
    absl::string_view rest = config_.endpoint;
    const size_t scheme_end = rest.find("://");
    url = absl::StrCat(rest.substr(0, scheme_end + 3), bucket, ".", rest.substr(scheme_end + 3),
                       "/", UriEncode(key, false));
  }
  if (!query.empty()) absl::StrAppend(&url, "?", query);
  return url;
}

absl::StatusOr<S3Client::Response> S3Client::SendOnce(const Request& request, bool* retryable) {
  *retryable = false;
  // The canonical query: sorted by name, names and values encoded, "k=" for
  // an empty value, exactly as SigV4 signs it (libcurl signs the query it is
  // given).
  std::vector<std::pair<std::string, std::string>> q = request.query;
  std::sort(q.begin(), q.end());
  std::string query;
  for (const auto& [k, v] : q) {
    if (!query.empty()) query += '&';
    absl::StrAppend(&query, UriEncode(k, true), "=", UriEncode(v, true));
  }
  const std::string url = Url(request.bucket, request.key, query);
  const std::string what = absl::StrCat(request.method, " s3://", request.bucket,
                                        request.key.empty() ? "" : "/", request.key);

  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("libcurl: curl_easy_init failed");
  Transfer t;
  t.sink = request.sink;
  t.curl = curl;
  t.cancel = options_.cancel;
  curl_slist* headers = nullptr;
  const std::string payload_hash = Sha256Hex(request.body);
  headers = curl_slist_append(headers, ("x-amz-content-sha256: " + payload_hash).c_str());
  if (!config_.session_token.empty()) {
    headers =
        curl_slist_append(headers, ("x-amz-security-token: " + config_.session_token).c_str());
  }
  if (!request.content_type.empty()) {
    headers = curl_slist_append(headers, ("Content-Type: " + request.content_type).c_str());
  }
  if (!request.range.empty()) {
    headers = curl_slist_append(headers, ("Range: " + request.range).c_str());
  }
  const std::string sigv4 = absl::StrCat("aws:amz:", config_.region, ":s3");
  const std::string userpwd = absl::StrCat(config_.access_key_id, ":", config_.secret_access_key);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  // Large socket reads and writes: a checkpoint moves in 16 MiB bodies, and
  // libcurl's defaults (16 KiB in, 64 KiB out) cost a system call each.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
  // libcurl's own account of a failure ("Operation too slow. Less than 1024
  // bytes/sec transferred the last 30 seconds") says more than its code's.
  char curl_error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options_.low_speed_bytes));
  curl_easy_setopt(
      curl, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.low_speed_time))));
  if (options_.max_send_bytes_per_second > 0) {
    curl_easy_setopt(curl, CURLOPT_MAX_SEND_SPEED_LARGE,
                     static_cast<curl_off_t>(options_.max_send_bytes_per_second));
  }
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  const absl::string_view method = request.method;
  if (method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (method == "PUT" || method == "POST") {
    // The body from memory (libcurl copies nothing); PUT as a custom verb.
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    if (method == "PUT") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method);
  }
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);

  if (!t.sink_error.ok()) return t.sink_error;
  if (rc == CURLE_ABORTED_BY_CALLBACK) {
    return absl::CancelledError(absl::StrCat(what, ": cancelled"));
  }
  if (rc != CURLE_OK) {
    *retryable = !t.sank;
    return absl::UnavailableError(absl::StrCat(
        what, " (", config_.endpoint,
        "): no answer: ", curl_error[0] != '\0' ? curl_error : curl_easy_strerror(rc)));
  }
  if ((status >= 200 && status < 300) ||
      std::find(request.also_ok.begin(), request.also_ok.end(), status) != request.also_ok.end()) {
    Response out;
    out.http_status = status;
    out.body = std::move(t.body);
    if (method == "HEAD")
      out.body = absl::StrCat(t.content_length, " ", t.etag);
    else if (!t.etag.empty() && out.body.empty())
      out.body = t.etag;
    return out;
  }
  const std::string detail = absl::StrCat(what, ": ", ErrorDetail(status, t.body));
  if (status == 403) {
    return absl::PermissionDeniedError(
        absl::StrCat(detail, " (the store refused the credentials from ",
                     config_.credentials_source, " for bucket \"", request.bucket, "\")"));
  }
  if (status == 404) return absl::NotFoundError(detail);
  if (status == 416) return absl::OutOfRangeError(detail);  // a range past the object's end
  if (status >= 500 || status == 429 || status == 408) {
    *retryable = !t.sank;
    return absl::UnavailableError(detail);
  }
  return absl::InvalidArgumentError(detail);
}

absl::StatusOr<S3Client::Response> S3Client::Send(const Request& request) {
  absl::Duration backoff = options_.initial_backoff;
  absl::Status last;
  for (int attempt = 1;; ++attempt) {
    bool retryable = false;
    absl::StatusOr<Response> r = SendOnce(request, &retryable);
    if (r.ok() || !retryable || attempt >= options_.max_attempts) {
      if (!r.ok() && retryable) {
        return absl::UnavailableError(
            absl::StrCat(r.status().message(), " (after ", attempt, " tries)"));
      }
      return r;
    }
    // Sleep in small steps so that a cancel ends the wait.
    const absl::Time until = absl::Now() + backoff;
    while (absl::Now() < until) {
      if (options_.cancel != nullptr && options_.cancel->load()) {
        return absl::CancelledError(r.status().message());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status S3Client::CreateBucket(const std::string& bucket) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  std::string body;
  if (config_.region != "us-east-1") {
    body = absl::StrCat(
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>",
        config_.region, "</LocationConstraint></CreateBucketConfiguration>");
    r.content_type = "application/xml";
  }
  r.body = body;
  absl::StatusOr<Response> resp = Send(r);
  if (!resp.ok() && absl::StrContains(resp.status().message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return resp.status();
}

absl::Status S3Client::PutObject(const std::string& bucket, const std::string& key,
                                 absl::string_view body) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.body = body;
  r.content_type = "application/octet-stream";
  return Send(r).status();
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(const std::string& bucket,
                                                            const std::string& key) {
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploads", ""}};
  r.content_type = "application/octet-stream";
  absl::StatusOr<Response> resp = Send(r);
  if (!resp.ok()) return resp.status();
  std::string id = XmlValue(resp->body, "UploadId");
  if (id.empty()) {
    return absl::InternalError(
        absl::StrCat("POST s3://", bucket, "/", key, "?uploads: the answer has no UploadId"));
  }
  return id;
}

absl::StatusOr<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, int part_number,
                                                 absl::string_view body) {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  r.body = body;
  r.content_type = "application/octet-stream";
  absl::StatusOr<Response> resp = Send(r);
  if (!resp.ok()) return resp.status();
  if (resp->body.empty()) {
    return absl::InternalError(absl::StrCat("PUT s3://", bucket, "/", key, " part ", part_number,
                                            ": the answer has no ETag"));
  }
  return resp->body;
}

absl::Status S3Client::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                               const std::string& upload_id,
                                               const std::vector<std::string>& part_etags) {
  std::string body = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < part_etags.size(); ++i) {
    absl::StrAppend(&body, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>\"", part_etags[i],
                    "\"</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  r.body = body;
  r.content_type = "application/xml";
  absl::StatusOr<Response> resp = Send(r);
  if (!resp.ok()) return resp.status();
  // S3 may answer 200 with an error in the body (a failure after it began
  // to answer).
  if (absl::StrContains(resp->body, "<Error>")) {
    return absl::UnavailableError(
        absl::StrCat("POST s3://", bucket, "/", key, "?uploadId: ", ErrorDetail(200, resp->body)));
  }
  return absl::OkStatus();
}

absl::Status S3Client::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                            const std::string& upload_id) {
  Request r;
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  r.also_ok = {404};
  return Send(r).status();
}

absl::Status S3Client::GetObject(const std::string& bucket, const std::string& key,
                                 const std::function<absl::Status(absl::string_view)>& sink) {
  Request r;
  r.bucket = bucket;
  r.key = key;
  r.sink = &sink;
  return Send(r).status();
}

absl::StatusOr<std::string> S3Client::GetObject(const std::string& bucket, const std::string& key) {
  std::string out;
  std::function<absl::Status(absl::string_view)> sink = [&](absl::string_view piece) {
    out.append(piece.data(), piece.size());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(GetObject(bucket, key, sink));
  return out;
}

absl::StatusOr<std::string> S3Client::GetObjectRange(const std::string& bucket,
                                                     const std::string& key, uint64_t offset,
                                                     uint64_t length) {
  if (length == 0) return std::string();
  Request r;
  r.bucket = bucket;
  r.key = key;
  r.range = absl::StrCat("bytes=", offset, "-", offset + length - 1);
  std::string out;
  out.reserve(length);
  std::function<absl::Status(absl::string_view)> sink = [&](absl::string_view piece) {
    if (out.size() + piece.size() > length) {
      return absl::OutOfRangeError(absl::StrCat("GET s3://", bucket, "/", key, " ", r.range,
                                                ": more than ", length, " bytes"));
    }
    out.append(piece.data(), piece.size());
    return absl::OkStatus();
  };
  r.sink = &sink;
  RETURN_IF_ERROR(Send(r).status());
  if (out.size() != length) {
    return absl::OutOfRangeError(absl::StrCat("GET s3://", bucket, "/", key, " ", r.range, ": ",
                                              out.size(), " bytes, not ", length));
  }
  return out;
}

absl::StatusOr<ObjectInfo> S3Client::HeadObject(const std::string& bucket, const std::string& key) {
  Request r;
  r.method = "HEAD";
  r.bucket = bucket;
  r.key = key;
  absl::StatusOr<Response> resp = Send(r);
  if (!resp.ok()) return resp.status();
  ObjectInfo info;
  info.key = key;
  const size_t space = resp->body.find(' ');
  (void)absl::SimpleAtoi(resp->body.substr(0, space), &info.size);
  if (space != std::string::npos) info.etag = resp->body.substr(space + 1);
  return info;
}

absl::StatusOr<std::vector<ObjectInfo>> S3Client::ListObjects(const std::string& bucket,
                                                              const std::string& prefix,
                                                              int page_size) {
  std::vector<ObjectInfo> out;
  std::string token;
  for (int page = 0; page < 100000; ++page) {
    Request r;
    r.bucket = bucket;
    r.query = {{"list-type", "2"}, {"max-keys", std::to_string(page_size)}, {"prefix", prefix}};
    if (!token.empty()) r.query.push_back({"continuation-token", token});
    absl::StatusOr<Response> resp = Send(r);
    if (!resp.ok()) return resp.status();
    for (absl::string_view block : XmlBlocks(resp->body, "Contents")) {
      ObjectInfo info;
      info.key = XmlValue(block, "Key");
      (void)absl::SimpleAtoi(XmlValue(block, "Size"), &info.size);
      info.etag =
          std::string(absl::StripSuffix(absl::StripPrefix(XmlValue(block, "ETag"), "\""), "\""));
      out.push_back(std::move(info));
    }
    if (XmlValue(resp->body, "IsTruncated") != "true") break;
    token = XmlValue(resp->body, "NextContinuationToken");
    if (token.empty()) break;
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

absl::Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) {
  Request r;
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  r.also_ok = {404};
  return Send(r).status();
}

}  // namespace loom::object_store
