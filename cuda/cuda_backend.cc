// cuda/cuda_backend.cc — the cuMemAlloc backend (cuda/cuda_backend.h), MakeCudaBackend() and its
// registry row.
#include "cuda/cuda_backend.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "backend/registry.h"
#include "cuda/cuda_status.h"

namespace bucketalloc {
namespace internal {
namespace {

bool IsDefaultStream(Stream stream) {
  return stream == nullptr || stream == kLegacyStream || stream == kPerThreadStream;
}

}  // namespace

CudaBackend::~CudaBackend() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_events_.empty() && foreign_events_.empty()) return;
  ScopedContext ctx(driver_, device_);
  if (!ctx.Enter("cuEventDestroy").ok()) return;  // the context is gone; nothing to free
  for (CUevent event : free_events_) driver_.EventDestroy(event);
  for (CUevent event : foreign_events_) driver_.EventDestroy(event);
  free_events_.clear();
  foreign_events_.clear();
}

absl::StatusOr<void*> CudaBackend::Allocate(std::size_t bytes) {
  if (bytes == 0 || bytes % Granularity() != 0) {
    Count(&BackendCounters::failed_allocs);
    return absl::InvalidArgumentError(absl::StrCat("cuMemAlloc(", bytes, " bytes) on device ", device_,
                                                   ": the size must be a positive multiple of the granularity ",
                                                   Granularity()));
  }
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuMemAlloc"); !status.ok()) {
    Count(&BackendCounters::failed_allocs);
    return status;
  }
  CUdeviceptr ptr = 0;
  // In relaxed capture mode, as PyTorch's allocator calls cudaMalloc: growth during a capture (a
  // private pool's, or an unannounced capture's) is legal.
  CUresult alloc_error;
  {
    RelaxedCaptureMode relaxed(driver_);
    alloc_error = driver_.MemAlloc(&ptr, bytes);
  }
  if (CUresult error = alloc_error; error != CUDA_SUCCESS) {
    Count(&BackendCounters::failed_allocs);
    return Error(absl::StrCat("cuMemAlloc(", bytes, " bytes)"), error);
  }
  Count(&BackendCounters::allocs, 1, &BackendCounters::alloc_bytes, static_cast<std::int64_t>(bytes));
  return reinterpret_cast<void*>(ptr);
}

