#include "worker/telemetry/telemetry.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/telemetry/scoped_env.h"

#ifndef LOOM_FAKE_NVML_PATH
#error "LOOM_FAKE_NVML_PATH must name the nvml_fake_lib.cc shared library"
#endif

namespace loom::telemetry {
namespace {

TEST(TelemetryTest, Gpt2SmallFlopsPerToken) {
  // GPT-2 small: L 12, d 768, V 50257, s 1024.
  ModelShape m;
  m.n_layer = 12;
  m.d_model = 768;
  m.n_head = 12;
  m.seq_len = 1024;
  m.vocab_size = 50257;
  EXPECT_EQ(MatmulParameters(m), 12 * 12 * 768 * 768 + 50257 * 768);  // 123.5M
  // 6N = 741.2M plus attention 12·12·1024·768 = 113.2M per token.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m), 6.0 * (84934656.0 + 38597376.0) + 113246208.0);
}

TEST(TelemetryTest, LlamaFlopsCountGroupedQueryAttentionAndTheGatedMlp) {
  // Llama-2-7B's block: d 4096, 32 heads, MHA, SwiGLU hidden 11008; untied.
  ModelShape m;
  m.n_layer = 32;
  m.d_model = 4096;
  m.n_head = 32;
  m.ffn_hidden = 11008;
  m.gated_mlp = true;
  m.bias = false;
  m.rms_norm = true;
  m.learned_position_embedding = false;
  m.tied_embeddings = false;
  m.seq_len = 4096;
  m.vocab_size = 32000;
  const int64_t per_layer = 4 * 4096LL * 4096 + 3 * 4096LL * 11008;
  EXPECT_EQ(MatmulParameters(m), 32 * per_layer + 32000LL * 4096);  // 6.61B
  // With 8 K/V heads (GQA), K and V shrink to d x d/4 each.
  m.n_kv_head = 8;
  EXPECT_EQ(MatmulParameters(m), 32 * (per_layer - 2 * 4096LL * 3072) + 32000LL * 4096);
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m), 6.0 * MatmulParameters(m) + 12.0 * 32 * 4096 * 4096);
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


// A scratch directory for fake sysfs files, removed at the end of the test.
class PowerMeterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_power_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteRapl(int64_t microjoules) {
    const std::string path = (dir_ / "energy_uj").string();
    std::ofstream(path) << microjoules << "\n";
    return path;
  }
  std::string Missing() const { return (dir_ / "no_such_energy_uj").string(); }

  // Options with no RAPL and a CPU clock the test drives.
  PowerMeterOptions ModelOptions(int threads, int cores) {
    PowerMeterOptions o;
    o.threads = threads;
    o.cores = cores;
    o.rapl_energy_uj = Missing();
    o.process_cpu_seconds = [this] { return cpu_seconds_; };
    return o;
  }

  std::filesystem::path dir_;
  double cpu_seconds_ = 100;
};

