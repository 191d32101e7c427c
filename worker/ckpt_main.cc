// loom-ckpt: inspect trainer checkpoints.
//   loom-ckpt digest CHECKPOINT...   one line each: <sha256 of the model> <tensors> <parameters>
//   CHECKPOINT
// (a step directory, which is verified against its manifest first, or an
// old single-file checkpoint)
// Two checkpoints have the same digest exactly when their model parameters
// are bitwise equal. Exit 1 with a reason on stderr if a file is unreadable.
//
//   loom-ckpt verify CHECKPOINT...   re-reads every file of each checkpoint
// (a step-<9 digits> directory, or an old ckpt_<8 digits>.pt file) and checks
// it against its manifest (sidecar), as a rank does before resuming from it.
// One line each on stdout, fields separated by tabs (paths may hold spaces):
//   ok<TAB>CHECKPOINT
//   corrupt<TAB>CHECKPOINT<TAB>FILE<TAB>CHECK<TAB>MESSAGE
// where FILE is the file that failed and CHECK which check (checkpoint.h's
// kCheck* names: missing, unreadable, manifest_crc32c, manifest_content,
// size, crc32c, sha256). Exit 0 if every one verified, 1 if any did not, 2
// for bad usage (a name that is not a checkpoint's included). The
// controller makes the same checks in process (checkpoint_files.h) for
// `loomctl checkpoints JOB --verify`.
//
//   loom-ckpt sample CHECKPOINT --tokenizer DATA_DIR --prompt TEXT
//             [--tokens N] [--temperature T] [--top-k K] [--seed X]
// generates N tokens (default 64) after the prompt from the checkpoint's
// model (engine/sampler.h: key/value cache, temperature, top-k, a seeded
// generator) and writes the prompt and its continuation, decoded with the
// tokenizer the data was prepared with (common/tokenizer.h), to stdout.
// `loomctl sample` runs it. Exit 1 with a reason on stderr on failure, 2 for
// bad usage.
//
//   loom-ckpt export CHECKPOINT --tokenizer DATA_DIR --out DIR
// writes the checkpoint's model in Hugging Face's layout (engine/hf_export.h:
// model.safetensors, config.json, the tokenizer). `loomctl export` runs it.
//
//   loom-ckpt fetch REMOTE DIR [--resume-step N]
// brings into DIR, a job's checkpoint directory, the newest checkpoint under
// REMOTE (s3://bucket/prefix/<job>: where checkpoint.remote keeps the job's)
// when DIR has none as new that verifies (at or before step N when N > 0;
// default -1, the newest), checked object by object against the uploaded
// manifest's SHA-256 and committed into DIR as a save commits
// (common/object_store/remote_checkpoints.h). Rank 0 runs it before it
// resumes (so that loom-rank links no HTTP client). The store comes from
// the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...: s3_config.h).
// One line on stdout saying what was done; exit 0 when DIR is ready (a
// checkpoint restored, or none needed), 1 when nothing could be restored
// (the line says why), 2 for bad usage.
//
//   loom-ckpt fetch s3://bucket/prefix/<job>/step-NNNNNNNNN DIR
// brings that one checkpoint into DIR as step-NNNNNNNNN, checked the same
// way (nothing is read when DIR already has a copy that verifies). Rank 0
// of a job whose init_from is in the store runs it before it loads it.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "common/object_store/remote_checkpoints.h"
#include "common/tokenizer.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_inspect.h"
#include "worker/engine/checkpoint/checkpoint_model.h"
#include "worker/engine/hf_export.h"
#include "worker/engine/sampler.h"

