// plugins/preload/preload.cc — libbucketalloc_preload.so (layer L5): serves a dynamically linked CUDA
// program's cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync and cudaMemGetInfo from bucketalloc
// when loaded with LD_PRELOAD (docs/preload.md), and sees its cudaStreamDestroy.
//
// Interposition: these definitions come first in the process's symbol search order, so the program's
// calls (through its PLT into libcudart.so) land here. Calls the shim forwards reach the runtime's
// definitions through plugins/preload/real_runtime.cc (dlsym(RTLD_NEXT)), never these; bucketalloc's
// backends call the driver (cuda/driver_api.h), never the runtime.
// This file includes the CUDA runtime header because it defines CUDA's own functions: the compiler
// checks every signature against it.
//
// Initialization is lazy (the first interposed call), thread-safe (one mutex; other threads wait),
// and never re-entrant: a call made on the initializing thread while it creates the allocator (none
// is expected: creation calls the runtime only through the RTLD_NEXT table) goes to the runtime. When
// the allocator cannot be created (a bad BUCKETALLOC_CONF, no device for backend:cuda) the reason is
// printed once and every call goes to the runtime unchanged. The allocator is never destroyed.
//
// Semantics kept from the runtime:
//   - cudaFree synchronizes the device before the block can be reused (as cudaFree does), so a kernel
//     still using the memory on any stream cannot see it handed out again;
//   - cudaFreeAsync on a stream other than the allocation stream delays reuse until that stream's work
//     queued before the free has completed (an event, as RecordStream);
//   - cudaFreeAsync on a stream being captured is part of the graph, which bucketalloc cannot see
//     launched: the block is parked (nothing is recorded inside the capture) and stays allocated;
//   - cudaMallocAsync on a capturing stream goes to the runtime (a graph allocation node); device
//     memory the shim takes while another thread captures is taken in relaxed capture mode, as
//     PyTorch's allocator does, so that capture is not invalidated;
//   - cudaStreamDestroy first waits for the stream's work when bucketalloc keeps memory for it
//     (Allocator::RetireStream): CUDA may give the handle to a new stream, which must not inherit
//     blocks still in use;
//   - no context is made current or created on a device the program did not use: the shim never
//     calls cudaSetDevice (a wait on another device goes through the backend's context guard);
//   - cudaFree(NULL) goes to the runtime (programs use it to create the context), except on the
//     simulated device, where it is a no-op;
//   - a pointer bucketalloc did not hand out goes to the runtime's cudaFree / cudaFreeAsync;
//   - bad input returns the runtime's documented error codes (a NULL output pointer:
//     cudaErrorInvalidValue; out of memory: cudaErrorMemoryAllocation). The runtime's "last error"
//     (cudaGetLastError) is not set by these codes, nor by the shim's own queries; no exception
//     (a host std::bad_alloc) ever reaches the program: it becomes cudaErrorMemoryAllocation.
// Environment: BUCKETALLOC_CONF (the options), BUCKETALLOC_STATS_ON_EXIT=stderr|<path> (stats and
// the fragmentation report at exit: JSON for a path ending in .json, else the summary table),
// BUCKETALLOC_VERBOSE=1 (every error also on stderr).
#include <cuda_runtime_api.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "plugins/common/metrics_server.h"
#include "plugins/common/process_allocator.h"
#include "plugins/common/timeline_writer.h"
#include "plugins/preload/real_runtime.h"

