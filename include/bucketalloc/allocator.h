// bucketalloc/allocator.h — the allocator front end (layer L4): the public C++ API.
//
// Owns: routing by size to the small pool (size classes packed in 2 MiB slabs) or the large pool
// (tiers, binned best fit, split below max_split_size, coalescing), one state per device, stream
// ordering and RecordStream, the capacity cap, garbage collection, release-and-retry, stats, the
// fragmentation report and the OOM report.
// Thread-safety: every method may be called from any thread. Each device has one lock; a cache hit
// takes that lock once and makes no heap allocation, no log and no backend (CUDA) call.
//
// Example:
//   auto options = bucketalloc::ParseOptions("backend:sim,capacity:4GiB");
//   auto allocator = bucketalloc::Allocator::Create(*options);
//   absl::StatusOr<void*> p = (*allocator)->Allocate(3 << 20, /*device=*/0, stream);
//   ...
//   (*allocator)->Free(*p, /*device=*/0).IgnoreError();
#ifndef BUCKETALLOC_ALLOCATOR_H_
#define BUCKETALLOC_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/capture.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/options.h"
#include "bucketalloc/sharing.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/stats.h"

namespace bucketalloc {

namespace internal {
class DeviceAllocator;
}

class Allocator {
 public:
  // Creates an allocator with `options` (validated). Device states are created on first use.
  static absl::StatusOr<std::unique_ptr<Allocator>> Create(const Options& options);
  // Creates an allocator whose device 0 uses `backend` (tests and embedders).
  static absl::StatusOr<std::unique_ptr<Allocator>> CreateWithBackend(const Options& options,
                                                                      std::unique_ptr<Backend> backend);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Allocates `size` bytes on `device` for use on `stream`. Size 0 returns nullptr (OK).
  // The block is reusable on `stream` as soon as it is freed, and on other streams only after the
  // events of RecordStream have completed.
  // Errors: InvalidArgument for size > kMaxRequestBytes or a bad device; ResourceExhausted with the
  // OOM report's diagnosis when the memory cannot be had after releasing the cache and retrying.
  // cudaStreamPerThread (kPerThreadStream) is the calling thread's own per-thread default stream:
  // each thread's is a pool of its own (PoolKey).
  absl::StatusOr<void*> Allocate(std::size_t size, int device = 0, Stream stream = nullptr);

  // Allocates the block [addr, addr + block_size) in free memory of private pool `pool` of `device`
  // ({0, 0}: the device's own pools) for use on `stream`, and returns addr; `requested` (at most
  // block_size) is the size the caller asked for, as stats and Free(ptr, size) see it. The block
  // is a live allocation like any other (Free returns it). PyTorch's cudagraph trees restore a
  // checkpoint with it (setCheckpointPoolState), and allocateWithAddress: `block_size` is a block
  // size bucketalloc handed out there before (a snapshot's or bucketalloc_visit_segments's), or 0
  // for the block the pool holding addr rounds `requested` to; the range must lie wholly inside one
  // free block of the segment or slab that holds addr (a slab:
  // exactly one free slot of its slot size), which belongs to `stream`. No backend call: it may run
  // during a capture. Errors (nothing changes): InvalidArgument for sizes out of range or a range
  // the pool could not have handed out (misaligned, not a slot); FailedPrecondition for a pool that
  // is unknown or freeable, a range not wholly in one free block (it overlaps a live or pending
  // block), or memory of another stream; NotFound when no memory of the pool holds addr.
  absl::StatusOr<void*> AllocateAt(int device, GraphPoolId pool, void* addr, std::size_t block_size,
                                   std::size_t requested, Stream stream = nullptr);

  // The pool key of an allocation for `stream` made on this thread: the stream itself, except
  // cudaStreamPerThread, which is the calling thread's per-thread default stream (a pseudo key,
  // bucketalloc/backend.h). What a CaptureFilter is given.
  static Stream PoolKey(Stream stream) {
    if (stream != kPerThreadStream) [[likely]]
      return stream;
    return PerThreadKey();
  }
  // The inverse on this thread: the stream handle a pool key can be named by here (this thread's
  // per-thread key is cudaStreamPerThread); another pseudo key stays as it is (it names no stream).
  static Stream StreamOfKey(Stream key) {
    return IsPseudoStream(key) && key == PerThreadKey() ? kPerThreadStream : key;
  }

