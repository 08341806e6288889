// cuda/driver_api.h — the CUDA driver functions the vmm backend calls, resolved at run time (L1).
//
// Owns: `DriverApi`, the table of driver entry points (cuMemAddressReserve/Free, cuMemCreate/
// Release, cuMemMap, cuMemSetAccess, cuMemUnmap, ...), resolved once through the runtime's
// cudaGetDriverEntryPointByVersion (`Driver()`), so that libcuda is never linked; and the mapping
// of CUresult errors to typed statuses, as cuda/cuda_status.h maps runtime errors.
// Thread-safety: Driver() is thread-safe and its table read-only once resolved.
//
// Example:
//   absl::StatusOr<const DriverApi*> driver = Driver();
//   if (CUresult e = (*driver)->MemUnmap(va, bytes); e != CUDA_SUCCESS) return CuStatus(**driver, "cuMemUnmap", e);
#ifndef BUCKETALLOC_CUDA_DRIVER_API_H_
#define BUCKETALLOC_CUDA_DRIVER_API_H_

#include <cuda.h>  // the driver API's types and constants only: its functions come from Driver()
#include <cudaTypedefs.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::internal {

// Every driver function the vmm backend calls: X(field, symbol, version), where `version` is the
// CUDA version that introduced the signature of cudaTypedefs.h's PFN_<symbol>_v<version>. Asking
// for exactly that version returns exactly that ABI, on any driver at least that recent.
#define BUCKETALLOC_DRIVER_FUNCTIONS(X)                                \
  X(GetErrorName, cuGetErrorName, 6000)                                \
  X(GetErrorString, cuGetErrorString, 6000)                            \
  X(DeviceGet, cuDeviceGet, 2000)                                      \
  X(DeviceGetAttribute, cuDeviceGetAttribute, 2000)                    \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020) \
  X(MemAddressReserve, cuMemAddressReserve, 10020)                     \
  X(MemAddressFree, cuMemAddressFree, 10020)                           \
  X(MemCreate, cuMemCreate, 10020)                                     \
  X(MemRelease, cuMemRelease, 10020)                                   \
  X(MemMap, cuMemMap, 10020)                                           \
  X(MemSetAccess, cuMemSetAccess, 10020)                               \
  X(MemUnmap, cuMemUnmap, 10020)

// The resolved driver functions; every pointer is non-null once Driver() returns the table.
struct DriverApi {
#define BUCKETALLOC_DRIVER_FIELD(field, symbol, version) PFN_##symbol##_v##version field = nullptr;
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_DRIVER_FIELD)
#undef BUCKETALLOC_DRIVER_FIELD
};

// Returns the driver functions, resolved on the first successful call and read-only after that.
// Every failure (no driver, a runtime without the entry-point call, a driver without a symbol or
// too old for its version) is FailedPrecondition, and is not kept: the preload library's runtime
// may be loaded later.
absl::StatusOr<const DriverApi*> Driver();

// Maps a driver error to a typed status as CudaStatus maps a runtime error, with the driver's own
// error name and string (driver calls do not touch the runtime's last error).
absl::Status CuStatus(const DriverApi& driver, absl::string_view what, CUresult error);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_DRIVER_API_H_
