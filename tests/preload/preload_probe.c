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
 * and each makes 1000 cudaMalloc/cudaFree pairs of varying sizes; exit 0 when all succeed.
 * With --fork, 4 threads make such pairs while the main thread forks 10 children, each of which
 * makes 1000 pairs and exits; exit 0 when every child exited 0 (one that hangs on a lock a parent
 * thread held at the fork is killed by alarm(2) and counts as failed). */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* The i-th cudaMalloc/cudaFree pair of thread `salt`, of varying sizes: its failed calls (0 to 2). */
static long pair(long i, long salt) {
  long failed = 0;
  void* p = NULL;
  size_t size = (size_t)((i * 7919 + salt * 104729) % 4096 + 1) << ((i % 3) * 8);
  if (cudaMalloc(&p, size) != cudaSuccess || p == NULL) ++failed;
  if (cudaFree(p) != cudaSuccess) ++failed;
  return failed;
}

static void* worker(void* arg) {
  long failed = 0;
  for (int i = 0; i < kPairs; ++i) failed += pair(i, (long)arg);
  return (void*)failed;
}

/* Joins `n` threads that return their failed calls; the sum. */
static long join_all(pthread_t* t, int n) {
  long failed = 0;
  for (int i = 0; i < n; ++i) {
    void* r = NULL;
    pthread_join(t[i], &r);
    failed += (long)r;
  }
  return failed;
}

static int threads(void) {
  pthread_t t[kThreads];
  for (long i = 0; i < kThreads; ++i) pthread_create(&t[i], NULL, worker, (void*)i);
  const long failed = join_all(t, kThreads);
  printf("preload_probe --threads: %d threads x %d pairs, %ld failed calls\n", kThreads, kPairs, failed);
  return failed == 0 ? 0 : 1;
}

static volatile int stop_forking_threads = 0;

static void* busy(void* arg) {
  long failed = 0;
  for (long i = 0; !stop_forking_threads; ++i) failed += pair(i, (long)arg);
  return (void*)failed;
}

static int forks(void) {
  enum { kBusy = 4, kChildren = 10 };
  pthread_t t[kBusy];
  for (long i = 0; i < kBusy; ++i) pthread_create(&t[i], NULL, busy, (void*)i);
  int good = 0;
  for (int c = 0; c < kChildren; ++c) {
    usleep(3000);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(30);
      _exit(worker((void*)(long)c) == NULL ? 0 : 1); /* 1000 pairs in the child */
    }
    int status = 0;
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++good;
    } else {
      printf("child %d: wait status %d (signal 14 is SIGALRM: it hung)\n", c, status);
    }
  }
  stop_forking_threads = 1;
  const long failed = join_all(t, kBusy);
  printf("preload_probe --fork: %d of %d children finished, %ld failed calls in the parent\n", good, kChildren, failed);
  return good == kChildren && failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--threads") == 0) return threads();
  if (argc > 1 && strcmp(argv[1], "--fork") == 0) return forks();
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
