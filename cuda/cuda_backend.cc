// cuda/cuda_backend.cc — the cudaMalloc and virtual-memory backends (layer L1).
//
// Owns: `CudaBackend`, the Backend of one CUDA device built on the runtime API (cudaMalloc,
// cudaFree, cudaMemGetInfo, cudaEvent*), its small pool of recycled events, and the mapping of
// CUDA errors to typed statuses (out of memory -> ResourceExhausted; no driver or device ->
// FailedPrecondition; anything else -> Internal), each message naming the call, the error name,
// number and string, and the device. `VmmBackend` extends it with the virtual-memory family over
// the driver API (cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap + cuMemSetAccess,
// cuMemUnmap), whose entry points are resolved once through the runtime's
// cudaGetDriverEntryPointByVersion (`Driver()`), and maps CUresult errors the same way. Also
// MakeCudaBackend(), MakeVmmBackend() and CudaDeviceCount().
// Layer: L1. The only place that includes a CUDA header (<cuda.h> for the driver's types only);
// cudart is linked statically and libcuda is never a link dependency, so this file links and loads
// on a machine without a driver, where every call reports FailedPrecondition.
// Thread-safety: the caller uses a backend under its device lock; in addition the event pool and
// the counters are guarded by a mutex, so every method is safe to call from any thread. Each call
// makes `device()` current for its duration and restores the caller's current device afterwards.
// The cuda backend keeps the base class's virtual-memory defaults (Unimplemented).
#include "cuda/cuda_runtime.h"

#include <cuda.h>  // the driver API's types and constants only: its functions come from Driver()
#include <cudaTypedefs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "src/internal/bits.h"

