#include "controller/scheduling/queue_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/yaml_util.h"
#include "yaml-cpp/yaml.h"

namespace loom::scheduling {
namespace {

absl::Status FieldError(absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

// One YAML mapping: each key is claimed by a handler; unknown and repeated
// keys are errors naming the path. (The planner's topology reader has the
// same walker in its own anonymous namespace.)
class MapReader {
 public:
  using Handler = std::function<absl::Status(const YAML::Node&, const std::string& path)>;

  explicit MapReader(std::string path) : path_(std::move(path)) {}

  void On(const std::string& key, Handler handler) { handlers_.emplace_back(key, handler); }

  absl::Status Read(const YAML::Node& node) const {
    const std::string where = path_.empty() ? "queue config" : path_;
    if (!node.IsMap()) {
      return FieldError(where, absl::StrCat("expected a mapping, got ", DescribeYamlNode(node)));
    }
    std::set<std::string> seen;
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) return FieldError(where, "keys must be plain names");
      const std::string key = entry.first.Scalar();
      const std::string path = JoinYamlPath(path_, key);
      if (!seen.insert(key).second) return FieldError(path, "given more than once");
      auto it = std::find_if(handlers_.begin(), handlers_.end(),
                             [&](const auto& h) { return h.first == key; });
      if (it == handlers_.end()) {
        std::vector<std::string> known;
        for (const auto& h : handlers_) known.push_back(h.first);
        return FieldError(path,
                          absl::StrCat("unknown field (known: ", absl::StrJoin(known, ", "), ")"));
      }
      RETURN_IF_ERROR(it->second(entry.second, path));
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::vector<std::pair<std::string, Handler>> handlers_;
};

bool PlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

MapReader::Handler NonNegativeInt(int64_t* out) {
  return [out](const YAML::Node& node, const std::string& path) {
    int64_t value = 0;
    if (!PlainScalar(node) || !absl::SimpleAtoi(node.Scalar(), &value)) {
      return FieldError(path, absl::StrCat("expected an integer, got ", DescribeYamlNode(node)));
    }
    if (value < 0) return FieldError(path, absl::StrCat("must be >= 0, got ", value));
    if (value >= kUnlimited) return FieldError(path, absl::StrCat("must be < ", kUnlimited));
    *out = value;
    return absl::OkStatus();
  };
}

// A number of seconds; `positive` refuses 0.
MapReader::Handler Seconds(absl::Duration* out, bool positive) {
  return [out, positive](const YAML::Node& node, const std::string& path) {
    double value = 0;
    if (!PlainScalar(node) || !absl::SimpleAtod(node.Scalar(), &value) || !std::isfinite(value)) {
      return FieldError(path, absl::StrCat("expected a number of seconds, got ", DescribeYamlNode(node)));
    }
    if (positive ? value <= 0 : value < 0) {
      return FieldError(
          path, absl::StrCat(positive ? "must be > 0" : "must be >= 0", ", got ", node.Scalar()));
    }
    *out = absl::Seconds(value);
    return absl::OkStatus();
  };
}

MapReader::Handler Bool(bool* out) {
  return [out](const YAML::Node& node, const std::string& path) {
    const std::string text = PlainScalar(node) ? node.Scalar() : "";
    if (text == "true") {
      *out = true;
    } else if (text == "false") {
      *out = false;
    } else {
      return FieldError(path, absl::StrCat("expected true or false, got ", DescribeYamlNode(node)));
    }
    return absl::OkStatus();
  };
}

// Queue, cohort and priority-class names: what a job spec can name
// (common/jobspec_rules.h IsValidJobName): 1-63 of [a-z0-9-], starting and
// ending with a letter or digit.
absl::Status CheckName(const YAML::Node& node, const std::string& path, std::string* out) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    return FieldError(path, absl::StrCat("expected a name, got ", DescribeYamlNode(node)));
  }
  const std::string& name = node.Scalar();
  const bool ok = name.size() <= 63 && name.front() != '-' && name.back() != '-' &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
                  });
  if (!ok) {
    return FieldError(path, absl::StrCat("\"", name,
                                         "\" is not a name: 1-63 lower-case letters, digits and "
                                         "'-', starting and ending with a letter or digit"));
  }
  *out = name;
  return absl::OkStatus();
}

