// cuda/cuda_status.cc — error statuses, device initialization and CudaDeviceCount()
// (cuda/cuda_status.h).
#include "cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "bucketalloc/backend.h"
#include "cuda/driver_api.h"

namespace bucketalloc {
namespace internal {

std::string Hex(std::uint64_t value) { return absl::StrCat("0x", absl::Hex(value)); }
std::string Hex(const void* ptr) { return Hex(reinterpret_cast<std::uintptr_t>(ptr)); }

std::string ErrorMessage(absl::string_view what, absl::string_view name, int number, absl::string_view text) {
  return absl::StrCat(what, " failed: ", name, " (", number, "): ", text);
}

absl::Status TypedStatus(bool out_of_memory, bool precondition, std::string message) {
  if (out_of_memory) return absl::ResourceExhaustedError(message);
  if (precondition) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

absl::Status InitDevice(absl::string_view backend, int device) {
  absl::StatusOr<const DriverApi*> driver = Driver();
  if (!driver.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the ", backend, " backend for device ", device, ": ", driver.status().message()));
  }
  if (device < 0 || device >= (*driver)->device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " is out of range: ", (*driver)->device_count, " CUDA device(s) present"));
  }
  absl::StatusOr<CUcontext> ctx = PrimaryContext(**driver, device);
  if (!ctx.ok()) {
    return absl::Status(ctx.status().code(), absl::StrCat("cannot create the ", backend, " backend for device ", device,
                                                          ": ", ctx.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDevicesOf(const BackendSettings&) { return CudaDeviceCount(); }

}  // namespace internal

absl::StatusOr<int> CudaDeviceCount() {
  absl::StatusOr<const internal::DriverApi*> driver = internal::Driver();
  if (!driver.ok()) return driver.status();
  return (*driver)->device_count;
}

}  // namespace bucketalloc
