// src/frontend/core/device_allocator.h — the state of one device: the coordinator (layer L4).
//
// Owns: the device's lock, its backend, and the components it coordinates:
//   - the pools (frontend/bookkeeping/pools.h) and each stream's free lists;
//   - the live map of allocations (address -> LiveEntry);
//   - the segment registry and cap (frontend/bookkeeping/segment_registry.h), the pools' MemorySource;
//   - pending frees and stream events (frontend/bookkeeping/pending_frees.h);
//   - graph captures and the private pools they allocate into (frontend/bookkeeping/private_pools.h);
//   - the history ring (frontend/observability/history.h) and the stat ledger (internal/stat_ledger.h);
//   - the OOM log (frontend/observability/oom_log.h): the last OOM report and the recent OOMs;
//   - the tenants' pools and accounting (frontend/bookkeeping/tenants.h) and CUDA IPC imports
//     (frontend/bookkeeping/ipc.h).
// Its methods live in one file per concern: device_allocator.cc (the request path),
// device_captures.cc, device_sharing.cc, device_reports.cc, device_limits.cc, device_check.cc.
// It routes each request to its pool, runs the slow path in one order for every pool (poll stream
// events, serve from cache or new memory, release and retry once, a smaller fallback request, then
// the OOM report of frontend/observability/oom_diagnosis.h), garbage-collects before growth, and builds
// snapshots (frontend/observability/snapshot_walk.h).
// Thread-safety: every public method takes `mu_`; a cache hit takes it exactly once, allocates no
// heap memory (the live map and free lists reuse their storage) and calls no backend function.
//
// Invariants (CheckInvariants): each component's own, and what ties them together: live and
// pending blocks never overlap and each lies in one registered segment or slab; every pool unit is
// registered with its size and mapped bytes, and nothing else is; every stat equals the sum of what
// the components hold (requested/allocated/allocation over live entries, active over live and
// pending ones, reserved/segment over the registry and the spare pieces, cached = reserved -
// active, inactive_split over the pools' partly used memory, oversize over both); each pool holds
// as many active blocks as the entries name (the device's own pools and each private pool); every
// entry's private pool exists; with tenants, each tenant's pool exists and carries its cap.
//
// Example: see bucketalloc/allocator.h, which owns one DeviceAllocator per device.
#ifndef BUCKETALLOC_FRONTEND_CORE_DEVICE_ALLOCATOR_H_
#define BUCKETALLOC_FRONTEND_CORE_DEVICE_ALLOCATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/capture.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/options.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/stats.h"
#include "frontend/bookkeeping/ipc.h"
#include "frontend/bookkeeping/pending_frees.h"
#include "frontend/bookkeeping/pools.h"
#include "frontend/bookkeeping/private_pools.h"
#include "frontend/bookkeeping/segment_registry.h"
#include "frontend/bookkeeping/tenants.h"
#include "frontend/observability/history.h"
#include "frontend/observability/oom_log.h"
#include "internal/live_map.h"
#include "internal/mutex.h"
#include "internal/stat_ledger.h"

namespace bucketalloc::internal {

// A pointer as the coordinator's messages write it: "0x7f00...".
std::string PtrStr(const void* p);

class DeviceAllocator final {
 public:
  // Creates the state of `device` over `backend`; reads the device's memory to set the cap.
  // `tenants` are the allocator's (frontend/bookkeeping/tenants.h); null: the device makes its own from
  // options.tenants.
  static absl::StatusOr<std::unique_ptr<DeviceAllocator>> Create(const Options& options,
                                                                 std::unique_ptr<Backend> backend, int device,
                                                                 std::shared_ptr<const Tenants> tenants = nullptr);
  ~DeviceAllocator();

  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream);
  // See Allocator::AllocateAt (`stream` is a pool key).
  absl::StatusOr<void*> AllocateAt(GraphPoolId pool, void* addr, std::size_t block_size, std::size_t requested,
                                   Stream stream);
  absl::Status Free(void* ptr, std::optional<std::size_t> size);
  // True when `ptr` is a live allocation of this device (for cross-device error messages).
  bool OwnsLive(void* ptr) const;
  // Which other device holds `ptr` live, or -1: a free refused as foreign here names that device.
  // Called with no device lock held. Set once, before the device is published.
  using LiveElsewhere = std::function<int(void* ptr, int device)>;
  void SetLiveElsewhere(LiveElsewhere lookup) { live_elsewhere_ = std::move(lookup); }
  // CUDA IPC (Allocator's methods of the same names).
  absl::StatusOr<SharedMemory> ShareBlock(void* ptr);
  absl::StatusOr<void*> OpenShared(int pid, absl::Span<const SharedPiece> pieces);
  absl::Status CloseShared(void* base);
  bool HasOpenShared(void* base) const;
  // True when `ptr` lies in memory this device reserved from the backend (live or not).
  bool InReservedMemory(void* ptr) const;
  absl::Status RecordStream(void* ptr, Stream stream);
  absl::Status EmptyCache();
  // See Allocator::Prefetch: spares of the device's own large pool.
  absl::StatusOr<std::size_t> Prefetch(std::size_t spare_target, std::size_t max_create);
  // Before the host destroys `stream`: waits for its work if this device keeps memory for it (see
  // Allocator::RetireStream).
  absl::Status RetireStream(Stream stream);
  // See Allocator::BeginCapture.
  absl::Status BeginCapture(GraphPoolId pool, CaptureFilter filter);
  absl::Status EndCapture(GraphPoolId pool);
  absl::Status ReleasePool(GraphPoolId pool);
  absl::Status SetMemoryFraction(double fraction);
  // The fraction last set (SetMemoryFraction, else Options::memory_fraction).
  double memory_fraction() const;

