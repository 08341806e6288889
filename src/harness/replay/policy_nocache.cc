// src/harness/replay/policy_nocache.cc — the "nocache" replay policy: one backend call per request, what
// cudaMalloc/cudaFree without a cache does (harness/replay/policies.h).
#include <memory>

#include "bucketalloc/units.h"
#include "harness/replay/replay_allocator.h"

namespace bucketalloc::harness {
namespace {

class NoCacheReplay final : public DeviceReplayAllocator {
 public:
  using DeviceReplayAllocator::DeviceReplayAllocator;
  absl::StatusOr<void*> Allocate(std::size_t size, Stream) override {
    if (size == 0) return nullptr;
    absl::StatusOr<void*> p = device().Allocate(RoundUp(size, device().Granularity()));
    if (p.ok()) {
      NotePeak();
      requested_ += size;
    }
    return p;
  }
  absl::Status Free(void* ptr, std::size_t size) override {
    if (ptr == nullptr) return absl::OkStatus();
    absl::Status s = device().Free(ptr, RoundUp(size, device().Granularity()));
    if (s.ok()) requested_ -= size;
    return s;
  }
  // Nothing is cached: every reserved byte belongs to a live block, and the rounding to 2 MiB is
  // internal fragmentation (allocated - requested), not free blocks.
  PoolFragmentation Fragmentation() const override {
    PoolFragmentation f = ReplayAllocator::Fragmentation();
    f.requested = static_cast<std::int64_t>(requested_);
    return f;
  }
  MemoryBreakdown Breakdown() const override {
    MemoryBreakdown m;  // every reserved byte is a live block's: what it asked for and its rounding
    m.reserved = reserved_bytes();
    m.live_requested = requested_;
    m.live_rounding = m.reserved - requested_;
    return m;
  }

 private:
  std::size_t requested_ = 0;  // bytes asked for by live blocks
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeNoCachePolicy(absl::string_view, std::size_t capacity,
                                                                   ReplayDeviceKind kind, DriverMeter* meter) {
  absl::StatusOr<std::unique_ptr<ReplayDevice>> b = MakeReplayDevice(capacity, kind, /*virtual_memory=*/false, meter);
  if (!b.ok()) return b.status();
  return std::unique_ptr<ReplayAllocator>(std::make_unique<NoCacheReplay>(std::move(*b)));
}

}  // namespace bucketalloc::harness