namespace {

constexpr char kUsage[] =
    "usage: loom-ckpt digest CHECKPOINT... | loom-ckpt verify CHECKPOINT... |\n"
    "       loom-ckpt sample CHECKPOINT --tokenizer DATA_DIR --prompt TEXT [--tokens N]\n"
    "                 [--temperature T] [--top-k K] [--seed X] |\n"
    "       loom-ckpt export CHECKPOINT --tokenizer DATA_DIR --out DIR |\n"
    "       loom-ckpt fetch s3://BUCKET/PREFIX/JOB DIR [--resume-step N] |\n"
    "       loom-ckpt fetch s3://BUCKET/PREFIX/JOB/step-NNNNNNNNN DIR";

int Digest(int argc, char** argv) {
  int rc = 0;
  for (int i = 2; i < argc; ++i) {
    auto d = loom::engine::DigestCheckpointModel(argv[i]);
    if (!d.ok()) {
      std::cerr << "loom-ckpt: " << d.status() << std::endl;
      rc = 1;
      continue;
    }
    std::cout << d->sha256 << " " << d->tensors << " " << d->parameters << " " << argv[i]
              << std::endl;
  }
  return rc;
}

std::string OneLine(const std::string& s) {
  return absl::StrReplaceAll(s, {{"\t", " "}, {"\n", " "}});
}

int Verify(int argc, char** argv) {
  int rc = 0;
  for (int i = 2; i < argc; ++i) {
    loom::engine::CheckpointEntry entry;
    if (!loom::engine::CheckpointEntryOfPath(argv[i], &entry)) {
      std::cerr << "loom-ckpt: " << argv[i]
                << ": not a checkpoint (step-<9 digits> or ckpt_<8 digits>.pt)" << std::endl;
      return 2;
    }
    loom::engine::VerificationFailure failure;
    absl::StatusOr<loom::engine::VerifiedCheckpoint> verified =
        loom::engine::VerifyCheckpoint(entry, &failure);
    if (verified.ok()) {
      std::cout << "ok\t" << OneLine(argv[i]) << "\n";
    } else {
      std::cout << "corrupt\t" << OneLine(argv[i]) << "\t" << OneLine(failure.file) << "\t"
                << failure.check << "\t" << OneLine(std::string(verified.status().message()))
                << "\n";
      rc = 1;
    }
  }
  std::cout << std::flush;
  return rc;
}

int Sample(int argc, char** argv) {
  const std::string checkpoint = argv[2];
  std::string tokenizer_dir, prompt;
  bool have_prompt = false;
  loom::engine::SampleOptions options;
  for (int i = 3; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "loom-ckpt sample: " << flag << " needs a value\n" << kUsage << std::endl;
      return 2;
    }
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "--tokenizer") {
      tokenizer_dir = value;
    } else if (flag == "--prompt") {
      prompt = value;
      have_prompt = true;
    } else if (flag == "--tokens") {
      ok = absl::SimpleAtoi(value, &options.max_new_tokens);
    } else if (flag == "--temperature") {
      ok = absl::SimpleAtod(value, &options.temperature);
    } else if (flag == "--top-k") {
      ok = absl::SimpleAtoi(value, &options.top_k);
    } else if (flag == "--seed") {
      ok = absl::SimpleAtoi(value, &options.seed);
    } else {
      std::cerr << "loom-ckpt sample: unknown flag " << flag << "\n" << kUsage << std::endl;
      return 2;
    }
    if (!ok) {
      std::cerr << "loom-ckpt sample: " << flag << ": not a number: " << value << std::endl;
      return 2;
    }
  }
  if (tokenizer_dir.empty() || !have_prompt) {
    std::cerr << "loom-ckpt sample: --tokenizer and --prompt are required\n" << kUsage << std::endl;
    return 2;
  }
  auto tokenizer = loom::LoadDataTokenizer(tokenizer_dir);
  if (!tokenizer.ok()) {
    std::cerr << "loom-ckpt: " << tokenizer.status() << std::endl;
    return 1;
  }
  auto loaded = loom::engine::LoadCheckpointModel(checkpoint);
  if (!loaded.ok()) {
    std::cerr << "loom-ckpt: " << loaded.status() << std::endl;
    return 1;
  }
  if (loaded->config.vocab_size < (*tokenizer)->vocab_size()) {
    std::cerr << "loom-ckpt: the model's vocabulary (" << loaded->config.vocab_size
              << ") is smaller than the " << (*tokenizer)->kind() << " tokenizer's ("
              << (*tokenizer)->vocab_size() << ") in " << tokenizer_dir << std::endl;
    return 1;
  }
  auto model = loom::engine::BuildCheckpointModel(*loaded);
  if (!model.ok()) {
    std::cerr << "loom-ckpt: " << model.status() << std::endl;
    return 1;
  }
  auto ids = (*tokenizer)->Encode(prompt);
  if (!ids.ok()) {
    std::cerr << "loom-ckpt: " << ids.status() << std::endl;
    return 1;
  }
  auto generated = loom::engine::Generate(*model, *ids, options);
  if (!generated.ok()) {
    std::cerr << "loom-ckpt: " << generated.status() << std::endl;
    return 1;
  }
  // Tokens the tokenizer does not know (a model whose vocabulary is larger
  // than the tokenizer's) are dropped from the text, and counted.
  std::vector<int> known;
  for (int id : *generated) {
    if (id < (*tokenizer)->vocab_size()) known.push_back(id);
  }
  auto text = (*tokenizer)->Decode(known);
  if (!text.ok()) {
    std::cerr << "loom-ckpt: " << text.status() << std::endl;
    return 1;
  }
  std::cerr << "loom-ckpt: step " << loaded->step << ", " << ids->size() << " prompt token(s), "
            << generated->size() << " generated (" << (*tokenizer)->kind() << " tokenizer"
            << (known.size() < generated->size()
                    ? ", " + std::to_string(generated->size() - known.size()) +
                          " beyond its vocabulary dropped"
                    : std::string())
            << ")" << std::endl;
  std::cout << prompt << *text << std::endl;
  return 0;
}

