// cuda/cuda_status.cc — CUDA runtime errors as typed statuses (cuda/cuda_status.h), and
// CudaDeviceCount().
#include "cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "bucketalloc/backend.h"

namespace bucketalloc {
namespace internal {

std::string Hex(std::uint64_t value) { return absl::StrCat("0x", absl::Hex(value)); }
std::string Hex(const void* ptr) { return Hex(reinterpret_cast<std::uintptr_t>(ptr)); }

std::string ErrorMessage(absl::string_view what, absl::string_view name, int number, absl::string_view text) {
  return absl::StrCat(what, " failed: ", name, " (", number, "): ", text);
}

std::string CudaErrorMessage(absl::string_view what, cudaError_t error) {
  return ErrorMessage(what, Rt().GetErrorName(error), static_cast<int>(error), Rt().GetErrorString(error));
}

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

absl::Status TypedStatus(bool out_of_memory, bool precondition, std::string message) {
  if (out_of_memory) return absl::ResourceExhaustedError(message);
  if (precondition) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

absl::Status CudaStatus(absl::string_view what, cudaError_t error) {
  ClearLastErrorIf(Rt(), error);
  return TypedStatus(error == cudaErrorMemoryAllocation, IsMissingDriverOrDevice(error) || IsCaptureError(error),
                     CudaErrorMessage(what, error));
}

absl::Status ScopedDevice::Enter(absl::string_view call) {
  cudaError_t error = Rt().GetDevice(&previous_);
  if (error != cudaSuccess) {
    return CudaStatus(absl::StrCat("cudaGetDevice for ", call, " on device ", device_), error);
  }
  if (previous_ == device_) return absl::OkStatus();
  error = Rt().SetDevice(device_);
  if (error != cudaSuccess) {
    return CudaStatus(absl::StrCat("cudaSetDevice(", device_, ") for ", call, " on device ", device_), error);
  }
  switched_ = true;
  return absl::OkStatus();
}

absl::Status InitDevice(absl::string_view backend, int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the ", backend, " backend for device ", device, ": ", count.status().message()));
  }
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " is out of range: ", *count, " CUDA device(s) present"));
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

absl::StatusOr<int> CudaDevicesOf(const BackendSettings&) { return CudaDeviceCount(); }

}  // namespace internal

absl::StatusOr<int> CudaDeviceCount() {
  const internal::CudaRuntime& rt = internal::Rt();
  int count = 0;
  if (cudaError_t error = rt.GetDeviceCount(&count); error != cudaSuccess) {
    internal::ClearLastErrorIf(rt, error);  // do not leave the error for an unrelated later call
    // A failed device query always means there is no usable driver or device.
    return absl::FailedPreconditionError(internal::CudaErrorMessage("cudaGetDeviceCount", error));
  }
  if (count <= 0) {  // not expected (the runtime reports cudaErrorNoDevice), but be explicit
    return absl::FailedPreconditionError(absl::StrCat(
        internal::CudaErrorMessage("cudaGetDeviceCount", cudaErrorNoDevice), " (it reported ", count, " devices)"));
  }
  return count;
}

}  // namespace bucketalloc
