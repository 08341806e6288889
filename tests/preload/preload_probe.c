/* tests/preload/preload_probe.c — a CUDA program linked dynamically against libcudart.so that calls
 * the five functions libbucketalloc_preload.so interposes, plus their documented bad inputs. Run by
 * check_preload.sh with and without LD_PRELOAD.
 *
 * Prints one line per call ("<call>: <error name> (<code>)") and exits:
 *   0  every call behaved as expected with a working allocator (bucketalloc under LD_PRELOAD on the
 *      simulated device, or a real GPU);
 *   3  the first cudaMalloc failed (e.g. cudaErrorInsufficientDriver (35) without a driver);
 *   1  a later call did not behave as expected.
 * With --threads, 8 threads instead start at once (the first calls race the lazy initialization)
 * and each makes 1000 cudaMalloc/cudaFree pairs of varying sizes; exit 0 when all succeed. */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

static cudaError_t report(const char* call, cudaError_t got, cudaError_t want) {
  printf("%s: %s (%d)\n", call, cudaGetErrorName(got), (int)got);
  if (got != want) {
    printf("  expected %s (%d)\n", cudaGetErrorName(want), (int)want);
    ++failures;
  }
  return got;
}

enum { kThreads = 8, kPairs = 1000 };

static void* worker(void* arg) {
  long failed = 0;
  for (int i = 0; i < kPairs; ++i) {
    void* p = NULL;
    size_t size = (size_t)((i * 7919 + (long)arg * 104729) % 4096 + 1) << ((i % 3) * 8);
    if (cudaMalloc(&p, size) != cudaSuccess || p == NULL) ++failed;
    if (cudaFree(p) != cudaSuccess) ++failed;
  }
  return (void*)failed;
}

static int threads(void) {
  pthread_t t[kThreads];
  for (long i = 0; i < kThreads; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  long failed = 0;
  for (int i = 0; i < kThreads; ++i) {
    void* r = NULL;
    pthread_join(t[i], &r);
    failed += (long)r;
  }
  printf("preload_probe --threads: %d threads x %d pairs, %ld failed calls\n", kThreads, kPairs, failed);
  return failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--threads") == 0) return threads();
  void* p = NULL;
  cudaError_t first = cudaMalloc(&p, 1 << 20);
  printf("cudaMalloc(1 MiB): %s (%d)\n", cudaGetErrorName(first), (int)first);
  if (first != cudaSuccess) return 3;

  size_t free_bytes = 0, total_bytes = 0;
  report("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  printf("  free %zu of %zu bytes\n", free_bytes, total_bytes);
  if (free_bytes == 0 || free_bytes > total_bytes) {
    printf("  expected 0 < free <= total\n");
    ++failures;
  }

  void* q = NULL;
  report("cudaMallocAsync(3 MiB, stream 0)", cudaMallocAsync(&q, 3 << 20, 0), cudaSuccess);
  void* r = NULL;
  report("cudaMallocAsync(300 KiB, per-thread stream)", cudaMallocAsync(&r, 300 << 10, cudaStreamPerThread),
         cudaSuccess);
  report("cudaFreeAsync(3 MiB, stream 0)", cudaFreeAsync(q, 0), cudaSuccess);
  report("cudaFreeAsync(300 KiB, on stream 0: another stream)", cudaFreeAsync(r, 0), cudaSuccess);
  report("cudaFree(1 MiB)", cudaFree(p), cudaSuccess);

  void* several[8];
  for (int i = 0; i < 8; ++i)
    report("cudaMalloc(i x 5 MiB + 1)", cudaMalloc(&several[i], (size_t)i * (5 << 20) + 1), cudaSuccess);
  for (int i = 0; i < 8; ++i) report("cudaFree", cudaFree(several[i]), cudaSuccess);

  /* Bad input, as the runtime documents it. */
  void* twice = NULL;
  report("cudaMalloc(64 KiB)", cudaMalloc(&twice, 64 << 10), cudaSuccess);
  report("cudaFree(an interior pointer)", cudaFree((char*)twice + 512), cudaErrorInvalidValue);
  report("cudaFree", cudaFree(twice), cudaSuccess);
  report("cudaFree(the same pointer again)", cudaFree(twice), cudaErrorInvalidValue);
  void* empty = NULL;
  report("cudaMalloc(0 bytes)", cudaMalloc(&empty, 0), cudaSuccess);
  report("cudaMalloc(NULL output)", cudaMalloc(NULL, 16), cudaErrorInvalidValue);
  void* huge = NULL;
  report("cudaMalloc(1 TiB)", cudaMalloc(&huge, (size_t)1 << 40), cudaErrorMemoryAllocation);
  report("cudaMalloc(1 EiB)", cudaMalloc(&huge, (size_t)1 << 60), cudaErrorMemoryAllocation);
  report("cudaMemGetInfo(NULL outputs)", cudaMemGetInfo(NULL, NULL), cudaErrorInvalidValue);
  report("cudaFree(NULL)", cudaFree(NULL), cudaSuccess);

  printf("preload_probe: %d unexpected result(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