int Export(int argc, char** argv) {
  const std::string checkpoint = argv[2];
  std::string tokenizer_dir, out;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      tokenizer_dir = argv[i + 1];
    } else if (flag == "--out") {
      out = argv[i + 1];
    } else {
      std::cerr << "loom-ckpt export: unknown flag " << flag << "\n" << kUsage << std::endl;
      return 2;
    }
  }
  if (tokenizer_dir.empty() || out.empty() || argc % 2 == 0) {
    std::cerr << "loom-ckpt export: --tokenizer and --out are required\n" << kUsage << std::endl;
    return 2;
  }
  auto loaded = loom::engine::LoadCheckpointModel(checkpoint);
  if (!loaded.ok()) {
    std::cerr << "loom-ckpt: " << loaded.status() << std::endl;
    return 1;
  }
  auto arch = loom::engine::HfArchitecture(loaded->config);
  if (!arch.ok()) {
    std::cerr << "loom-ckpt: " << arch.status() << std::endl;
    return 1;
  }
  if (absl::Status s = loom::engine::ExportHf(loaded->config, loaded->parameters, tokenizer_dir, out);
      !s.ok()) {
    std::cerr << "loom-ckpt: " << s << std::endl;
    return 1;
  }
  std::cout << "exported step " << loaded->step << " as Hugging Face " << *arch << " to " << out
            << " (model.safetensors, config.json, tokenizer)" << std::endl;
  return 0;
}

int Fetch(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::cerr << kUsage << std::endl;
    return 2;
  }
  loom::object_store::S3Location unused;
  if (loom::object_store::ParseCheckpointUrl(argv[2], &unused).ok()) {
    // One checkpoint by its location (a job's init_from in the store).
    if (argc != 4) {
      std::cerr << "loom-ckpt fetch: a checkpoint's location takes no --resume-step\n"
                << kUsage << std::endl;
      return 2;
    }
    absl::StatusOr<std::string> done = loom::object_store::FetchForInit(argv[2], argv[3]);
    std::cout << (done.ok() ? *done : std::string(done.status().message())) << std::endl;
    return done.ok() ? 0 : 1;
  }
  int64_t resume_step = -1;
  if (argc == 6 && (std::string(argv[4]) != "--resume-step" ||
                    !absl::SimpleAtoi(argv[5], &resume_step) || resume_step < -1)) {
    std::cerr << "loom-ckpt fetch: --resume-step takes a step >= -1\n" << kUsage << std::endl;
    return 2;
  }
  absl::StatusOr<std::string> done =
      loom::object_store::RestoreForResume(argv[2], argv[3], resume_step);
  std::cout << (done.ok() ? *done : std::string(done.status().message())) << std::endl;
  return done.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc >= 2 ? argv[1] : "";
  if (argc < 3 || (command != "digest" && command != "verify" && command != "sample" &&
                   command != "export" && command != "fetch")) {
    std::cerr << kUsage << std::endl;
    return 2;
  }
  if (command == "sample") return Sample(argc, argv);
  if (command == "export") return Export(argc, argv);
  if (command == "fetch") return Fetch(argc, argv);
  return command == "digest" ? Digest(argc, argv) : Verify(argc, argv);
}
