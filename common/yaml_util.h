// YAML loading that ends (found by the jobspec fuzzer).
//
// yaml-cpp 0.7 (Debian 12's) loops forever in YAML::LoadAll on some
// malformed streams, allocating as it goes: a stream that is just ","
// makes every HandleNextDocument "succeed" without consuming anything
// (yaml-cpp issue #1040, fixed upstream only in 0.8.1). Job specs and the
// Plan RPC's topology text are untrusted input, so Loom never calls
// LoadAll: LoadYamlDocuments counts the documents with a bound, then loads
// the first.
#ifndef LOOM_COMMON_YAML_UTIL_H_
#define LOOM_COMMON_YAML_UTIL_H_

#include <string>

#include <yaml-cpp/yaml.h>

#include "absl/strings/string_view.h"

namespace loom {

// The stream's documents as far as `max_documents` + 1 (so a caller can
// tell "more than max_documents"), counting a document that the parser
// accepts without consuming any input as the end of a bad stream: then it
// throws YAML::ParserException (at the position it stuck) like any other
// syntax error. Throws what yaml-cpp throws otherwise.
int CountYamlDocuments(const std::string& text, int max_documents);

// For error messages about YAML input (job specs, topologies, queue
// files): how `node` reads ("null", "a list", "a mapping", a scalar in
// quotes, C-escaped where not printable UTF-8 and cut to `max_chars`,
// "nothing" when undefined), and a field's dotted path ("parent.key"; "key"
// at the top).
std::string DescribeYamlNode(const YAML::Node& node, size_t max_chars = 40);
std::string JoinYamlPath(absl::string_view parent, absl::string_view key);

}  // namespace loom

#endif  // LOOM_COMMON_YAML_UTIL_H_
