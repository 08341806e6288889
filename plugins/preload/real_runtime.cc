// plugins/preload/real_runtime.cc — CudaRuntimeApi() for libbucketalloc_preload.so: the process's
// own CUDA runtime (libcudart.so). The preload library defines cudaMalloc and friends itself, so its
// backend must reach the runtime's definitions, never its own:
//   1. dlsym(RTLD_NEXT): the next definition in the global scope (a program linked against
//      libcudart.so);
//   2. else the libcudart.so.* already loaded in the process but outside the global scope (dlopen'd
//      with RTLD_LOCAL by a plugin or a Python extension), found with dl_iterate_phdr and opened
//      with RTLD_NOLOAD.
// A resolution that finds no runtime is not kept: the next call tries again (a program may load
// libcudart later). Until then every function reports cudaErrorSharedObjectInitFailed.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "plugins/preload/real_runtime.h"

namespace bucketalloc::internal {
namespace {

template <typename... Args>
cudaError_t Missing(Args...) {
  return cudaErrorSharedObjectInitFailed;
}
const char* ErrorNameFallback(cudaError_t error) {
  return error == cudaErrorSharedObjectInitFailed ? "cudaErrorSharedObjectInitFailed" : "cudaError (no libcudart)";
}
const char* ErrorStringFallback(cudaError_t error) {
  return error == cudaErrorSharedObjectInitFailed ? "the CUDA runtime (libcudart.so) is not loaded in this process"
                                                  : "unknown error (libcudart.so is not loaded)";
}

constexpr CudaRuntime kMissing = {
    &Missing<void**, std::size_t>,
    &Missing<void*>,
    &Missing<std::size_t*, std::size_t*>,
    &Missing<cudaEvent_t*, unsigned int>,
    &Missing<cudaEvent_t, cudaStream_t>,
    &Missing<cudaEvent_t>,
    &Missing<cudaEvent_t>,
    &Missing<cudaEvent_t>,
    &Missing<cudaStream_t, cudaStreamCaptureStatus*>,
    &Missing<int*>,
    &Missing<int>,
    &Missing<int*>,
    &Missing<>,
    &Missing<>,
    &Missing<>,
    &Missing<cudaStream_t>,
    &Missing<cudaStream_t, int*>,
    &ErrorNameFallback,
    &ErrorStringFallback,
};

// The path of a loaded libcudart.so.*, or "" (dl_iterate_phdr visits every loaded object).
std::string LoadedCudart() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) -> int {
        const char* name = info->dlpi_name;
        const char* base = name != nullptr ? std::strrchr(name, '/') : nullptr;
        base = base != nullptr ? base + 1 : name;
        if (base == nullptr || std::strncmp(base, "libcudart.so", 12) != 0) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &found);
  return found;
}

// Fills `rt` from `handle` (RTLD_NEXT or an opened libcudart); false when cudaMalloc is missing.
bool Fill(void* handle, CudaRuntime* rt) {
  auto get = [&](const char* name, auto fallback) {
    void* f = dlsym(handle, name);
    return f != nullptr ? reinterpret_cast<decltype(fallback)>(f) : fallback;
  };
  if (dlsym(handle, "cudaMalloc") == nullptr) return false;
  *rt = kMissing;
  rt->Malloc = get("cudaMalloc", rt->Malloc);
  rt->Free = get("cudaFree", rt->Free);
  rt->MemGetInfo = get("cudaMemGetInfo", rt->MemGetInfo);
  rt->EventCreateWithFlags = get("cudaEventCreateWithFlags", rt->EventCreateWithFlags);
  rt->EventRecord = get("cudaEventRecord", rt->EventRecord);
  rt->EventQuery = get("cudaEventQuery", rt->EventQuery);
  rt->EventSynchronize = get("cudaEventSynchronize", rt->EventSynchronize);
  rt->EventDestroy = get("cudaEventDestroy", rt->EventDestroy);
  rt->StreamIsCapturing = get("cudaStreamIsCapturing", rt->StreamIsCapturing);
  rt->GetDevice = get("cudaGetDevice", rt->GetDevice);
  rt->SetDevice = get("cudaSetDevice", rt->SetDevice);
  rt->GetDeviceCount = get("cudaGetDeviceCount", rt->GetDeviceCount);
  rt->GetLastError = get("cudaGetLastError", rt->GetLastError);
  rt->PeekAtLastError = get("cudaPeekAtLastError", rt->PeekAtLastError);
  rt->DeviceSynchronize = get("cudaDeviceSynchronize", rt->DeviceSynchronize);
  rt->StreamSynchronize = get("cudaStreamSynchronize", rt->StreamSynchronize);
  rt->StreamGetDevice = get("cudaStreamGetDevice", rt->StreamGetDevice);
  rt->GetErrorName = get("cudaGetErrorName", rt->GetErrorName);
  rt->GetErrorString = get("cudaGetErrorString", rt->GetErrorString);
  return true;
}

std::mutex g_mu;
void* g_handle = RTLD_NEXT;  // where the runtime was found (guarded like g_runtime)
CudaRuntime g_runtime;       // guarded by g_mu until g_resolved is set, then read-only
std::atomic<bool> g_resolved{false};

}  // namespace

const CudaRuntime& CudaRuntimeApi() {
  if (g_resolved.load(std::memory_order_acquire)) [[likely]]
    return g_runtime;
  // A fork child has no copy of a parent thread that held g_mu at the fork: its g_mu is made free
  // again (the child then resolves the runtime itself).
  static const int fork_safe = pthread_atfork(nullptr, nullptr, [] { ::new (&g_mu) std::mutex(); });
  (void)fork_safe;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_resolved.load(std::memory_order_relaxed)) return g_runtime;
  bool found = Fill(RTLD_NEXT, &g_runtime);
  if (!found) {
    const std::string path = LoadedCudart();
    if (void* handle = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      found = Fill(handle, &g_runtime);  // the handle stays open: the table points into it
      if (found) g_handle = handle;
    }
  }
  if (!found) return kMissing;  // not kept: try again on the next call
  g_resolved.store(true, std::memory_order_release);
  return g_runtime;
}

bool CudaRuntimeLoaded() { return &CudaRuntimeApi() != &kMissing; }

void* RealCudartSymbol(const char* name) {
  if (!CudaRuntimeLoaded()) return nullptr;
  return dlsym(g_handle, name);  // g_handle is fixed once the runtime is resolved
}

}  // namespace bucketalloc::internal