namespace bucketalloc {
namespace {

using internal::CudaRuntime;
inline const CudaRuntime& Rt() { return internal::CudaRuntimeApi(); }

constexpr std::size_t kGranularity = std::size_t{2} << 20;  // cudaMalloc's granule; the allocator's too
constexpr std::size_t kMaxPooledEvents = 256;               // beyond this, events are destroyed

// True for the errors that mean "no usable driver or device" rather than a failed operation.
bool IsMissingDriverOrDevice(cudaError_t error) {
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

// Formats an address or opaque handle as hex ("0x7f...").
std::string Hex(std::uint64_t value) { return absl::StrCat("0x", absl::Hex(value)); }
std::string Hex(const void* ptr) { return Hex(reinterpret_cast<std::uintptr_t>(ptr)); }

// Formats "<what> failed: <name> (<number>): <string>". `what` names the call and the device.
std::string ErrorMessage(absl::string_view what, absl::string_view name, int number,
                         absl::string_view text) {
  return absl::StrCat(what, " failed: ", name, " (", number, "): ", text);
}

// ErrorMessage of a runtime error.
std::string CudaErrorMessage(absl::string_view what, cudaError_t error) {
  return ErrorMessage(what, Rt().GetErrorName(error), static_cast<int>(error),
                      Rt().GetErrorString(error));
}

// The errors of a call CUDA forbids while a stream capture is running.
bool IsCaptureError(cudaError_t error) {
  switch (error) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
      return true;
    default:
      return false;
  }
}

// The typed status of a failed call: out of memory -> ResourceExhausted; no usable driver or
// device, or a call refused during a stream capture (`precondition`) -> FailedPrecondition;
// anything else -> Internal.
absl::Status TypedStatus(bool out_of_memory, bool precondition, std::string message) {
  if (out_of_memory) return absl::ResourceExhaustedError(message);
  if (precondition) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

// Maps a CUDA error to a typed status. Also resets the thread's last error when it is this one, so
// that a non-sticky error (out of memory above all) is not reported again by an unrelated later
// call; the error is reported here instead. An earlier error the host program has not read yet is
// left alone. Sticky errors (a lost context) cannot be reset and keep failing calls.
absl::Status CudaStatus(absl::string_view what, cudaError_t error) {
  internal::ClearLastErrorIf(Rt(), error);
  return TypedStatus(error == cudaErrorMemoryAllocation,
                     IsMissingDriverOrDevice(error) || IsCaptureError(error),
                     CudaErrorMessage(what, error));
}

// ---------------------------------------------------------------------------------------------
// The driver API (vmm backend only), through the runtime's cudaGetDriverEntryPointByVersion.

// Every driver function the vmm backend calls: X(field, symbol, version), where `version` is the
// CUDA version that introduced the signature of cudaTypedefs.h's PFN_<symbol>_v<version>. Asking
// for exactly that version returns exactly that ABI, on any driver at least that recent.
#define BUCKETALLOC_DRIVER_FUNCTIONS(X)                             \
  X(GetErrorName, cuGetErrorName, 6000)                             \
  X(GetErrorString, cuGetErrorString, 6000)                         \
  X(DeviceGet, cuDeviceGet, 2000)                                   \
  X(DeviceGetAttribute, cuDeviceGetAttribute, 2000)                 \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020) \
  X(MemAddressReserve, cuMemAddressReserve, 10020)                  \
  X(MemAddressFree, cuMemAddressFree, 10020)                        \
  X(MemCreate, cuMemCreate, 10020)                                  \
  X(MemRelease, cuMemRelease, 10020)                                \
  X(MemMap, cuMemMap, 10020)                                        \
  X(MemSetAccess, cuMemSetAccess, 10020)                            \
  X(MemUnmap, cuMemUnmap, 10020)

// The resolved driver functions; every pointer is non-null once Driver() returns the table.
struct DriverApi {
#define BUCKETALLOC_DRIVER_FIELD(field, symbol, version) PFN_##symbol##_v##version field = nullptr;
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_DRIVER_FIELD)
#undef BUCKETALLOC_DRIVER_FIELD
};

// Resolves `symbol` at `version` into `*function`. Every failure (no driver, a runtime without the
// entry-point call, a driver without the symbol or too old for the version) is FailedPrecondition.
template <typename Function>
absl::Status ResolveEntryPoint(const char* symbol, unsigned int version, Function* function) {
  const std::string call =
      absl::StrCat("cudaGetDriverEntryPointByVersion(\"", symbol, "\", ", version, ")");
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaError_t error = Rt().GetDriverEntryPointByVersion(symbol, &address, version,
                                                            cudaEnableDefault, &found);
      error != cudaSuccess) {
    internal::ClearLastErrorIf(Rt(), error);
    return absl::FailedPreconditionError(CudaErrorMessage(call, error));
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": ",
        found == cudaDriverEntryPointVersionNotSufficent
            ? "the driver has the symbol but not at this version"
            : "the driver has no such symbol",
        " (cudaDriverEntryPointQueryResult ", static_cast<int>(found), ")"));
  }
  *function = reinterpret_cast<Function>(address);
  return absl::OkStatus();
}

// Returns the driver functions, resolved on the first successful call and read-only after that.
// A failed resolution is not kept: the preload library's runtime may be loaded later. Thread-safe.
absl::StatusOr<const DriverApi*> Driver() {
  static std::mutex mu;
  static DriverApi api;                      // written once under mu, before `resolved` is set
  static std::atomic<bool> resolved{false};
  if (resolved.load(std::memory_order_acquire)) [[likely]] return &api;
  std::lock_guard<std::mutex> lock(mu);
  if (resolved.load(std::memory_order_relaxed)) return &api;
  DriverApi found;
#define BUCKETALLOC_RESOLVE(field, symbol, version)                                           \
  if (absl::Status status = ResolveEntryPoint(#symbol, version, &found.field); !status.ok()) { \
    return status;                                                                            \
  }
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_RESOLVE)
#undef BUCKETALLOC_RESOLVE
  api = found;
  resolved.store(true, std::memory_order_release);
  return &api;
}

// The CUresult twins of IsMissingDriverOrDevice and IsCaptureError.
bool IsMissingDriverOrDevice(CUresult error) {
  switch (error) {
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return true;
    default:
      return false;
  }
}
bool IsCaptureError(CUresult error) {
  switch (error) {
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return true;
    default:
      return false;
  }
}

