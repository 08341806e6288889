// plugins/preload/real_runtime.cc — CudaRuntimeApi() for libbucketalloc_preload.so: the process's
// own CUDA runtime (libcudart.so), found with dlsym(RTLD_NEXT). The preload library defines cudaMalloc
// and friends itself, so its backend must reach the next definition, never its own. A function the
// process does not have (no libcudart.so loaded) reports cudaErrorSharedObjectInitFailed.
#include <dlfcn.h>

#include "cuda/cuda_runtime.h"

namespace bucketalloc::internal {
namespace {

cudaError_t Missing() { return cudaErrorSharedObjectInitFailed; }

const char* ErrorNameFallback(cudaError_t error) {
  return error == cudaErrorSharedObjectInitFailed ? "cudaErrorSharedObjectInitFailed" : "cudaError (unknown: no libcudart)";
}
const char* ErrorStringFallback(cudaError_t error) {
  return error == cudaErrorSharedObjectInitFailed
             ? "the CUDA runtime (libcudart.so) is not loaded in this process: the program does not link it dynamically"
             : "unknown error (libcudart.so is not loaded)";
}

// The next definition of `name` after this library, or `fallback` when there is none.
template <typename F>
F Next(const char* name, F fallback) {
  void* f = dlsym(RTLD_NEXT, name);
  return f != nullptr ? reinterpret_cast<F>(f) : fallback;
}

template <typename... Args>
cudaError_t MissingWith(Args...) {
  return Missing();
}

CudaRuntime Resolve() {
  CudaRuntime rt;
  rt.Malloc = Next("cudaMalloc", &MissingWith<void**, std::size_t>);
  rt.Free = Next("cudaFree", &MissingWith<void*>);
  rt.MemGetInfo = Next("cudaMemGetInfo", &MissingWith<std::size_t*, std::size_t*>);
  rt.EventCreateWithFlags = Next("cudaEventCreateWithFlags", &MissingWith<cudaEvent_t*, unsigned int>);
  rt.EventRecord = Next("cudaEventRecord", &MissingWith<cudaEvent_t, cudaStream_t>);
  rt.EventQuery = Next("cudaEventQuery", &MissingWith<cudaEvent_t>);
  rt.EventSynchronize = Next("cudaEventSynchronize", &MissingWith<cudaEvent_t>);
  rt.EventDestroy = Next("cudaEventDestroy", &MissingWith<cudaEvent_t>);
  rt.StreamIsCapturing = Next("cudaStreamIsCapturing", &MissingWith<cudaStream_t, cudaStreamCaptureStatus*>);
  rt.GetDevice = Next("cudaGetDevice", &MissingWith<int*>);
  rt.SetDevice = Next("cudaSetDevice", &MissingWith<int>);
  rt.GetDeviceCount = Next("cudaGetDeviceCount", &MissingWith<int*>);
  rt.GetLastError = Next("cudaGetLastError", &MissingWith<>);
  rt.DeviceSynchronize = Next("cudaDeviceSynchronize", &MissingWith<>);
  rt.GetErrorName = Next("cudaGetErrorName", &ErrorNameFallback);
  rt.GetErrorString = Next("cudaGetErrorString", &ErrorStringFallback);
  return rt;
}

}  // namespace

const CudaRuntime& CudaRuntimeApi() {
  static const CudaRuntime rt = Resolve();  // thread-safe (a magic static); dlsym never calls back
  return rt;
}

}  // namespace bucketalloc::internal