  // Frees `ptr` (nullptr is a no-op). When `size` is given it must equal the requested size.
  // Errors (the state is left untouched): InvalidArgument for an unknown pointer, a double free, a
  // pointer of another device, or a size mismatch.
  absl::Status Free(void* ptr, int device = 0, std::optional<std::size_t> size = std::nullopt);

  // Marks `ptr` as used on `stream`: its reuse after Free waits for the work queued on `stream`
  // (cudaStreamPerThread: the calling thread's per-thread stream; when another thread frees the
  // block, that wait is a device synchronization).
  absl::Status RecordStream(void* ptr, int device, Stream stream);
  // The same, for a caller that does not know the device (PyTorch's record_stream hook).
  absl::Status RecordStream(void* ptr, Stream stream);

  // The device whose live allocation starts at `ptr`; InvalidArgument when there is none.
  absl::StatusOr<int> DeviceOf(void* ptr) const;
  // The device whose reserved memory (segments and slabs, live or cached) contains `ptr`;
  // NotFound when none does: the pointer is not bucketalloc's at all.
  absl::StatusOr<int> DeviceHolding(void* ptr) const;
  // The device allocation (segment or slab) holding the live allocation `ptr`: base and size.
  absl::StatusOr<std::pair<void*, std::size_t>> BaseAllocation(void* ptr) const;

  // CUDA IPC. What another process needs to map live allocation `ptr` (SharedMemory); a virtual
  // segment's pieces are exported by the backend (POSIX descriptors). InvalidArgument when no live
  // allocation starts at `ptr`; FailedPrecondition when the backend cannot export its pieces.
  absl::StatusOr<SharedMemory> ShareBlock(void* ptr);
  // Maps on `device` the pieces process `pid` shared (its SharedMemory::pieces) side by side in a
  // new address range, and returns its start; CloseShared unmaps it. The memory is the sender's:
  // it is not reserved here and not under the cap.
  absl::StatusOr<void*> OpenShared(int device, int pid, absl::Span<const SharedPiece> pieces);
  // Unmaps what OpenShared mapped at `base` (on whichever device), after a device synchronization.
  absl::Status CloseShared(void* base);

  // Releases every cached block that can be released (whole free segments and empty slabs) on
  // every device, after synchronizing pending stream events.
  absl::Status EmptyCache();

  // Call before destroying `stream` (cudaStreamDestroy returns at once and CUDA may give the handle
  // to a new stream): waits for the stream's work if bucketalloc keeps memory for it (cached
  // blocks, or blocks that RecordStream marked as used on it), so that no later wait uses the dead
  // handle and a new stream with the same handle value inherits only idle blocks. The LD_PRELOAD
  // shim calls it from its cudaStreamDestroy. FailedPrecondition during a capture (the wait is
  // forbidden then).
  absl::Status RetireStream(Stream stream);

  // Creates physical memory on `device` ahead of need, off any request's path: spare pieces of the
  // device's own large pool (not tenants', MemPools' or graph pools'), which its grows and stitches
  // map before they create any (a grow then makes
  // no cuMemCreate on the request's path, only its map and access). Brings the spares up to
  // `spare_target` bytes, creating at most `max_create` bytes in this call (whole granules), and
  // returns the bytes created (0 when the spares were enough): a host or a thread calls it again as
  // requests use the spares. Spares count as reserved and cached, never pass the cap (it stops
  // there), and a release (EmptyCache, release-and-retry) gives them back. It holds the device's lock
  // while it creates (about 0.2 ms per 2 MiB on an A100; `max_create` bounds it): call it where no
  // request waits (start-up, between steps). FailedPrecondition unless the large pool's segments
  // are virtual memory (backend:vmm, or expandable_segments:true); ResourceExhausted when it needed
  // to create and the cap let it create nothing.
  absl::StatusOr<std::size_t> Prefetch(int device, std::size_t spare_target, std::size_t max_create = kUnlimited);

  // Sets the cap of `device` to fraction x device memory (fraction in (0, 1]).
  absl::Status SetMemoryFraction(double fraction, int device);