  // PyTorch's allocator interface beyond captures (Allocator's methods of the same names).
  absl::Status IncrefPool(GraphPoolId pool);
  void SetUseOnOom(GraphPoolId pool, bool use_on_oom);
  // Changes the settings of `pool` with `change`, under the device lock (a read-modify-write no
  // other caller interleaves with).
  absl::Status ConfigurePool(GraphPoolId pool, absl::FunctionRef<void(PrivatePoolSettings&)> change);
  // PyTorch's markCaptureBegin/markCaptureEnd: a CUDA graph capture starts or ends on this device.
  // From the first mark on, only a marked capture restricts the slow path (no release, no
  // synchronization, no event query); a routing with none underway is a MemPool context, which
  // releases and retries, empties the cache and records events as outside one. A caller that never
  // marks (the C ABI's captures, the LD_PRELOAD shim) has every routing counted as a capture.
  void MarkCapture(bool begin);
  int PoolUseCount(GraphPoolId pool) const;
  absl::Status EmptyPoolCache(GraphPoolId pool);
  std::size_t CacheInfo(bool with_headroom);
  void ResetAccumulatedStats();
  void SetTraceHook(TraceHook hook);

  // Tenants (frontend/bookkeeping/tenants.h; index 1 up, 0 the default tenant): applies tenant `index`'s cap
  // (index >= 1). A cap under what the tenant reserves releases its cache (after synchronizing
  // pending frees) and refuses its growth until it fits under the cap; live memory stays.
  // FailedPrecondition when the release it needs falls during a CUDA graph capture (the cap is
  // then unchanged), or in a fork child that cannot use the device.
  absl::Status SetTenantCap(int index, std::size_t cap);
  // Each tenant's figures, the default tenant first; empty without tenants.
  std::vector<TenantStats> GetTenantStats() const;

  DeviceStats GetStats() const;
  // The stats, fragmentation report and backend call counts, taken together under the lock.
  DeviceMetrics GetMetrics() const;
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
  // ResourceExhausted (recording off) when the ring's first entries cannot be allocated.
  absl::Status SetHistory(bool enabled, std::size_t max_entries);
  // fork(2): PrepareFork takes the device's and the backend's locks; ParentAfterFork releases
  // them; ChildAfterFork releases them in the child, where a backend that cannot serve a fork
  // child (CUDA) makes every later request on the device fail with its reason.
  void PrepareFork();
  void ParentAfterFork();
  void ChildAfterFork();
  // The device allocation (segment or slab) that holds the live allocation `ptr`: base and size.
  absl::StatusOr<std::pair<void*, std::size_t>> BaseAllocation(void* ptr) const;

 private:
  friend class DeviceAllocatorTestPeer;  // corrupts state on purpose to test CheckInvariants
  DeviceAllocator(const Options& options, std::unique_ptr<Backend> backend, int device,
                  std::shared_ptr<const Tenants> tenants);
  // The cap: the smaller of capacity (0: the device) and fraction x total, in whole granules. A cap
  // under one granule would fail every allocation: InvalidArgument naming both settings.
  static absl::StatusOr<std::size_t> ComputeCap(std::size_t capacity, double fraction, std::size_t total,
                                                std::size_t granularity, int device);

