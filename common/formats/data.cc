#include "common/formats/data.h"

#include "common/formats/prepare_data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

// Aborts on a broken caller invariant (the accessors return void, and a bad
// cursor or rank is a programming error, not a runtime condition).
#define LOOM_DATA_CHECK(cond)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,    \
                   #cond);                                                     \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

namespace loom::engine {
namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// starts_ packs (shard, offset) as shard << kOffsetBits | offset.
constexpr int kOffsetBits = 40;
constexpr uint64_t kOffsetMask = (uint64_t{1} << kOffsetBits) - 1;
constexpr uint64_t kMaxShards = uint64_t{1} << (64 - kOffsetBits);

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr bool kHostIsLittleEndian = false;
#else
constexpr bool kHostIsLittleEndian = true;
#endif

absl::Status ErrnoError(int err, absl::string_view op, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(op, " ", path));
}

// Owns a file descriptor; closes it (ignoring errors) unless Release()d.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Reads until `n` bytes or end of file. Returns the number of bytes read.
absl::StatusOr<size_t> ReadFully(int fd, void* buf, size_t n, const std::string& path) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read", path);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

absl::Status WriteFully(int fd, const void* buf, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

int32_t DecodeInt32LE(const unsigned char* p) {
  const uint32_t u = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                     uint32_t{p[3]} << 24;
  return static_cast<int32_t>(u);
}

void EncodeInt32LE(int32_t v, unsigned char* p) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(u >> (8 * i));
}

uint16_t ByteSwap16(uint16_t v) { return static_cast<uint16_t>(v << 8 | v >> 8); }

// fsync of the directory makes a rename inside it durable. Some filesystems
// refuse fsync on directories (EINVAL); there is nothing more to do there.
absl::Status SyncDirectoryOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory", dir);
  ScopedFd closer(fd);
  if (::fsync(fd) != 0 && errno != EINVAL) return ErrnoError(errno, "fsync", dir);
  return absl::OkStatus();
}

// --- Deterministic permutation ---------------------------------------------
// Spelled out here (not std::shuffle / std::uniform_int_distribution, whose
// output is implementation-defined) so that every rank on every platform, and
// every future build resuming a checkpoint, visits samples in the same order.

// splitmix64 (Steele, Lea, Flood 2014; constants from Vigna's reference
// implementation, prng.di.unimi.it/splitmix64.c).
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256** 1.0 (Blackman & Vigna, prng.di.unimi.it/xoshiro256starstar.c),
// seeded through splitmix64 as its authors recommend.
class Xoshiro256StarStar {
 public:
  explicit Xoshiro256StarStar(uint64_t seed) {
    for (uint64_t& word : s_) word = SplitMix64(seed);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, bound) for bound >= 1, without modulo bias: values below
  // 2^64 mod bound are rejected, leaving a multiple of bound to reduce.
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_;
};

// One generator seed per (seed, epoch): hash the seed, mix in the epoch, hash
// again, so neighbouring seeds or epochs give unrelated streams.
uint64_t EpochKey(uint64_t seed, int64_t epoch) {
  uint64_t state = seed;
  uint64_t key = SplitMix64(state) ^ static_cast<uint64_t>(epoch);
  return SplitMix64(key);
}

// Fisher-Yates (Durstenfeld's in-place form, Knuth TAOCP vol. 2, 3.4.2 P).
void BuildPermutation(uint64_t seed, int64_t epoch, int64_t n, std::vector<int64_t>* perm) {
  perm->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*perm)[i] = i;
  Xoshiro256StarStar rng(EpochKey(seed, epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap((*perm)[i], (*perm)[j]);
  }
}

// --- Byte-level preparation ------------------------------------------------

std::string ShardPath(const std::string& dir, const std::string& prefix, int index) {
  return (std::filesystem::path(dir) / absl::StrFormat("%s_%06d.bin", prefix, index))
      .string();
}

