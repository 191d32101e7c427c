#include "worker/blas_info.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

// This test links OpenBLAS as LibTorch does (libopenblas.so.0).
extern "C" int openblas_get_num_threads();
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*,
                       const float*, const float*, const int*, const float*, const int*,
                       const float*, float*, const int*, size_t, size_t);

namespace loom::worker {
namespace {

// CPU ticks (user + system) of every thread of this process but the caller.
long OtherThreadsTicks() {
  const std::string self = std::to_string(gettid());
  long ticks = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    const std::string tid = e->d_name;
    if (tid == "." || tid == ".." || tid == self) continue;
    std::ifstream stat("/proc/self/task/" + tid + "/stat");
    std::string line;
    std::getline(stat, line);
    // Fields after the parenthesised name: state is field 3; utime, stime
    // are fields 14 and 15.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields;
    size_t at = close + 2;
    while (at < line.size()) {
      size_t end = line.find(' ', at);
      if (end == std::string::npos) end = line.size();
      fields.push_back(line.substr(at, end - at));
      at = end + 1;
    }
    if (fields.size() > 12) ticks += std::stol(fields[11]) + std::stol(fields[12]);
  }
  closedir(dir);
  return ticks;
}

// Enough single-precision products to run ~1 s on one core.
void Multiply(int rounds) {
  const int n = 768;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  const float alpha = 1, beta = 0;
  for (int i = 0; i < rounds; ++i) {
    sgemm_("N", "N", &n, &n, &n, &alpha, a.data(), &n, b.data(), &n, &beta, c.data(), &n, 1, 1);
  }
}

TEST(SetBlasThreadsTest, TheBlasTheProcessCallsRunsOnTheThreadsGiven) {
  ASSERT_EQ(SetBlasThreads(1), 1) << "OpenBLAS is linked: its thread count is settable";
  EXPECT_EQ(openblas_get_num_threads(), 1);
  // OpenBLAS's pool threads poll for work for a moment (~0.1 s here)
  // after they start or finish a job, then sleep: let that pass.
  Multiply(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long before = OtherThreadsTicks();
  Multiply(60);
  const long others = OtherThreadsTicks() - before;
  // One thread: no other thread of the process does the work (a tick or
  // two of bookkeeping at most). Uncapped, OpenBLAS's pthreads build has
  // a thread per core share the products (below).
  EXPECT_LE(others, 2) << "ticks of other threads during one-thread products";

  if (std::thread::hardware_concurrency() >= 2) {
    // The control: the same products on two threads do run on another.
    ASSERT_EQ(SetBlasThreads(2), 2);
    const long start = OtherThreadsTicks();
    Multiply(60);
    EXPECT_GT(OtherThreadsTicks() - start, 10) << "two BLAS threads, yet one did all the work";
    SetBlasThreads(1);
  }
}

TEST(SetBlasThreadsTest, FewerThanOneMeansOne) {
  EXPECT_EQ(SetBlasThreads(0), 1);
  EXPECT_EQ(SetBlasThreads(-3), 1);
}

}  // namespace
}  // namespace loom::worker