namespace bucketalloc {
namespace internal {
bool CudaRuntimeLoaded();                  // real_runtime.cc
void* RealCudartSymbol(const char* name);  // real_runtime.cc: the runtime's definition, or nullptr
}  // namespace internal

namespace {

constexpr int kMaxTrackedDevices = 64;

constinit plugins::ProcessAllocator g_process;
std::atomic<bool> g_unavailable{false};        // creation failed: everything goes to the runtime
std::atomic<std::uint64_t> g_used_devices{0};  // devices that served an allocation (stats at exit)

// Pool keys: bucketalloc reuses a freed block at once only for the same key, and for other keys
// only after the work of the streams it was freed on. A stream is its own key: a user stream, the
// legacy default stream (NULL and cudaStreamLegacy are both kLegacyStream), cudaStreamPerThread
// (the allocator keys each thread's own). cudaMalloc's memory, usable on any stream, has a pseudo
// key (bucketalloc/backend.h): nothing is recorded on it, waiting for it waits for the device.
Stream SyncKey() {
  static const Stream key = NewPseudoStream();
  return key;
}

// Blocks freed with cudaFreeAsync on a stream being captured: the free belongs to the graph, whose
// kernels use the block whenever the graph is launched, which bucketalloc cannot see. Such a block
// is parked: it stays allocated (counted as active in the stats) for the life of the process.
std::atomic<std::int64_t> g_parked{0};

const internal::CudaRuntime& Real() { return internal::CudaRuntimeApi(); }

bool VerboseOn() {
  static const bool on = [] {
    const char* v = ReadEnv("BUCKETALLOC_VERBOSE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void Verbose(absl::string_view call, absl::string_view what, cudaError_t error) {
  if (!VerboseOn()) return;
  std::fprintf(stderr, "bucketalloc preload: %.*s: %.*s -> %s (%d)\n", static_cast<int>(call.size()), call.data(),
               static_cast<int>(what.size()), what.data(), Real().GetErrorName(error), static_cast<int>(error));
}

void PrintStatsAtExit();

// Creates the allocator from BUCKETALLOC_CONF. A failure is printed once and is final: every call
// goes to the runtime from then on. Before libcudart is loaded (backend:cuda) nothing is created and
// the next call tries again.
Allocator* CreateAllocator() {
  return g_process.CreateOnce([]() -> std::unique_ptr<Allocator> {
    if (g_unavailable.load(std::memory_order_relaxed)) return nullptr;
    absl::StatusOr<Options> options = OptionsFromEnv();
    if (options.ok() && !options->tenants.empty()) {
      // The shim serves unmodified programs: nothing in them can bind a stream or a thread to a
      // tenant, so every tenant's pool would stay empty under its cap.
      options = absl::InvalidArgumentError(
          "tenants:[...] needs a host that binds streams or threads to tenants (the C ABI library "
          "libbucketalloc.so, or bucketalloc_torch); the LD_PRELOAD shim serves unmodified programs and cannot "
          "bind them: remove tenants from BUCKETALLOC_CONF");
    }
    if (options.ok() && options->backend != "sim" && !internal::CudaRuntimeLoaded()) {
      return nullptr;  // libcudart is not loaded yet: forward this call, try again on the next one
    }
    absl::StatusOr<std::unique_ptr<Allocator>> created =
        options.ok() ? Allocator::Create(*options) : absl::StatusOr<std::unique_ptr<Allocator>>(options.status());
    if (!created.ok()) {
      std::fprintf(stderr,
                   "bucketalloc preload: the allocator is not available (%s); CUDA calls go to the runtime unchanged\n",
                   std::string(created.status().message()).c_str());
      g_unavailable.store(true, std::memory_order_relaxed);
      return nullptr;
    }
    if (ReadEnv("BUCKETALLOC_STATS_ON_EXIT") != nullptr) std::atexit(&PrintStatsAtExit);
    return std::move(*created);
  });
}

// The allocator, or nullptr when calls must go to the runtime (unavailable, or re-entered during
// creation on this thread).
inline Allocator* Get() {
  if (Allocator* a = g_process.get()) [[likely]]
    return a;
  if (g_unavailable.load(std::memory_order_relaxed)) return nullptr;
  Allocator* a = CreateAllocator();
  // After it is published, the observers the environment asks for (BUCKETALLOC_METRICS_ADDR,
  // BUCKETALLOC_TIMELINE), each once per process; one that cannot start changes nothing else.
  plugins::StartMetricsServerFromEnv(a, "bucketalloc preload");
  plugins::StartTimelineFromEnv(a, "bucketalloc preload");
  return a;
}

bool IsSim(const Allocator& a) { return a.options().backend == "sim"; }

// The runtime's current device (device 0 on the simulated device, which has none).
absl::StatusOr<int> CurrentDevice(const Allocator& a) {
  if (IsSim(a)) return 0;
  int device = 0;
  if (cudaError_t error = Real().GetDevice(&device); error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaGetDevice failed: ", Real().GetErrorName(error)));
  }
  return device;
}

bool IsDefaultStream(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

// The device a stream-ordered allocation on `stream` belongs to: the stream's (cudaStreamGetDevice)
// for a created stream, the current device for the default streams.
absl::StatusOr<int> StreamDevice(const Allocator& a, cudaStream_t stream) {
  if (IsSim(a) || IsDefaultStream(stream)) return CurrentDevice(a);
  int device = 0;
  if (cudaError_t error = Real().StreamGetDevice(stream, &device); error != cudaSuccess) {
    internal::ClearLastErrorIf(Real(), error);
    return CurrentDevice(a);
  }
  return device;
}

// The pool key of an allocation for `stream` (see the keys above).
Stream KeyFor(cudaStream_t stream) {
  if (stream == nullptr) return kLegacyStream;
  return static_cast<Stream>(stream);
}

// Whether `stream` is being captured (the legacy stream during a blocking stream's capture counts:
// CUDA refuses it then). Leaves no error behind.
bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t error = Real().StreamIsCapturing(stream, &capture);
  if (error != cudaSuccess) internal::ClearLastErrorIf(Real(), error);
  if (error == cudaErrorStreamCaptureImplicit) return true;
  return error == cudaSuccess && capture != cudaStreamCaptureStatusNone;
}

void NoteDevice(int device) {
  if (device < 0 || device >= kMaxTrackedDevices) return;
  const std::uint64_t bit = std::uint64_t{1} << device;
  if ((g_used_devices.load(std::memory_order_relaxed) & bit) == 0) g_used_devices.fetch_or(bit);
}

// The runtime's error code for a failed Allocate.
cudaError_t AllocationError(const absl::Status& s) {
  if (absl::IsResourceExhausted(s) || absl::IsInvalidArgument(s)) return cudaErrorMemoryAllocation;
  if (absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), "capture")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaErrorUnknown;
}

// Allocates for cudaMalloc (stream_key = the sync key) and cudaMallocAsync, or returns nullopt when
// the call must go to the runtime (the allocator is not available).
std::optional<cudaError_t> Malloc(absl::string_view call, void** ptr, std::size_t size, Allocator* a, int device,
                                  Stream key) {
  absl::StatusOr<void*> p = a->Allocate(size, device, key);
  if (!p.ok()) {
    const cudaError_t error = AllocationError(p.status());
    Verbose(call, p.status().message(), error);
    return error;
  }
  NoteDevice(device);
  *ptr = *p;
  return cudaSuccess;
}

// The runtime's definition of `name` (for forwarding), looked up once it exists.
void* RealSymbol(std::atomic<void*>& cache, const char* name) {
  void* f = cache.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = internal::RealCudartSymbol(name);
    cache.store(f, std::memory_order_release);
  }
  return f;
}

// Waits for `device` (cudaFree's implicit synchronization). On the thread's current device, the
// runtime's cudaDeviceSynchronize (its error code is the program's); on another device, the
// backend's, which makes that device's context current for the call and restores exactly what was
// current (never cudaSetDevice: restoring "device 0" on a thread that chose none would create a
// context there).
cudaError_t SynchronizeDevice(Allocator& a, int device) {
  int current = 0;
  if (cudaError_t e = Real().GetDevice(&current); e != cudaSuccess) return e;
  if (current == device) return Real().DeviceSynchronize();
  absl::StatusOr<Backend*> backend = a.backend(device);
  absl::Status s = backend.ok() ? (*backend)->SynchronizeDevice() : backend.status();
  if (s.ok()) return cudaSuccess;
  Verbose("cudaFree", s.message(), cudaErrorUnknown);
  return cudaErrorUnknown;
}

// Frees `ptr` if it lies in bucketalloc's memory: the result, or nullopt (not bucketalloc's: the
// caller forwards it to the runtime). `stream` is cudaFreeAsync's; `synchronize` is cudaFree's.
std::optional<cudaError_t> Free(absl::string_view call, void* ptr, cudaStream_t stream, bool synchronize) {
  Allocator* a = Get();
  if (a == nullptr) return std::nullopt;
  absl::StatusOr<int> device = a->DeviceOf(ptr);
  if (!device.ok()) {
    // Not a live allocation. Inside bucketalloc's memory it is a double or interior free: the
    // runtime must never see it (its cudaFree would release memory bucketalloc still serves).
    absl::StatusOr<int> holder = a->DeviceHolding(ptr);
    if (!holder.ok()) return std::nullopt;
    absl::Status s = a->Free(ptr, *holder);  // fails, naming the problem; changes nothing
    Verbose(call, s.message(), cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  cudaError_t result = cudaSuccess;
  if (IsSim(*a)) {
    // The simulated device has no work to wait for.
  } else if (synchronize) {
    // No kernel on any stream may still use the block when it is handed out again. A failure (a
    // sticky error, the runtime unloading at exit) is returned as cudaFree would return it; the
    // block goes back to the cache either way.
    result = SynchronizeDevice(*a, *device);
    if (result != cudaSuccess) internal::ClearLastErrorIf(Real(), result);
  } else if (Capturing(stream)) {
    // The free is part of the graph being captured: park the block (see g_parked), record nothing.
    g_parked.fetch_add(1, std::memory_order_relaxed);
    Verbose(call, "freed inside a stream capture: the block stays allocated (parked)", cudaSuccess);
    return cudaSuccess;
  } else {
    absl::StatusOr<int> stream_device = StreamDevice(*a, stream);
    if (stream_device.ok() && *stream_device != *device) {
      // An event of `stream`'s device cannot order another device's block: wait for the stream.
      result = Real().StreamSynchronize(stream);
    } else if (absl::Status s = a->RecordStream(ptr, *device, KeyFor(stream)); !s.ok()) {
      Verbose(call, s.message(), cudaErrorInvalidValue);
      return cudaErrorInvalidValue;
    }
  }
  if (absl::Status s = a->Free(ptr, *device); !s.ok()) {
    Verbose(call, s.message(), cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  if (result != cudaSuccess) Verbose(call, "waiting for the device's work failed", result);
  return result;
}

void PrintStatsAtExit() {
  Allocator* a = g_process.get();
  const char* target = ReadEnv("BUCKETALLOC_STATS_ON_EXIT");
  if (a == nullptr || target == nullptr) return;
  const std::string where(target);
  const bool json = absl::EndsWith(where, ".json");
  std::string text = json ? "{\"devices\":[" : "";
  bool first = true;
  const std::uint64_t used = g_used_devices.load();
  for (int d = 0; d < kMaxTrackedDevices && d < a->device_count(); ++d) {
    if ((used & (std::uint64_t{1} << d)) == 0) continue;
    absl::StatusOr<DeviceStats> stats = a->GetStats(d);
    absl::StatusOr<FragmentationReport> frag = a->GetFragmentation(d);
    if (!stats.ok() || !frag.ok()) continue;
    if (json) {
      absl::StrAppend(&text, first ? "" : ",", "{\"device\":", d, ",\"stats\":", StatsToJson(*stats),
                      ",\"fragmentation\":", FragmentationToJson(*frag), "}");
    } else {
      absl::StrAppend(&text, StatsSummary(*stats, d), FragmentationToTable(*frag));
    }
    first = false;
  }
  if (json) absl::StrAppend(&text, "]}\n");
  if (where == "stderr") {
    std::fputs(text.c_str(), stderr);
    return;
  }
  std::FILE* f = std::fopen(where.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "bucketalloc preload: BUCKETALLOC_STATS_ON_EXIT=%s: cannot open it for writing: %s\n",
                 where.c_str(), std::strerror(errno));
    return;
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

using MallocAsyncFn = cudaError_t (*)(void**, size_t, cudaStream_t);
using FreeAsyncFn = cudaError_t (*)(void*, cudaStream_t);

cudaError_t MallocAsync(const char* name, std::atomic<void*>& real, void** ptr, size_t size, cudaStream_t stream) {
  if (ptr == nullptr) {
    Verbose(name, "the output pointer is NULL", cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  Allocator* a = Get();
  // A captured allocation becomes a graph allocation node of the runtime: forward it (its free is
  // forwarded too, since bucketalloc does not know the pointer).
  if (a != nullptr && !IsSim(*a) && Capturing(stream)) a = nullptr;
  if (a != nullptr) {
    absl::StatusOr<int> device = StreamDevice(*a, stream);
    if (!device.ok()) {
      Verbose(name, device.status().message(), cudaErrorInvalidDevice);
      return cudaErrorInvalidDevice;
    }
    return *Malloc(name, ptr, size, a, *device, KeyFor(stream));
  }
  auto next = reinterpret_cast<MallocAsyncFn>(RealSymbol(real, name));
  return next != nullptr ? next(ptr, size, stream) : cudaErrorSharedObjectInitFailed;
}

cudaError_t FreeAsync(const char* name, std::atomic<void*>& real, void* ptr, cudaStream_t stream) {
  if (ptr != nullptr) {
    if (std::optional<cudaError_t> r = Free(name, ptr, stream, /*synchronize=*/false)) return *r;
  }
  auto next = reinterpret_cast<FreeAsyncFn>(RealSymbol(real, name));
  return next != nullptr ? next(ptr, stream) : cudaErrorSharedObjectInitFailed;
}

std::atomic<void*> g_real_malloc_async{nullptr};
std::atomic<void*> g_real_malloc_async_ptsz{nullptr};
std::atomic<void*> g_real_free_async{nullptr};
std::atomic<void*> g_real_free_async_ptsz{nullptr};

}  // namespace
}  // namespace bucketalloc

using bucketalloc::Get;
using bucketalloc::Real;

namespace bucketalloc {
namespace {

// Runs an interposer's body: no exception (std::bad_alloc from a host allocation above all) may
// cross into the C program, which would terminate it; it becomes the runtime's error code.
template <typename Body>
cudaError_t NoThrow(const char* call, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    Verbose(call, "host memory exhausted (std::bad_alloc)", cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  } catch (...) {
    Verbose(call, "an internal exception", cudaErrorUnknown);
    return cudaErrorUnknown;
  }
}

using StreamDestroyFn = cudaError_t (*)(cudaStream_t);
std::atomic<void*> g_real_stream_destroy{nullptr};

}  // namespace
}  // namespace bucketalloc

extern "C" {

// The per-thread-default-stream variants (nvcc --default-stream per-thread); not declared by the
// header unless that mode is on.
cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream);

__attribute__((visibility("default"))) cudaError_t cudaMalloc(void** ptr, size_t size) {
  return bucketalloc::NoThrow("cudaMalloc", [&] {
    if (ptr == nullptr) {
      bucketalloc::Verbose("cudaMalloc", "the output pointer is NULL", cudaErrorInvalidValue);
      return cudaErrorInvalidValue;
    }
    bucketalloc::Allocator* a = Get();
    if (a == nullptr) return Real().Malloc(ptr, size);
    absl::StatusOr<int> device = bucketalloc::CurrentDevice(*a);
    if (!device.ok()) {
      bucketalloc::Verbose("cudaMalloc", device.status().message(), cudaErrorInvalidDevice);
      return cudaErrorInvalidDevice;
    }
    return *bucketalloc::Malloc("cudaMalloc", ptr, size, a, *device, bucketalloc::SyncKey());
  });
}

__attribute__((visibility("default"))) cudaError_t cudaFree(void* ptr) {
  return bucketalloc::NoThrow("cudaFree", [&] {
    if (ptr == nullptr) {
      // Programs call it to create the context: the runtime's, except on the simulated device.
      bucketalloc::Allocator* a = Get();
      if (a != nullptr && bucketalloc::IsSim(*a)) return cudaSuccess;
      return Real().Free(nullptr);
    }
    if (std::optional<cudaError_t> r = bucketalloc::Free("cudaFree", ptr, nullptr, /*synchronize=*/true)) return *r;
    return Real().Free(ptr);
  });
}

__attribute__((visibility("default"))) cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  return bucketalloc::NoThrow("cudaMallocAsync", [&] {
    return bucketalloc::MallocAsync("cudaMallocAsync", bucketalloc::g_real_malloc_async, ptr, size, stream);
  });
}

__attribute__((visibility("default"))) cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  return bucketalloc::NoThrow("cudaMallocAsync_ptsz", [&] {
    return bucketalloc::MallocAsync("cudaMallocAsync_ptsz", bucketalloc::g_real_malloc_async_ptsz, ptr, size,
                                    stream == nullptr ? cudaStreamPerThread : stream);
  });
}

__attribute__((visibility("default"))) cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return bucketalloc::NoThrow("cudaFreeAsync", [&] {
    return bucketalloc::FreeAsync("cudaFreeAsync", bucketalloc::g_real_free_async, ptr, stream);
  });
}

__attribute__((visibility("default"))) cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  return bucketalloc::NoThrow("cudaFreeAsync_ptsz", [&] {
    return bucketalloc::FreeAsync("cudaFreeAsync_ptsz", bucketalloc::g_real_free_async_ptsz, ptr,
                                  stream == nullptr ? cudaStreamPerThread : stream);
  });
}

// cudaStreamDestroy returns while the stream's work is still queued, and the runtime may give the
// handle to a new stream: bucketalloc first waits for the work of a stream it keeps memory for
// (Allocator::RetireStream), so that the new stream inherits only idle blocks.
__attribute__((visibility("default"))) cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return bucketalloc::NoThrow("cudaStreamDestroy", [&] {
    bucketalloc::Allocator* a = bucketalloc::g_process.get();  // none yet: nothing to retire
    if (a != nullptr && stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
      if (absl::Status s = a->RetireStream(static_cast<bucketalloc::Stream>(stream)); !s.ok()) {
        bucketalloc::Verbose("cudaStreamDestroy", s.message(), cudaErrorUnknown);
      }
    }
    auto next = reinterpret_cast<bucketalloc::StreamDestroyFn>(
        bucketalloc::RealSymbol(bucketalloc::g_real_stream_destroy, "cudaStreamDestroy"));
    return next != nullptr ? next(stream) : cudaErrorSharedObjectInitFailed;
  });
}

// What the program sees: total = min(device total, bucketalloc's cap); free = min(the device's free
// memory + what bucketalloc holds cached (reserved - active), cap - active). Memory bucketalloc
// caches is free for the program's next cudaMalloc, and it can never get more than the cap.
__attribute__((visibility("default"))) cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return bucketalloc::NoThrow("cudaMemGetInfo", [&] {
    bucketalloc::Allocator* a = Get();
    if (a == nullptr) return Real().MemGetInfo(free_bytes, total_bytes);
    if (free_bytes == nullptr || total_bytes == nullptr) {
      bucketalloc::Verbose("cudaMemGetInfo", "an output pointer is NULL", cudaErrorInvalidValue);
      return cudaErrorInvalidValue;
    }
    absl::StatusOr<int> device = bucketalloc::CurrentDevice(*a);
    absl::StatusOr<bucketalloc::Backend*> backend =
        device.ok() ? a->backend(*device) : absl::StatusOr<bucketalloc::Backend*>(device.status());
    absl::StatusOr<bucketalloc::DeviceMemInfo> info =
        backend.ok() ? (*backend)->GetMemInfo() : absl::StatusOr<bucketalloc::DeviceMemInfo>(backend.status());
    absl::StatusOr<bucketalloc::DeviceStats> stats =
        info.ok() ? a->GetStats(*device) : absl::StatusOr<bucketalloc::DeviceStats>(info.status());
    if (!stats.ok()) {
      bucketalloc::Verbose("cudaMemGetInfo", stats.status().message(), cudaErrorInvalidDevice);
      return cudaErrorInvalidDevice;
    }
    const auto cap = static_cast<std::size_t>(stats->capacity_bytes);
    const auto reserved = static_cast<std::size_t>(stats->reserved_bytes[bucketalloc::kAllPools].current);
    const auto active = static_cast<std::size_t>(stats->active_bytes[bucketalloc::kAllPools].current);
    *total_bytes = std::min(info->total_bytes, cap);
    *free_bytes = std::min({info->free_bytes + (reserved - active), cap - std::min(cap, active), *total_bytes});
    return cudaSuccess;
  });
}

}  // extern "C"
