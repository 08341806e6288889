// src/frontend/device_allocator.h — the state of one device (layer L4).
//
// Owns: the device's backend, small and large pools, per-stream free lists, the live-allocation
// map, blocks awaiting stream events, the cap, stats and the last OOM report. It routes each
// request (small pool up to small_pool_limit, else the large pool with its tiers), runs the slow
// path (process stream events, garbage collection, grow, release-and-retry once, OOM report), and
// is the pools' MemorySource (cap check, backend call, reserved stats, address registry).
// Thread-safety: every public method takes `mu_`; a cache hit takes it exactly once, allocates no
// heap memory (the live map and free lists reuse their storage) and calls no backend function.
//
// Invariants (CheckInvariants):
//   - live blocks (allocated or awaiting events) never overlap, and each lies in exactly one
//     registered segment or slab; the registry holds exactly the backend allocations and (vmm)
//     address ranges made, and its mapped granules plus the spares are the granules that exist;
//   - every stat equals the sum over blocks: requested/allocated/allocation over live entries,
//     active over live + pending, reserved/segment over the registry, cached = reserved - active,
//     inactive_split over the free pieces of partly used segments and slabs;
//   - the pools' own invariants (segment tiling, coalescing, free lists, slab slot stacks);
//   - every pending free waits for at least one stream use, with one event per use once armed
//     (none while deferred by a capture);
//   - the history ring holds at most trace_.size() entries.
//
// Example: see bucketalloc/allocator.h, which owns one DeviceAllocator per device.
#ifndef BUCKETALLOC_FRONTEND_DEVICE_ALLOCATOR_H_
#define BUCKETALLOC_FRONTEND_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/capture.h"
#include "bucketalloc/options.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/stats.h"
#include "internal/live_map.h"
#include "internal/mutex.h"
#include "pool/large_pool.h"
#include "pool/memory_source.h"
#include "pool/small_pool.h"

namespace bucketalloc::internal {

class DeviceAllocator final : public MemorySource {
 public:
  // Creates the state of `device` over `backend`; reads the device's memory to set the cap.
  static absl::StatusOr<std::unique_ptr<DeviceAllocator>> Create(const Options& options,
                                                                  std::unique_ptr<Backend> backend,
                                                                  int device);
  ~DeviceAllocator() override;

  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream);
  absl::Status Free(void* ptr, std::optional<std::size_t> size);
  // True when `ptr` is a live allocation of this device (for cross-device error messages).
  bool OwnsLive(void* ptr) const;
  // True when `ptr` lies in memory this device reserved from the backend (live or not).
  bool InReservedMemory(void* ptr) const;
  absl::Status RecordStream(void* ptr, Stream stream);
  absl::Status EmptyCache();
  // See Allocator::BeginCapture.
  absl::Status BeginCapture(GraphPoolId pool, CaptureFilter filter);
  absl::Status EndCapture(GraphPoolId pool);
  absl::Status ReleasePool(GraphPoolId pool);
  absl::Status SetMemoryFraction(double fraction);

  DeviceStats GetStats() const;
  void ResetPeakStats();
  FragmentationReport GetFragmentation() const;
  std::optional<OomReport> LastOom() const;
  absl::Status CheckInvariants() const;
  Backend* backend() const { return backend_.get(); }

  // Appends this device's segments and slabs, each with its blocks, to `segments`, and returns
  // the history (oldest first; empty while recording is off).
  std::vector<TraceEntry> AppendSnapshot(std::vector<SegmentSnapshot>* segments) const;
  // Turns history recording on (allocating a ring of `max_entries`, clearing the old history) or
  // off (freeing it).
  void SetHistory(bool enabled, std::size_t max_entries);
  // The device allocation (segment or slab) that holds the live allocation `ptr`: base and size.
  absl::StatusOr<std::pair<void*, std::size_t>> BaseAllocation(void* ptr) const;