  absl::StatusOr<DeviceStats> GetStats(int device) const;
  absl::Status ResetPeakStats(int device);
  absl::StatusOr<FragmentationReport> GetFragmentation(int device) const;
  // The metrics of every device created so far (none is created by asking), each taken under its
  // device's lock: what MetricsToPrometheus (bucketalloc/metrics.h) renders.
  std::vector<DeviceMetrics> Metrics() const;
  // The readable summary table (stats, then the fragmentation table).
  absl::StatusOr<std::string> Summary(int device) const;
  // CUDA graph capture and private pools (PyTorch's beginAllocateToPool / endAllocateToPool /
  // releasePool hooks, called by CUDAGraph and MemPool, or the C ABI's bucketalloc_capture_*), with
  // PyTorch's semantics. BeginCapture routes the requests of the streams `filter` accepts into
  // private pool `pool` (created, or its use count + 1) until EndCapture; ReleasePool drops one use.
  // A private pool has its own segments and free lists: a block freed into it serves later requests
  // routed to it (later in the same capture, or another capture sharing the pool), never others.
  // During a capture a miss grows the pool (allocation in relaxed capture mode, which CUDA allows);
  // no event is queried, nothing is synchronized, released or stitched, and cross-stream frees
  // record their events after it. At a use count of 0 the pool's memory goes back at the next
  // release (release-and-retry, EmptyCache), after a device synchronization. A capture that failed
  // before EndCapture ends at ReleasePool, or when its streams are seen no longer capturing.
  absl::Status BeginCapture(int device, GraphPoolId pool, CaptureFilter filter);
  absl::Status EndCapture(int device, GraphPoolId pool);
  absl::Status ReleasePool(int device, GraphPoolId pool);
  // PyTorch's markCaptureBegin/markCaptureEnd (CUDAGraph calls them around cudaStreamBeginCapture
  // and cudaStreamEndCapture): from the first mark on, `device` treats a routing with no marked
  // capture underway as a MemPool context (use_mem_pool), whose misses release and retry and whose
  // frees record events as outside one. Without marks every routing is treated as a capture.
  absl::Status MarkCapture(int device, bool begin);

  // PyTorch's allocator interface beyond allocation and captures (what its native CUDAAllocator
  // serves; docs/pytorch.md):
  // MemPool: one more use of private pool `pool` with nothing routed to it (createOrIncrefPool;
  // created when missing); ReleasePool drops it. InvalidArgument for {0, 0} or a tenant's id.
  absl::Status IncrefPool(int device, GraphPoolId pool);
  // MemPool(use_on_oom=True): a request of the device's own pools that would fail with an OOM takes
  // a cached block of `pool` instead (while the pool is in use), as PyTorch's fallback does.
  absl::Status SetUseOnOom(int device, GraphPoolId pool, bool use_on_oom);
  // How private pool `pool` gets and splits its memory (PrivatePoolSettings: PyTorch's
  // MemPool(allocator, no_split=...)). Set on a pool in use (IncrefPool) before it holds memory:
  // NotFound for a pool not in use, InvalidArgument for a tenant's, FailedPrecondition once it
  // holds memory.
  absl::Status ConfigurePool(int device, GraphPoolId pool, PrivatePoolSettings settings);
  // The same as a change of the pool's settings as they are, under the device's lock (no other
  // call's change is lost between reading and setting them).
  absl::Status UpdatePoolSettings(int device, GraphPoolId pool, absl::FunctionRef<void(PrivatePoolSettings&)> change);
  // The use count of `pool` on `device` (0 when the device holds no such pool).
  absl::StatusOr<int> PoolUseCount(int device, GraphPoolId pool) const;
  // emptyCache(mempool_id): releases the wholly free memory of `pool` after synchronizing the
  // device when the pool is freeable (no graph or MemPool uses it: ReleasePool dropped its last
  // use); a pool in use keeps its memory, as in PyTorch. {0, 0}: EmptyCache. Device -1: every device
  // created so far (none is created by asking).
  // FailedPrecondition during a capture or a MemPool context (nothing released).
  absl::Status EmptyPoolCache(int device, GraphPoolId pool);
  // cacheInfo: the largest block a request could get without a release: the largest free cached
  // block of any pool and, with `with_headroom`, what the device could still give under the cap.
  absl::StatusOr<std::size_t> CacheInfo(int device, bool with_headroom) const;
  // The memory fraction of `device` (SetMemoryFraction's, else Options::memory_fraction).
  absl::StatusOr<double> MemoryFraction(int device) const;
  // Resets every gauge's accumulated totals (allocated, freed) and every counter of `device`.
  absl::Status ResetAccumulatedStats(int device);
  // Gives every history event of every device, present and future, to `hook` as it is recorded
  // while recording is on (hook.fn nullptr: none); see TraceHookFn.
  void SetTraceHook(TraceHook hook);

