#include "common/object_store/s3_config.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom::object_store {
namespace {

bool ValidBucket(absl::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-')) return false;
  }
  auto alnum = [](char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c); };
  return alnum(b.front()) && alnum(b.back()) && !absl::StrContains(b, "..");
}

// One section of an awscli-style INI file: key -> value, with a nested
// block ("s3 =" followed by indented "key = value" lines) flattened to
// "s3.key".
using Section = std::map<std::string, std::string>;

std::map<std::string, Section> ParseIni(absl::string_view text) {
  std::map<std::string, Section> out;
  Section* current = nullptr;
  std::string nested;  // the key of an open nested block
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    absl::string_view line = absl::StripTrailingAsciiWhitespace(raw);
    absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
    if (stripped.empty() || stripped[0] == '#' || stripped[0] == ';') continue;
    const bool indented = stripped.size() != line.size();
    if (stripped.front() == '[' && stripped.back() == ']') {
      current =
          &out[std::string(absl::StripAsciiWhitespace(stripped.substr(1, stripped.size() - 2)))];
      nested.clear();
      continue;
    }
    if (current == nullptr) continue;
    const size_t eq = stripped.find('=');
    if (eq == absl::string_view::npos) continue;
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(stripped.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(stripped.substr(eq + 1)));
    if (indented && !nested.empty()) {
      (*current)[nested + "." + key] = value;
    } else if (value.empty()) {
      nested = key;
    } else {
      nested.clear();
      (*current)[key] = value;
    }
  }
  return out;
}

std::string HomePath(const EnvLookup& env, absl::string_view rest) {
  std::optional<std::string> home = env("HOME");
  return absl::StrCat(home.value_or(""), rest);
}

// The file a variable names (must be readable), or its default (may be
// absent). nullopt text: no file.
absl::StatusOr<std::optional<std::string>> ReadAwsFile(const EnvLookup& env, const char* var,
                                                       const std::string& fallback,
                                                       std::string* path) {
  if (std::optional<std::string> named = env(var); named && !named->empty()) {
    *path = *named;
    absl::StatusOr<std::string> text = ReadFile(*named);
    if (!text.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          var, " names ", *named, ", which cannot be read: ", text.status().message()));
    }
    return std::optional<std::string>(*std::move(text));
  }
  *path = fallback;
  absl::StatusOr<std::string> text = ReadFile(fallback);
  if (!text.ok()) return std::optional<std::string>();
  return std::optional<std::string>(*std::move(text));
}

std::optional<std::string> NonEmpty(const EnvLookup& env, const char* name) {
  std::optional<std::string> v = env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

}  // namespace

std::string S3Location::Url() const {
  return absl::StrCat("s3://", bucket, prefix.empty() ? "" : "/", absl::StripSuffix(prefix, "/"));
}

S3Location S3Location::Child(absl::string_view name) const {
  S3Location out = *this;
  out.prefix = absl::StrCat(prefix, name);
  if (!out.prefix.empty() && out.prefix.back() != '/') out.prefix += '/';
  return out;
}

