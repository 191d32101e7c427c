#include "common/json_writer.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(JsonWriterTest, EscapesAndNests) {
  JsonWriter w;
  w.BeginObject();
  w.Field("s", std::string("a\"b\\c\n"));
  w.Key("list");
  w.BeginArray();
  w.Value(1);
  w.Value(2.5);
  w.EndArray();
  w.Key("empty");
  w.BeginObject();
  w.EndObject();
  w.Field("nan", std::nan(""));
  w.EndObject();
  EXPECT_EQ(w.Finish(),
            "{\n  \"s\": \"a\\\"b\\\\c\\n\",\n  \"list\": [\n    1,\n    2.5\n  ],\n"
            "  \"empty\": {},\n  \"nan\": null\n}\n");
}

// What a home directory or a log path may hold (quotes, backslashes, tabs,
// control characters) comes back whole through a real JSON parser
// (protobuf's), along with 64-bit integers.
TEST(JsonWriterTest, AnyPathRoundTripsThroughAJsonParser) {
  const std::string path = "/home/o'brien \"x\"\\y\t\x01z/run";
  JsonWriter w;
  w.BeginArray();
  w.BeginObject();
  w.Field("log", path);
  w.Field("pid", 4242);
  w.Field("tokens", int64_t{1} << 40);
  w.Field("alive", true);
  w.EndObject();
  w.EndArray();
  google::protobuf::ListValue parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(w.Finish(), &parsed).ok()) << w.Finish();
  ASSERT_EQ(parsed.values_size(), 1);
  const auto& fields = parsed.values(0).struct_value().fields();
  EXPECT_EQ(fields.at("log").string_value(), path);
  EXPECT_EQ(fields.at("pid").number_value(), 4242);
  EXPECT_EQ(fields.at("tokens").number_value(), static_cast<double>(int64_t{1} << 40));
  EXPECT_TRUE(fields.at("alive").bool_value());
}

}  // namespace
}  // namespace loom
