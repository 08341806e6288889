// plugins/preload/real_runtime.h — the CUDA runtime functions the LD_PRELOAD shim calls on the
// process's own libcudart, as a table (layer L5).
//
// The shim defines cudaMalloc & co. itself, so it must never call them by name: it calls the
// runtime's definitions through CudaRuntimeApi() (plugins/preload/real_runtime.cc: dlsym(RTLD_NEXT),
// or a libcudart loaded outside the global scope). The allocator's own backends do not use the
// runtime at all (they load the driver: cuda/driver_api.h).
// Every pointer is non-null; a function that cannot be found reports cudaErrorSharedObjectInitFailed.
// The struct's member order is the order of the initializers in real_runtime.cc.
#ifndef BUCKETALLOC_PLUGINS_PRELOAD_REAL_RUNTIME_H_
#define BUCKETALLOC_PLUGINS_PRELOAD_REAL_RUNTIME_H_

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

#endif  // BUCKETALLOC_PLUGINS_PRELOAD_REAL_RUNTIME_H_
