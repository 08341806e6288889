/* tests/preload/dlopen_host.c PLUGIN — loads PLUGIN (dlopen_plugin.c) with RTLD_LOCAL and prints the
 * CUDA error code of its cudaMalloc + cudaFree. The host itself does not link libcudart. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) {
    fprintf(stderr, "dlopen_host: %s\n", dlerror());
    return 2;
  }
  int (*f)(void) = (int (*)(void))dlsym(plugin, "plugin_malloc_free");
  if (f == NULL) return 2;
  printf("dlopen_host: cudaMalloc+cudaFree in an RTLD_LOCAL plugin: %d\n", f());
  return 0;
}
