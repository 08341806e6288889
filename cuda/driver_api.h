// cuda/driver_api.h — the CUDA driver, loaded at run time: every CUDA call bucketalloc's backends
// make (layer L1).
//
// Owns: `DriverApi`, the table of driver entry points (memory, contexts, events, streams, virtual
// memory); `Driver()`, which loads libcuda.so.1 with dlopen on first use and resolves each entry
// with cuGetProcAddress_v2 at the version of the ABI it is called with; the primary context of each
// device (`PrimaryContext`, retained once and kept for the process); `ScopedContext`, which makes a
// device's primary context current for one call and restores exactly what was current before
// (nothing, when nothing was); and the mapping of CUresult errors to typed statuses.
// Why the driver, loaded at run time: libbucketalloc.so then needs no CUDA library to load (a
// machine without a driver gets a FailedPrecondition naming the reason), and one build runs on every
// driver from CUDA 12.0 (r525) on — CUDA 12.x and 13.x drivers, PyTorch builds for CUDA 12 and 13 —
// because each entry point is asked for at the oldest version whose ABI it uses, which every newer
// driver still serves. Nothing links cudart: the process's runtime (PyTorch's, any version) works
// on the same primary contexts, streams and events (cudaStream_t is CUstream, cudaEvent_t CUevent).
// Thread-safety: Driver() and PrimaryContext() are thread-safe; the table is read-only once
// resolved; a ScopedContext belongs to one call on one thread.
//
// Example:
//   absl::StatusOr<const DriverApi*> driver = Driver();
//   ScopedContext ctx(**driver, device);
//   if (absl::Status s = ctx.Enter("cuMemAlloc"); !s.ok()) return s;
//   if (CUresult e = (*driver)->MemAlloc(&p, bytes); e != CUDA_SUCCESS) return CuStatus(**driver, "cuMemAlloc", e);
#ifndef BUCKETALLOC_CUDA_DRIVER_API_H_
#define BUCKETALLOC_CUDA_DRIVER_API_H_

#include <cuda.h>  // the driver API's types and constants only: its functions come from Driver()
#include <cudaTypedefs.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::internal {

// The oldest driver served: cuGetProcAddress_v2 (the only entry looked up by name) is CUDA 12.0's.
inline constexpr int kMinDriverVersion = 12000;

// Every driver function the backends call: X(field, symbol, version), where `version` is the CUDA
// version that introduced the signature of cudaTypedefs.h's PFN_<symbol>_v<version>. Asking for
// exactly that version returns exactly that ABI, on any driver at least that recent (e.g.
// cuCtxGetDevice at 2000, not 13000, whose ABI differs).
#define BUCKETALLOC_DRIVER_FUNCTIONS(X)                                        \
  X(Init, cuInit, 2000)                                                        \
  X(DriverGetVersion, cuDriverGetVersion, 2020)                                \
  X(GetErrorName, cuGetErrorName, 6000)                                        \
  X(GetErrorString, cuGetErrorString, 6000)                                    \
  X(DeviceGetCount, cuDeviceGetCount, 2000)                                    \
  X(DeviceGet, cuDeviceGet, 2000)                                              \
  X(DeviceGetAttribute, cuDeviceGetAttribute, 2000)                            \
  X(DeviceCanAccessPeer, cuDeviceCanAccessPeer, 4000)                          \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)                    \
  X(CtxGetCurrent, cuCtxGetCurrent, 4000)                                      \
  X(CtxPushCurrent, cuCtxPushCurrent, 4000)                                    \
  X(CtxPopCurrent, cuCtxPopCurrent, 4000)                                      \
  X(CtxSynchronize, cuCtxSynchronize, 2000)                                    \
  X(MemAlloc, cuMemAlloc, 3020)                                                \
  X(MemFree, cuMemFree, 3020)                                                  \
  X(MemGetInfo, cuMemGetInfo, 3020)                                            \
  X(EventCreate, cuEventCreate, 2000)                                          \
  X(EventRecord, cuEventRecord, 2000)                                          \
  X(EventQuery, cuEventQuery, 2000)                                            \
  X(EventSynchronize, cuEventSynchronize, 2000)                                \
  X(EventDestroy, cuEventDestroy, 4000)                                        \
  X(StreamIsCapturing, cuStreamIsCapturing, 10000)                             \
  X(StreamGetCtx, cuStreamGetCtx, 9020)                                        \
  X(ThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode, 10010) \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020)         \
  X(MemAddressReserve, cuMemAddressReserve, 10020)                             \
  X(MemAddressFree, cuMemAddressFree, 10020)                                   \
  X(MemCreate, cuMemCreate, 10020)                                             \
  X(MemRelease, cuMemRelease, 10020)                                           \
  X(MemMap, cuMemMap, 10020)                                                   \
  X(MemSetAccess, cuMemSetAccess, 10020)                                       \
  X(MemUnmap, cuMemUnmap, 10020)                                               \
  X(MemExportToShareableHandle, cuMemExportToShareableHandle, 10020)           \
  X(MemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020)