// Maps a driver error to a typed status as CudaStatus maps a runtime error, with the driver's own
// error name and string (driver calls do not touch the runtime's last error).
absl::Status CuStatus(const DriverApi& driver, absl::string_view what, CUresult error) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.GetErrorName(error, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_?";
  if (driver.GetErrorString(error, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown error";
  return TypedStatus(error == CUDA_ERROR_OUT_OF_MEMORY,
                     IsMissingDriverOrDevice(error) || IsCaptureError(error),
                     ErrorMessage(what, name, static_cast<int>(error), text));
}

// The physical memory the vmm backend creates: pinned memory of `device`.
CUmemAllocationProp PinnedDeviceMemory(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Makes `device` current for the lifetime of the guard and restores the previous device after.
// Only switches (and restores) when the current device differs.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : device_(device) {}
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (switched_) Rt().SetDevice(previous_);  // best effort; nothing to report it to
  }

  // Switches to the device; `call` names the operation it is for (used only in an error).
  absl::Status Enter(absl::string_view call) {
    cudaError_t error = Rt().GetDevice(&previous_);
    if (error != cudaSuccess) {
      return CudaStatus(absl::StrCat("cudaGetDevice for ", call, " on device ", device_), error);
    }
    if (previous_ == device_) return absl::OkStatus();
    error = Rt().SetDevice(device_);
    if (error != cudaSuccess) {
      return CudaStatus(
          absl::StrCat("cudaSetDevice(", device_, ") for ", call, " on device ", device_), error);
    }
    switched_ = true;
    return absl::OkStatus();
  }

 private:
  const int device_;
  int previous_ = 0;
  bool switched_ = false;
};

// The cudaMalloc backend; VmmBackend extends it.
class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  ~CudaBackend() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_events_.empty()) return;
    ScopedDevice guard(device_);
    if (!guard.Enter("cudaEventDestroy").ok()) return;  // the context is gone; nothing to free
    for (cudaEvent_t event : free_events_) Rt().EventDestroy(event);
    free_events_.clear();
  }

  absl::string_view Name() const override { return "cuda"; }
  int device() const override { return device_; }
  std::size_t Granularity() const override { return kGranularity; }

  absl::StatusOr<void*> Allocate(std::size_t bytes) override {
    if (bytes == 0 || bytes % Granularity() != 0) {
      Count(&BackendCounters::failed_allocs);
      return absl::InvalidArgumentError(
          absl::StrCat("cudaMalloc(", bytes, " bytes) on device ", device_,
                       ": the size must be a positive multiple of the granularity ", Granularity()));
    }
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaMalloc"); !status.ok()) {
      Count(&BackendCounters::failed_allocs);
      return status;
    }
    void* ptr = nullptr;
    if (cudaError_t error = Rt().Malloc(&ptr, bytes); error != cudaSuccess) {
      Count(&BackendCounters::failed_allocs);
      return Error(absl::StrCat("cudaMalloc(", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::allocs);
    return ptr;
  }

  absl::Status Free(void* ptr, std::size_t bytes) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaFree"); !status.ok()) return status;
    if (cudaError_t error = Rt().Free(ptr); error != cudaSuccess) {
      return Error(absl::StrCat("cudaFree(", Hex(ptr), ", ", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::frees);
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceMemInfo> GetMemInfo() override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaMemGetInfo"); !status.ok()) return status;
    DeviceMemInfo info;
    if (cudaError_t error = Rt().MemGetInfo(&info.free_bytes, &info.total_bytes);
        error != cudaSuccess) {
      return Error("cudaMemGetInfo", error);
    }
    return info;
  }

  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaEventRecord"); !status.ok()) return status;
    cudaEvent_t event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_events_.empty()) {
        event = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (event == nullptr) {
      if (cudaError_t error = Rt().EventCreateWithFlags(&event, cudaEventDisableTiming);
          error != cudaSuccess) {
        return Error("cudaEventCreateWithFlags(cudaEventDisableTiming)", error);
      }
    }
    if (cudaError_t error = Rt().EventRecord(event, static_cast<cudaStream_t>(stream));
        error != cudaSuccess) {
      ReturnToPool(event);
      return Error(absl::StrCat("cudaEventRecord(stream ", Hex(stream), ")"), error);
    }
    Count(&BackendCounters::events_recorded);
    return static_cast<Event>(event);
  }

  absl::StatusOr<bool> QueryEvent(Event event) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaEventQuery"); !status.ok()) return status;
    cudaError_t error = Rt().EventQuery(static_cast<cudaEvent_t>(event));
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) {
      internal::ClearLastErrorIf(Rt(), error);  // "not ready" is no error; do not leave it as the last error
      return false;
    }
    return Error(absl::StrCat("cudaEventQuery(", Hex(event), ")"), error);
  }

  absl::Status SynchronizeEvent(Event event) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaEventSynchronize"); !status.ok()) return status;
    if (cudaError_t error = Rt().EventSynchronize(static_cast<cudaEvent_t>(event));
        error != cudaSuccess) {
      return Error(absl::StrCat("cudaEventSynchronize(", Hex(event), ")"), error);
    }
    return absl::OkStatus();
  }

  void DestroyEvent(Event event) override {
    if (event == nullptr) return;
    ReturnToPool(static_cast<cudaEvent_t>(event));
  }

  absl::Status SynchronizeDevice() override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaDeviceSynchronize"); !status.ok()) return status;
    if (cudaError_t error = Rt().DeviceSynchronize(); error != cudaSuccess) return Error("cudaDeviceSynchronize", error);
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsCapturing(Stream stream) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaStreamIsCapturing"); !status.ok()) return status;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t error = Rt().StreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
    // The legacy default stream cannot be queried while another stream captures in global mode:
    // that also forbids the calls the caller is about to make.
    if (error == cudaErrorStreamCaptureImplicit) {
      internal::ClearLastErrorIf(Rt(), error);
      return true;
    }
    if (error != cudaSuccess) return Error(absl::StrCat("cudaStreamIsCapturing(stream ", Hex(stream), ")"), error);
    return capture != cudaStreamCaptureStatusNone;
  }

  BackendCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 protected:
  // The typed status of a failed `call` (with its arguments) on this device.
  absl::Status Error(absl::string_view call, cudaError_t error) const {
    return CudaStatus(absl::StrCat(call, " on device ", device_), error);
  }

  // Adds one to `counter` (e.g. &BackendCounters::allocs).
  void Count(std::int64_t BackendCounters::* counter) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(counters_.*counter);
  }

 private:
  // Keeps `event` for reuse, or destroys it when the pool is full.
  void ReturnToPool(cudaEvent_t event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_events_.size() < kMaxPooledEvents) {
        free_events_.push_back(event);
        return;
      }
    }
    ScopedDevice guard(device_);
    if (guard.Enter("cudaEventDestroy").ok()) Rt().EventDestroy(event);
  }

  const int device_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;  // guarded by mu_
  BackendCounters counters_;              // guarded by mu_
};

