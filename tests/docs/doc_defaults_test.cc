// The defaults the docs state are the defaults the code applies.
//
// A YAML block in docs/*.md that follows the line
//   <!-- defaults: checked by tests/docs/doc_defaults_test.cc -->
// states job-spec fields with their default values. This test reads every
// such block, walks its leaves (checkpoint.interval_steps, recovery.window,
// ...) and compares each with what the code makes of a spec that says
// nothing: ApplyJobSpecDefaults (common/jobspec_defaults.h) for the spec's
// own defaults, and the recovery policy's effective settings
// (RecoveryPolicy::EffectiveRecovery) for recovery.*, where zero means
// "default" and the default lives in the controller. A leaf that is not a
// job-spec field, or whose value differs, fails with the page, the block's
// line and the path.
#include <dirent.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/jobspec_defaults.h"
#include "controller/recovery/recovery_policy.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "loom/v1/job.pb.h"

#ifndef LOOM_SOURCE_DIR
#error "LOOM_SOURCE_DIR: the repository root (tests/tests.cmake defines it)"
#endif

namespace loom {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr absl::string_view kMarker = "<!-- defaults: checked by tests/docs/doc_defaults_test.cc -->";

// A spec that says nothing, with every default the code applies filled in.
// The optimizer's oneof member is created first (its defaults apply only to
// a member that is there), as a spec that names AdamW has it.
loom::v1::JobSpec EffectiveDefaults() {
  loom::v1::JobSpec spec;
  spec.mutable_optimizer()->mutable_adamw();
  ApplyJobSpecDefaults(&spec);
  const controller::RecoveryOptions o =
      controller::RecoveryPolicy::EffectiveRecovery(spec.recovery());
  loom::v1::RecoverySpec* r = spec.mutable_recovery();
  r->set_max_restarts(o.max_restarts);
  r->set_disable_spike_detection(!o.detect_spikes);
  r->set_window(o.detector.window);
  r->set_min_history(o.detector.min_history);
  r->set_threshold(o.detector.threshold);
  r->set_confirm_steps(o.detector.confirm_steps);
  r->set_rollback_distance(o.rollback_distance);
  r->set_skip_before(o.skip_before);
  r->set_skip_after(o.skip_after);
  r->set_max_rollbacks(o.max_rollbacks);
  loom::v1::SlowRankSpec* slow = r->mutable_slow_rank();
  slow->set_disabled(!o.detect_slow_ranks);
  slow->set_action(o.slow_rank_action);
  slow->set_min_slowdown(o.slow_ranks.min_slowdown);
  slow->set_threshold(o.slow_ranks.threshold);
  slow->set_confirm_reports(o.slow_ranks.confirm_reports);
  slow->set_window(o.slow_ranks.window);
  slow->set_confirm_seconds(o.slow_ranks.confirm_seconds);
  slow->set_cordon_seconds(o.cordon_seconds);
  return spec;
}

// "" when `stated` (a YAML scalar) is the value of `field` in `m`, else
// what the code has.
std::string Mismatch(const Message& m, const FieldDescriptor* field, const std::string& stated) {
  const auto* reflection = m.GetReflection();
  auto numeric = [&](double have) -> std::string {
    double want = 0;
    if (absl::SimpleAtod(stated, &want) &&
        std::abs(want - have) <= 1e-12 * std::max(1.0, std::abs(have))) {
      return "";
    }
    return absl::StrCat(have);
  };
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return numeric(reflection->GetInt32(m, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return numeric(static_cast<double>(reflection->GetInt64(m, field)));
    case FieldDescriptor::CPPTYPE_UINT32:
      return numeric(reflection->GetUInt32(m, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return numeric(static_cast<double>(reflection->GetUInt64(m, field)));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return numeric(reflection->GetDouble(m, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return numeric(reflection->GetFloat(m, field));
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool have = reflection->GetBool(m, field);
      return stated == (have ? "true" : "false") ? "" : (have ? "true" : "false");
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const std::string have = reflection->GetEnum(m, field)->name();
      return stated == have ? "" : have;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string have = reflection->GetString(m, field);
      return stated == have ? "" : absl::StrCat("\"", have, "\"");
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "a message, not a value";
  }
  return "?";
}

// Compares every leaf of `node` (under `path`) with `m`; appends findings.
void Compare(const YAML::Node& node, const Message& m, const std::string& path,
             std::vector<std::string>* findings, int* leaves) {
  if (!node.IsMap()) {
    findings->push_back(absl::StrCat(path, ": expected a mapping of job-spec fields"));
    return;
  }
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string here = path.empty() ? key : absl::StrCat(path, ".", key);
    const FieldDescriptor* field = m.GetDescriptor()->FindFieldByName(key);
    if (field == nullptr || field->is_repeated()) {
      findings->push_back(absl::StrCat(here, ": not a (singular) field of ",
                                       m.GetDescriptor()->full_name()));
      continue;
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Compare(item.second, m.GetReflection()->GetMessage(m, field), here, findings, leaves);
      continue;
    }
    if (!item.second.IsScalar()) {
      findings->push_back(absl::StrCat(here, ": expected a value"));
      continue;
    }
    ++*leaves;
    const std::string stated = item.second.as<std::string>();
    const std::string have = Mismatch(m, field, stated);
    if (!have.empty()) {
      findings->push_back(
          absl::StrCat(here, ": the doc says ", stated, ", the code's default is ", have));
    }
  }
}

struct Block {
  std::string page;
  int line = 0;  // of the block's first YAML line
  std::string yaml;
};

// The marked YAML blocks of one Markdown text.
std::vector<Block> MarkedBlocks(const std::string& page, const std::string& text) {
  std::vector<Block> blocks;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    if (absl::StripAsciiWhitespace(lines[i]) != kMarker) continue;
    Block b;
    b.page = page;
    size_t j = i + 1;
    if (j >= lines.size() || !absl::StartsWith(absl::StripLeadingAsciiWhitespace(lines[j]), "```")) {
      b.line = static_cast<int>(i + 1);
      b.yaml = "!!no fenced block after the marker";
      blocks.push_back(b);
      continue;
    }
    b.line = static_cast<int>(j + 2);
    for (++j; j < lines.size() && !absl::StartsWith(absl::StripLeadingAsciiWhitespace(lines[j]), "```");
         ++j) {
      absl::StrAppend(&b.yaml, lines[j], "\n");
    }
    blocks.push_back(b);
    i = j;
  }
  return blocks;
}

// Every finding of one block against the effective defaults.
std::vector<std::string> Check(const Block& b, const loom::v1::JobSpec& defaults, int* leaves) {
  std::vector<std::string> findings;
  try {
    const YAML::Node root = YAML::Load(b.yaml);
    Compare(root, defaults, "", &findings, leaves);
  } catch (const YAML::Exception& e) {
    findings.push_back(absl::StrCat("not YAML: ", e.what()));
  }
  for (std::string& f : findings) f = absl::StrCat(b.page, ":", b.line, ": ", f);
  return findings;
}

TEST(DocDefaultsTest, EveryStatedDefaultIsTheCodesDefault) {
  const std::string docs = absl::StrCat(LOOM_SOURCE_DIR, "/docs");
  DIR* dir = opendir(docs.c_str());
  ASSERT_NE(dir, nullptr) << docs;
  std::vector<std::string> pages;
  while (dirent* e = readdir(dir)) {
    if (absl::EndsWith(e->d_name, ".md")) pages.push_back(e->d_name);
  }
  closedir(dir);
  const loom::v1::JobSpec defaults = EffectiveDefaults();
  int blocks = 0, leaves = 0;
  for (const std::string& page : pages) {
    std::ifstream in(absl::StrCat(docs, "/", page));
    std::stringstream text;
    text << in.rdbuf();
    for (const Block& b : MarkedBlocks("docs/" + page, text.str())) {
      ++blocks;
      for (const std::string& f : Check(b, defaults, &leaves)) ADD_FAILURE() << f;
    }
  }
  std::cout << blocks << " marked defaults block(s), " << leaves << " stated default(s) checked"
            << std::endl;
  // The recovery page's block at least: a marker lost in an edit must not
  // turn this test into one that checks nothing.
  EXPECT_GE(blocks, 1);
  EXPECT_GE(leaves, 10);
}

// The checker itself finds a wrong default, an unknown field and a block
// that is not YAML.
TEST(DocDefaultsTest, AWrongDefaultIsFound) {
  const std::string page = absl::StrCat(
      "text\n", kMarker,
      "\n```yaml\ncheckpoint:\n  interval_steps: 200\n  keep: 3\nrecovery:\n  window: 128\n"
      "  no_such_field: 1\n```\n",
      kMarker, "\n```yaml\n: [\n```\n");
  const std::vector<Block> blocks = MarkedBlocks("page.md", page);
  ASSERT_EQ(blocks.size(), 2u);
  int leaves = 0;
  const std::vector<std::string> findings = Check(blocks[0], EffectiveDefaults(), &leaves);
  ASSERT_EQ(findings.size(), 2u) << absl::StrJoin(findings, "\n");
  EXPECT_EQ(findings[0],
            "page.md:4: checkpoint.interval_steps: the doc says 200, the code's default is 0");
  EXPECT_TRUE(absl::StrContains(findings[1], "recovery.no_such_field: not a (singular) field"))
      << findings[1];
  EXPECT_EQ(leaves, 3);
  EXPECT_EQ(Check(blocks[1], EffectiveDefaults(), &leaves).size(), 1u);
}

}  // namespace
}  // namespace loom