// Accumulates tokens and writes them as numbered shards of at most
// `max_tokens` tokens. Holds at most one shard in memory.
class ShardSink {
 public:
  ShardSink(std::string dir, std::string prefix, int64_t max_tokens, int64_t expected_tokens)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), max_tokens_(max_tokens) {
    buffer_.reserve(static_cast<size_t>(std::min(max_tokens, expected_tokens)));
  }

  absl::Status Append(uint16_t token) {
    buffer_.push_back(token);
    if (static_cast<int64_t>(buffer_.size()) == max_tokens_) return Flush();
    return absl::OkStatus();
  }

  // Writes the partly filled last shard, if any.
  absl::Status Finish() { return buffer_.empty() ? absl::OkStatus() : Flush(); }

  const std::vector<std::string>& paths() const { return paths_; }

 private:
  absl::Status Flush() {
    std::string path = ShardPath(dir_, prefix_, static_cast<int>(paths_.size()));
    RETURN_IF_ERROR(WriteShard(path, buffer_));
    paths_.push_back(std::move(path));
    buffer_.clear();
    return absl::OkStatus();
  }

  const std::string dir_;
  const std::string prefix_;
  const int64_t max_tokens_;
  std::vector<uint16_t> buffer_;
  std::vector<std::string> paths_;
};

// Deletes prefix_<first>.bin, prefix_<first+1>.bin, ... while they exist.
absl::Status RemoveStaleShards(const std::string& dir, const std::string& prefix, int first) {
  for (int i = first;; ++i) {
    const std::string path = ShardPath(dir, prefix, i);
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoError(errno, "unlink", path);
    }
  }
}

struct InputInfo {
  int64_t bytes = 0;
  bool separator_after = false;  // a '\n' follows this file in the stream
};

absl::StatusOr<InputInfo> InspectInput(const std::string& path, bool is_last) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  ScopedFd closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  InputInfo info;
  info.bytes = st.st_size;
  if (!is_last) {
    char last = 0;
    if (info.bytes > 0) {
      const ssize_t r = ::pread(fd, &last, 1, info.bytes - 1);
      if (r < 0) return ErrnoError(errno, "read", path);
      if (r != 1) return absl::AbortedError(absl::StrCat(path, " shrank while being read"));
    }
    info.separator_after = last != '\n';
  }
  return info;
}

}  // namespace

absl::StatusOr<std::vector<uint16_t>> ReadShard(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  ScopedFd closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < static_cast<int64_t>(kHeaderBytes)) {
    return absl::DataLossError(absl::StrCat(path, ": ", file_bytes,
                                            " bytes, shorter than the shard header"));
  }
  std::array<unsigned char, kHeaderBytes> header;
  ASSIGN_OR_RETURN(const size_t header_read, ReadFully(fd, header.data(), kHeaderBytes, path));
  if (header_read != kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  const int32_t magic = DecodeInt32LE(&header[0]);
  const int32_t version = DecodeInt32LE(&header[4]);
  const int32_t num_tokens = DecodeInt32LE(&header[8]);
  if (magic != kShardMagic) {
    return absl::DataLossError(
        absl::StrCat(path, ": bad magic ", magic, ", want ", kShardMagic));
  }
  if (version != kShardVersion) {
    return absl::DataLossError(
        absl::StrCat(path, ": unsupported version ", version, ", want ", kShardVersion));
  }
  const int64_t want_bytes =
      static_cast<int64_t>(kHeaderBytes) + int64_t{num_tokens} * int64_t{sizeof(uint16_t)};
  if (num_tokens < 0 || file_bytes != want_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": header says ", num_tokens,
                                            " tokens (", want_bytes, " bytes) but file has ",
                                            file_bytes, " bytes"));
  }
  std::vector<uint16_t> tokens(static_cast<size_t>(num_tokens));
  const size_t token_bytes = tokens.size() * sizeof(uint16_t);
  ASSIGN_OR_RETURN(const size_t got, ReadFully(fd, tokens.data(), token_bytes, path));
  if (got != token_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": file shrank while being read"));
  }
  if (!kHostIsLittleEndian) {
    for (uint16_t& t : tokens) t = ByteSwap16(t);
  }
  return tokens;
}

