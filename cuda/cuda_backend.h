// cuda/cuda_backend.h — the cuMemAlloc backend (layer L1).
//
// Owns: `CudaBackend`, the Backend of one CUDA device on the driver API (cuMemAlloc, cuMemFree,
// cuMemGetInfo, cuEvent*, cuStreamIsCapturing: what cudaMalloc & co. do, on the same primary
// context), its small pool of recycled events and its call counters. The vmm backend
// (cuda/vmm_backend.cc) extends it. It keeps the base class's virtual-memory defaults
// (Unimplemented).
// Layer: L1. cuda/ is the only place that includes CUDA headers; the driver is loaded at run time
// (cuda/driver_api.h) and nothing CUDA is linked, so it links and loads on a machine without a
// driver, where every call reports FailedPrecondition.
// Thread-safety: the caller uses a backend under its device lock; in addition the event pool and
// the counters are guarded by a mutex, so every method is safe to call from any thread. Each call
// makes the device's primary context current for its duration (ScopedContext) and restores the
// caller's afterwards.
//
// Example:
//   absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);  // bucketalloc/backend.h
#ifndef BUCKETALLOC_CUDA_CUDA_BACKEND_H_
#define BUCKETALLOC_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "cuda/driver_api.h"

namespace bucketalloc::internal {

class CudaBackend : public Backend {
 public:
  // cudaMalloc's granule; the allocator's too.
  static constexpr std::size_t kGranularity = std::size_t{2} << 20;

  CudaBackend(int device, const DriverApi& driver) : driver_(driver), device_(device) {}
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  ~CudaBackend() override;

  absl::string_view Name() const override { return "cuda"; }
  int device() const override { return device_; }
  std::size_t Granularity() const override { return kGranularity; }

  absl::StatusOr<void*> Allocate(std::size_t bytes) override;
  absl::Status Free(void* ptr, std::size_t bytes) override;
  absl::StatusOr<DeviceMemInfo> GetMemInfo() override;
  // The event is created in the stream's own context: a stream of another device (a block used
  // there, PyTorch's record_stream) gets an event of that device, as cuEventRecord requires.
  absl::StatusOr<Event> RecordEvent(Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  void DestroyEvent(Event event) override;
  absl::Status SynchronizeDevice() override;
  absl::StatusOr<bool> IsCapturing(Stream stream) override;
  BackendCounters counters() const override;
  // fork(2): CUDA does not copy its contexts, threads or driver state into a child of fork, and
  // any CUDA use in the child before exec is undefined (PyTorch refuses it: "Cannot re-initialize
  // CUDA in forked subprocess"). The child's device state is therefore unusable: ChildAfterFork
  // says so, and every request on the device then fails with that reason.
  void PrepareFork() override;
  void ParentAfterFork() override;
  absl::Status ChildAfterFork() override;

 protected:
  // The typed status of a failed driver `call` (with its arguments) on this device.
  absl::Status Error(absl::string_view call, CUresult error) const;
  // Adds `n` to `counter` (e.g. &BackendCounters::allocs), and `bytes` to `byte_counter` when given
  // (both in one locked section, so that a reader never sees one without the other).
  void Count(std::int64_t BackendCounters::*counter, std::int64_t n = 1,
             std::int64_t BackendCounters::*byte_counter = nullptr, std::int64_t bytes = 0);

  const DriverApi& driver_;  // resolved by Driver(); lives as long as the process

 private:
  static constexpr std::size_t kMaxPooledEvents = 256;  // beyond this, events are destroyed

  // The context `stream` belongs to (the device's own for the default-stream handles, which name
  // the current context's, and this call makes the device's current).
  absl::StatusOr<CUcontext> ContextOf(Stream stream) const;
  // Keeps `event` for reuse, or destroys it when the pool is full or it is another context's.
  void ReturnToPool(CUevent event);

  const int device_;
  mutable std::mutex mu_;
  std::vector<CUevent> free_events_;             // guarded by mu_; events of this device's context
  absl::flat_hash_set<CUevent> foreign_events_;  // guarded by mu_; live events of other contexts
  BackendCounters counters_;                     // guarded by mu_
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_CUDA_BACKEND_H_
