#include "worker/telemetry/telemetry.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace loom::telemetry {
namespace {

TEST(TelemetryTest, Gpt2SmallFlopsPerToken) {
  // GPT-2 small: L 12, d 768, V 50257, s 1024.
  GptShape m{12, 768, 1024, 50257};
  EXPECT_EQ(MatmulParameters(m), 12 * 12 * 768 * 768 + 50257 * 768);  // 123.5M
  // 6N = 741.2M plus attention 12·12·1024·768 = 113.2M per token.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m), 6.0 * (84934656.0 + 38597376.0) + 113246208.0);
}

TEST(TelemetryTest, Fp32AdamWIsSixteenBytesPerParameter) {
  StateBytes b = Fp32AdamWStateBytes(1000);
  EXPECT_EQ(b.parameters + b.gradients + b.optimizer, 16000u);
  EXPECT_EQ(b.optimizer, 8000u);
}

TEST(TelemetryTest, RssIsReadFromProc) {
  Rss r = ReadRss();
  EXPECT_GT(r.current, 1024u * 1024u);  // a running test binary holds more than 1 MiB
  EXPECT_GE(r.peak, r.current);
}

TEST(TelemetryTest, ModelPowerWhenNoRapl) {
  PowerMeter meter(2, 16);
  if (meter.source() == "model") {
    EXPECT_DOUBLE_EQ(meter.Account(3.0), 2 * PowerMeter::kModelBusyWattsPerCore);
    EXPECT_DOUBLE_EQ(meter.energy_joules(), 3.0 * 2 * PowerMeter::kModelBusyWattsPerCore);
  } else {
    EXPECT_EQ(meter.source(), "rapl");
    EXPECT_GE(meter.Account(0.1), 0.0);
  }
  EXPECT_EQ(meter.Account(0), 0.0);
}

TEST(TelemetryTest, MemoryLimitIsTheSmallerOfMemTotalAndTheCgroupLimit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("loom_memlimit_" + std::to_string(getpid()));
  fs::create_directories(dir / "cg" / "memory");
  auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  write(dir / "meminfo", "MemTotal:       16384 kB\nMemFree:        1 kB\n");
  // No cgroup files: MemTotal.
  EXPECT_EQ(ReadMemoryLimitBytes((dir / "meminfo").string(), (dir / "cg").string()),
            16384u * 1024);
  // cgroup v2 "max": no limit.
  write(dir / "cg" / "memory.max", "max\n");
  EXPECT_EQ(ReadMemoryLimitBytes((dir / "meminfo").string(), (dir / "cg").string()),
            16384u * 1024);
  // A smaller v2 limit wins.
  write(dir / "cg" / "memory.max", "4194304\n");
  EXPECT_EQ(ReadMemoryLimitBytes((dir / "meminfo").string(), (dir / "cg").string()), 4194304u);
  // v1's "unlimited" (page-rounded LLONG_MAX) is ignored.
  fs::remove(dir / "cg" / "memory.max");
  write(dir / "cg" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(ReadMemoryLimitBytes((dir / "meminfo").string(), (dir / "cg").string()),
            16384u * 1024);
  // The real host: something positive.
  EXPECT_GT(ReadMemoryLimitBytes(), 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::telemetry
