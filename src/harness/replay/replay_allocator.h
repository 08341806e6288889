// src/harness/replay/replay_allocator.h — what a replay drives: an allocator policy over a device of a
// given capacity (layer L5, the benchmark harness).
//
// Owns: `ReplayAllocator`, the interface every policy implements (harness/replay/policies.h names them);
// `ReplayDeviceKind`, where a replay runs; and `ReplayDevice`, the memory of exactly `capacity`
// bytes under the policies that do their own caching (pytorch-policy, pytorch-expandable, nocache).
// Thread-safety: none; one replay at a time per allocator.
//
// Example:
//   absl::StatusOr<std::unique_ptr<ReplayDevice>> d = MakeReplayDevice(64 << 20);  // simulated
//   absl::StatusOr<void*> p = (*d)->Allocate(2 << 20);
#ifndef BUCKETALLOC_HARNESS_REPLAY_REPLAY_ALLOCATOR_H_
#define BUCKETALLOC_HARNESS_REPLAY_REPLAY_ALLOCATOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/stat_types.h"
#include "harness/replay/driver_meter.h"
#include "harness/replay/memory_breakdown.h"

namespace bucketalloc::harness {

class ReplayAllocator {
 public:
  virtual ~ReplayAllocator() = default;
  // Allocates `size` bytes for `stream`; ResourceExhausted when it cannot (an OOM).
  virtual absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) = 0;
  // The trace's stream of the next Allocate (before any mapping to the replay device's streams),
  // outside the timed call: bucketalloc with tenants routes long requests' stream by it.
  virtual void SetTraceStream(std::uint64_t /*stream*/) {}
  // After an Allocate that failed: the tenant whose own cap refused it, and that cap (bucketalloc
  // with tenants), or nullopt when the card did; a bigger card would not serve it. Its cause is
  // OomCause::kTenantCap, as the allocator counts it in a process.
  struct TenantCapOom {
    std::string tenant;
    std::size_t cap = 0;
  };
  virtual std::optional<TenantCapOom> LastOomAtTenantCap() const { return std::nullopt; }
  virtual absl::Status Free(void* ptr, std::size_t size) = 0;
  // True when the policy works in the time between the trace's events (Idle): the replay then reads
  // the trace's times (its Time column) and gives each gap to Idle.
  virtual bool WorksWhenIdle() const { return false; }
  // The `seconds` between two events of the trace, outside every request: the policy's background
  // work that time pays for at its device's prices (bucketalloc's reserve_ahead_mb: creates of spare
  // memory). True when it called the driver.
  virtual bool Idle(double seconds) { return false; }
  // Reserved from the device now, and the peak since the last ResetPeak().
  virtual std::size_t reserved_bytes() const = 0;
  virtual std::size_t peak_reserved_bytes() const = 0;
  virtual void ResetPeak() = 0;
  virtual BackendCounters backend_counters() const = 0;
  // Physical granules moved from free blocks into stitched ranges (bucketalloc with stitching).
  virtual std::uint64_t granules_stitched() const { return 0; }
  // bucketalloc's own metrics of the replay device (the timeline samples them as a process's
  // writer does); nullopt for the models, whose samples the replay builds from Fragmentation().
  virtual std::optional<DeviceMetrics> Metrics() const { return std::nullopt; }
  // Returns the allocator's cached free blocks in power-of-two bins, with its reserved, allocated
  // (block sizes of live allocations) and requested bytes. The default, for an allocator that
  // caches nothing, has empty bins and reports reserved bytes as allocated. Not timed: it may walk
  // every free block.
  virtual PoolFragmentation Fragmentation() const;
  // Where the reserved bytes are now (harness/replay/memory_breakdown.h): each policy describes its
  // spans. The default, for a policy that describes none, counts them all as `other`. Not timed: it
  // walks every block.
  virtual MemoryBreakdown Breakdown() const { return BreakDown({}, reserved_bytes()); }
};

// A replay's capacity is a multiple of this (the granularity of every backend it runs on).
inline constexpr std::size_t kReplayGranularity = std::size_t{2} << 20;
// `capacity` rounded down to kReplayGranularity.
inline std::size_t ReplayCapacity(std::size_t capacity) { return capacity / kReplayGranularity * kReplayGranularity; }

// Where a replay runs: the simulated device (unbacked: addresses, no memory; the default, and what
// every figure in docs/harness.md uses, since it is reproducible) or CUDA device 0 through cudaMalloc
// (bucketalloc with backend:cuda; nocache and pytorch-policy on cudaMalloc), capped at the capacity.
enum class ReplayDeviceKind : std::uint8_t { kSim, kCuda };
absl::StatusOr<ReplayDeviceKind> ParseReplayDeviceKind(absl::string_view name);  // sim, cuda
absl::string_view ReplayDeviceName(ReplayDeviceKind kind);                       // "sim", "cuda"