absl::Status WriteShard(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", path, " would hold ", tokens.size(), " tokens, more than INT32_MAX"));
  }
  std::array<unsigned char, kHeaderBytes> header{};
  EncodeInt32LE(kShardMagic, &header[0]);
  EncodeInt32LE(kShardVersion, &header[4]);
  EncodeInt32LE(static_cast<int32_t>(tokens.size()), &header[8]);

  // Unique per process and call, in the target's directory so that rename()
  // is atomic.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "create", tmp);
  ScopedFd file(fd);

  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(WriteFully(fd, header.data(), header.size(), tmp));
    if (kHostIsLittleEndian) {
      RETURN_IF_ERROR(WriteFully(fd, tokens.data(), tokens.size() * sizeof(uint16_t), tmp));
    } else {
      std::vector<uint16_t> chunk;
      constexpr size_t kChunk = 1 << 16;
      for (size_t i = 0; i < tokens.size(); i += kChunk) {
        const size_t n = std::min(kChunk, tokens.size() - i);
        chunk.assign(tokens.begin() + i, tokens.begin() + i + n);
        for (uint16_t& t : chunk) t = ByteSwap16(t);
        RETURN_IF_ERROR(WriteFully(fd, chunk.data(), n * sizeof(uint16_t), tmp));
      }
    }
    if (::fsync(fd) != 0) return ErrnoError(errno, "fsync", tmp);
    if (::close(file.Release()) != 0) return ErrnoError(errno, "close", tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError(errno, "rename", tmp);
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return SyncDirectoryOf(path);
}

absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns) {
  if (patterns.empty()) return absl::InvalidArgumentError("no shard patterns given");
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    glob_t matches;
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    if (rc == GLOB_NOSPACE) {
      ::globfree(&matches);
      return absl::ResourceExhaustedError(absl::StrCat("glob ", pattern, ": out of memory"));
    }
    if (rc != 0 && rc != GLOB_NOMATCH) {
      ::globfree(&matches);
      return absl::InternalError(absl::StrCat("glob ", pattern, " failed with code ", rc));
    }
    size_t regular = 0;
    for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) {
      struct stat st;
      if (::stat(matches.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) {
        files.emplace_back(matches.gl_pathv[i]);
        ++regular;
      }
    }
    ::globfree(&matches);
    if (regular == 0) {
      return absl::NotFoundError(absl::StrCat("no file matches ", pattern));
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

absl::StatusOr<TokenDataset> TokenDataset::Load(const std::vector<std::string>& paths,
                                                int seq_len) {
  // Checked before reading, which may take long for big shards.
  if (seq_len < 1) return absl::InvalidArgumentError(absl::StrCat("seq_len ", seq_len, " < 1"));
  if (paths.empty()) return absl::InvalidArgumentError("no shard paths given");
  std::vector<std::vector<uint16_t>> shards;
  shards.reserve(paths.size());
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, ReadShard(path));
    shards.push_back(std::move(tokens));
  }
  return FromShards(std::move(shards), seq_len);
}

absl::StatusOr<TokenDataset> TokenDataset::FromShards(std::vector<std::vector<uint16_t>> shards,
                                                      int seq_len) {
  if (seq_len < 1) return absl::InvalidArgumentError(absl::StrCat("seq_len ", seq_len, " < 1"));
  if (shards.empty()) return absl::InvalidArgumentError("no shards given");
  if (shards.size() > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat(shards.size(), " shards, at most ", kMaxShards));
  }
  TokenDataset ds;
  ds.seq_len_ = seq_len;
  const uint64_t window = static_cast<uint64_t>(seq_len) + 1;
  size_t longest = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::vector<uint16_t>& shard = shards[s];
    if (shard.size() > kOffsetMask) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", s, " holds ", shard.size(),
                                                     " tokens, at most ", kOffsetMask));
    }
    longest = std::max(longest, shard.size());
    ds.num_tokens_ += static_cast<int64_t>(shard.size());
    for (uint16_t t : shard) ds.max_token_ = std::max(ds.max_token_, t);
    for (uint64_t offset = 0; offset + window <= shard.size(); offset += seq_len) {
      ds.starts_.push_back(static_cast<uint64_t>(s) << kOffsetBits | offset);
    }
  }
  if (ds.starts_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no shard holds seq_len + 1 = ", window, " tokens (longest holds ",
                     longest, "), so no sample fits"));
  }
  ds.shards_ = std::move(shards);
  return ds;
}