absl::Status CudaBackend::Free(void* ptr, std::size_t bytes) {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuMemFree"); !status.ok()) return status;
  if (CUresult error = driver_.MemFree(reinterpret_cast<CUdeviceptr>(ptr)); error != CUDA_SUCCESS) {
    return Error(absl::StrCat("cuMemFree(", Hex(ptr), ", ", bytes, " bytes)"), error);
  }
  Count(&BackendCounters::frees, 1, &BackendCounters::free_bytes, static_cast<std::int64_t>(bytes));
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemInfo> CudaBackend::GetMemInfo() {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuMemGetInfo"); !status.ok()) return status;
  DeviceMemInfo info;
  if (CUresult error = driver_.MemGetInfo(&info.free_bytes, &info.total_bytes); error != CUDA_SUCCESS) {
    return Error("cuMemGetInfo", error);
  }
  return info;
}

absl::StatusOr<CUcontext> CudaBackend::ContextOf(Stream stream) const {
  absl::StatusOr<CUcontext> own = PrimaryContext(driver_, device_);
  if (!own.ok() || IsDefaultStream(stream)) return own;
  CUcontext ctx = nullptr;
  if (CUresult error = driver_.StreamGetCtx(static_cast<CUstream>(stream), &ctx); error != CUDA_SUCCESS) {
    return Error(absl::StrCat("cuStreamGetCtx(stream ", Hex(stream), ")"), error);
  }
  return ctx;
}

absl::StatusOr<Event> CudaBackend::RecordEvent(Stream stream) {
  ScopedContext guard(driver_, device_);
  if (absl::Status status = guard.Enter("cuEventRecord"); !status.ok()) return status;
  absl::StatusOr<CUcontext> stream_ctx = ContextOf(stream);
  if (!stream_ctx.ok()) return stream_ctx.status();
  absl::StatusOr<CUcontext> own = PrimaryContext(driver_, device_);
  if (!own.ok()) return own.status();
  const bool foreign = *stream_ctx != *own;
  CUevent event = nullptr;
  if (!foreign) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  // A stream of another device: its context is current while the event is created and recorded.
  ScopedContext stream_guard(driver_, device_);
  if (foreign) {
    if (absl::Status status =
            stream_guard.EnterContext(*stream_ctx, absl::StrCat("cuEventRecord(stream ", Hex(stream), ")"));
        !status.ok()) {
      return status;
    }
  }
  if (event == nullptr) {
    if (CUresult error = driver_.EventCreate(&event, CU_EVENT_DISABLE_TIMING); error != CUDA_SUCCESS) {
      return Error("cuEventCreate(CU_EVENT_DISABLE_TIMING)", error);
    }
  }
  if (CUresult error = driver_.EventRecord(event, static_cast<CUstream>(stream)); error != CUDA_SUCCESS) {
    if (foreign) {
      driver_.EventDestroy(event);
    } else {
      ReturnToPool(event);
    }
    return Error(absl::StrCat("cuEventRecord(stream ", Hex(stream), ")"), error);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (foreign) foreign_events_.insert(event);
    counters_.events_recorded += 1;
  }
  return static_cast<Event>(event);
}

absl::StatusOr<bool> CudaBackend::QueryEvent(Event event) {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuEventQuery"); !status.ok()) return status;
  const CUresult error = driver_.EventQuery(static_cast<CUevent>(event));
  if (error == CUDA_SUCCESS) return true;
  if (error == CUDA_ERROR_NOT_READY) return false;
  return Error(absl::StrCat("cuEventQuery(", Hex(event), ")"), error);
}

absl::Status CudaBackend::SynchronizeEvent(Event event) {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuEventSynchronize"); !status.ok()) return status;
  if (CUresult error = driver_.EventSynchronize(static_cast<CUevent>(event)); error != CUDA_SUCCESS) {
    return Error(absl::StrCat("cuEventSynchronize(", Hex(event), ")"), error);
  }
  return absl::OkStatus();
}

void CudaBackend::DestroyEvent(Event event) {
  if (event == nullptr) return;
  ReturnToPool(static_cast<CUevent>(event));
}

absl::Status CudaBackend::SynchronizeDevice() {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuCtxSynchronize"); !status.ok()) return status;
  if (CUresult error = driver_.CtxSynchronize(); error != CUDA_SUCCESS) return Error("cuCtxSynchronize", error);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::IsCapturing(Stream stream) {
  ScopedContext ctx(driver_, device_);
  if (absl::Status status = ctx.Enter("cuStreamIsCapturing"); !status.ok()) return status;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult error = driver_.StreamIsCapturing(static_cast<CUstream>(stream), &capture);
  // The legacy default stream cannot be queried while a blocking stream captures (cuda.h:15526,
  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; the capture is not invalidated): that also forbids the calls
  // the caller is about to make.
  if (error == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  if (error != CUDA_SUCCESS) return Error(absl::StrCat("cuStreamIsCapturing(stream ", Hex(stream), ")"), error);
  return capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

BackendCounters CudaBackend::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

absl::Status CudaBackend::Error(absl::string_view call, CUresult error) const {
  return CuStatus(driver_, absl::StrCat(call, " on device ", device_), error);
}

void CudaBackend::Count(std::int64_t BackendCounters::*counter, std::int64_t n,
                        std::int64_t BackendCounters::*byte_counter, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.*counter += n;
  if (byte_counter != nullptr) counters_.*byte_counter += bytes;
}

void CudaBackend::ReturnToPool(CUevent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool foreign = foreign_events_.erase(event) > 0;
    if (!foreign && free_events_.size() < kMaxPooledEvents) {
      free_events_.push_back(event);
      return;
    }
  }
  driver_.EventDestroy(event);  // needs no current context
}

namespace {

absl::StatusOr<std::unique_ptr<Backend>> MakeCuda(const BackendSettings&, int device) {
  return MakeCudaBackend(device);
}

}  // namespace

constinit const BackendEntry kCudaBackendEntry = {
    "cuda",
    {},
    /*stitching_backend=*/"vmm",
    /*always_stitches=*/false,
    CudaDevicesOf,
    MakeCuda,
};

void CudaBackend::PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.lock(); }
void CudaBackend::ParentAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }
absl::Status CudaBackend::ChildAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu_.unlock();
  return absl::FailedPreconditionError(absl::StrCat(
      "bucketalloc: device ", device_,
      " was set up in the parent of this fork() child, and CUDA cannot be used in a child of fork before exec "
      "(its contexts are not copied); start workers with spawn or forkserver, or create the allocator after "
      "forking"));
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  if (absl::Status status = internal::InitDevice("cuda", device); !status.ok()) return status;
  absl::StatusOr<const internal::DriverApi*> driver = internal::Driver();  // loaded by InitDevice
  if (!driver.ok()) return driver.status();
  return std::unique_ptr<Backend>(std::make_unique<internal::CudaBackend>(device, **driver));
}

}  // namespace bucketalloc