// The memory under the policies that do their own caching: a backend of exactly `capacity` bytes.
// Allocate and CreatePhysical return ResourceExhausted past the capacity (the simulated device
// enforces it itself; on CUDA this wrapper does, and counts the refusal as a failed backend call,
// as the simulated device counts its own). The virtual-memory calls are the backend's (a device
// made with virtual memory: MakeReplayDevice).
class ReplayDevice {
 public:
  ReplayDevice(std::unique_ptr<Backend> backend, std::size_t capacity, bool enforce_capacity)
      : backend_(std::move(backend)), capacity_(capacity), enforce_capacity_(enforce_capacity) {}
  absl::StatusOr<void*> Allocate(std::size_t bytes);  // bytes: a multiple of Granularity()
  absl::Status Free(void* ptr, std::size_t bytes);
  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes) {
    return backend_->ReserveAddressRange(bytes, 0);
  }
  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) {
    return backend_->ReleaseAddressRange(va, bytes);
  }
  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes);
  absl::Status ReleasePhysical(PhysicalHandle handle, std::size_t bytes);
  absl::Status MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) {
    return backend_->MapRun(va, pieces, mapped);
  }
  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) { return backend_->Unmap(va, bytes); }
  // Waits for the work queued on the device (a policy that unmaps memory a stream may still use).
  absl::Status Synchronize() { return backend_->SynchronizeDevice(); }
  // Bytes allocated and physical bytes created, not yet freed or released.
  std::size_t used_bytes() const { return used_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t Granularity() const { return backend_->Granularity(); }
  BackendCounters counters() const;

 private:
  // True (and the refusal counted) when `bytes` more would pass the capacity this wrapper enforces.
  bool Refuse(std::size_t bytes, std::int64_t* refusals);

  std::unique_ptr<Backend> backend_;
  std::size_t capacity_;
  bool enforce_capacity_;
  std::size_t used_ = 0;
  std::int64_t refused_allocs_ = 0;
  std::int64_t refused_creates_ = 0;
};

// A policy that does its own caching over a ReplayDevice (pytorch-policy, pytorch-expandable,
// nocache): reserved bytes are the device's, and the peak is what the policy noted after growing.
class DeviceReplayAllocator : public ReplayAllocator {
 public:
  explicit DeviceReplayAllocator(std::unique_ptr<ReplayDevice> device) : device_(std::move(device)) {}
  std::size_t reserved_bytes() const override { return device_->used_bytes(); }
  std::size_t peak_reserved_bytes() const override { return peak_; }
  void ResetPeak() override { peak_ = device_->used_bytes(); }
  BackendCounters backend_counters() const override { return device_->counters(); }

 protected:
  // Called after the device grew.
  void NotePeak() { peak_ = std::max(peak_, device_->used_bytes()); }
  ReplayDevice& device() const { return *device_; }

 private:
  std::unique_ptr<ReplayDevice> device_;
  std::size_t peak_ = 0;
};

// The backend settings of the replay device of `capacity` bytes of `kind`: on the simulated device
// unbacked and exactly `capacity` (it enforces the capacity itself); on CUDA none (the capacity is
// enforced above the backend).
BackendSettings ReplayDeviceSettings(std::size_t capacity, ReplayDeviceKind kind);

// `cause` (the backend's error) as the error of a replay device of `capacity` bytes of `kind` that
// cannot be made: FailedPrecondition naming the device, the cause and what would work (on the
// simulated device, a capacity whose address space the process may reserve: `ulimit -v` limits
// it). Every policy reports it so, never as an OOM.
absl::Status ReplayDeviceError(const absl::Status& cause, std::size_t capacity, ReplayDeviceKind kind);

// The replay device's backend, from the public factories (bucketalloc/backend.h,
// bucketalloc/testing/sim_backend.h): on the simulated device what ReplayDeviceSettings names
// (unbacked, with its virtual memory), on CUDA device 0's vmm backend (the driver's VMM API) when
// `virtual_memory`, else its cuda backend (cudaMalloc). With a `meter`, MeterBackend's decorator
// over it. A device that cannot be made is ReplayDeviceError's.
absl::StatusOr<std::unique_ptr<Backend>> MakeReplayBackend(std::size_t capacity, ReplayDeviceKind kind,
                                                           bool virtual_memory, DriverMeter* meter);

// The device of `capacity` bytes of `kind` over MakeReplayBackend's backend.
absl::StatusOr<std::unique_ptr<ReplayDevice>> MakeReplayDevice(std::size_t capacity,
                                                               ReplayDeviceKind kind = ReplayDeviceKind::kSim,
                                                               bool virtual_memory = false,
                                                               DriverMeter* meter = nullptr);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_REPLAY_ALLOCATOR_H_