  // The pools of private pool `tag` (0: the device's own).
  Pools& PoolsOf(std::uint16_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tag == 0 ? pools_ : *private_.at(tag).pools;
  }
  const Pools& PoolsOf(std::uint16_t tag) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tag == 0 ? pools_ : *private_.at(tag).pools;
  }
  // While a capture or MemPool context routes requests: the free lists of `stream` in the private
  // pool its filter accepts it for (*tag set); else, with tenants, in the pool of the request's
  // tenant (DeviceTenants::TagFor; 0 for the default tenant); else the device's own (*tag = 0).
  ABSL_ATTRIBUTE_NOINLINE StreamPools& RoutedPoolsFor(Stream stream, std::uint16_t* tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The free lists of `stream` (the last stream's without a lookup).
  StreamPools& PoolsFor(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (last_pools_ != nullptr && stream == last_stream_) [[likely]]
      return *last_pools_;
    return PoolsForNewStream(stream);
  }
  StreamPools& PoolsForNewStream(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fast path in `pool`, then its slow path.
  template <typename P>
  ABSL_ATTRIBUTE_ALWAYS_INLINE absl::StatusOr<void*> AllocateIn(P& pool, StreamPools& sp, std::size_t size,
                                                                Stream stream, std::uint16_t private_pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slow path, the same for every pool: poll stream events, serve, release and retry once, a
  // fallback, then the OOM report. During a capture: serve (growing in relaxed capture mode, as
  // PyTorch does), a fallback, the OOM report; no event query, release or stitching.
  // What it grows is counted as private pool `private_pool`'s (0: the device's own pools).
  // A request of the device's own pools that would fail takes a cached block of a use_on_oom
  // private pool (PyTorch's MemPool(use_on_oom=True)) when one has it: `private_pool` becomes that
  // pool's tag.
  template <typename P>
  absl::StatusOr<typename P::Handle> AllocateSlow(P& pool, typename P::StreamState& ss, Stream stream, std::size_t size,
                                                  const typename P::Request& request, std::uint16_t& private_pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cached block of a use_on_oom pool for `request` (its tag in *tag), if one has it.
  template <typename P>
  std::optional<typename P::Handle> BorrowFromUseOnOomPools(Stream stream, const typename P::Request& request,
                                                            std::uint16_t* tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename P>
  ABSL_ATTRIBUTE_ALWAYS_INLINE void CommitLive(const P& pool, std::uintptr_t ptr, typename P::Handle h,
                                               std::size_t size, std::uint16_t private_pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stats and history of a free of `h` (its pool's counts and the free_requested event).
  template <typename P>
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Release(const P& pool, std::uintptr_t ptr, typename P::Handle h,
                                            const LiveEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives freed `h` back to `pool` once nothing holds it: the free_completed event and the return
  // to its pool.
  // (Inlined: it is the end of every cache-hit free.)
  template <typename P>
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Complete(P& pool, std::uintptr_t ptr, typename P::Handle h, const LiveEntry& entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The free of a block that other streams used: it waits, or, with no use recorded for it after
  // all, goes back to its pool.
  void FreeInUse(std::uintptr_t addr, const LiveEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a freed block back to its pool (it is no longer active).
  void ReturnEntry(std::uintptr_t ptr, const LiveEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetirePending(PendingFrees::Mode mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronizes pending events and releases the wholly free memory of the device's own pools and
  // of the freeable private pools.
  void SyncAndReleaseAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the wholly free memory of the freeable private pools (every private pool when `all`,
  // as the device goes away), after a device synchronization (the last replay of a graph may still
  // run), and forgets the pools left with no memory.
  void ReleasePrivatePools(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a CUDA graph capture may be running (PrivatePools::CaptureMayRun).
  bool CaptureMayRun() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return private_.CaptureMayRun(); }
  // Forgets private pool `tag` and the registry's counts for it when it holds no memory.
  void ForgetPrivatePoolIfEmpty(std::uint16_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!private_.ForgetIfEmpty(tag)) return;
    registry_.ForgetOwner(tag);
    if (last_routed_tag_ == tag) last_routed_pools_ = nullptr;  // its free lists are gone
  }
  // Ends the routings of captures that were abandoned (their streams no longer capture).
  void EndAbandonedCaptures() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `stream` (a pool key) is capturing now; `if_unknown` when that cannot be asked (another
  // thread's per-thread stream, a backend error).
  bool StreamCaptures(Stream stream, bool if_unknown) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Garbage collection before `incoming` bytes of growth: releases wholly free memory, oldest
  // first across the pools, until reserved + incoming fits under threshold x cap.
  void CollectGarbage(std::size_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the OOM report of a `pool` request (frontend/observability/oom_diagnosis.h) and returns it as
  // ResourceExhausted.
  absl::Status OutOfMemory(PoolIndex pool, std::size_t size, std::size_t rounded, std::size_t segment,
                           const absl::Status& cause, std::uint16_t private_pool, bool rejected)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The errors of Allocate and Free, out of line so that the fast paths keep a small frame.
  ABSL_ATTRIBUTE_NOINLINE absl::Status InvalidSize(std::size_t size) const;
  // A free of no live allocation: why (double free, interior pointer, another device's pointer).
  // Takes the device lock itself, and asks live_elsewhere_ after dropping it.
  ABSL_ATTRIBUTE_NOINLINE absl::Status FreeOfNoLiveAllocation(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  ABSL_ATTRIBUTE_NOINLINE absl::Status FreeSizeMismatch(void* ptr, std::size_t requested, std::size_t given)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InvalidFree(void* ptr, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the slow path for `stream` runs under capture rules (no event query, synchronization
  // or release): a capture announced by BeginCapture runs on this device, or `stream` itself is
  // capturing (for hosts that do not announce captures; cudaStreamIsCapturing on the live stream).
  bool CaptureRestricts(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a request that only fresh device memory could serve during capture of `stream`,
  // when the backend cannot allocate during a capture.
  absl::Status CaptureMiss(std::size_t size, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FragmentationReport FragmentationLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the wholly free memory of private pool `tag` (a graph pool's or a tenant's), counted as
  // its own.
  void ReleasePoolCache(std::uint16_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While a tenant is over its cap (DeviceTenants::over_cap), after every free and slow path (its
  // own frees, or its pending frees retired on any call): each such tenant gives back its wholly
  // free memory, oldest first, until it is within its cap again (its reserved bytes come down to
  // its cap as its frees allow, not only at its next allocation). Nothing during a registered
  // capture (CUDA forbids the frees then): the next free or slow path after it trims.
  void TrimTenantsToCaps() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the stream events of every pending free and returns those blocks to their pools.
  void SyncPendingFrees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `since_start`: counters and totals since the device was made, whatever a reset zeroed (metrics).
  DeviceStats StatsLocked(bool since_start = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls f(pools) for the device's own pools and every private pool's.
  template <typename F>
  void ForEachPools(F&& f) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    f(pools_, GraphPoolId{});
    private_.ForEach([&](std::uint16_t, const PrivatePools::Pool& p) { f(*p.pools, p.id); });
  }
  // Reserved bytes in no pool unit: every pool's spares.
  std::size_t SpareBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCheckInvariants() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const int device_;
  LiveElsewhere live_elsewhere_;  // set before the device is published, then only read
  const std::unique_ptr<Backend> backend_;
  std::size_t device_total_ = 0;
  double memory_fraction_ ABSL_GUARDED_BY(mu_);

  mutable Mutex mu_;
  StatLedger stats_ ABSL_GUARDED_BY(mu_);
  std::uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // advances on every free; orders cached memory by age
  HistoryRing history_ ABSL_GUARDED_BY(mu_);
  SegmentRegistry registry_ ABSL_GUARDED_BY(mu_);
  const LargePoolConfig large_config_;  // of the device's large pool and every private pool's
  Pools pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Stream, std::unique_ptr<StreamPools>> streams_ ABSL_GUARDED_BY(mu_);
  Stream last_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  StreamPools* last_pools_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The same for the last request routed to a private pool or a tenant's (RoutedPoolsFor).
  Stream last_routed_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::uint16_t last_routed_tag_ ABSL_GUARDED_BY(mu_) = 0;
  StreamPools* last_routed_pools_ ABSL_GUARDED_BY(mu_) = nullptr;
  LiveMap<LiveEntry> live_ ABSL_GUARDED_BY(mu_);
  PendingFrees pending_ ABSL_GUARDED_BY(mu_);
  PrivatePools private_ ABSL_GUARDED_BY(mu_);
  IpcImports imports_ ABSL_GUARDED_BY(mu_);  // memory other processes shared, mapped here
  OomLog ooms_ ABSL_GUARDED_BY(mu_);         // the last OOM report and the recent OOMs
  // Tenants: each tenant's pool here, what its blocks hold, its OOMs (frontend/bookkeeping/tenants.h).
  DeviceTenants tenants_ ABSL_GUARDED_BY(mu_);
  // In a child of fork whose backend cannot serve it: the reason, given for every request.
  absl::Status fork_child_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_CORE_DEVICE_ALLOCATOR_H_