int64_t TokenDataset::SampleAt(uint64_t seed, int64_t cursor) const {
  LOOM_DATA_CHECK(cursor >= 0);
  const int64_t n = num_samples();
  const int64_t epoch = cursor / n;
  if (epoch != perm_epoch_ || seed != perm_seed_ || static_cast<int64_t>(perm_.size()) != n) {
    BuildPermutation(seed, epoch, n, &perm_);
    perm_epoch_ = epoch;
    perm_seed_ = seed;
  }
  return perm_[static_cast<size_t>(cursor % n)];
}

void TokenDataset::CopySample(int64_t index, int64_t* inputs, int64_t* targets) const {
  LOOM_DATA_CHECK(index >= 0 && index < num_samples());
  const uint64_t start = starts_[static_cast<size_t>(index)];
  const uint16_t* tokens = shards_[start >> kOffsetBits].data() + (start & kOffsetMask);
  for (int i = 0; i < seq_len_; ++i) {
    inputs[i] = tokens[i];
    targets[i] = tokens[i + 1];
  }
}

void TokenDataset::FillRankBatch(uint64_t seed, int64_t cursor, int global_batch, int rank,
                                 int world_size, int64_t* inputs, int64_t* targets) const {
  LOOM_DATA_CHECK(cursor >= 0);
  LOOM_DATA_CHECK(global_batch > 0 && world_size > 0);
  LOOM_DATA_CHECK(global_batch % world_size == 0);
  LOOM_DATA_CHECK(rank >= 0 && rank < world_size);
  LOOM_DATA_CHECK(cursor <= std::numeric_limits<int64_t>::max() - global_batch);
  const int rows = global_batch / world_size;
  const int64_t first = cursor + int64_t{rank} * rows;
  for (int row = 0; row < rows; ++row) {
    const int64_t offset = int64_t{row} * seq_len_;
    CopySample(SampleAt(seed, first + row), inputs + offset, targets + offset);
  }
}

