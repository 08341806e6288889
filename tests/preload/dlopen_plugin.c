/* tests/preload/dlopen_plugin.c — a plugin library linked against libcudart.so, loaded by
 * dlopen_host.c with RTLD_LOCAL (as Python extensions and plugins are): libcudart is then outside
 * the global scope, where dlsym(RTLD_NEXT) cannot find it. */
#include <cuda_runtime_api.h>

int plugin_malloc_free(void) {
  void* p = NULL;
  cudaError_t e = cudaMalloc(&p, 1 << 20);
  if (e != cudaSuccess) return (int)e;
  return (int)cudaFree(p);
}
