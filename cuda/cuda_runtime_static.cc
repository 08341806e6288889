// cuda/cuda_runtime_static.cc — CudaRuntimeApi() over the statically linked cudart.
#include "cuda/cuda_runtime.h"

namespace bucketalloc::internal {

const CudaRuntime& CudaRuntimeApi() {
  static constexpr CudaRuntime kStatic = {
      &cudaMalloc,
      &cudaFree,
      &cudaMemGetInfo,
      &cudaEventCreateWithFlags,
      &cudaEventRecord,
      &cudaEventQuery,
      &cudaEventSynchronize,
      &cudaEventDestroy,
      &cudaStreamIsCapturing,
      &cudaGetDevice,
      &cudaSetDevice,
      &cudaGetDeviceCount,
      &cudaGetLastError,
      &cudaPeekAtLastError,
      &cudaDeviceSynchronize,
      &cudaStreamSynchronize,
      &cudaStreamGetDevice,
      &cudaGetErrorName,
      &cudaGetErrorString,
      &cudaGetDriverEntryPointByVersion,
  };
  return kStatic;
}

}  // namespace bucketalloc::internal
