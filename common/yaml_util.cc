#include "common/yaml_util.h"

#include <sstream>
#include <string>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

// Keeps the position of a document's first node event.
class FirstEvent : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Saw(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Saw(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Saw(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Saw(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Saw(mark);
  }
  void OnMapEnd() override {}

  YAML::Mark first = YAML::Mark::null_mark();
  bool seen = false;

 private:
  void Saw(const YAML::Mark& mark) {
    if (seen) return;
    first = mark;
    seen = true;
  }
};

}  // namespace

int CountYamlDocuments(const std::string& text, int max_documents) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  int documents = 0;
  bool have_previous = false;
  YAML::Mark previous = YAML::Mark::null_mark();
  while (documents <= max_documents) {
    FirstEvent events;
    if (!parser.HandleNextDocument(events)) break;
    // Every document starts further on than the one before; one that
    // starts where the previous did is the parser stuck on a token it
    // cannot place (yaml-cpp issue #1040), and would repeat forever.
    if (events.seen && have_previous && events.first.pos == previous.pos) {
      throw YAML::ParserException(events.first, "unexpected token here");
    }
    if (events.seen) {
      previous = events.first;
      have_previous = true;
    }
    ++documents;
  }
  return documents;
}

std::string DescribeYamlNode(const YAML::Node& node, size_t max_chars) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar: {
      std::string text = node.Scalar();
      if (text.size() > max_chars && max_chars > 3) text = text.substr(0, max_chars - 3) + "...";
      return absl::StrCat("\"", absl::Utf8SafeCHexEscape(text), "\"");
    }
    default:
      return "nothing";
  }
}

std::string JoinYamlPath(absl::string_view parent, absl::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

}  // namespace loom