MapReader::Handler ResourcesOf(Resources* out, std::string path) {
  return [out, path](const YAML::Node& node, const std::string&) {
    MapReader reader(path);
    reader.On("slots", NonNegativeInt(&out->slots));
    reader.On("gpus", NonNegativeInt(&out->gpus));
    return reader.Read(node);
  };
}

absl::Status ReadQueue(const YAML::Node& node, const std::string& path, QueueSpec* q) {
  bool has_name = false, has_borrowing = false;
  MapReader reader(path);
  reader.On("name", [&](const YAML::Node& n, const std::string& p) {
    has_name = true;
    return CheckName(n, p, &q->name);
  });
  reader.On("cohort",
            [&](const YAML::Node& n, const std::string& p) { return CheckName(n, p, &q->cohort); });
  reader.On("nominal_quota", ResourcesOf(&q->nominal_quota, JoinYamlPath(path, "nominal_quota")));
  reader.On("borrowing_limit", [&](const YAML::Node& n, const std::string& p) {
    has_borrowing = true;
    return ResourcesOf(&q->borrowing_limit, p)(n, p);
  });
  reader.On("weight", [&](const YAML::Node& n, const std::string& p) {
    double value = 0;
    if (!PlainScalar(n) || !absl::SimpleAtod(n.Scalar(), &value) || !std::isfinite(value)) {
      return FieldError(p, absl::StrCat("expected a number, got ", DescribeYamlNode(n)));
    }
    if (value <= 0) return FieldError(p, absl::StrCat("must be > 0, got ", n.Scalar()));
    q->weight = value;
    return absl::OkStatus();
  });
  reader.On("preemption", Bool(&q->preemption));
  reader.On("submit_roles", [&](const YAML::Node& n, const std::string& p) {
    if (!n.IsSequence() || n.size() == 0) {
      return FieldError(p, absl::StrCat("expected a list of roles (user, admin), got ",
                                        DescribeYamlNode(n)));
    }
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string at = absl::StrCat(p, "[", i, "]");
      if (!n[i].IsScalar() || (n[i].Scalar() != "user" && n[i].Scalar() != "admin")) {
        return FieldError(at, absl::StrCat("expected user or admin (the roles that may submit), "
                                           "got ",
                                           DescribeYamlNode(n[i])));
      }
      q->submit_roles.push_back(n[i].Scalar());
    }
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(reader.Read(node));
  if (!has_name) return FieldError(JoinYamlPath(path, "name"), "required");
  if (has_borrowing && q->cohort.empty()) {
    return FieldError(JoinYamlPath(path, "borrowing_limit"),
                      "needs a cohort: a queue borrows only from the other queues of its cohort");
  }
  return absl::OkStatus();
}

absl::Status ReadConfig(const YAML::Node& root, QueueConfig* config) {
  MapReader fair("fair_share");
  fair.On("half_life_seconds", Seconds(&config->fair_share_half_life, /*positive=*/true));
  MapReader preemption("preemption");
  preemption.On("grace_seconds", Seconds(&config->preemption_grace, /*positive=*/false));
  preemption.On("min_run_time_seconds", Seconds(&config->min_run_time, /*positive=*/false));

  MapReader top("");
  top.On("fair_share", [&](const YAML::Node& n, const std::string&) { return fair.Read(n); });
  top.On("preemption", [&](const YAML::Node& n, const std::string&) { return preemption.Read(n); });
  top.On("priority_classes", [&](const YAML::Node& n, const std::string& p) {
    if (!n.IsMap()) return FieldError(p, absl::StrCat("expected a mapping, got ", DescribeYamlNode(n)));
    for (const auto& entry : n) {
      std::string name;
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "?";
      const std::string path = JoinYamlPath(p, key);
      RETURN_IF_ERROR(CheckName(entry.first, path, &name));
      int value = 0;
      if (!PlainScalar(entry.second) || !absl::SimpleAtoi(entry.second.Scalar(), &value)) {
        return FieldError(path, absl::StrCat("expected an integer, got ", DescribeYamlNode(entry.second)));
      }
      if (value < -kMaxPriority || value > kMaxPriority) {
        return FieldError(path, absl::StrCat("must be in [", -kMaxPriority, ", ", kMaxPriority,
                                             "], got ", value));
      }
      if (!config->priority_classes.emplace(name, value).second) {
        return FieldError(path, "given more than once");
      }
    }
    return absl::OkStatus();
  });
  top.On("queues", [&](const YAML::Node& n, const std::string& p) {
    if (!n.IsSequence()) return FieldError(p, absl::StrCat("expected a list, got ", DescribeYamlNode(n)));
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string path = absl::StrCat(p, "[", i, "]");
      QueueSpec q;
      RETURN_IF_ERROR(ReadQueue(n[i], path, &q));
      if (config->Find(q.name) != nullptr) {
        return FieldError(JoinYamlPath(path, "name"),
                          absl::StrCat("queue \"", q.name, "\" is defined more than once"));
      }
      config->queues.push_back(std::move(q));
    }
    return absl::OkStatus();
  });
  return top.Read(root);
}

}  // namespace

