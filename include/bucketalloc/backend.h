// bucketalloc/backend.h — the memory source (layer L1).
//
// Owns: the type-erased `Backend` interface through which every layer above obtains device memory,
// stream events and (for the virtual-memory backend) address ranges and physical granules, its
// call counters, the settings a backend reads from BUCKETALLOC_CONF, and the factories of the CUDA
// backends for embedders (Allocator::CreateWithBackend). Backends are made by name through the
// registry (src/backend/registry.h): sim (src/backend, its test controls in
// bucketalloc/testing/sim_backend.h), cuda and vmm (cuda/).
// Layer: L1. Included by the pools and the front end. Nothing here includes a CUDA header: streams
// and events are opaque pointers.
// Thread-safety: a Backend is used by one device state at a time, under that device's lock.
// Cost: every call is a slow-path call. The fast path (a cache hit) never calls the backend.
//
// Example:
//   absl::StatusOr<std::unique_ptr<bucketalloc::Backend>> backend = bucketalloc::MakeCudaBackend(0);
//   absl::StatusOr<void*> p = (*backend)->Allocate(2 << 20);
//   (*backend)->Free(*p, 2 << 20).IgnoreError();
#ifndef BUCKETALLOC_BACKEND_H_
#define BUCKETALLOC_BACKEND_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace bucketalloc {

// A CUDA stream (`cudaStream_t`) as an opaque handle; nullptr is the legacy default stream.
using Stream = void*;

// CUDA's special stream handles (cudaStreamLegacy, cudaStreamPerThread; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD in the driver API).
inline const Stream kLegacyStream = reinterpret_cast<Stream>(std::uintptr_t{1});
inline const Stream kPerThreadStream = reinterpret_cast<Stream>(std::uintptr_t{2});

// A pool key that is not a CUDA stream: each thread's per-thread default stream (cudaStreamPerThread
// is the same handle in every thread, but a different stream), and the LD_PRELOAD shim's keys for
// what is not one stream. A block is reused at once only for the same key; nothing is ever recorded
// on a pseudo key (waiting for "its" work is waiting for the device). Each NewPseudoStream() is
// unique for the life of the process: a key is never reused, not even by a thread that gets the id
// or the thread-local addresses of a finished one, while that thread's stream may still have work.
// Pseudo keys are kPseudoStreamBase + 16 k + 1: no CUDA stream handle has that form (the special
// handles are 1 and 2, created streams aligned pointers).
inline constexpr std::uintptr_t kPseudoStreamBase = 0x10000;
inline Stream NewPseudoStream() {
  static std::atomic<std::uint64_t> next{0};
  const std::uint64_t id = next.fetch_add(1, std::memory_order_relaxed);
  return reinterpret_cast<Stream>(kPseudoStreamBase + (id << 4) + 1);
}
inline bool IsPseudoStream(Stream s) {
  const auto v = reinterpret_cast<std::uintptr_t>(s);
  return v >= kPseudoStreamBase && (v & 0xF) == 1;
}

// A backend event recorded on a stream; opaque, owned by the backend that made it.
using Event = void*;
// A physical memory allocation (virtual-memory backends only: cuMemCreate), of any multiple of the
// granularity; opaque, never 0 (the allocator uses 0 for "none").
using PhysicalHandle = std::uint64_t;
// A physical allocation and its size: mapped whole, it is one piece of an address range.
struct PhysicalPiece {
  PhysicalHandle handle = 0;
  std::size_t bytes = 0;
};

// The BUCKETALLOC_CONF keys a backend owns (e.g. the simulated device's sim_total_memory), as
// text: key -> value. The option table validates them against the backend's own option rows; a
// key not set takes its row's default.
using BackendSettings = std::map<std::string, std::string, std::less<>>;

