// cuda/cuda_backend.cc — the cudaMalloc backend (cuda/cuda_backend.h), MakeCudaBackend() and its
// registry row.
#include "cuda/cuda_backend.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "backend/registry.h"
#include "cuda/cuda_status.h"

namespace bucketalloc {
namespace internal {

CudaBackend::~CudaBackend() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_events_.empty()) return;
  ScopedDevice guard(device_);
  if (!guard.Enter("cudaEventDestroy").ok()) return;  // the context is gone; nothing to free
  for (cudaEvent_t event : free_events_) Rt().EventDestroy(event);
  free_events_.clear();
}

absl::StatusOr<void*> CudaBackend::Allocate(std::size_t bytes) {
  if (bytes == 0 || bytes % Granularity() != 0) {
    Count(&BackendCounters::failed_allocs);
    return absl::InvalidArgumentError(absl::StrCat("cudaMalloc(", bytes, " bytes) on device ", device_,
                                                   ": the size must be a positive multiple of the granularity ",
                                                   Granularity()));
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
  Count(&BackendCounters::allocs, 1, &BackendCounters::alloc_bytes, static_cast<std::int64_t>(bytes));
  return ptr;
}

absl::Status CudaBackend::Free(void* ptr, std::size_t bytes) {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaFree"); !status.ok()) return status;
  if (cudaError_t error = Rt().Free(ptr); error != cudaSuccess) {
    return Error(absl::StrCat("cudaFree(", Hex(ptr), ", ", bytes, " bytes)"), error);
  }
  Count(&BackendCounters::frees, 1, &BackendCounters::free_bytes, static_cast<std::int64_t>(bytes));
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemInfo> CudaBackend::GetMemInfo() {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaMemGetInfo"); !status.ok()) return status;
  DeviceMemInfo info;
  if (cudaError_t error = Rt().MemGetInfo(&info.free_bytes, &info.total_bytes); error != cudaSuccess) {
    return Error("cudaMemGetInfo", error);
  }
  return info;
}

absl::StatusOr<Event> CudaBackend::RecordEvent(Stream stream) {
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
    if (cudaError_t error = Rt().EventCreateWithFlags(&event, cudaEventDisableTiming); error != cudaSuccess) {
      return Error("cudaEventCreateWithFlags(cudaEventDisableTiming)", error);
    }
  }
  if (cudaError_t error = Rt().EventRecord(event, static_cast<cudaStream_t>(stream)); error != cudaSuccess) {
    ReturnToPool(event);
    return Error(absl::StrCat("cudaEventRecord(stream ", Hex(stream), ")"), error);
  }
  Count(&BackendCounters::events_recorded);
  return static_cast<Event>(event);
}

absl::StatusOr<bool> CudaBackend::QueryEvent(Event event) {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaEventQuery"); !status.ok()) return status;
  cudaError_t error = Rt().EventQuery(static_cast<cudaEvent_t>(event));
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) {
    ClearLastErrorIf(Rt(), error);  // "not ready" is no error; do not leave it as the last error
    return false;
  }
  return Error(absl::StrCat("cudaEventQuery(", Hex(event), ")"), error);
}

absl::Status CudaBackend::SynchronizeEvent(Event event) {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaEventSynchronize"); !status.ok()) return status;
  if (cudaError_t error = Rt().EventSynchronize(static_cast<cudaEvent_t>(event)); error != cudaSuccess) {
    return Error(absl::StrCat("cudaEventSynchronize(", Hex(event), ")"), error);
  }
  return absl::OkStatus();
}

void CudaBackend::DestroyEvent(Event event) {
  if (event == nullptr) return;
  ReturnToPool(static_cast<cudaEvent_t>(event));
}

absl::Status CudaBackend::SynchronizeDevice() {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaDeviceSynchronize"); !status.ok()) return status;
  if (cudaError_t error = Rt().DeviceSynchronize(); error != cudaSuccess) return Error("cudaDeviceSynchronize", error);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::IsCapturing(Stream stream) {
  ScopedDevice guard(device_);
  if (absl::Status status = guard.Enter("cudaStreamIsCapturing"); !status.ok()) return status;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t error = Rt().StreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
  // The legacy default stream cannot be queried while another stream captures in global mode:
  // that also forbids the calls the caller is about to make.
  if (error == cudaErrorStreamCaptureImplicit) {
    ClearLastErrorIf(Rt(), error);
    return true;
  }
  if (error != cudaSuccess) return Error(absl::StrCat("cudaStreamIsCapturing(stream ", Hex(stream), ")"), error);
  return capture != cudaStreamCaptureStatusNone;
}

BackendCounters CudaBackend::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

absl::Status CudaBackend::Error(absl::string_view call, cudaError_t error) const {
  return CudaStatus(absl::StrCat(call, " on device ", device_), error);
}

void CudaBackend::Count(std::int64_t BackendCounters::*counter, std::int64_t n,
                        std::int64_t BackendCounters::*byte_counter, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.*counter += n;
  if (byte_counter != nullptr) counters_.*byte_counter += bytes;
}

void CudaBackend::ReturnToPool(cudaEvent_t event) {
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

}  // namespace internal

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  if (absl::Status status = internal::InitDevice("cuda", device); !status.ok()) return status;
  return std::unique_ptr<Backend>(std::make_unique<internal::CudaBackend>(device));
}

}  // namespace bucketalloc
