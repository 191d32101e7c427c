// Lints the Grafana dashboard: importable structure, unique panel ids, no
// overlapping grid positions, a unit and a description on every panel, the
// datasource templated. (Which metrics it uses is checked against a live
// scrape in cluster_test.cc.)
#include <set>
#include <string>

#include "common/file_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

const std::string kDashboard = std::string(LOOM_SOURCE_DIR) + "/dashboards/grafana/loom-training.json";

const Value& Field(const Struct& s, const std::string& key) {
  static const Value kNull;
  auto it = s.fields().find(key);
  return it == s.fields().end() ? kNull : it->second;
}

Struct Load() {
  auto text = ReadFile(kDashboard);
  EXPECT_TRUE(text.ok()) << text.status();
  Struct doc;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.ok() ? *text : "{}", &doc).ok());
  return doc;
}

TEST(DashboardTest, PanelsAreWellFormed) {
  Struct doc = Load();
  EXPECT_FALSE(Field(doc, "uid").string_value().empty());
  const auto& panels = Field(doc, "panels").list_value().values();
  ASSERT_GE(panels.size(), 12);
  std::set<double> ids;
  struct Box {
    double x, y, w, h;
    std::string title;
  };
  std::vector<Box> boxes;
  for (const Value& v : panels) {
    const Struct& p = v.struct_value();
    std::string title = Field(p, "title").string_value();
    SCOPED_TRACE(title);
    EXPECT_FALSE(title.empty());
    EXPECT_TRUE(ids.insert(Field(p, "id").number_value()).second) << "duplicate panel id";
    EXPECT_FALSE(Field(p, "description").string_value().empty()) << "no description";
    const Struct& defaults =
        Field(Field(p, "fieldConfig").struct_value(), "defaults").struct_value();
    EXPECT_FALSE(Field(defaults, "unit").string_value().empty()) << "no unit";
    EXPECT_EQ(Field(Field(p, "datasource").struct_value(), "uid").string_value(), "${datasource}");
    const auto& targets = Field(p, "targets").list_value().values();
    EXPECT_FALSE(targets.empty());
    for (const Value& t : targets) {
      EXPECT_FALSE(Field(t.struct_value(), "expr").string_value().empty());
    }
    const Struct& g = Field(p, "gridPos").struct_value();
    Box b{Field(g, "x").number_value(), Field(g, "y").number_value(), Field(g, "w").number_value(),
          Field(g, "h").number_value(), title};
    EXPECT_GT(b.w, 0);
    EXPECT_GT(b.h, 0);
    EXPECT_LE(b.x + b.w, 24) << "wider than the 24-column grid";
    for (const Box& o : boxes) {
      bool overlap = b.x < o.x + o.w && o.x < b.x + b.w && b.y < o.y + o.h && o.y < b.y + b.h;
      EXPECT_FALSE(overlap) << "overlaps " << o.title;
    }
    boxes.push_back(b);
  }
}

TEST(DashboardTest, VariablesAreTemplated) {
  Struct doc = Load();
  std::set<std::string> names;
  for (const Value& v : Field(Field(doc, "templating").struct_value(), "list").list_value().values()) {
    names.insert(Field(v.struct_value(), "name").string_value());
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf({"datasource", "job_id", "instance"}));
}

}  // namespace
}  // namespace loom