// Free and total bytes of the device as the backend sees them.
struct DeviceMemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// Call counters every backend keeps (reported in stats as num_device_alloc / num_device_free).
struct BackendCounters {
  std::int64_t allocs = 0;  // successful Allocate calls
  std::int64_t frees = 0;   // successful Free calls
  // Bytes of the successful Allocate and Free calls. Optional: a backend that leaves both at 0 (one
  // written before they existed) is checked by its call counts alone.
  std::int64_t alloc_bytes = 0;
  std::int64_t free_bytes = 0;
  std::int64_t failed_allocs = 0;  // Allocate calls that returned an error
  std::int64_t events_recorded = 0;
  // Calls CUDA forbids while a stream capture is running (Free, Unmap, QueryEvent,
  // SynchronizeEvent, SynchronizeDevice); the sim backend refuses them and counts them here. Always
  // 0 on CUDA. (Allocation is allowed: the backends allocate in relaxed capture mode.)
  std::int64_t capture_violations = 0;
  std::int64_t device_syncs = 0;  // SynchronizeDevice calls that succeeded (the sim backend counts them)
  // Virtual memory (backends that support it).
  std::int64_t physical_creates = 0;   // successful CreatePhysical calls
  std::int64_t physical_releases = 0;  // successful ReleasePhysical calls of handles CreatePhysical made
  std::int64_t failed_physical_creates = 0;
  std::int64_t maps = 0;    // handles mapped (one cuMemMap each)
  std::int64_t unmaps = 0;  // successful Unmap calls
  // Access grants (one cuMemSetAccess each: a Map, or a MapRun's whole run), and address ranges
  // reserved and released (cuMemAddressReserve, cuMemAddressFree).
  std::int64_t access_grants = 0;
  std::int64_t address_reserves = 0;
  std::int64_t address_releases = 0;
  // IPC of virtual memory: successful ImportPhysical calls, and ReleasePhysical calls of imported
  // handles. Kept apart from physical_creates and physical_releases, so that creates - releases is
  // still the number of handles this process created and holds (the allocator's registry check).
  std::int64_t physical_imports = 0;
  std::int64_t imported_releases = 0;
};

// The memory calls of `BackendCounters` one by one, for the reports that list them: the key of the
// harness's JSON ("allocs"), the driver call it counts ("cuMemAlloc"), the count (failed
// allocations and creates included), and whether it is a virtual-memory call.
struct BackendCall {
  const char* key;
  const char* call;
  std::int64_t count;
  bool virtual_memory;
};
inline std::array<BackendCall, 9> BackendCalls(const BackendCounters& c) {
  return {{{"allocs", "cuMemAlloc", c.allocs + c.failed_allocs, false},
           {"frees", "cuMemFree", c.frees, false},
           {"creates", "cuMemCreate", c.physical_creates + c.failed_physical_creates, true},
           {"releases", "cuMemRelease", c.physical_releases, true},
           {"maps", "cuMemMap", c.maps, true},
           {"access_grants", "cuMemSetAccess", c.access_grants, true},
           {"unmaps", "cuMemUnmap", c.unmaps, true},
           {"address_reserves", "cuMemAddressReserve", c.address_reserves, true},
           {"address_releases", "cuMemAddressFree", c.address_releases, true}}};
}

// The memory source of one device. Implementations: sim (CPU, with a VMM twin), cuda (cudaMalloc),
// and vmm (cudaMalloc for Allocate, the driver's virtual memory management for the VMM family).
//
// Errors: Allocate returns `absl::ResourceExhaustedError` when the device is out of memory (the
// allocator then releases its cache and retries), and another code for anything else (a missing
// driver is `absl::FailedPreconditionError`).
class Backend {
 public:
  virtual ~Backend() = default;

  // Returns its registry name ("sim", "cuda", "vmm").
  virtual absl::string_view Name() const = 0;
  // Returns the device ordinal this backend serves.
  virtual int device() const = 0;
  // Returns the allocation granularity; Allocate sizes are multiples of it.
  virtual std::size_t Granularity() const = 0;

  // Allocates `bytes` (a positive multiple of Granularity()) of device memory.
  virtual absl::StatusOr<void*> Allocate(std::size_t bytes) = 0;
  // Frees memory returned by Allocate; `bytes` is the size passed to Allocate.
  virtual absl::Status Free(void* ptr, std::size_t bytes) = 0;
  // Reports the device's free and total memory.
  virtual absl::StatusOr<DeviceMemInfo> GetMemInfo() = 0;

  // Records an event on `stream` that completes when the work queued on it so far completes.
  virtual absl::StatusOr<Event> RecordEvent(Stream stream) = 0;
  // Returns true when `event` has completed. Does not block.
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  // Blocks until `event` has completed.
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  // Destroys (or recycles) `event`.
  virtual void DestroyEvent(Event event) = 0;
  // Waits for all work queued on the device (cudaDeviceSynchronize). The default does nothing
  // (the sim backend's streams complete only when a test says so).
  virtual absl::Status SynchronizeDevice() { return absl::OkStatus(); }
  // Returns true while `stream` is being captured into a CUDA graph. While any capture runs, CUDA
  // forbids freeing, synchronizing and querying events (cudaErrorStreamCaptureUnsupported, and the
  // capture is invalidated), and allocating except in relaxed capture mode (which the backends
  // switch to), so the allocator asks this before any of them on a slow path.
  // An event recorded on a capturing stream becomes a graph node and never completes eagerly.
  virtual absl::StatusOr<bool> IsCapturing(Stream stream) { return false; }

