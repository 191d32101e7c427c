// A small client of the S3 API over libcurl: the calls Loom's checkpoint tier
// needs, against AWS or any S3-compatible store. Requests are signed with
// AWS Signature Version 4 by libcurl itself (CURLOPT_AWS_SIGV4); every
// payload is hashed (x-amz-content-sha256), so a store that checks it
// refuses a body that changed on the way.
//
// Errors, for every call (the message names the object, the HTTP status and
// the store's own <Code> and <Message>):
//   PERMISSION_DENIED   403: the credentials were refused (not retried)
//   NOT_FOUND           404: no such key, bucket or upload
//   OUT_OF_RANGE        416: a range past the object's end
//   INVALID_ARGUMENT    other 4xx
//   UNAVAILABLE         5xx, 429, or no answer (connection refused, reset,
//                       a transfer slower than low_speed_bytes per second
//                       for low_speed_time): retried with exponential
//                       backoff up to max_attempts, then returned
//   CANCELLED           `cancel` (ClientOptions) became true
//
// Thread-safe: calls may run on many threads at once (each call uses its own
// libcurl handle).
#ifndef LOOM_COMMON_OBJECT_STORE_S3_CLIENT_H_
#define LOOM_COMMON_OBJECT_STORE_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/object_store/s3_config.h"

namespace loom::object_store {

struct S3ClientOptions {
  int max_attempts = 5;  // tries of one request before UNAVAILABLE
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(5);
  // A transfer slower than this many bytes a second for this long fails
  // (and is retried): a stalled store is an error, not a hang.
  int64_t low_speed_bytes = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);
  // Upper bound on one request's send rate, bytes a second (0: none).
  int64_t max_send_bytes_per_second = 0;
  // Set to true (by another thread) to make calls give up: CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

class S3Client {
 public:
  explicit S3Client(S3Config config, S3ClientOptions options = {});

  const S3Config& config() const { return config_; }

  // Creates a bucket (tests, tools). OK if this account already owns it.
  absl::Status CreateBucket(const std::string& bucket);

  absl::Status PutObject(const std::string& bucket, const std::string& key, absl::string_view body);

  // Multipart upload: Create, then UploadPart for parts 1..N (each but the
  // last at least 5 MiB on AWS), then Complete with their ETags in order, or
  // Abort. Complete makes the object appear whole at once.
  absl::StatusOr<std::string> CreateMultipartUpload(const std::string& bucket,
                                                    const std::string& key);
  // Returns the part's ETag.
  absl::StatusOr<std::string> UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int part_number,
                                         absl::string_view body);
  absl::Status CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                       const std::string& upload_id,
                                       const std::vector<std::string>& part_etags);
  absl::Status AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                    const std::string& upload_id);

  // The object's bytes, in pieces as they arrive: `sink` may refuse them
  // (its error ends the call; nothing is retried after a piece was given).
  absl::Status GetObject(const std::string& bucket, const std::string& key,
                         const std::function<absl::Status(absl::string_view)>& sink);
  // The whole object in memory (small objects: manifests).
  absl::StatusOr<std::string> GetObject(const std::string& bucket, const std::string& key);
  // Bytes [offset, offset + length) of the object, in memory (a ranged GET:
  // parts of a large object fetched at once). OUT_OF_RANGE when the store
  // gives a different number of bytes (the object is shorter).
  absl::StatusOr<std::string> GetObjectRange(const std::string& bucket, const std::string& key,
                                             uint64_t offset, uint64_t length);

  absl::StatusOr<ObjectInfo> HeadObject(const std::string& bucket, const std::string& key);

  // Every object whose key starts with `prefix`, in key order (ListObjectsV2,
  // page after page of at most `page_size` keys; 1,000 is S3's most).
  absl::StatusOr<std::vector<ObjectInfo>> ListObjects(const std::string& bucket,
                                                      const std::string& prefix,
                                                      int page_size = 1000);

  // OK also when the key did not exist (S3's own answer).
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);

 private:
  struct Request;
  struct Response {
    long http_status = 0;
    std::string body;
  };
  // Sends `request`, retrying as the header says; the response of the last
  // try (a 2xx), or the error.
  absl::StatusOr<Response> Send(const Request& request);
  absl::StatusOr<Response> SendOnce(const Request& request, bool* retryable);
  std::string Url(const std::string& bucket, const std::string& key,
                  const std::string& query) const;

  const S3Config config_;
  const S3ClientOptions options_;
};

// Percent-encodes as SigV4 wants (RFC 3986 unreserved characters kept,
// everything else %XX with uppercase hex); '/' kept unless `encode_slash`.
std::string UriEncode(absl::string_view s, bool encode_slash);

// The text of the first <tag>...</tag> in `xml`, with XML entities decoded
// (empty if absent); XmlBlocks: every such element's inner text.
std::string XmlValue(absl::string_view xml, absl::string_view tag);
std::vector<absl::string_view> XmlBlocks(absl::string_view xml, absl::string_view tag);

}  // namespace loom::object_store

#endif  // LOOM_COMMON_OBJECT_STORE_S3_CLIENT_H_