// The virtual-memory backend: CudaBackend's Allocate, Free and events, plus the Reserve/Create/Map
// family over the driver's VMM API. Before any driver call it refuses (InvalidArgument, as the sim
// backend does) a size that is not a positive multiple of the granularity and an alignment that is
// neither 0 (the granularity) nor a power of two. Other misuse (an unknown handle, a range that is
// not reserved or is already mapped, an unmap of nothing) is left to the driver, whose error is
// mapped like any other. Unlike the sim backend, the driver accepts two things the allocator never
// does: ReleasePhysical of a granule that is still mapped (its memory goes with the last mapping)
// and a Map of fewer bytes than the granule (its prefix is mapped). Unmap is one cuMemUnmap, which
// takes a range made of whole mappings and refuses one that cuts a mapping.
class VmmBackend final : public CudaBackend {
 public:
  VmmBackend(int device, const DriverApi& driver, std::size_t granularity)
      : CudaBackend(device), driver_(driver), granularity_(granularity) {}

  absl::string_view Name() const override { return "vmm"; }
  std::size_t Granularity() const override { return granularity_; }
  bool SupportsVirtualMemory() const override { return true; }

  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes,
                                                     std::size_t alignment) override {
    const std::string call =
        absl::StrCat("cuMemAddressReserve(", bytes, " bytes, alignment ", alignment, ")");
    if (!IsGranuleMultiple(bytes) || (alignment != 0 && !internal::IsPowerOfTwo(alignment))) {
      return Refuse(call, "a positive multiple of the granularity and an alignment of 0 or a power of two");
    }
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemAddressReserve"); !status.ok()) return status;
    CUdeviceptr va = 0;
    if (CUresult error = driver_.MemAddressReserve(&va, bytes, alignment, /*addr=*/0, /*flags=*/0);
        error != CUDA_SUCCESS) {
      return CuError(call, error);
    }
    return static_cast<std::uintptr_t>(va);
  }

  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemAddressFree"); !status.ok()) return status;
    if (CUresult error = driver_.MemAddressFree(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemAddressFree(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes) override {
    const std::string call = absl::StrCat("cuMemCreate(", bytes, " bytes, pinned on device ", device(), ")");
    if (!IsGranuleMultiple(bytes)) {
      Count(&BackendCounters::failed_physical_creates);
      return Refuse(call, "a positive multiple of the granularity");
    }
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemCreate"); !status.ok()) {
      Count(&BackendCounters::failed_physical_creates);
      return status;
    }
    const CUmemAllocationProp prop = PinnedDeviceMemory(device());
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult error = driver_.MemCreate(&handle, bytes, &prop, /*flags=*/0); error != CUDA_SUCCESS) {
      Count(&BackendCounters::failed_physical_creates);
      return CuError(call, error);
    }
    Count(&BackendCounters::physical_creates);
    return static_cast<PhysicalHandle>(handle);
  }

  absl::Status ReleasePhysical(PhysicalHandle handle) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemRelease"); !status.ok()) return status;
    if (CUresult error = driver_.MemRelease(handle); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemRelease(handle ", Hex(handle), ")"), error);
    }
    Count(&BackendCounters::physical_releases);
    return absl::OkStatus();
  }

  // cuMemMap, then cuMemSetAccess (a new mapping is inaccessible until then); a failed
  // cuMemSetAccess undoes the mapping.
  absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemMap"); !status.ok()) return status;
    if (CUresult error = driver_.MemMap(va, bytes, /*offset=*/0, handle, /*flags=*/0);
        error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemMap(", Hex(va), ", ", bytes, " bytes, handle ", Hex(handle), ")"),
                     error);
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device();
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult error = driver_.MemSetAccess(va, bytes, &access, 1); error != CUDA_SUCCESS) {
      const CUresult undo = driver_.MemUnmap(va, bytes);
      return CuError(absl::StrCat("cuMemSetAccess(", Hex(va), ", ", bytes, " bytes, read-write for device ",
                                  device(), ") after cuMemMap (",
                                  undo == CUDA_SUCCESS ? "unmapped again" : "cuMemUnmap also failed", ")"),
                     error);
    }
    Count(&BackendCounters::maps);
    return absl::OkStatus();
  }

  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemUnmap"); !status.ok()) return status;
    if (CUresult error = driver_.MemUnmap(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemUnmap(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::unmaps);
    return absl::OkStatus();
  }

 private:
  bool IsGranuleMultiple(std::size_t bytes) const { return bytes != 0 && bytes % granularity_ == 0; }

  // The InvalidArgument of a `call` refused before reaching the driver.
  absl::Status Refuse(absl::string_view call, absl::string_view accepted) const {
    return absl::InvalidArgumentError(absl::StrCat(call, " on device ", device(), ": accepted ", accepted,
                                                   " (granularity ", granularity_, ")"));
  }

  // The typed status of a failed driver `call` (with its arguments) on this device.
  absl::Status CuError(absl::string_view call, CUresult error) const {
    return CuStatus(driver_, absl::StrCat(call, " on device ", device()), error);
  }

  const DriverApi& driver_;  // resolved by Driver(); lives as long as the process
  const std::size_t granularity_;
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  if (cudaError_t error = Rt().GetDeviceCount(&count); error != cudaSuccess) {
    internal::ClearLastErrorIf(Rt(), error);  // do not leave the error for an unrelated later call
    // A failed device query always means there is no usable driver or device.
    return absl::FailedPreconditionError(CudaErrorMessage("cudaGetDeviceCount", error));
  }
  if (count <= 0) {  // not expected (the runtime reports cudaErrorNoDevice), but be explicit
    return absl::FailedPreconditionError(
        absl::StrCat(CudaErrorMessage("cudaGetDeviceCount", cudaErrorNoDevice), " (it reported ",
                     count, " devices)"));
  }
  return count;
}