  // MemorySource (called by the pools under mu_).
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t bytes, PoolIndex pool) override;
  bool ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) override;
  absl::StatusOr<std::uintptr_t> ReserveRange(std::size_t bytes, std::size_t to_map) override;
  void ReleaseRange(std::uintptr_t va, std::size_t bytes) override;
  absl::StatusOr<PhysicalHandle> CreateGranule() override;
  bool ReleaseGranule(PhysicalHandle handle) override;
  absl::Status MapGranule(std::uintptr_t va, PhysicalHandle handle) override;
  absl::Status UnmapGranule(std::uintptr_t va) override;
  absl::Status SynchronizeStream(Stream stream) override;
  std::size_t Headroom() const override;

 private:
  // One live or pending allocation.
  struct LiveEntry {
    void* owner = nullptr;  // Block* (large) or Slab* (small)
    std::size_t requested = 0;
    std::uint32_t slot = 0;  // small only
    std::uint16_t graph = 0;  // the graph pool's tag (index into graph_pools_) if allocated in a capture
    bool small = false;
    std::size_t allocated_size() const;
    Stream stream() const;
  };
  // A freed block that waits for the work queued on the streams it was used on. `events` is empty
  // while the free is deferred: a stream in `uses` (or the allocation stream) was capturing when
  // it was freed, and an event recorded during capture never completes eagerly, so the events are
  // recorded once no capture runs.
  // A block of a graph pool (entry.graph != 0) waits for its pool's release instead: a replay of
  // the graph may still write it. Its stream uses are armed after that.
  struct PendingFree {
    std::uintptr_t ptr = 0;
    LiveEntry entry;
    absl::InlinedVector<Event, 2> events;
    absl::InlinedVector<Stream, 2> uses;
  };
  // A graph pool known to this device (tag = index in graph_pools_; tag 0 is unused).
  struct GraphPool {
    GraphPoolId id;
    int captures = 0;          // running captures into it
    bool released = false;     // ReleasePool was called: its blocks are reusable again
    std::int64_t blocks = 0;   // live or held blocks that carry its tag
  };
  struct ActiveCapture {
    std::uint16_t tag = 0;
    CaptureFilter filter;
  };
  struct StreamPools {
    explicit StreamPools(std::size_t tiers) : large(tiers) {}
    SmallPool::StreamState small;
    LargePool::StreamState large;
  };
  // A registered backend allocation, or (vmm) an address range with `mapped` bytes of granules.
  struct SegmentInfo {
    std::size_t bytes = 0;
    PoolIndex pool = kLargePool;
    bool vmm = false;
    std::size_t mapped = 0;
  };

  friend class DeviceAllocatorTestPeer;  // corrupts state on purpose to test CheckInvariants
  DeviceAllocator(const Options& options, std::unique_ptr<Backend> backend, int device);

  StreamPools& PoolsFor(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLive(std::uintptr_t ptr, const LiveEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnEntry(const LiveEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Slow paths.
  absl::Status AllocateSmallSlow(StreamPools& sp, Stream stream, std::size_t size, int cls,
                                 SmallPool::Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> AllocateLargeSlow(StreamPools& sp, Stream stream, std::size_t size, int tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cached block (whole bin scanned) or a new segment (preferred size, then the minimal one).
  absl::StatusOr<Block*> ServeLarge(StreamPools& sp, Stream stream, std::size_t rounded, int tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns to the pools the pending blocks whose events have completed: kPollAll queries every
  // pending block (the slow path); kPollUntilBusy stops at the first one still in use, so a free
  // costs O(1) backend queries in the common case; kSynchronize waits for each event (release).
  enum class RetireMode { kPollAll, kPollUntilBusy, kSynchronize };
  void RetirePending(RetireMode mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronizes pending events and releases every wholly free segment and empty slab.
  void SyncAndReleaseAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectGarbage(std::size_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the OOM report of a `pool` request (diagnosis: see docs/architecture.md) and returns it
  // as ResourceExhausted.
  absl::Status OutOfMemory(PoolIndex pool, std::size_t size, std::size_t rounded, std::size_t minimal_segment,
                           const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InvalidFree(void* ptr, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResourceExhausted when reserving `bytes` more would exceed the cap.
  absl::Status CheckHeadroom(std::size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records one event per stream of `uses` into `events`; on failure destroys those recorded.
  absl::Status RecordUseEvents(absl::Span<const Stream> uses, absl::InlinedVector<Event, 2>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the slow path for `stream` must make no backend call: a capture announced by
  // BeginCapture runs on this device, or `stream` itself is capturing (for hosts that do not
  // announce captures; cudaStreamIsCapturing on the live allocating stream).
  bool CaptureRestricts(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The graph-pool tag of an allocation on `stream` now (0 outside captures).
  std::uint16_t GraphTagFor(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True while a pending free must stay pending: its graph pool is not released.
  bool HeldByGraph(const PendingFree& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return p.entry.graph != 0 && !graph_pools_[p.entry.graph].released;
  }
  // Drops one block from its graph pool's count; forgets a released pool that has none left.
  void UntagBlock(std::uint16_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::uint16_t> FindPool(GraphPoolId id, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a request that only fresh device memory could serve during capture of `stream`.
  absl::Status CaptureMiss(std::size_t size, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a history entry while recording (one predictable branch otherwise).
  void Trace(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream,
             std::size_t device_free = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!trace_.empty()) [[unlikely]] AppendTrace(action, addr, size, stream, device_free);
  }
  void AppendTrace(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream,
                   std::size_t device_free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FragmentationReport FragmentationLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCheckInvariants() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const int device_;
  const std::unique_ptr<Backend> backend_;
  std::size_t device_total_ = 0;

  mutable Mutex mu_;
  std::size_t cap_ ABSL_GUARDED_BY(mu_) = 0;
  DeviceStats stats_ ABSL_GUARDED_BY(mu_);
  std::uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  SmallPool small_ ABSL_GUARDED_BY(mu_);
  LargePool large_ ABSL_GUARDED_BY(mu_);
  const std::size_t small_limit_;
  absl::flat_hash_map<Stream, std::unique_ptr<StreamPools>> streams_ ABSL_GUARDED_BY(mu_);
  Stream last_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  StreamPools* last_pools_ ABSL_GUARDED_BY(mu_) = nullptr;
  LiveMap<LiveEntry> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, absl::InlinedVector<Stream, 2>> stream_uses_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingFree> pending_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<std::uintptr_t, SegmentInfo> registry_ ABSL_GUARDED_BY(mu_);
  std::optional<OomReport> last_oom_ ABSL_GUARDED_BY(mu_);
  // The stream whose slow path is running (for segment_alloc entries), and whether it captures:
  // then AllocateSegment refuses, as CUDA forbids cudaMalloc during capture.
  Stream slow_path_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool slow_path_capturing_ ABSL_GUARDED_BY(mu_) = false;
  // Graph capture: the running captures, and the graph pools by tag (slot 0 unused; a freed slot has
  // blocks == 0, released == true and is reused).
  std::vector<ActiveCapture> captures_ ABSL_GUARDED_BY(mu_);
  std::vector<GraphPool> graph_pools_ ABSL_GUARDED_BY(mu_) = std::vector<GraphPool>(1);
  // History: a ring of trace_.size() entries (empty while recording is off); trace_next_ is the
  // slot written next and trace_count_ the number of entries held (<= trace_.size()).
  std::vector<TraceEntry> trace_ ABSL_GUARDED_BY(mu_);
  std::size_t trace_next_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t trace_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_DEVICE_ALLOCATOR_H_