// The resolved driver functions; every pointer is non-null once Driver() returns the table.
struct DriverApi {
#define BUCKETALLOC_DRIVER_FIELD(field, symbol, version) PFN_##symbol##_v##version field = nullptr;
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_DRIVER_FIELD)
#undef BUCKETALLOC_DRIVER_FIELD
  int version = 0;       // cuDriverGetVersion, e.g. 12040 or 13000
  int device_count = 0;  // cuDeviceGetCount, at least 1
};

// Returns the driver, loaded, initialized (cuInit) and resolved on the first successful call and
// read-only after that. Every failure (no libcuda.so.1, a driver older than 12.0, a symbol missing,
// cuInit failing: no device, a driver/kernel-module mismatch) is FailedPrecondition naming it, and is
// not kept: a later call tries again.
absl::StatusOr<const DriverApi*> Driver();

// The installed driver's version (cuDriverGetVersion, e.g. 13000 for 13.0), read without cuInit
// and without resolving the table, so it answers on a machine whose driver cannot run bucketalloc
// (too old, no device); FailedPrecondition naming why when there is no driver library.
absl::StatusOr<int> CudaDriverVersion();

// The CUDA toolkit version whose headers this build was compiled with (cuda.h's CUDA_VERSION).
int CudaHeadersVersion();

// The primary context of `device` (retained on first use, which creates it: what the runtime's
// cudaSetDevice or cudaFree(0) does), kept for the life of the process.
absl::StatusOr<CUcontext> PrimaryContext(const DriverApi& driver, int device);

// Maps a driver error to a typed status (out of memory -> ResourceExhausted; no usable driver or
// device, or a call refused during a stream capture -> FailedPrecondition; anything else ->
// Internal), with the driver's own error name and string. Driver calls leave the runtime's "last
// error" (cudaGetLastError) alone.
absl::Status CuStatus(const DriverApi& driver, absl::string_view what, CUresult error);

// Makes `device`'s primary context current for the lifetime of the guard (a push, only when another
// context or none is current) and pops it after, so that the thread's current context is exactly
// what it was: a thread that had none gets none back, and no context is ever created on a device
// the caller did not name.
class ScopedContext {
 public:
  ScopedContext(const DriverApi& driver, int device) : driver_(driver), device_(device) {}
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  ~ScopedContext() {
    CUcontext popped = nullptr;
    if (pushed_) driver_.CtxPopCurrent(&popped);  // cannot fail: this thread pushed it
  }

  // Makes the device's primary context current; `call` names the operation it is for (used only
  // in an error).
  absl::Status Enter(absl::string_view call);
  // Makes `ctx` current instead (a stream's own context, e.g. another device's), the same way.
  absl::Status EnterContext(CUcontext ctx, absl::string_view call);

 private:
  const DriverApi& driver_;
  const int device_;
  bool pushed_ = false;
};

// Puts the calling thread in relaxed stream-capture mode for its lifetime, as PyTorch's allocator
// does around cudaMalloc (cudaMallocMaybeCapturing): a capture running in global mode, on this
// thread or another, then does not forbid the allocation calls made meanwhile (cuda.h,
// cuThreadExchangeStreamCaptureMode: "CU_STREAM_CAPTURE_MODE_RELAXED ... the local thread is not
// prohibited from potentially unsafe API calls"). Those calls are not stream-ordered, so they are
// not part of any graph.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const DriverApi& driver) : driver_(driver) {
    exchanged_ = driver_.ThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCaptureMode() {
    if (exchanged_) driver_.ThreadExchangeStreamCaptureMode(&mode_);  // the thread's mode back
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  const DriverApi& driver_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_DRIVER_API_H_
