#include "worker/gemm_peak_cache.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

class GemmPeakCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_gemm_peak_cache_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/loom-gemm-peak.cache";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  static GemmPeak At(double flops, absl::Time when) { return {flops, when, 4242}; }

  std::string dir_, path_;
  const absl::Duration max_age_ = absl::Minutes(10);
};

TEST_F(GemmPeakCacheTest, AFreshEntryIsReusedForItsKeyAndThreadCountOnly) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 2, max_age_, now).has_value());  // no file
  ASSERT_TRUE(WriteGemmPeak(path_, "host a", 2, At(9.5e10, now), max_age_).ok());
  ASSERT_TRUE(WriteGemmPeak(path_, "host a", 1, At(5.1e10, now), max_age_).ok());
  ASSERT_TRUE(WriteGemmPeak(path_, "host b", 2, At(7.0e10, now), max_age_).ok());
  auto two = ReadGemmPeak(path_, "host a", 2, max_age_, now + absl::Minutes(9));
  ASSERT_TRUE(two.has_value());
  EXPECT_DOUBLE_EQ(two->flops_per_second, 9.5e10);
  EXPECT_EQ(two->pid, 4242);
  EXPECT_EQ(two->measured, now);
  EXPECT_DOUBLE_EQ(ReadGemmPeak(path_, "host a", 1, max_age_, now)->flops_per_second, 5.1e10);
  EXPECT_DOUBLE_EQ(ReadGemmPeak(path_, "host b", 2, max_age_, now)->flops_per_second, 7.0e10);
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 4, max_age_, now).has_value());
  // Stale, from the future, or the cache turned off: calibrate again.
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 2, max_age_, now + absl::Minutes(11)).has_value());
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 2, max_age_, now - absl::Minutes(2)).has_value());
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 2, absl::ZeroDuration(), now).has_value());
  // A new measurement replaces its own entry and keeps the others.
  ASSERT_TRUE(WriteGemmPeak(path_, "host a", 2, At(9.9e10, now), max_age_).ok());
  EXPECT_DOUBLE_EQ(ReadGemmPeak(path_, "host a", 2, max_age_, now)->flops_per_second, 9.9e10);
  EXPECT_DOUBLE_EQ(ReadGemmPeak(path_, "host b", 2, max_age_, now)->flops_per_second, 7.0e10);
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(GemmPeakCacheTest, ADamagedFileOrALinkIsNotTrusted) {
  const absl::Time now = absl::Now();
  std::ofstream(path_) << "not a cache\n2 9e10 1 1 host a\n";
  EXPECT_FALSE(ReadGemmPeak(path_, "host a", 2, max_age_, now).has_value());
  // Written over: the damaged file is replaced.
  ASSERT_TRUE(WriteGemmPeak(path_, "host a", 2, At(9e10, now), max_age_).ok());
  EXPECT_TRUE(ReadGemmPeak(path_, "host a", 2, max_age_, now).has_value());
  const std::string link = dir_ + "/link.cache";
  ASSERT_EQ(symlink(path_.c_str(), link.c_str()), 0);
  EXPECT_FALSE(ReadGemmPeak(link, "host a", 2, max_age_, now).has_value());
}

TEST_F(GemmPeakCacheTest, TheWorkersMaxAgeReachesTheRank) {
  unsetenv("LOOM_PROBE_MAX_AGE_SECONDS");
  EXPECT_EQ(GemmPeakMaxAge(), absl::Minutes(10));
  setenv("LOOM_PROBE_MAX_AGE_SECONDS", "0", 1);
  EXPECT_EQ(GemmPeakMaxAge(), absl::ZeroDuration());
  setenv("LOOM_PROBE_MAX_AGE_SECONDS", "90", 1);
  EXPECT_EQ(GemmPeakMaxAge(), absl::Seconds(90));
  unsetenv("LOOM_PROBE_MAX_AGE_SECONDS");
}

}  // namespace
}  // namespace loom::worker
