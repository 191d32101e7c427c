#include "worker/engine/cpu_memory_meter.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace loom::engine {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

void RaisePeak(int64_t value) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (value > peak && !g_peak.compare_exchange_weak(peak, value, std::memory_order_relaxed)) {
  }
}

// Each counted block carries its size in a header in front of the data, so
// that the DataPtr stays "simple" (context == data, one raw deleter), which
// raw_allocate users such as oneDNN's scratchpad require. 64 bytes keep the
// data as aligned as the underlying allocator made the block.
constexpr size_t kHeaderBytes = 64;
c10::DeleterFnPtr g_inner_deleter = nullptr;

void DeleteCounted(void* data) {
  char* base = static_cast<char*>(data) - kHeaderBytes;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_current.fetch_sub(bytes, std::memory_order_relaxed);
  g_inner_deleter(base);
}

// Forwards to the allocator that was registered before it. LibTorch 1.13
// declares Allocator::allocate const; 2.x makes it non-const and adds the
// pure virtual copy_data. Declaring both forms (without `override`) makes
// this class implement the interface of either.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {
    g_inner_deleter = inner->raw_deleter();
    TORCH_CHECK(g_inner_deleter != nullptr,
                "CpuMemoryMeter: the CPU allocator has no raw deleter to wrap");
  }

  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteCounted; }
  void copy_data(void* dest, const void* src, size_t count) const {
    std::memcpy(dest, src, count);
  }

 private:
  c10::DataPtr Allocate(size_t n) const {
    c10::DataPtr inner = inner_->allocate(n + kHeaderBytes);
    TORCH_CHECK(inner.get() == inner.get_context() && inner.get_deleter() == g_inner_deleter,
                "CpuMemoryMeter: unexpected DataPtr from the CPU allocator");
    const c10::Device device = inner.device();
    char* base = static_cast<char*>(inner.release_context());
    const int64_t bytes = static_cast<int64_t>(n);
    std::memcpy(base, &bytes, sizeof bytes);
    RaisePeak(g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    void* data = base + kHeaderBytes;
    return c10::DataPtr(data, data, &DeleteCounted, device);
  }

  c10::Allocator* inner_;
};

}  // namespace

CpuMemoryMeter& CpuMemoryMeter::Install() {
  static CpuMemoryMeter* meter = [] {
    // Never destroyed: storages freed during static destruction still call
    // into it.
    static auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    TORCH_CHECK(c10::GetCPUAllocator() == allocator,
                "CpuMemoryMeter: another CPU allocator has a higher priority");
    return new CpuMemoryMeter();
  }();
  return *meter;
}

int64_t CpuMemoryMeter::current_bytes() const { return g_current.load(std::memory_order_relaxed); }

int64_t CpuMemoryMeter::peak_bytes() const { return g_peak.load(std::memory_order_relaxed); }

void CpuMemoryMeter::ResetPeak() { g_peak.store(g_current.load(std::memory_order_relaxed)); }

}  // namespace loom::engine