namespace {

// The end of every preparation: the last shards written, numbered shards of
// an earlier run beyond them removed, and the train split's unigram entropy
// H = -sum_t p_t ln p_t from its token counts.
absl::Status FinishPreparation(const std::string& out_dir, ShardSink& train, ShardSink& val,
                               const std::vector<int64_t>& counts, PrepareResult* result) {
  RETURN_IF_ERROR(train.Finish());
  RETURN_IF_ERROR(val.Finish());
  result->train_shards = train.paths();
  result->val_shards = val.paths();
  RETURN_IF_ERROR(RemoveStaleShards(out_dir, "train", static_cast<int>(result->train_shards.size())));
  RETURN_IF_ERROR(RemoveStaleShards(out_dir, "val", static_cast<int>(result->val_shards.size())));
  const double n = static_cast<double>(result->train_tokens);
  for (int64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    result->unigram_entropy_nats -= p * std::log(p);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrepareResult> PrepareEncodedData(
    const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
    int vocab_size, const std::string& train_text,
    const std::function<absl::Status(const std::string&)>& prepare,
    const std::function<absl::StatusOr<std::vector<int>>(std::string_view)>& encode,
    int64_t max_tokens_per_shard) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction ", val_fraction, " is not in [0, 1)"));
  }
  if (vocab_size < 1 || vocab_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " is not in [1, 65536] (16-bit token shards)"));
  }
  if (max_tokens_per_shard < 1 || max_tokens_per_shard > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens_per_shard ", max_tokens_per_shard, " is not in [1, INT32_MAX]"));
  }
  // The stream, whole.
  std::string stream;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSIGN_OR_RETURN(InputInfo info, InspectInput(inputs[i], i + 1 == inputs.size()));
    const int fd = ::open(inputs[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "open", inputs[i]);
    ScopedFd closer(fd);
    const size_t start = stream.size();
    stream.resize(start + static_cast<size_t>(info.bytes));
    ASSIGN_OR_RETURN(const size_t n, ReadFully(fd, stream.data() + start,
                                               static_cast<size_t>(info.bytes), inputs[i]));
    if (static_cast<int64_t>(n) != info.bytes) {
      return absl::AbortedError(absl::StrCat(inputs[i], " changed size while being read"));
    }
    if (info.separator_after) stream.push_back('\n');
  }
  size_t split = stream.size() - static_cast<size_t>(std::llround(
                                     val_fraction * static_cast<double>(stream.size())));
  while (split > 0 && split < stream.size() && stream[split - 1] != '\n') ++split;
  if (split == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train split is empty: ", stream.size(), " input bytes, val_fraction ", val_fraction));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return ErrnoError(ec.value(), "create directory", out_dir);
  if (!train_text.empty()) {
    std::ofstream out(train_text, std::ios::binary | std::ios::trunc);
    out.write(stream.data(), static_cast<std::streamsize>(split));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("writing ", train_text, " failed"));
  }
  if (prepare) RETURN_IF_ERROR(prepare(train_text));

  PrepareResult result;
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
  auto encode_range = [&](size_t begin, size_t end, std::vector<uint16_t>* tokens,
                          bool count) -> absl::Status {
    while (begin < end) {
      size_t line_end = stream.find('\n', begin);
      line_end = line_end == std::string::npos || line_end >= end ? end : line_end + 1;
      ASSIGN_OR_RETURN(std::vector<int> ids,
                       encode(std::string_view(stream).substr(begin, line_end - begin)));
      for (int id : ids) {
        if (id < 0 || id >= vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("token id ", id, " is outside the vocabulary of ", vocab_size));
        }
        tokens->push_back(static_cast<uint16_t>(id));
        if (count) ++counts[static_cast<size_t>(id)];
      }
      begin = line_end;
    }
    return absl::OkStatus();
  };
  std::vector<uint16_t> train_tokens, val_tokens;
  RETURN_IF_ERROR(encode_range(0, split, &train_tokens, /*count=*/true));
  RETURN_IF_ERROR(encode_range(split, stream.size(), &val_tokens, /*count=*/false));
  if (train_tokens.empty()) return absl::InvalidArgumentError("the train split encodes to no tokens");
  result.train_tokens = static_cast<int64_t>(train_tokens.size());
  result.val_tokens = static_cast<int64_t>(val_tokens.size());
  ShardSink train(out_dir, "train", max_tokens_per_shard, result.train_tokens);
  ShardSink val(out_dir, "val", max_tokens_per_shard, result.val_tokens);
  for (uint16_t t : train_tokens) RETURN_IF_ERROR(train.Append(t));
  for (uint16_t t : val_tokens) RETURN_IF_ERROR(val.Append(t));
  RETURN_IF_ERROR(FinishPreparation(out_dir, train, val, counts, &result));
  return result;
}

