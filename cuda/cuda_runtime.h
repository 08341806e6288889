// cuda/cuda_runtime.h — the CUDA runtime functions the cuda and vmm backends call, as a table (L1).
//
// The backends never name a runtime function directly; they call through CudaRuntimeApi(), which is
// defined once per library:
//   - cuda/cuda_runtime_static.cc: the statically linked cudart (libbucketalloc.a, libbucketalloc.so);
//   - plugins/preload/real_runtime.cc: the process's own libcudart, found with dlsym(RTLD_NEXT)
//     (libbucketalloc_preload.so, which defines cudaMalloc & co. itself and so must not call them).
// Every pointer is non-null; a function that cannot be found reports cudaErrorSharedObjectInitFailed.
// The struct's member order is the order of the initializers in both definitions.
#ifndef BUCKETALLOC_CUDA_CUDA_RUNTIME_H_
#define BUCKETALLOC_CUDA_CUDA_RUNTIME_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace bucketalloc::internal {

struct CudaRuntime {
  cudaError_t (*Malloc)(void** ptr, std::size_t bytes);
  cudaError_t (*Free)(void* ptr);
  cudaError_t (*MemGetInfo)(std::size_t* free_bytes, std::size_t* total_bytes);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t* event, unsigned int flags);
  cudaError_t (*EventRecord)(cudaEvent_t event, cudaStream_t stream);
  cudaError_t (*EventQuery)(cudaEvent_t event);
  cudaError_t (*EventSynchronize)(cudaEvent_t event);
  cudaError_t (*EventDestroy)(cudaEvent_t event);
  cudaError_t (*StreamIsCapturing)(cudaStream_t stream, cudaStreamCaptureStatus* status);
  cudaError_t (*GetDevice)(int* device);
  cudaError_t (*SetDevice)(int device);
  cudaError_t (*GetDeviceCount)(int* count);
  cudaError_t (*GetLastError)();
  cudaError_t (*PeekAtLastError)();
  cudaError_t (*DeviceSynchronize)();
  cudaError_t (*StreamSynchronize)(cudaStream_t stream);
  cudaError_t (*StreamGetDevice)(cudaStream_t stream, int* device);
  const char* (*GetErrorName)(cudaError_t error);
  const char* (*GetErrorString)(cudaError_t error);
  // The vmm backend reaches the driver API (cuMem*) only through this: libcuda is never linked.
  cudaError_t (*GetDriverEntryPointByVersion)(const char* symbol, void** function, unsigned int cuda_version,
                                              unsigned long long flags, cudaDriverEntryPointQueryResult* status);
};

// The runtime of this library (see the file comment). Thread-safe.
const CudaRuntime& CudaRuntimeApi();

// Clears the thread's last CUDA error when it is `error` (the one a call just returned), so that a
// non-sticky failure is not reported again by an unrelated later call, without swallowing an
// earlier error of the host program that it has not read yet.
inline void ClearLastErrorIf(const CudaRuntime& rt, cudaError_t error) {
  if (rt.PeekAtLastError() == error) rt.GetLastError();
}

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_CUDA_CUDA_RUNTIME_H_