bool QueueSpec::AcceptsRole(absl::string_view role) const {
  if (submit_roles.empty()) return true;
  return std::find(submit_roles.begin(), submit_roles.end(), role) != submit_roles.end();
}

Resources QueueSpec::Limit() const {
  return cohort.empty() ? nominal_quota : Saturate(nominal_quota + borrowing_limit);
}

const QueueSpec* QueueConfig::Find(absl::string_view name) const {
  for (const QueueSpec& q : queues) {
    if (q.name == name) return &q;
  }
  return nullptr;
}

absl::StatusOr<const QueueSpec*> QueueConfig::ResolveQueue(absl::string_view name) const {
  const QueueSpec* q = Find(name.empty() ? absl::string_view(kDefaultQueue) : name);
  if (q != nullptr) return q;
  std::vector<std::string> names;
  for (const QueueSpec& spec : queues) names.push_back(spec.name);
  return absl::InvalidArgumentError(absl::StrCat("scheduling.queue: unknown queue \"", name,
                                                 "\" (queues: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<int> QueueConfig::ResolvePriority(absl::string_view value) const {
  if (value.empty()) return 0;
  int number = 0;
  if (absl::SimpleAtoi(value, &number)) {
    if (number < -kMaxPriority || number > kMaxPriority) {
      return absl::InvalidArgumentError(absl::StrCat("scheduling.priority: must be in [",
                                                     -kMaxPriority, ", ", kMaxPriority,
                                                     "], got ", number));
    }
    return number;
  }
  auto it = priority_classes.find(std::string(value));
  if (it != priority_classes.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [name, unused] : priority_classes) names.push_back(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "scheduling.priority: \"", value, "\" is neither an integer nor a priority class",
      names.empty() ? " (the queue configuration defines none)"
                    : absl::StrCat(" (classes: ", absl::StrJoin(names, ", "), ")")));
}

Resources QueueConfig::CohortCapacity(absl::string_view cohort) const {
  Resources sum;
  for (const QueueSpec& q : queues) {
    if (!cohort.empty() && q.cohort == cohort) sum = Saturate(sum + q.nominal_quota);
  }
  return sum;
}

QueueConfig DefaultQueueConfig() {
  QueueConfig config;
  QueueSpec q;
  q.name = kDefaultQueue;
  config.queues.push_back(q);
  return config;
}

absl::StatusOr<QueueConfig> ParseQueueConfig(absl::string_view text) {
  QueueConfig config;
  try {
    // Not YAML::LoadAll: it never returns on some malformed streams
    // (common/yaml_util.h).
    const std::string yaml(text);
    const int documents = CountYamlDocuments(yaml, 4);
    if (documents > 1) return FieldError("queue config", "expected one YAML document");
    const YAML::Node root = documents == 0 ? YAML::Node() : YAML::Load(yaml);
    if (root.IsDefined() && !root.IsNull()) RETURN_IF_ERROR(ReadConfig(root, &config));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return FieldError("queue config", absl::StrCat("invalid YAML: ", e.msg));
    return FieldError("queue config", absl::StrFormat("invalid YAML at line %d, column %d: %s",
                                                      e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (config.Find(kDefaultQueue) == nullptr) {
    config.queues.push_back(DefaultQueueConfig().queues[0]);
  }
  return config;
}

absl::StatusOr<QueueConfig> LoadQueueConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  auto config = ParseQueueConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace loom::scheduling