namespace {

// What both backends check before they are made: `device` exists and can be made current, and its
// context is created (a device that exists but cannot be used, e.g. in prohibited compute mode,
// fails here rather than on the first allocation). `backend` names the backend in the error.
absl::Status InitDevice(absl::string_view backend, int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the ", backend, " backend for device ",
                                                      device, ": ", count.status().message()));
  }
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is out of range: ",
                                                   *count, " CUDA device(s) present"));
  }
  ScopedDevice guard(device);
  if (absl::Status status = guard.Enter(absl::StrCat(backend, " backend init")); !status.ok()) {
    return status;
  }
  if (cudaError_t error = Rt().Free(nullptr); error != cudaSuccess) {  // creates the context
    return CudaStatus(absl::StrCat("cudaFree(nullptr) (context init) on device ", device), error);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  if (absl::Status status = InitDevice("cuda", device); !status.ok()) return status;
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeVmmBackend(int device) {
  if (absl::Status status = InitDevice("vmm", device); !status.ok()) return status;
  absl::StatusOr<const DriverApi*> driver = Driver();
  if (!driver.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the vmm backend for device ", device,
                                                      ": ", driver.status().message()));
  }
  const DriverApi& api = **driver;
  ScopedDevice guard(device);
  if (absl::Status status = guard.Enter("vmm backend init"); !status.ok()) return status;
  CUdevice cu_device = 0;
  if (CUresult error = api.DeviceGet(&cu_device, device); error != CUDA_SUCCESS) {
    return CuStatus(api, absl::StrCat("cuDeviceGet(", device, ")"), error);
  }
  int supported = 0;
  if (CUresult error = api.DeviceGetAttribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
      error != CUDA_SUCCESS) {
    return CuStatus(api,
                    absl::StrCat("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) "
                                 "on device ", device),
                    error);
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the vmm backend for device ", device,
        ": the device does not support virtual memory management "
        "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); backend:cuda works without it"));
  }
  const CUmemAllocationProp prop = PinnedDeviceMemory(device);
  std::size_t granularity = 0;
  if (CUresult error = api.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      error != CUDA_SUCCESS) {
    return CuStatus(api,
                    absl::StrCat("cuMemGetAllocationGranularity(pinned on device ", device,
                                 ", CU_MEM_ALLOC_GRANULARITY_MINIMUM) on device ", device),
                    error);
  }
  // The allocator's sizes (2 MiB slabs, segments rounded to 2 MiB) must be whole numbers of
  // granules.
  if (!internal::IsPowerOfTwo(granularity) || kGranularity % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot create the vmm backend for device ", device, ": its minimum allocation granularity is ",
        granularity, " bytes; the allocator needs a power of two that divides ", kGranularity,
        " (backend:cuda works on this device)"));
  }
  return std::unique_ptr<Backend>(std::make_unique<VmmBackend>(device, api, granularity));
}

}  // namespace bucketalloc