  // Virtual memory (for the stitching backend). The default implementation reports Unimplemented.
  // Returns true when the Reserve/Create/Map family below is available.
  virtual bool SupportsVirtualMemory() const { return false; }
  // Reserves `bytes` of device virtual address space aligned to `alignment`.
  virtual absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes, std::size_t alignment);
  // Releases a range from ReserveAddressRange (nothing may be mapped in it).
  virtual absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes);
  // Creates a physical allocation of `bytes` (a positive multiple of Granularity()).
  virtual absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes);
  // Releases a physical allocation (it must no longer be mapped).
  virtual absl::Status ReleasePhysical(PhysicalHandle handle);
  // Maps `handle` (whole, `bytes`) at `va` (inside a reserved range) and makes it accessible.
  virtual absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle);
  // Maps `pieces` (each handle whole, from offset 0: cuda.h's cuMemMap takes no other offset) one
  // after another from `va` and makes them accessible, stopping at the first failure: `*mapped` is
  // then the number of pieces that stay mapped and accessible (a prefix), and the error is returned;
  // DataLoss when pieces that could not be made accessible could not be unmapped either (the range
  // must not be mapped again).
  // The default maps piece by piece with Map; the sim and vmm backends grant access once for the
  // run (one cuMemMap per piece, then one cuMemSetAccess, as PyTorch's expandable segments do).
  virtual absl::Status MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped);
  // Unmaps `[va, va + bytes)`: one or more whole mappings side by side (one cuMemUnmap).
  virtual absl::Status Unmap(std::uintptr_t va, std::size_t bytes);

  // IPC of virtual memory (the vmm backend), as PyTorch's expandable segments share theirs. The
  // defaults report Unimplemented.
  // Returns a POSIX file descriptor for physical allocation `handle` (cuMemExportToShareableHandle,
  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), which another process opens with pidfd_getfd and
  // ImportPhysical. The descriptor belongs to the backend: it is made once per handle, kept, and
  // closed when the handle is released. FailedPrecondition when the handle was created without a
  // shareable type (the device or driver refused one).
  virtual absl::StatusOr<int> ExportPhysical(PhysicalHandle handle);
  // Imports the physical allocation another process exported (`fd`: a descriptor of this process,
  // from pidfd_getfd; the caller keeps and closes it). The handle is released with ReleasePhysical,
  // and counted apart from the handles CreatePhysical made (BackendCounters::physical_imports and
  // imported_releases), so that the allocator's registry check (creates - releases = the handles it
  // holds) is untouched by imports.
  virtual absl::StatusOr<PhysicalHandle> ImportPhysical(int fd);

  // Returns the counters (a copy).
  virtual BackendCounters counters() const = 0;

  // fork(2), called by the allocator's pthread_atfork handlers with the device's lock held (the
  // forking thread is then the only one inside the backend). PrepareFork takes the backend's own
  // locks; ParentAfterFork releases them; ChildAfterFork releases them in the child and makes the
  // child's state its own. It returns an error when the device cannot be used in a child of
  // fork (CUDA: a context does not survive fork), which the allocator then gives for every request
  // on the device. The defaults do nothing (a backend without locks or shared state).
  virtual void PrepareFork() {}
  virtual void ParentAfterFork() {}
  virtual absl::Status ChildAfterFork() { return absl::OkStatus(); }
};

// Creates the cudaMalloc backend for `device`. On a machine without a usable driver or device it
// returns FailedPreconditionError naming the CUDA error (e.g. error 35, "driver version is
// insufficient"). Implemented in cuda/; always compiled.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

// Creates the virtual-memory backend for `device`: the cuda backend's Allocate, Free and events,
// plus the Reserve/Create/Map family over CUDA's driver VMM API (cuMemAddressReserve, cuMemCreate,
// cuMemMap, ...), reached through the runtime's cudaGetDriverEntryPointByVersion (libcuda is never
// linked). Granularity() is the device's minimum physical granularity (2 MiB on current GPUs).
// Fails like MakeCudaBackend without a usable driver or device; with FailedPrecondition when a
// driver function cannot be resolved or the device does not support virtual memory management;
// with InvalidArgument when the granularity is not a power of two dividing 2 MiB. Implemented in
// cuda/; always compiled.
absl::StatusOr<std::unique_ptr<Backend>> MakeVmmBackend(int device);

// Returns the number of CUDA devices, or the CUDA error as FailedPrecondition.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace bucketalloc

#endif  // BUCKETALLOC_BACKEND_H_