  // The segments and blocks of `device` (or every device created so far when device == -1) and
  // their histories, in the layout of torch.cuda.memory._snapshot() (see bucketalloc/snapshot.h).
  absl::StatusOr<MemorySnapshot> Snapshot(int device = -1) const;
  // Turns history recording on or off for every device, present and future; see snapshot.h.
  // max_entries (>= 1 when enabling) bounds each device's ring buffer.
  absl::Status RecordHistory(bool enabled, std::size_t max_entries);

  // Tenants (Options::tenants; docs/configuration.md, "Tenants"): each has its own pools, cap and
  // stats on every device; a request goes to the tenant its stream is bound to, else to the calling
  // thread's tenant, else to "default" (the device's own pools). One tenant's cache is never
  // handed to another. NotFound for a name that is not a tenant (the accepted names are listed).
  // Binds `stream` (its pool key on this thread) to `tenant` on every device ("default" unbinds;
  // RetireStream unbinds it too).
  absl::Status BindStream(Stream stream, absl::string_view tenant);
  // Sets the calling thread's tenant for this allocator ("default": none).
  absl::Status SetThreadTenant(absl::string_view tenant);
  // The calling thread's tenant.
  std::string ThreadTenant() const;
  // Changes `tenant`'s cap on every device, present and future. Lowering it below what the tenant
  // reserves releases its cache and refuses its growth until it fits; live memory is never freed.
  // InvalidArgument for "default" (its cap is the device's: SetMemoryFraction) or a cap outside
  // 2 MiB to 16 TiB; FailedPrecondition when a device would have to release cache during a CUDA
  // graph capture (that device keeps its cap; the others take the new one).
  absl::Status SetTenantCap(absl::string_view tenant, std::size_t cap);
  // Each tenant's figures on `device`, the default tenant first (empty without tenants).
  absl::StatusOr<std::vector<TenantStats>> GetTenantStats(int device) const;

  // The report of the last out-of-memory error on `device`, if any.
  absl::StatusOr<std::optional<OomReport>> LastOomReport(int device) const;

  // Checks every invariant of `device`'s state (see docs/architecture.md); Internal error naming
  // the first violation.
  absl::Status CheckInvariants(int device) const;

  // The backend of `device` (created on demand); for tests and tools (e.g. sim stream control).
  absl::StatusOr<Backend*> backend(int device);

  int device_count() const;
  const Options& options() const { return options_; }

 private:
  Allocator(const Options& options, int device_count);
  static Stream PerThreadKey();
  absl::StatusOr<internal::DeviceAllocator*> Device(int device) const;
  // The out-of-line parts of Allocate and Free: a device not yet created (or a per-thread stream's
  // key).
  ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<void*> AllocateOnNewDevice(std::size_t size, int device, Stream stream);
  ABSL_ATTRIBUTE_NOINLINE absl::Status FreeOnNewDevice(void* ptr, int device, std::optional<std::size_t> size);

  Options options_;
  struct Devices;
  std::unique_ptr<Devices> devices_;
};

// The CUDA versions of this build and machine, for version reports (python -m bucketalloc_torch
// --version), in CUDA's encoding (1000 * major + 10 * minor: 13000 is 13.0).
// The toolkit headers this build was compiled with (cuda.h's CUDA_VERSION; nothing CUDA is linked).
int CudaHeadersVersion();
// The installed driver's (cuDriverGetVersion through libcuda.so.1, loaded at run time without cuInit
// and without creating an allocator); FailedPrecondition naming why when there is no driver.
absl::StatusOr<int> CudaDriverVersion();

}  // namespace bucketalloc

#endif  // BUCKETALLOC_ALLOCATOR_H_
