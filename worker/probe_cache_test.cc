#include "worker/probe_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

class ProbeCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_probe_cache_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/loom-probe.cache";
    binary_ = dir_ + "/loom-rank";
    std::ofstream(binary_) << "a rank binary";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  static HostProbes Measured(absl::Time when) {
    HostProbes p;
    p.cpu.gemm_flops_per_second_per_thread = 1.1734e11;
    p.cpu.memory_bandwidth_bytes_per_second = 4.28e10;
    p.cpu.gemm_source = "sgemm 384^3 best of 8, 1 thread(s), openblas";
    p.cpu.gemm_threads = 1;
    p.cpu.seconds = 0.21;
    p.blocks.fixed_seconds = 0.000178;
    p.blocks.seconds_per_activation = 3.63e-8;
    p.blocks.allreduce_latency_seconds = 0.000714;
    p.blocks.allreduce_bytes_per_second = 1.5939e11;
    p.blocks.tensor_collective_extra_seconds = 0;
    p.blocks.tensor_collective_idle_fraction = 0.54;
    p.blocks.concurrent_slowdown = 1.05;
    p.blocks.line = "probe: fixed_ms=0.178 ns_per_element=36.3\nsecond line";
    p.measured = when;
    p.pid = 4242;
    return p;
  }

  std::string dir_, path_, binary_;
};

TEST_F(ProbeCacheTest, AFreshResultUnderTheSameKeyIsReadBackWhole) {
  const absl::Time t = absl::FromUnixMillis(absl::ToUnixMillis(absl::Now()));
  const std::string key = ProbeCacheKey(binary_);
  ASSERT_TRUE(WriteProbeCache(path_, key, Measured(t)).ok());
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto got = ReadProbeCache(path_, key, absl::Minutes(10), t + absl::Minutes(9));
  ASSERT_TRUE(got.has_value());
  const HostProbes want = Measured(t);
  EXPECT_EQ(got->measured, t);
  EXPECT_EQ(got->pid, 4242);
  EXPECT_EQ(got->cpu.gemm_flops_per_second_per_thread, want.cpu.gemm_flops_per_second_per_thread);
  EXPECT_EQ(got->cpu.memory_bandwidth_bytes_per_second, want.cpu.memory_bandwidth_bytes_per_second);
  EXPECT_EQ(got->cpu.gemm_source, want.cpu.gemm_source);
  EXPECT_EQ(got->cpu.gemm_threads, 1);
  EXPECT_EQ(got->blocks.fixed_seconds, want.blocks.fixed_seconds);
  EXPECT_EQ(got->blocks.seconds_per_activation, want.blocks.seconds_per_activation);
  EXPECT_EQ(got->blocks.allreduce_latency_seconds, want.blocks.allreduce_latency_seconds);
  EXPECT_EQ(got->blocks.allreduce_bytes_per_second, want.blocks.allreduce_bytes_per_second);
  EXPECT_EQ(got->blocks.tensor_collective_idle_fraction,
            want.blocks.tensor_collective_idle_fraction);
  EXPECT_EQ(got->blocks.concurrent_slowdown, want.blocks.concurrent_slowdown);
  // A newline in free text would have cut the file's lines.
  EXPECT_EQ(got->blocks.line, "probe: fixed_ms=0.178 ns_per_element=36.3 second line");
}

TEST_F(ProbeCacheTest, StaleOtherKeyDisabledMissingOrGarbledIsNotUsed) {
  const absl::Time t = absl::Now();
  const std::string key = ProbeCacheKey(binary_);
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());  // none yet
  ASSERT_TRUE(WriteProbeCache(path_, key, Measured(t)).ok());
  EXPECT_TRUE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t + absl::Minutes(11)).has_value());
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::ZeroDuration(), t).has_value());
  EXPECT_FALSE(ReadProbeCache(path_, key + "x", absl::Minutes(10), t).has_value());
  // From the future (a clock set back since): not trusted.
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t - absl::Minutes(5)).has_value());
  // Cut short: every field must be there.
  std::string text;
  {
    std::ifstream in(path_);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path_) << text.substr(0, text.find("block_fixed_seconds"));
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
  std::ofstream(path_) << "not a cache\n";
  EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
}

TEST_F(ProbeCacheTest, TheKeyChangesWithTheRankBinaryAndTheBlasCore) {
  const char* core = getenv("OPENBLAS_CORETYPE");
  const std::string saved = core == nullptr ? "" : core;
  unsetenv("OPENBLAS_CORETYPE");
  const std::string key = ProbeCacheKey(binary_);
  EXPECT_EQ(ProbeCacheKey(binary_), key);
  EXPECT_EQ(key.find('\n'), std::string::npos);
  EXPECT_NE(key.find("loom-rank size 13"), std::string::npos) << key;
  // A rebuilt binary (another size, another time).
  std::ofstream(binary_) << "a rebuilt rank binary";
  EXPECT_NE(ProbeCacheKey(binary_), key);
  const std::string rebuilt = ProbeCacheKey(binary_);
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  EXPECT_NE(ProbeCacheKey(binary_), rebuilt);
  if (saved.empty()) {
    unsetenv("OPENBLAS_CORETYPE");
  } else {
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  }
}

// A cache another user wrote is not taken (root can hand it to nobody; an
// unprivileged run checks the owner test through its own file only).
TEST_F(ProbeCacheTest, AFileAnotherUserOwnsIsIgnored) {
  const absl::Time t = absl::Now();
  const std::string key = ProbeCacheKey(binary_);
  ASSERT_TRUE(WriteProbeCache(path_, key, Measured(t)).ok());
  ASSERT_TRUE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
  const uid_t other = geteuid() == 0 ? 65534 : geteuid();
  if (chown(path_.c_str(), other, static_cast<gid_t>(-1)) == 0 && other != geteuid()) {
    EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
  } else {
    // Without root the file cannot change hands: a symlink (O_NOFOLLOW)
    // stands for a path someone else put there.
    ASSERT_EQ(rename(path_.c_str(), (path_ + ".real").c_str()), 0);
    ASSERT_EQ(symlink((path_ + ".real").c_str(), path_.c_str()), 0);
    EXPECT_FALSE(ReadProbeCache(path_, key, absl::Minutes(10), t).has_value());
  }
}

}  // namespace
}  // namespace loom::worker
