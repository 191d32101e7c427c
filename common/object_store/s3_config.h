// Where an S3-compatible object store is and how to sign for it, taken from
// the environment and files the AWS tools read, never from a job spec or a
// command line (a spec is stored and shown; a command line is visible in ps).
//
// Sources, first found wins, with the names awscli uses:
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; else the profile's
//                `endpoint_url` in the config file; else AWS's regional
//                endpoint https://s3.<region>.amazonaws.com
//   region       AWS_REGION, AWS_DEFAULT_REGION; else the profile's `region`;
//                else us-east-1
//   credentials  AWS_ACCESS_KEY_ID with AWS_SECRET_ACCESS_KEY (and
//                AWS_SESSION_TOKEN); else the profile in the credentials
//                file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials)
//   addressing   AWS_S3_ADDRESSING_STYLE ("path" or "virtual"); else the
//                profile's `s3 = ... addressing_style`; else "path" for an
//                explicit endpoint (most self-hosted stores want it) and
//                "virtual" for AWS's own
//   profile      AWS_PROFILE, else "default"; the config file is
//                AWS_CONFIG_FILE, default ~/.aws/config ([profile NAME] or
//                [default] sections)
#ifndef LOOM_COMMON_OBJECT_STORE_S3_CONFIG_H_
#define LOOM_COMMON_OBJECT_STORE_S3_CONFIG_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::object_store {

// An object-store location: s3://bucket/prefix. `prefix` has no leading
// slash and, when not empty, ends with one, so that prefix + name is a key.
struct S3Location {
  std::string bucket;
  std::string prefix;
  // s3://bucket/prefix (prefix without its trailing slash).
  std::string Url() const;
  // The location of `name` under this one (a key, or a deeper prefix).
  S3Location Child(absl::string_view name) const;
};

// Parses "s3://bucket[/prefix]". INVALID_ARGUMENT naming what is wrong: a
// scheme other than s3, a bucket name S3 would refuse (3-63 characters of
// lowercase letters, digits, dots and hyphens, starting and ending with a
// letter or digit), an empty path segment or a ".." in the prefix.
absl::StatusOr<S3Location> ParseS3Url(absl::string_view url);

// A checkpoint's own location in an object store, as the remote tier lays
// it out ("s3://bucket/prefix/<job>/step-000000200"): its step, and the
// location above it in `*job` (not null). INVALID_ARGUMENT saying what such
// a location looks like otherwise.
absl::StatusOr<int64_t> ParseCheckpointUrl(absl::string_view url, S3Location* job);

struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  std::string region = "us-east-1";
  bool path_style = true;  // https://host/bucket/key, else https://bucket.host/key
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: none
  // Where the credentials came from, for messages ("environment",
  // "/root/.aws/credentials [default]"); never the secret itself.
  std::string credentials_source;
};

// Reads a variable of the environment (nullopt: unset). Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
// The process's environment.
EnvLookup ProcessEnvironment();

// The configuration from `env` and the files it names. FAILED_PRECONDITION
// when no credentials are found (naming every place looked at), or a file
// named by a variable cannot be read; INVALID_ARGUMENT for an endpoint that
// is not http(s)://host[:port] or an unknown addressing style.
absl::StatusOr<S3Config> S3ConfigFromEnvironment(const EnvLookup& env);

}  // namespace loom::object_store

#endif  // LOOM_COMMON_OBJECT_STORE_S3_CONFIG_H_
