// loomctl commands that need no cluster, run as the real binary.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/help.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace loom {
namespace {

using ::loom::testing::RunCommand;
using ::testing::HasSubstr;

const std::string kBin = LOOM_BIN_DIR;
const std::string kSrc = LOOM_SOURCE_DIR;

std::string Loomctl(const std::string& args) { return absl::StrCat(kBin, "/loomctl ", args); }

TEST(PlanCommandTest, PlansTheMegatron18BModelOnA100s) {
  auto r = RunCommand(Loomctl(absl::StrCat("plan ", kSrc, "/examples/gpt3-18b.yaml --topology ",
                                           kSrc, "/examples/topology-a100-80g-256.yaml --top 3")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("18.4B parameters"));
  EXPECT_THAT(r.out, HasSubstr("Chosen layout"));
  EXPECT_THAT(r.out, HasSubstr("Top 3 layouts"));
  EXPECT_THAT(r.out, HasSubstr("MFU"));
}

TEST(PlanCommandTest, JsonOutputParses) {
  // --cluster is the same as --topology.
  auto r = RunCommand(Loomctl(absl::StrCat("-o json plan ", kSrc, "/examples/gpt3-18b.yaml ",
                                           "--cluster ", kSrc,
                                           "/examples/topology-a100-80g-256.yaml")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct doc;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &doc).ok()) << r.out.substr(0, 500);
  EXPECT_GT(doc.fields_size(), 0);
}

TEST(PlanCommandTest, InfeasibleRequestSaysWhy) {
  std::string dir = loom::testing::MakeTempDir("loom_plan_test");
  std::ofstream(dir + "/one.yaml") << R"(name: one-gpu
device: A100-80GB
nodes: 1
devices_per_node: 1
intra_node: {bandwidth_gb_per_s: 300, latency_us: 3}
inter_node: {bandwidth_gbit_per_s: 200, latency_us: 10}
)";
  std::ofstream(dir + "/big.yaml") << R"(name: big
model: {gpt: {n_layer: 32, n_head: 32, d_model: 4096, seq_len: 2048, vocab_size: 32000}}
data: {train: ["x.bin"]}
optimizer: {adamw: {lr: 0.0003}}
schedule: {total_steps: 1000}
batch: {global_batch: 8}
precision: BF16
)";
  auto r = RunCommand(Loomctl(absl::StrCat("plan ", dir, "/big.yaml --topology ", dir, "/one.yaml")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr("GB per device before activations, device has 85.9 GB"));
}

TEST(PlanCommandTest, BadTopologyNamesTheFieldAndFile) {
  std::string dir = loom::testing::MakeTempDir("loom_plan_test");
  std::ofstream(dir + "/bad.yaml") << "name: x\ndevice: A100-80GB\nnodes: -1\ndevices_per_node: 8\n";
  auto r = RunCommand(Loomctl(absl::StrCat("plan ", kSrc, "/examples/gpt3-18b.yaml --topology ",
                                           dir, "/bad.yaml")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("bad.yaml"));
  EXPECT_THAT(r.err, HasSubstr("nodes"));
}

// Devices that don't pay: the 1T GPT with a batch of 3,072 on
// 131,072 A100s runs at 9.4% MFU on all of them (9.3% since the planner
// counts the embedding's and head's tensor-parallel collectives and the
// once-a-step sums); loomctl plan shows which device counts pay and
// recommends one.
TEST(PlanCommandTest, ShowsWhichDeviceCountsPayForTheOneTrillionModel) {
  auto r = RunCommand(Loomctl(absl::StrCat("plan ", kSrc, "/examples/gpt3-1t.yaml --topology ",
                                           kSrc, "/examples/topology-a100-80g-131072.yaml")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Device counts (the same request on fewer devices)"));
  EXPECT_THAT(r.out, HasSubstr("Recommended: 16,384 of 131,072 devices: "));
  EXPECT_THAT(r.out, HasSubstr("instead of 9.3%"));
  r = RunCommand(Loomctl(absl::StrCat("-o json plan ", kSrc, "/examples/gpt3-1t.yaml --topology ",
                                      kSrc, "/examples/topology-a100-80g-131072.yaml")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  google::protobuf::Struct doc;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &doc).ok());
  const auto& sweep = doc.fields().at("device_sweep").struct_value();
  EXPECT_EQ(sweep.fields().at("recommended_devices").number_value(), 16384);
}

// Knobs and model families the engine does not run yet are
// planned (loomctl plan) but refused at submit (loomctl validate runs the
// same check), each naming its field; malformed values are errors for both.
TEST(PlanCommandTest, PlansLlamaStyleModelsAndPinnedKnobsThatSubmitRefuses) {
  std::string dir = loom::testing::MakeTempDir("loom_plan_family_test");
  const std::string spec = R"(name: llama-ish
model:
  gpt:
    n_layer: 32
    n_head: 32
    n_kv_head: 8
    d_model: 4096
    seq_len: 2048
    vocab_size: 32000
    mlp: {gated: true, hidden: 11008}
    norm: RMSNORM
    untied_embeddings: true
data: {train: ["x.bin"]}
optimizer: {adamw: {lr: 0.0003}}
schedule: {total_steps: 1000}
batch: {global_batch: 64, micro_batch: 1}
precision: BF16
resources: {workers: 32, ranks: 256}
parallelism:
  data: 16
  tensor: 8
  pipeline: 2
  virtual_stages: 2
  sequence_parallel: true
)";
  std::ofstream(dir + "/llama.yaml") << spec;
  auto r = RunCommand(Loomctl(absl::StrCat("plan ", dir, "/llama.yaml --topology ", kSrc,
                                           "/examples/topology-a100-80g-256.yaml")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("32 heads (8 KV), MLP 11008"));
  EXPECT_THAT(r.out, HasSubstr("The spec's own layout"));
  EXPECT_THAT(r.out, HasSubstr("tp 8 | pp 2 | dp 16 | mb 1 | v 2 | recompute none | ZeRO-0 | SP"));
  auto v = RunCommand(Loomctl(absl::StrCat("validate ", dir, "/llama.yaml")));
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_THAT(v.err, HasSubstr("UNIMPLEMENTED"));
  EXPECT_THAT(v.err, HasSubstr("parallelism.sequence_parallel"));

  std::string bad = spec;
  bad.replace(bad.find("n_kv_head: 8"), 12, "n_kv_head: 5");
  std::ofstream(dir + "/bad.yaml") << bad;
  r = RunCommand(Loomctl(absl::StrCat("plan ", dir, "/bad.yaml --topology ", kSrc,
                                      "/examples/topology-a100-80g-256.yaml")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("model.gpt.n_kv_head: 5 does not divide model.gpt.n_head 32"));
}

TEST(ValidateCommandTest, MistypedFieldIsAnErrorWithItsPath) {
  std::string dir = loom::testing::MakeTempDir("loom_validate_test");
  std::ofstream(dir + "/typo.yaml") << R"(name: typo
model: {gpt: {n_layer: 2, n_heads: 2, d_model: 32, seq_len: 16, vocab_size: 256}}
)";
  auto r = RunCommand(Loomctl(absl::StrCat("validate ", dir, "/typo.yaml")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("model.gpt.n_heads"));
  auto ok = RunCommand(Loomctl(absl::StrCat("validate ", kSrc, "/examples/gpt-tiny.yaml")));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(UsageTest, UnknownCommandIsAUsageError) {
  auto r = RunCommand(Loomctl("frobnicate"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command frobnicate"));
}

TEST(PlanCommandTest, WithoutTopologyAsksTheControllerAndSaysWhenThereIsNone) {
  std::string home = loom::testing::MakeTempDir("loom_plan_live_test");
  auto r = RunCommand(Loomctl(absl::StrCat("--home ", home, " plan ", kSrc,
                                           "/examples/gpt-tiny.yaml")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(r.err, HasSubstr("loomctl local up"));
  // --executable-only is a question for the live cluster only.
  r = RunCommand(Loomctl(absl::StrCat("plan ", kSrc, "/examples/gpt3-18b.yaml --topology ", kSrc,
                                      "/examples/topology-a100-80g-256.yaml --executable-only")));
  EXPECT_EQ(r.exit_code, 2);
}

TEST(RollbackCommandTest, UsageErrorsExitTwo) {
  for (const char* args : {"rollback", "rollback job-1", "rollback job-1 --to-step x",
                           "rollback job-1 --to-step 10 --skip 5",
                           "rollback job-1 --to-step 10 --skip a:b",
                           "rollback job-1 --to-step 10 --frob"}) {
    auto r = RunCommand(Loomctl(args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
}

// `checkpoints gc` only previews (retention itself runs after every save):
// without --dry-run, with no job or an unknown flag it is a usage error that
// says so, before any controller is asked.
TEST(CheckpointsGcCommandTest, UsageErrorsExitTwoAndSayWhatGcDoes) {
  for (const char* args :
       {"checkpoints gc", "checkpoints gc job-1 --frob", "checkpoints gc job-1 job-2 --dry-run"}) {
    auto r = RunCommand(Loomctl(args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
  }
  auto r = RunCommand(Loomctl("checkpoints gc job-1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, ::testing::HasSubstr("retention already runs after every save"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("pass --dry-run"));
}

// `data prepare --tokenizer bpe` trains a SentencePiece BPE model
// on the train split, writes it beside the shards and says so in meta.json;
// every token id is below the vocabulary, and English compresses to well
// under a token per byte.
TEST(DataPrepareTest, BpeTokenizerIsTrainedAndWrittenBesideTheShards) {
  const std::string dir = loom::testing::MakeTempDir("loom_bpe_prepare");
  auto r = RunCommand(Loomctl(absl::StrCat(
      "data prepare --input /usr/share/games/fortunes/fortunes "
      "/usr/share/games/fortunes/literature --out ", dir, " --tokenizer bpe --vocab-size 512")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tokenizer: SentencePiece BPE, vocabulary 512"));
  auto meta = RunCommand(absl::StrCat("cat ", dir, "/meta.json"));
  EXPECT_THAT(meta.out, HasSubstr("\"tokenizer\": \"bpe\""));
  EXPECT_THAT(meta.out, HasSubstr("\"model\": \"tokenizer.model\""));
  EXPECT_EQ(RunCommand(absl::StrCat("test -s ", dir, "/tokenizer.model")).exit_code, 0);
  EXPECT_NE(RunCommand(absl::StrCat("test -e ", dir, "/.tokenizer-train.txt")).exit_code, 0)
      << "the trainer's copy of the text is removed";
  // Shards: llm.c's header (256 int32, magic 20240520) then uint16 ids.
  auto max_id = RunCommand(absl::StrCat(
      "/usr/bin/python3 -c \"import struct,glob,sys\n"
      "m=0;n=0;b=0\n"
      "for f in glob.glob('", dir, "/*.bin'):\n"
      "  d=open(f,'rb').read();h=struct.unpack('<3i',d[:12]);assert h[0]==20240520,h\n"
      "  ids=struct.unpack('<%dH'%h[2],d[1024:1024+2*h[2]]);m=max(m,max(ids));n+=len(ids)\n"
      "import os\n"
      "b=sum(os.path.getsize(p) for p in ['/usr/share/games/fortunes/fortunes',"
      "'/usr/share/games/fortunes/literature'])\n"
      "print(m, n/b)\""));
  ASSERT_EQ(max_id.exit_code, 0) << max_id.err;
  double tokens_per_byte = 1;
  int max_token = 0;
  ASSERT_EQ(sscanf(max_id.out.c_str(), "%d %lf", &max_token, &tokens_per_byte), 2) << max_id.out;
  EXPECT_LT(max_token, 512);
  EXPECT_LT(tokens_per_byte, 0.6);
  // A bad vocabulary is a usage error naming the range.
  auto bad = RunCommand(Loomctl(absl::StrCat("data prepare --input /usr/share/games/fortunes/"
                                             "fortunes --out ", dir, " --tokenizer bpe "
                                             "--vocab-size 100")));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("[260, 65536]"));
}

// The commands `loomctl --help` lists, read from its output.
std::vector<std::string> ListedCommands() {
  auto r = RunCommand(Loomctl("--help"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> names;
  bool in_list = false;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (line == "Commands:") {
      in_list = true;
    } else if (in_list && line.empty()) {
      break;
    } else if (in_list) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (!words.empty()) names.emplace_back(words[0]);
    }
  }
  return names;
}

TEST(HelpTest, EveryCommandAnswersHelpWithItsOwnUsage) {
  const std::vector<std::string> names = ListedCommands();
  ASSERT_GE(names.size(), 15u);
  for (const std::string& name : names) {
    for (const char* flag : {"--help", "-h"}) {
      auto r = RunCommand(Loomctl(absl::StrCat(name, " ", flag)));
      EXPECT_EQ(r.exit_code, 0) << name << " " << flag << ": " << r.err;
      EXPECT_THAT(r.out, ::testing::StartsWith(absl::StrCat("usage: loomctl ", name))) << name;
      EXPECT_EQ(r.err, "") << name;
    }
    auto r = RunCommand(Loomctl(absl::StrCat("help ", name)));
    EXPECT_EQ(r.exit_code, 0) << name;
    EXPECT_THAT(r.out, ::testing::StartsWith(absl::StrCat("usage: loomctl ", name)));
  }
  // Help wins over a usage error, after a subcommand and arguments too.
  for (const char* args : {"plan --help", "submit -h", "local up --help", "users add bob -h",
                           "rollback job-1 --to-step 5 --help", "data prepare --help"}) {
    auto r = RunCommand(Loomctl(args));
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("usage: loomctl")) << args;
  }
  auto top = RunCommand(Loomctl("help"));
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("Global flags:"));
  auto unknown = RunCommand(Loomctl("help frobnicate"));
  EXPECT_EQ(unknown.exit_code, 2);
}

// The daemons' --help lists their own flags (not "No flags matched").
TEST(HelpTest, TheDaemonsHelpListsTheirFlags) {
  for (const auto& [daemon, flag] : std::vector<std::pair<std::string, std::string>>{
           {"loom-controller", "--data_dir"}, {"loom-worker", "--controller"}}) {
    auto r = RunCommand(absl::StrCat(kBin, "/", daemon, " --help"));
    const std::string all = r.out + r.err;
    EXPECT_THAT(all, HasSubstr(flag)) << daemon;
    EXPECT_THAT(all, ::testing::Not(HasSubstr("No flags matched"))) << daemon;
  }
}

// Completes the words of `line` (the cursor after its last character) with
// the script of `loomctl completion bash`, in a real bash.
std::string Complete(const std::string& dir, const std::string& line) {
  std::ofstream(dir + "/run.sh") << "PATH=" << kBin << ":$PATH\n"
                                 << "source <(loomctl completion bash)\n"
                                 << "COMP_LINE='" << line << "'\n"
                                 << "read -ra COMP_WORDS <<< \"$COMP_LINE\"\n"
                                 << "[[ $COMP_LINE == *' ' ]] && COMP_WORDS+=('')\n"
                                 << "COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
                                 << "_loomctl\n"
                                 << "printf '%s\\n' \"${COMPREPLY[@]}\" | sort\n";
  auto r = RunCommand(absl::StrCat("cd ", dir, " && bash ", dir, "/run.sh"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

TEST(CompletionTest, BashCompletesCommandsSubcommandsFlagsAndFiles) {
  auto script = RunCommand(Loomctl("completion bash"));
  ASSERT_EQ(script.exit_code, 0) << script.err;
  EXPECT_THAT(script.out, HasSubstr("complete -o filenames -o bashdefault -F _loomctl loomctl"));
  EXPECT_EQ(RunCommand(Loomctl("completion zsh")).exit_code, 2);
  const std::string dir = loom::testing::MakeTempDir("loom_completion_test");
  std::ofstream(dir + "/job.yaml") << "name: x\n";
  EXPECT_EQ(Complete(dir, "loomctl sub"), "submit\n");
  EXPECT_EQ(Complete(dir, "loomctl ch"), "checkpoints\n");
  EXPECT_EQ(Complete(dir, "loomctl local "), "down\nrestart\nstatus\nup\n");
  EXPECT_EQ(Complete(dir, "loomctl local up --wor"), "--worker-timeout\n--workers\n");
  EXPECT_EQ(Complete(dir, "loomctl checkpoints job-1 --v"), "--verify\n");
  EXPECT_EQ(Complete(dir, "loomctl users add bob --role "), "admin\nreader\nuser\n");
  EXPECT_EQ(Complete(dir, "loomctl --home /tmp sub"), "submit\n");
  EXPECT_EQ(Complete(dir, "loomctl submit jo"), "job.yaml\n");
  EXPECT_EQ(Complete(dir, "loomctl help rol"), "rollback\n");
  EXPECT_EQ(Complete(dir, "loomctl --pl"), "--plaintext\n");
  // A JOB argument asks the controller; with none there, nothing is offered
  // and nothing is printed.
  EXPECT_EQ(Complete(dir, "loomctl --home " + dir + " cancel "), "\n");
}


// Every example in `loomctl VERB --help` (its lines that start "  loomctl ")
// names only files that exist, and every one that needs no cluster runs
// and exits 0 from the repository root: validate, plan with --topology,
// data prepare (its --out sent to a temporary folder), completion, help.
// The help is read from the binary, as a user sees it.
TEST(HelpExamplesTest, ExamplesNameRealFilesAndTheOfflineOnesRun) {
  const std::string home = loom::testing::MakeTempDir("loom_help_examples");
  int examples = 0, ran = 0;
  for (const cli::CommandHelp& c : cli::Commands()) {
    SCOPED_TRACE(c.name);
    auto help = RunCommand(Loomctl(c.name + " --help"));
    ASSERT_EQ(help.exit_code, 0) << help.err;
    int mine = 0;
    for (absl::string_view line : absl::StrSplit(help.out, '\n')) {
      if (!absl::ConsumePrefix(&line, "  loomctl ")) continue;
      ++mine;
      ++examples;
      const std::string example(line);
      std::vector<std::string> words = absl::StrSplit(example, ' ', absl::SkipEmpty());
      // Files the example reads: a word after --input (all of them), or
      // --topology, or a positional word that names a spec or text file.
      // What an example writes (--out, --dir) need not exist.
      std::string flag;
      for (const std::string& word : words) {
        if (absl::StartsWith(word, "-")) {
          flag = word;
          continue;
        }
        const bool output = flag == "--out" || flag == "--dir";
        const bool input = flag == "--input" || flag == "--topology";
        const bool looks_like_file =
            absl::EndsWith(word, ".yaml") || absl::EndsWith(word, ".yml") ||
            absl::EndsWith(word, ".json") || absl::EndsWith(word, ".md") ||
            absl::EndsWith(word, ".txt");
        if (!output && (input || looks_like_file)) {
          std::ifstream f(absl::StrCat(kSrc, "/", word));
          EXPECT_TRUE(f.good()) << "`loomctl " << example << "` names " << word
                                << ", which the repository does not have";
        }
        if (flag != "--input") flag.clear();
      }
      // The verb: the first word after the global flags (-o json, ...).
      size_t v = 0;
      while (v < words.size() && absl::StartsWith(words[v], "-")) v += 2;
      const std::string verb = v < words.size() ? words[v] : "";
      const bool offline =
          verb == "validate" || verb == "completion" || verb == "help" ||
          (verb == "data") ||
          (verb == "plan" && absl::StrContains(example, "--topology"));
      if (!offline) continue;
      // Outputs go to the temporary folder, not into the source tree.
      std::string command;
      for (size_t i = 0; i < words.size(); ++i) {
        const bool out_value = i > 0 && words[i - 1] == "--out";
        absl::StrAppend(&command, " ",
                        out_value ? absl::StrCat(home, "/out", ran) : words[i]);
      }
      auto r = RunCommand(absl::StrCat("cd ", kSrc, " && HOME=", home, " ", kBin, "/loomctl",
                                       command));
      EXPECT_EQ(r.exit_code, 0) << "`loomctl " << example << "` exited " << r.exit_code << ": "
                                << r.err << r.out.substr(0, 2000);
      ++ran;
    }
    EXPECT_GE(mine, 1) << "`loomctl " << c.name << " --help` has no example";
  }
  std::cout << examples << " examples, " << ran << " of them run without a cluster" << std::endl;
  EXPECT_GE(ran, 8);
  RunCommand("rm -rf " + home);
}

}  // namespace
}  // namespace loom
