// bucketalloc_torch/csrc/torch_alloc.cc — the alloc and free functions PyTorch's
// CUDAPluggableAllocator calls, compiled against the installed torch (bucketalloc_torch/_torch_ext.py
// builds and caches it), so that an out-of-memory failure is PyTorch's own c10::OutOfMemoryError:
// Python sees torch.cuda.OutOfMemoryError, and C++ code that catches it (cuDNN's algorithm search,
// accelerate's batch-size search through Python) treats it as an OOM.
//
// It calls libbucketalloc.so through the function pointers bucketalloc_torch_init is given (the
// process's one loaded copy), so it links nothing of bucketalloc's.
#include <sys/types.h>

#include <string>

#include <c10/util/Exception.h>

namespace {

using TryMallocFn = int (*)(ssize_t, int, void*, void**);
using FreeFn = void (*)(void*, ssize_t, int, void*);
using LastErrorFn = const char* (*)();

TryMallocFn g_try_malloc = nullptr;
FreeFn g_free = nullptr;
LastErrorFn g_last_error = nullptr;

}  // namespace

extern "C" {

// Given the library's bucketalloc_try_malloc, bucketalloc_free and bucketalloc_last_error.
__attribute__((visibility("default"))) void bucketalloc_torch_init(void* try_malloc, void* free_fn, void* last_error) {
  g_try_malloc = reinterpret_cast<TryMallocFn>(try_malloc);
  g_free = reinterpret_cast<FreeFn>(free_fn);
  g_last_error = reinterpret_cast<LastErrorFn>(last_error);
}

// PyTorch's MallocFuncType: void*(size_t, int, cudaStream_t).
__attribute__((visibility("default"))) void* bucketalloc_torch_malloc(ssize_t size, int device, void* stream) {
  TORCH_CHECK(g_try_malloc != nullptr,
              "bucketalloc_torch: the alloc function was not initialized "
              "(bucketalloc_torch.enable() calls bucketalloc_torch_init first)");
  void* p = nullptr;
  const int rc = g_try_malloc(size, device, stream, &p);
  if (rc == 0) return p;
  const std::string message = g_last_error();
  if (rc == 1) throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
}

// PyTorch's FreeFuncType: void(void*, size_t, int, cudaStream_t).
__attribute__((visibility("default"))) void bucketalloc_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, size, device, stream);
}

}  // extern "C"