absl::StatusOr<S3Location> ParseS3Url(absl::string_view url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an object-store location: write s3://bucket/prefix"));
  }
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(loc.bucket)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", url, "\": bucket \"", loc.bucket,
        "\" is not a valid bucket name (3-63 characters: lowercase letters, digits, dots and "
        "hyphens, beginning and ending with a letter or digit)"));
  }
  if (slash == absl::string_view::npos) return loc;
  absl::string_view prefix = absl::StripSuffix(rest.substr(slash + 1), "/");
  if (prefix.empty()) return loc;
  for (absl::string_view seg : absl::StrSplit(prefix, '/')) {
    if (seg.empty() || seg == "." || seg == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", url, "\": the prefix has an empty, \".\" or \"..\" path segment"));
    }
    for (char c : seg) {
      if (static_cast<unsigned char>(c) < 0x20 || c == '\\') {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", url, "\": the prefix has a control character or a backslash"));
      }
    }
  }
  loc.prefix = absl::StrCat(prefix, "/");
  return loc;
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<S3Config> S3ConfigFromEnvironment(const EnvLookup& env) {
  const std::string profile = NonEmpty(env, "AWS_PROFILE").value_or("default");
  std::string config_path, credentials_path;
  absl::StatusOr<std::optional<std::string>> config_text =
      ReadAwsFile(env, "AWS_CONFIG_FILE", HomePath(env, "/.aws/config"), &config_path);
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<std::optional<std::string>> credentials_text = ReadAwsFile(
      env, "AWS_SHARED_CREDENTIALS_FILE", HomePath(env, "/.aws/credentials"), &credentials_path);
  if (!credentials_text.ok()) return credentials_text.status();
  Section config_section, credentials_section;
  if (*config_text) {
    auto sections = ParseIni(**config_text);
    const std::string name = profile == "default" ? "default" : "profile " + profile;
    if (auto it = sections.find(name); it != sections.end()) config_section = it->second;
  }
  if (*credentials_text) {
    auto sections = ParseIni(**credentials_text);
    if (auto it = sections.find(profile); it != sections.end()) credentials_section = it->second;
  }
  auto from_config = [&](const std::string& key) -> std::optional<std::string> {
    auto it = config_section.find(key);
    if (it == config_section.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };

  S3Config out;
  out.region = NonEmpty(env, "AWS_REGION")
                   .value_or(NonEmpty(env, "AWS_DEFAULT_REGION")
                                 .value_or(from_config("region").value_or("us-east-1")));
  std::optional<std::string> endpoint = NonEmpty(env, "AWS_ENDPOINT_URL_S3");
  if (!endpoint) endpoint = NonEmpty(env, "AWS_ENDPOINT_URL");
  if (!endpoint) endpoint = from_config("s3.endpoint_url");
  if (!endpoint) endpoint = from_config("endpoint_url");
  const bool custom_endpoint = endpoint.has_value();
  if (!endpoint) endpoint = absl::StrCat("https://s3.", out.region, ".amazonaws.com");
  absl::string_view ep = absl::StripSuffix(*endpoint, "/");
  absl::string_view host = ep;
  if (!absl::ConsumePrefix(&host, "http://") && !absl::ConsumePrefix(&host, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("object-store endpoint \"", *endpoint,
                     "\" must be http://host[:port] or https://host[:port]"));
  }
  if (host.empty() || absl::StrContains(host, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "object-store endpoint \"", *endpoint, "\" must be a scheme and a host, without a path"));
  }
  out.endpoint = std::string(ep);

  std::optional<std::string> style = NonEmpty(env, "AWS_S3_ADDRESSING_STYLE");
  if (!style) style = from_config("s3.addressing_style");
  if (!style || *style == "auto") style = custom_endpoint ? "path" : "virtual";
  if (*style != "path" && *style != "virtual") {
    return absl::InvalidArgumentError(absl::StrCat("object-store addressing style \"", *style,
                                                   "\" is neither \"path\" nor \"virtual\""));
  }
  out.path_style = *style == "path";

  std::optional<std::string> key = NonEmpty(env, "AWS_ACCESS_KEY_ID");
  std::optional<std::string> secret = NonEmpty(env, "AWS_SECRET_ACCESS_KEY");
  if (key && secret) {
    out.access_key_id = *key;
    out.secret_access_key = *secret;
    out.session_token = NonEmpty(env, "AWS_SESSION_TOKEN").value_or("");
    out.credentials_source = "environment (AWS_ACCESS_KEY_ID)";
    return out;
  }
  auto cred = [&](const char* k) -> std::string {
    auto it = credentials_section.find(k);
    return it == credentials_section.end() ? "" : it->second;
  };
  if (!cred("aws_access_key_id").empty() && !cred("aws_secret_access_key").empty()) {
    out.access_key_id = cred("aws_access_key_id");
    out.secret_access_key = cred("aws_secret_access_key");
    out.session_token = cred("aws_session_token");
    out.credentials_source = absl::StrCat(credentials_path, " [", profile, "]");
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no object-store credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
      "daemon's environment, or put aws_access_key_id and aws_secret_access_key under [",
      profile, "] in ", credentials_path,
      (key && !secret ? " (AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY)" : "")));
}

absl::StatusOr<int64_t> ParseCheckpointUrl(absl::string_view url, S3Location* job) {
  absl::string_view trimmed = absl::StripSuffix(url, "/");
  const size_t slash = trimmed.rfind('/');
  const absl::string_view name = slash == absl::string_view::npos ? "" : trimmed.substr(slash + 1);
  int64_t step = -1;
  absl::string_view digits = name;
  if (!absl::ConsumePrefix(&digits, "step-") || digits.size() != 9 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url,
                     "\" is not a checkpoint's location in an object store: write "
                     "s3://bucket/prefix/<job>/step-NNNNNNNNN (loomctl checkpoints JOB shows "
                     "each remote copy)"));
  }
  ASSIGN_OR_RETURN(*job, ParseS3Url(trimmed.substr(0, slash)));
  return step;
}

}  // namespace loom::object_store
