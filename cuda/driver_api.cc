// cuda/driver_api.cc — the driver entry points through cudaGetDriverEntryPointByVersion
// (cuda/driver_api.h).
#include "cuda/driver_api.h"

#include <atomic>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace bucketalloc::internal {
namespace {

// Resolves `symbol` at `version` into `*function`. Every failure (no driver, a runtime without the
// entry-point call, a driver without the symbol or too old for the version) is FailedPrecondition.
template <typename Function>
absl::Status ResolveEntryPoint(const char* symbol, unsigned int version, Function* function) {
  const std::string call = absl::StrCat("cudaGetDriverEntryPointByVersion(\"", symbol, "\", ", version, ")");
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaError_t error = Rt().GetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
      error != cudaSuccess) {
    ClearLastErrorIf(Rt(), error);
    return absl::FailedPreconditionError(CudaErrorMessage(call, error));
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": ",
        found == cudaDriverEntryPointVersionNotSufficent ? "the driver has the symbol but not at this version"
                                                         : "the driver has no such symbol",
        " (cudaDriverEntryPointQueryResult ", static_cast<int>(found), ")"));
  }
  *function = reinterpret_cast<Function>(address);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  static std::mutex mu;
  static DriverApi api;  // written once under mu, before `resolved` is set
  static std::atomic<bool> resolved{false};
  if (resolved.load(std::memory_order_acquire)) [[likely]]
    return &api;
  std::lock_guard<std::mutex> lock(mu);
  if (resolved.load(std::memory_order_relaxed)) return &api;
  DriverApi found;
#define BUCKETALLOC_RESOLVE(field, symbol, version)                                            \
  if (absl::Status status = ResolveEntryPoint(#symbol, version, &found.field); !status.ok()) { \
    return status;                                                                             \
  }
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_RESOLVE)
#undef BUCKETALLOC_RESOLVE
  api = found;
  resolved.store(true, std::memory_order_release);
  return &api;
}

namespace {

// The CUresult twins of IsMissingDriverOrDevice and IsCaptureError (cuda/cuda_status.h).
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

}  // namespace

absl::Status CuStatus(const DriverApi& driver, absl::string_view what, CUresult error) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.GetErrorName(error, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_?";
  if (driver.GetErrorString(error, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown error";
  return TypedStatus(error == CUDA_ERROR_OUT_OF_MEMORY, IsMissingDriverOrDevice(error) || IsCaptureError(error),
                     ErrorMessage(what, name, static_cast<int>(error), text));
}

}  // namespace bucketalloc::internal
