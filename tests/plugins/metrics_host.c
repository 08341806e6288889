/* tests/plugins/metrics_host.c — a C host of libbucketalloc.so for the metrics test
 * (check_prometheus.sh): on the simulated device it allocates a known set of blocks, frees some,
 * asks once for more than the cap (one capacity OOM), prints the figures the metrics must show as
 * "key value" lines and "ready", and then waits until its standard input closes, so that a
 * Prometheus can scrape BUCKETALLOC_METRICS_ADDR meanwhile. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucketalloc/bucketalloc.h"

int main(void) {
  if (bucketalloc_configure("backend:sim,capacity:256MiB,sim_total_memory:512MiB") != 0) {
    fprintf(stderr, "configure: %s\n", bucketalloc_last_error());
    return 1;
  }
  void* blocks[8];
  size_t allocated = 0;
  for (int i = 0; i < 8; ++i) {
    const size_t size = (size_t)(i + 1) << 21; /* 2, 4, ..., 16 MiB */
    blocks[i] = bucketalloc_malloc((ssize_t)size, 0, NULL);
    if (blocks[i] == NULL) {
      fprintf(stderr, "malloc: %s\n", bucketalloc_last_error());
      return 1;
    }
    if (i % 2 == 1) {
      bucketalloc_free(blocks[i], (ssize_t)size, 0, NULL);
    } else {
      allocated += size;
    }
  }
  if (bucketalloc_malloc((ssize_t)1 << 30, 0, NULL) != NULL) { /* more than the cap: a capacity OOM */
    fprintf(stderr, "a 1 GiB request under a 256 MiB cap was served\n");
    return 1;
  }
  /* The cached bytes, from the stats JSON: all of them are free blocks (nothing awaits events). */
  char json[16384];
  const ssize_t n = bucketalloc_stats_json(0, json, sizeof json);
  const char* key = strstr(json, "\"cached_bytes.all.current\":");
  if (n < 0 || (size_t)n >= sizeof json || key == NULL) {
    fprintf(stderr, "stats_json: %s\n", n < 0 ? bucketalloc_last_error() : "no cached_bytes.all.current");
    return 1;
  }
  const long long cached = strtoll(key + strlen("\"cached_bytes.all.current\":"), NULL, 10);
  printf("allocated_bytes %zu\ncached_bytes %lld\nallocations 8\nfrees 4\nooms_capacity 1\nready\n", allocated, cached);
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin) != NULL) {
  }
  return 0;
}