TEST(TelemetryTest, ModelIsIdlePlusUtilisationTimesTdpMinusIdle) {
  // Per core idle 2 W, TDP 10 W.
  EXPECT_DOUBLE_EQ(PowerMeter::ModelWatts(1, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(PowerMeter::ModelWatts(1, 1.0), 10.0);
  // 4 cores: idle 8 W, TDP 40 W; half busy: 8 + 0.5·(40 − 8) = 24 W.
  EXPECT_DOUBLE_EQ(PowerMeter::ModelWatts(4, 0.5), 24.0);
  // Utilisation is clamped to [0, 1].
  EXPECT_DOUBLE_EQ(PowerMeter::ModelWatts(2, 1.7), 20.0);
  EXPECT_DOUBLE_EQ(PowerMeter::ModelWatts(2, -0.3), 4.0);
}

TEST_F(PowerMeterTest, ModelUsesTheProcessCpuTime) {
  PowerMeter meter(ModelOptions(4, 16));
  EXPECT_EQ(meter.source(), "model");
  EXPECT_THAT(meter.fallback_reason(),
              ::testing::StartsWith("rapl: " + Missing() + " not readable"));
  // 6 CPU seconds over 3 s on 4 cores: u = 0.5, 8 + 0.5·32 = 24 W, 72 J.
  cpu_seconds_ += 6;
  EXPECT_DOUBLE_EQ(meter.Account(3.0), 24.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 72.0);
  // All 4 cores busy for 2 s: TDP, 40 W, 80 J more.
  cpu_seconds_ += 8;
  EXPECT_DOUBLE_EQ(meter.Account(2.0), 40.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 152.0);
  // Idle for 1 s: 8 W.
  EXPECT_DOUBLE_EQ(meter.Account(1.0), 8.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 160.0);
  // Nothing to account.
  EXPECT_EQ(meter.Account(0), 0.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 160.0);
}

TEST_F(PowerMeterTest, RaplSharesThePackageByCores) {
  PowerMeterOptions o = ModelOptions(2, 8);
  o.rapl_energy_uj = WriteRapl(1000000);
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "rapl");
  EXPECT_EQ(meter.fallback_reason(), "");
  // The package used 8 J in 2 s; the rank has 2 of 8 cores: 2 J, 1 W.
  WriteRapl(9000000);
  EXPECT_DOUBLE_EQ(meter.Account(2.0), 1.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 2.0);
  // The counter wrapped: that interval counts nothing.
  WriteRapl(500);
  EXPECT_DOUBLE_EQ(meter.Account(1.0), 0.0);
  // And counting resumes from the wrapped value: 4 J · 2/8 = 1 J.
  WriteRapl(4000500);
  EXPECT_DOUBLE_EQ(meter.Account(1.0), 1.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 3.0);
}

TEST_F(PowerMeterTest, NvmlCounterOfTheRanksGpu) {
  PowerMeterOptions o = ModelOptions(4, 16);
  o.rapl_energy_uj = WriteRapl(1000000);  // present, but NVML comes first
  o.gpu_index = 1;
  o.nvml_library = LOOM_FAKE_NVML_PATH;
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "nvml");
  EXPECT_EQ(meter.fallback_reason(), "");
  // The fake's counter grows by 7.5 J per reading.
  EXPECT_DOUBLE_EQ(meter.Account(2.0), 3.75);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 7.5);
  EXPECT_DOUBLE_EQ(meter.Account(1.5), 5.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 15.0);
  // Neither RAPL nor the CPU clock is consulted.
  WriteRapl(999000000);
  cpu_seconds_ += 1000;
  EXPECT_DOUBLE_EQ(meter.Account(3.0), 2.5);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 22.5);
}

TEST_F(PowerMeterTest, NvmlFromTheEnvironmentVariable) {
  ScopedEnv env("LOOM_NVML_LIBRARY", LOOM_FAKE_NVML_PATH);
  PowerMeterOptions o = ModelOptions(1, 1);
  o.gpu_index = 0;
  EXPECT_EQ(PowerMeter(o).source(), "nvml");
  // A CPU rank does not load NVML even when it is there.
  o.gpu_index = -1;
  EXPECT_EQ(PowerMeter(o).source(), "model");
  // The legacy constructor is a CPU rank.
  EXPECT_NE(PowerMeter(2, 16).source(), "nvml");
}

TEST_F(PowerMeterTest, NoNvmlLibraryFallsBackToRaplThenModel) {
  PowerMeterOptions o = ModelOptions(2, 8);
  o.gpu_index = 0;
  o.nvml_library = (dir_ / "libnvidia-ml.so.1").string();
  o.rapl_energy_uj = WriteRapl(0);
  {
    PowerMeter meter(o);
    EXPECT_EQ(meter.source(), "rapl");
    EXPECT_THAT(meter.fallback_reason(),
                ::testing::StartsWith("nvml: " + o.nvml_library + " not found"));
    WriteRapl(4000000);
    EXPECT_DOUBLE_EQ(meter.Account(1.0), 1.0);
  }
  o.rapl_energy_uj = Missing();
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "model");
  EXPECT_THAT(meter.fallback_reason(), ::testing::HasSubstr(" not found"));
  EXPECT_THAT(meter.fallback_reason(), ::testing::HasSubstr("; rapl: " + Missing()));
  cpu_seconds_ += 2;
  EXPECT_DOUBLE_EQ(meter.Account(1.0), 20.0);  // both cores busy: 2 · 10 W
}

