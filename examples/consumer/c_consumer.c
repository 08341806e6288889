/* A C program against the installed C ABI (bucketalloc::c_abi: libbucketalloc.so), on the
 * simulated device: allocate, print the stats' allocated bytes, free, release. */
#include <bucketalloc/bucketalloc.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  if (bucketalloc_configure("backend:sim,capacity:1GiB") != 0) {
    fprintf(stderr, "%s\n", bucketalloc_last_error());
    return 1;
  }
  void* p = bucketalloc_malloc(10 << 20, 0, NULL);
  if (p == NULL) {
    fprintf(stderr, "%s\n", bucketalloc_last_error());
    return 1;
  }
  char stats[1 << 16];
  if (bucketalloc_stats_json(0, stats, sizeof stats) < 0) return 1;
  const char* key = strstr(stats, "\"allocated_bytes.all.current\"");
  printf("c consumer: libbucketalloc %s, %.60s\n", bucketalloc_version(), key ? key : "(no key)");
  bucketalloc_free(p, 10 << 20, 0, NULL);
  bucketalloc_empty_cache();
  return key != NULL ? 0 : 1;
}
