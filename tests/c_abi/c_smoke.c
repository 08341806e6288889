/* The C ABI from a C program linked against libbucketalloc.so: the header compiles as C and the
 * library links and runs with no C++ in the caller. Exits non-zero with a message on failure. */
#include "bucketalloc/bucketalloc.h"

#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "c_smoke: %s failed (last error: %s)\n", #cond, bucketalloc_last_error()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

int main(void) {
  CHECK(bucketalloc_configure("backend:sim,capacity:1GiB") == 0);
  void* p = bucketalloc_malloc(5 << 20, 0, NULL);
  CHECK(p != NULL);
  memset(p, 0xab, 5 << 20); /* the simulated device is backed by host memory */
  char buf[1 << 16];
  ssize_t n = bucketalloc_stats_json(0, buf, sizeof buf);
  CHECK(n > 0 && n < (ssize_t)sizeof buf);
  CHECK(strstr(buf, "\"allocation.all.current\":1") != NULL);
  bucketalloc_free(p, 5 << 20, 0, NULL);
  bucketalloc_empty_cache();
  n = bucketalloc_stats_json(0, buf, sizeof buf);
  CHECK(strstr(buf, "\"reserved_bytes.all.current\":0") != NULL);
  CHECK(strcmp(bucketalloc_version(), "") != 0);
  printf("c_smoke: ok (libbucketalloc %s)\n", bucketalloc_version());
  return 0;
}
