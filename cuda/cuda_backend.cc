// cuda/cuda_backend.cc — the cudaMalloc backend (layer L1).
//
// Owns: `CudaBackend`, the Backend of one CUDA device built on the runtime API (cudaMalloc,
// cudaFree, cudaMemGetInfo, cudaEvent*), its small pool of recycled events, and the mapping of
// CUDA errors to typed statuses (out of memory -> ResourceExhausted; no driver or device ->
// FailedPrecondition; anything else -> Internal), each message naming the call, the error name,
// number and string, and the device. Also MakeCudaBackend() and CudaDeviceCount().
// Layer: L1. The only place (with the later vmm backend) that includes a CUDA header; cudart is
// linked statically and libcuda is never a link dependency, so this file links and loads on a
// machine without a driver, where every call reports FailedPrecondition.
// Thread-safety: the caller uses a backend under its device lock; in addition the event pool and
// the counters are guarded by a mutex, so every method is safe to call from any thread. Each call
// makes `device()` current for its duration and restores the caller's current device afterwards.
// The virtual-memory methods keep the base class defaults (Unimplemented).
#include "cuda/cuda_runtime.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"

namespace bucketalloc {
namespace {

using internal::CudaRuntime;
inline const CudaRuntime& Rt() { return internal::CudaRuntimeApi(); }

constexpr std::size_t kGranularity = std::size_t{2} << 20;  // cudaMalloc's effective granule
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

// Formats a pointer or opaque handle as hex ("0x7f...").
std::string Hex(const void* ptr) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<std::uintptr_t>(ptr)));
}

// Formats "<what> failed: <name> (<number>): <string>". `what` names the call and the device.
std::string CudaErrorMessage(absl::string_view what, cudaError_t error) {
  return absl::StrCat(what, " failed: ", Rt().GetErrorName(error), " (", static_cast<int>(error),
                      "): ", Rt().GetErrorString(error));
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

// Maps a CUDA error to a typed status. Also resets the thread's last error when it is this one, so
// that a non-sticky error (out of memory above all) is not reported again by an unrelated later
// call; the error is reported here instead. An earlier error the host program has not read yet is
// left alone. Sticky errors (a lost context) cannot be reset and keep failing calls.
absl::Status CudaStatus(absl::string_view what, cudaError_t error) {
  internal::ClearLastErrorIf(Rt(), error);
  std::string message = CudaErrorMessage(what, error);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (IsMissingDriverOrDevice(error) || IsCaptureError(error)) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
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

class CudaBackend final : public Backend {
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
    if (bytes == 0 || bytes % kGranularity != 0) {
      CountFailedAlloc();
      return absl::InvalidArgumentError(
          absl::StrCat("cudaMalloc(", bytes, " bytes) on device ", device_,
                       ": the size must be a positive multiple of the granularity ", kGranularity));
    }
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaMalloc"); !status.ok()) {
      CountFailedAlloc();
      return status;
    }
    void* ptr = nullptr;
    if (cudaError_t error = Rt().Malloc(&ptr, bytes); error != cudaSuccess) {
      CountFailedAlloc();
      return Error(absl::StrCat("cudaMalloc(", bytes, " bytes)"), error);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.allocs;
    return ptr;
  }

  absl::Status Free(void* ptr, std::size_t bytes) override {
    ScopedDevice guard(device_);
    if (absl::Status status = guard.Enter("cudaFree"); !status.ok()) return status;
    if (cudaError_t error = Rt().Free(ptr); error != cudaSuccess) {
      return Error(absl::StrCat("cudaFree(", Hex(ptr), ", ", bytes, " bytes)"), error);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.frees;
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
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.events_recorded;
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

 private:
  // The typed status of a failed `call` (with its arguments) on this device.
  absl::Status Error(absl::string_view call, cudaError_t error) const {
    return CudaStatus(absl::StrCat(call, " on device ", device_), error);
  }

  void CountFailedAlloc() {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.failed_allocs;
  }

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

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the cuda backend for device ", device, ": ", count.status().message()));
  }
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is out of range: ",
                                                   *count, " CUDA device(s) present"));
  }
  // Make the device current once so that a device that exists but cannot be used (e.g. in
  // prohibited compute mode) fails here rather than on the first allocation.
  ScopedDevice guard(device);
  if (absl::Status status = guard.Enter("cuda backend init"); !status.ok()) return status;
  if (cudaError_t error = Rt().Free(nullptr); error != cudaSuccess) {  // creates the context
    return CudaStatus(absl::StrCat("cudaFree(nullptr) (context init) on device ", device), error);
  }
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device));
}

}  // namespace bucketalloc
