// loom-ckpt: inspect trainer checkpoints.
//   loom-ckpt digest CHECKPOINT...   one line each: <sha256 of the model> <tensors> <parameters> CHECKPOINT
// (a step directory, which is verified against its manifest first, or an
// old single-file checkpoint)
// Two checkpoints have the same digest exactly when their model parameters
// are bitwise equal. Exit 1 with a reason on stderr if a file is unreadable.
#include <iostream>
#include <string>

#include "worker/engine/checkpoint_inspect.h"

int main(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "digest") {
    std::cerr << "usage: loom-ckpt digest CHECKPOINT..." << std::endl;
    return 2;
  }
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
