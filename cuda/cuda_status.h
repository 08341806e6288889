// cuda/cuda_status.h — CUDA runtime errors as typed statuses, and the current-device guard (L1).
//
// Owns: the mapping of runtime errors to typed statuses (out of memory -> ResourceExhausted; no
// usable driver or device, or a call CUDA refuses during a stream capture -> FailedPrecondition;
// anything else -> Internal), each message naming the call, the error name, number and string;
// `ScopedDevice`, which makes a device current for one call and restores the caller's; and
// `InitDevice`, what every CUDA backend checks before it is made.
// Thread-safety: stateless functions; a ScopedDevice belongs to one call on one thread.
//
// Example:
//   ScopedDevice guard(device);
//   if (absl::Status s = guard.Enter("cudaMalloc"); !s.ok()) return s;
//   if (cudaError_t e = Rt().Malloc(&p, bytes); e != cudaSuccess) return CudaStatus("cudaMalloc", e);
#ifndef BUCKETALLOC_CUDA_CUDA_STATUS_H_
#define BUCKETALLOC_CUDA_CUDA_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "cuda/cuda_runtime.h"

namespace bucketalloc::internal {

inline const CudaRuntime& Rt() { return CudaRuntimeApi(); }

// Formats an address or opaque handle as hex ("0x7f...").
std::string Hex(std::uint64_t value);
std::string Hex(const void* ptr);

// Formats "<what> failed: <name> (<number>): <string>". `what` names the call and the device.
std::string ErrorMessage(absl::string_view what, absl::string_view name, int number, absl::string_view text);
// ErrorMessage of a runtime error.
std::string CudaErrorMessage(absl::string_view what, cudaError_t error);

// True for the errors that mean "no usable driver or device" rather than a failed operation.
bool IsMissingDriverOrDevice(cudaError_t error);
// The errors of a call CUDA forbids while a stream capture is running.
bool IsCaptureError(cudaError_t error);

// The typed status of a failed call: out of memory -> ResourceExhausted; no usable driver or
// device, or a call refused during a stream capture (`precondition`) -> FailedPrecondition;
// anything else -> Internal.
absl::Status TypedStatus(bool out_of_memory, bool precondition, std::string message);

// Maps a CUDA error to a typed status. Also resets the thread's last error when it is this one, so
// that a non-sticky error (out of memory above all) is not reported again by an unrelated later
// call; the error is reported here instead. An earlier error the host program has not read yet is
// left alone. Sticky errors (a lost context) cannot be reset and keep failing calls.
absl::Status CudaStatus(absl::string_view what, cudaError_t error);

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
  absl::Status Enter(absl::string_view call);

 private:
  const int device_;
  int previous_ = 0;
  bool switched_ = false;
};

// What every CUDA backend checks before it is made: `device` exists and can be made current, and
// its context is created (a device that exists but cannot be used, e.g. in prohibited compute
// mode, fails here rather than on the first allocation). `backend` names the backend in the error.
absl::Status InitDevice(absl::string_view backend, int device);

// The device count of the cuda and vmm registry rows: CudaDeviceCount(), whatever the settings
// (they have none).
absl::StatusOr<int> CudaDevicesOf(const BackendSettings& settings);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_CUDA_STATUS_H_
