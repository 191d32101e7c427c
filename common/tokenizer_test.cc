#include "common/tokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

// Real English text from Debian's fortunes-min (scripts/install-deps.sh).
constexpr char kCorpus[] = "/usr/share/games/fortunes/fortunes";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
  return dir;
}

TEST(ByteTokenizerTest, IsTheIdentityOnBytes) {
  auto t = MakeByteTokenizer();
  EXPECT_EQ(t->kind(), "byte");
  EXPECT_EQ(t->vocab_size(), 256);
  const std::string text("a\xff\n\0z", 5);
  auto ids = t->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int>{'a', 255, '\n', 0, 'z'}));
  EXPECT_EQ(*t->Decode(*ids), text);
  EXPECT_FALSE(t->Decode({256}).ok());
}

class BpeTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("loom_bpe_test"));
    ASSERT_TRUE(TrainBpeTokenizer(kCorpus, *dir_ + "/tokenizer", 512).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string* dir_;
};
std::string* BpeTokenizerTest::dir_ = nullptr;

TEST_F(BpeTokenizerTest, RoundTripsEveryLineAndCompressesEnglish) {
  auto t = LoadBpeTokenizer(*dir_ + "/tokenizer.model");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "bpe");
  EXPECT_EQ((*t)->vocab_size(), 512);
  const std::string corpus = ReadAll(kCorpus);
  ASSERT_GT(corpus.size(), 10000u);
  int64_t tokens = 0;
  for (absl::string_view line : absl::StrSplit(corpus, '\n')) {
    const std::string text = absl::StrCat(line, "\n");
    auto ids = (*t)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (int id : *ids) ASSERT_TRUE(id >= 0 && id < 512) << id;
    auto back = (*t)->Decode(*ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, text);
    tokens += static_cast<int64_t>(ids->size());
  }
  const double per_byte = static_cast<double>(tokens) / static_cast<double>(corpus.size());
  std::printf("BPE 512 on %s: %.3f tokens per byte\n", kCorpus, per_byte);
  EXPECT_LT(per_byte, 0.6) << "merges should shorten English well below one token per byte";
}

TEST_F(BpeTokenizerTest, BytesOutsideThePiecesFallBackToByteTokens) {
  auto t = LoadBpeTokenizer(*dir_ + "/tokenizer.model");
  ASSERT_TRUE(t.ok());
  for (const std::string& text :
       {std::string("  leading spaces, tabs\tand emoji \xF0\x9F\x98\x80 \xC3\xA9t\xC3\xA9"),
        std::string("ALL CAPS 12345 ~~~ {}[]"), std::string("\n\n"), std::string(" ")}) {
    auto ids = (*t)->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*(*t)->Decode(*ids), text);
  }
  auto bad = (*t)->Decode({0, 512});
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("outside the vocabulary"));
}

TEST_F(BpeTokenizerTest, DataDirectoriesNameTheirTokenizer) {
  std::ofstream(*dir_ + "/meta.json") << "{\"tokenizer\": \"bpe\", \"vocab_size\": 512, "
                                         "\"model\": \"tokenizer.model\"}\n";
  auto t = LoadDataTokenizer(*dir_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "bpe");
  const std::string bytes_dir = TempDir("loom_bytes_dir");
  auto bytes = LoadDataTokenizer(bytes_dir);  // no meta.json: byte-level
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)->kind(), "byte");
  std::ofstream(bytes_dir + "/meta.json") << "{\"tokenizer\": \"tiktoken\"}\n";
  EXPECT_EQ(LoadDataTokenizer(bytes_dir).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BpeTrainingTest, RefusesVocabulariesTheShardsCannotHold) {
  const std::string dir = TempDir("loom_bpe_bad");
  EXPECT_EQ(TrainBpeTokenizer(kCorpus, dir + "/t", 100).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainBpeTokenizer(kCorpus, dir + "/t", 70000).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(LoadBpeTokenizer(dir + "/missing.model").ok());
  std::ofstream(dir + "/junk.model") << "not a model";
  EXPECT_EQ(LoadBpeTokenizer(dir + "/junk.model").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
