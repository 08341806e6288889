// cuda/cuda_status.h — what every CUDA backend shares: error statuses, the device count and device
// initialization (layer L1).
//
// Owns: the typed status of a failed call (out of memory -> ResourceExhausted; no usable driver or
// device, or a call CUDA refuses during a stream capture -> FailedPrecondition; anything else ->
// Internal), each message naming the call, the error name, number and string; `InitDevice`, what
// every CUDA backend checks before it is made; the cuda and vmm registry rows' device count.
// The driver itself is cuda/driver_api.h.
// Thread-safety: stateless functions.
#ifndef BUCKETALLOC_CUDA_CUDA_STATUS_H_
#define BUCKETALLOC_CUDA_CUDA_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"

namespace bucketalloc::internal {

// Formats an address or opaque handle as hex ("0x7f...").
std::string Hex(std::uint64_t value);
std::string Hex(const void* ptr);

// Formats "<what> failed: <name> (<number>): <string>". `what` names the call and the device.
std::string ErrorMessage(absl::string_view what, absl::string_view name, int number, absl::string_view text);

// The typed status of a failed call: out of memory -> ResourceExhausted; no usable driver or
// device, or a call refused during a stream capture (`precondition`) -> FailedPrecondition;
// anything else -> Internal.
absl::Status TypedStatus(bool out_of_memory, bool precondition, std::string message);

// What every CUDA backend checks before it is made: the driver loads, `device` exists, and its
// primary context can be created (a device that exists but cannot be used, e.g. in prohibited
// compute mode, fails here rather than on the first allocation). `backend` names the backend in
// the error.
absl::Status InitDevice(absl::string_view backend, int device);

// The device count of the cuda and vmm registry rows: CudaDeviceCount(), whatever the settings
// (they have none).
absl::StatusOr<int> CudaDevicesOf(const BackendSettings& settings);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_CUDA_STATUS_H_
