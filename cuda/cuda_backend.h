// cuda/cuda_backend.h — the cudaMalloc backend (layer L1).
//
// Owns: `CudaBackend`, the Backend of one CUDA device built on the runtime API (cudaMalloc,
// cudaFree, cudaMemGetInfo, cudaEvent*, cudaStreamIsCapturing), its small pool of recycled events
// and its call counters. The vmm backend (cuda/vmm_backend.cc) extends it. It keeps the base
// class's virtual-memory defaults (Unimplemented).
// Layer: L1. cuda/ is the only place that includes CUDA headers; cudart is linked statically and
// libcuda never, so it links and loads on a machine without a driver, where every call reports
// FailedPrecondition.
// Thread-safety: the caller uses a backend under its device lock; in addition the event pool and
// the counters are guarded by a mutex, so every method is safe to call from any thread. Each call
// makes `device()` current for its duration and restores the caller's current device afterwards.
//
// Example:
//   absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);  // bucketalloc/backend.h
#ifndef BUCKETALLOC_CUDA_CUDA_BACKEND_H_
#define BUCKETALLOC_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "cuda/cuda_runtime.h"

namespace bucketalloc::internal {

class CudaBackend : public Backend {
 public:
  // cudaMalloc's granule; the allocator's too.
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;

  explicit CudaBackend(int device) : device_(device) {}
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  ~CudaBackend() override;

  absl::string_view Name() const override { return "cuda"; }
  int device() const override { return device_; }
  std::size_t Granularity() const override { return kGranularity; }

  absl::StatusOr<void*> Allocate(std::size_t bytes) override;
  absl::Status Free(void* ptr, std::size_t bytes) override;
  absl::StatusOr<DeviceMemInfo> GetMemInfo() override;
  absl::StatusOr<Event> RecordEvent(Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  void DestroyEvent(Event event) override;
  absl::Status SynchronizeDevice() override;
  absl::StatusOr<bool> IsCapturing(Stream stream) override;
  BackendCounters counters() const override;

 protected:
  // The typed status of a failed `call` (with its arguments) on this device.
  absl::Status Error(absl::string_view call, cudaError_t error) const;
  // Adds `n` to `counter` (e.g. &BackendCounters::allocs), and `bytes` to `byte_counter` when given
  // (both in one locked section, so that a reader never sees one without the other).
  void Count(std::int64_t BackendCounters::*counter, std::int64_t n = 1,
             std::int64_t BackendCounters::*byte_counter = nullptr, std::int64_t bytes = 0);

 private:
  static constexpr std::size_t kMaxPooledEvents = 256;  // beyond this, events are destroyed

  // Keeps `event` for reuse, or destroys it when the pool is full.
  void ReturnToPool(cudaEvent_t event);

  const int device_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_events_;  // guarded by mu_
  BackendCounters counters_;              // guarded by mu_
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_CUDA_BACKEND_H_