absl::StatusOr<PrepareResult> PrepareByteLevelData(const std::vector<std::string>& inputs,
                                                   const std::string& out_dir,
                                                   double val_fraction,
                                                   int64_t max_tokens_per_shard) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction ", val_fraction, " is not in [0, 1)"));
  }
  if (max_tokens_per_shard < 1 || max_tokens_per_shard > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens_per_shard ", max_tokens_per_shard, " is not in [1, INT32_MAX]"));
  }

  // First pass: sizes and separators, so the split point is known before any
  // byte is written and the input never has to fit in memory.
  std::vector<InputInfo> infos;
  int64_t total = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSIGN_OR_RETURN(InputInfo info, InspectInput(inputs[i], i + 1 == inputs.size()));
    total += info.bytes + (info.separator_after ? 1 : 0);
    infos.push_back(info);
  }
  PrepareResult result;
  result.val_tokens = std::llround(val_fraction * static_cast<double>(total));
  result.train_tokens = total - result.val_tokens;
  if (result.train_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train split is empty: ", total,
                                                   " input bytes, val_fraction ", val_fraction));
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return ErrnoError(ec.value(), "create directory", out_dir);

  ShardSink train(out_dir, "train", max_tokens_per_shard, result.train_tokens);
  ShardSink val(out_dir, "val", max_tokens_per_shard, result.val_tokens);
  std::array<int64_t, 256> counts{};
  int64_t position = 0;  // index of the next byte in the stream
  auto emit = [&](unsigned char byte) -> absl::Status {
    if (position++ < result.train_tokens) {
      ++counts[byte];
      return train.Append(byte);
    }
    return val.Append(byte);
  };

  std::vector<unsigned char> chunk(1 << 20);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& path = inputs[i];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "open", path);
    ScopedFd closer(fd);
    int64_t read_bytes = 0;
    for (;;) {
      ASSIGN_OR_RETURN(const size_t n, ReadFully(fd, chunk.data(), chunk.size(), path));
      if (n == 0) break;
      read_bytes += static_cast<int64_t>(n);
      if (read_bytes > infos[i].bytes) break;
      for (size_t k = 0; k < n; ++k) RETURN_IF_ERROR(emit(chunk[k]));
    }
    if (read_bytes != infos[i].bytes) {
      return absl::AbortedError(absl::StrCat(path, " changed size while being read"));
    }
    if (infos[i].separator_after) RETURN_IF_ERROR(emit('\n'));
  }
  RETURN_IF_ERROR(FinishPreparation(out_dir, train, val,
                                    std::vector<int64_t>(counts.begin(), counts.end()), &result));
  return result;
}

BatchPrefetcher::BatchPrefetcher(const TokenDataset* dataset, Options options,
                                 std::function<int64_t(int64_t)> next_after)
    : dataset_(dataset),
      options_(options),
      next_after_(std::move(next_after)),
      values_(static_cast<size_t>(options.global_batch / options.world_size) *
              static_cast<size_t>(dataset->seq_len())) {
  thread_ = std::thread([this] { Run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  const size_t depth = static_cast<size_t>(std::max(1, options_.depth));
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (next_to_fill_ >= 0 && ready_.size() < depth); });
    if (stop_) return;
    Slot slot;
    if (!free_.empty()) {
      slot = std::move(free_.back());
      free_.pop_back();
    }
    slot.batch = next_to_fill_;
    const uint64_t restarts = restarts_;
    lock.unlock();
    slot.inputs.resize(values_);
    slot.targets.resize(values_);
    dataset_->FillRankBatch(options_.seed, slot.batch * options_.global_batch,
                            options_.global_batch, options_.rank, options_.world_size,
                            slot.inputs.data(), slot.targets.data());
    const int64_t next = next_after_(slot.batch);
    lock.lock();
    if (restarts != restarts_) {  // Take() restarted elsewhere meanwhile
      free_.push_back(std::move(slot));
      continue;
    }
    ready_.push_back(std::move(slot));
    next_to_fill_ = next;
    cv_.notify_all();
  }
}

double BatchPrefetcher::Take(int64_t batch, int64_t* inputs, int64_t* targets) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  // Expected: the front of the queue, or the batch being filled now.
  const bool expected = !ready_.empty() ? ready_.front().batch == batch : next_to_fill_ == batch;
  if (!expected) {
    for (Slot& s : ready_) free_.push_back(std::move(s));
    ready_.clear();
    next_to_fill_ = batch;
    ++restarts_;
    cv_.notify_all();
  }
  cv_.wait(lock, [&] { return !ready_.empty(); });
  Slot slot = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();  // room for one more
  lock.unlock();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::memcpy(inputs, slot.inputs.data(), values_ * sizeof(int64_t));
  std::memcpy(targets, slot.targets.data(), values_ * sizeof(int64_t));
  lock.lock();
  free_.push_back(std::move(slot));
  return waited;
}

}  // namespace loom::engine