TEST_F(PowerMeterTest, NvmlWithoutTheCounterIntegratesPower) {
  ScopedEnv unsupported("LOOM_FAKE_NVML_ENERGY_RC", "3");  // NVML_ERROR_NOT_SUPPORTED
  PowerMeterOptions o = ModelOptions(2, 8);
  o.gpu_index = 0;
  o.nvml_library = LOOM_FAKE_NVML_PATH;
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "nvml");
  EXPECT_EQ(meter.fallback_reason(),
            "nvml: nvmlDeviceGetTotalEnergyConsumption: Not Supported on device 0 (pre-Volta "
            "GPU); integrating nvmlDeviceGetPowerUsage instead");
  // The fake's device 0 draws 250 W.
  EXPECT_DOUBLE_EQ(meter.Account(2.0), 250.0);
  EXPECT_DOUBLE_EQ(meter.energy_joules(), 500.0);
}

TEST_F(PowerMeterTest, NvmlWithNeitherCounterNorPowerFallsBack) {
  ScopedEnv no_energy("LOOM_FAKE_NVML_ENERGY_RC", "3");
  ScopedEnv no_power("LOOM_FAKE_NVML_POWER_RC", "3");
  PowerMeterOptions o = ModelOptions(1, 4);
  o.gpu_index = 0;
  o.nvml_library = LOOM_FAKE_NVML_PATH;
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "model");
  EXPECT_THAT(meter.fallback_reason(),
              ::testing::StartsWith("nvml: nvmlDeviceGetTotalEnergyConsumption: Not Supported "
                                    "on device 0 (pre-Volta GPU); rapl: "));
}

TEST_F(PowerMeterTest, NvmlInitFailureOrNoSuchGpuFallsBack) {
  PowerMeterOptions o = ModelOptions(1, 4);
  o.nvml_library = LOOM_FAKE_NVML_PATH;
  o.gpu_index = 5;
  {
    PowerMeter meter(o);
    EXPECT_EQ(meter.source(), "model");
    EXPECT_THAT(meter.fallback_reason(),
                ::testing::StartsWith("nvml: nvmlDeviceGetHandleByIndex_v2: no GPU 5 on this "
                                      "host (NVML sees 2 GPUs)"));
  }
  ScopedEnv fail("LOOM_FAKE_NVML_INIT_RC", "9");
  o.gpu_index = 0;
  PowerMeter meter(o);
  EXPECT_EQ(meter.source(), "model");
  EXPECT_THAT(meter.fallback_reason(),
              ::testing::StartsWith("nvml: nvmlInit_v2: Driver Not Loaded"));
}

TEST(TelemetryTest, HostPowerMeterWorks) {
  // This host's real sources: RAPL when readable, else the model.
  PowerMeter meter(2, 16);
  EXPECT_TRUE(meter.source() == "rapl" || meter.source() == "model") << meter.source();
  const double watts = meter.Account(0.1);
  EXPECT_GE(watts, 0.0);
  if (meter.source() == "model") {
    EXPECT_GE(watts, 2 * PowerMeter::kModelIdleWattsPerCore);
    EXPECT_LE(watts, 2 * PowerMeter::kModelTdpWattsPerCore);
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

// The process's age grows with the time it has run (lower bounds only: the
// clock tick is 10 ms), and a process started after this one is younger.
TEST(ProcessStartTest, AgeGrowsAndAChildStartedLaterIsYounger) {
  const double before = SecondsSinceProcessStart();
  ASSERT_GE(before, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double after = SecondsSinceProcessStart();
  EXPECT_GE(after - before, 0.15);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double age = SecondsSinceProcessStart();
    (void)!write(fds[1], &age, sizeof(age));
    _exit(0);
  }
  double child_age = -1;
  ASSERT_EQ(read(fds[0], &child_age, sizeof(child_age)), static_cast<ssize_t>(sizeof(child_age)));
  waitpid(child, nullptr, 0);
  close(fds[0]);
  close(fds[1]);
  EXPECT_GE(child_age, 0.05);
  EXPECT_LT(child_age, SecondsSinceProcessStart());
}

}  // namespace
}  // namespace loom::telemetry
