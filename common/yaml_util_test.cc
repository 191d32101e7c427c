#include "common/yaml_util.h"

#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(YamlUtilTest, CountsDocumentsUpToTheBound) {
  EXPECT_EQ(CountYamlDocuments("", 4), 0);
  EXPECT_EQ(CountYamlDocuments("a: 1\n", 4), 1);
  EXPECT_EQ(CountYamlDocuments("a: 1\n---\nb: 2\n", 4), 2);
  EXPECT_EQ(CountYamlDocuments("---\n---\n---\n", 4), 3);
  EXPECT_EQ(CountYamlDocuments("1\n---\n2\n---\n3\n---\n4\n", 1), 2);  // more than 1
  EXPECT_THROW(CountYamlDocuments("a: [1\n", 4), YAML::Exception);
}

// Inputs on which YAML::LoadAll of yaml-cpp 0.7 never returns (found by
// loom_jobspec_fuzz): an error now, at once.
TEST(YamlUtilTest, StreamsThatHangLoadAllAreErrors) {
  for (const std::string text : {",", "\n,\n", "# spec\n  ,", "a: 1\n---\n,"}) {
    EXPECT_THROW(CountYamlDocuments(text, 16), YAML::Exception) << text;
  }
}

TEST(YamlMessagesTest, DescribeNodesAndJoinPaths) {
  const YAML::Node doc = YAML::Load(
      "a: ~\nb: [1]\nc: {d: 1}\ne: short\nf: "
      "a-scalar-much-longer-than-forty-characters-in-all\n");
  EXPECT_EQ(DescribeYamlNode(doc["a"]), "null");
  EXPECT_EQ(DescribeYamlNode(doc["b"]), "a list");
  EXPECT_EQ(DescribeYamlNode(doc["c"]), "a mapping");
  EXPECT_EQ(DescribeYamlNode(doc["e"]), "\"short\"");
  EXPECT_EQ(DescribeYamlNode(doc["f"]), "\"a-scalar-much-longer-than-forty-chara...\"");
  EXPECT_EQ(DescribeYamlNode(YAML::Node()), "null");
  EXPECT_EQ(JoinYamlPath("", "queues"), "queues");
  EXPECT_EQ(JoinYamlPath("queues[0]", "name"), "queues[0].name");
}

}  // namespace
}  // namespace loom
