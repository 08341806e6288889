// tests/preload/preload_kernel_check.cu [--negative-control] — a CUDA program (shared libcudart) for
// scripts/gpu_check.sh, run under libbucketalloc_preload.so on a real GPU.
//
// Each round: cudaMallocAsync a buffer on stream s1 and fill it there; a slow kernel on s2 (it sleeps
// first, then checks every word) reads it; cudaFreeAsync it on s2; then at once cudaMallocAsync the
// same size on s1 and fill that with other values. A correct allocator never hands the first buffer
// out again before s2's check has run, so the check sees no bad word. Rounds of cudaMalloc/cudaFree
// (variable sizes, 4 KiB to ~96 MiB) follow, each buffer written and checked.
// --negative-control frees the first buffer on s1 instead: a program bug that lets s1 reuse the
// block while s2 still reads it; the check must then see bad words, which shows it can detect reuse.
// Exits 0 when the result is the expected one (no bad word; bad words under the control).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

__device__ std::uint32_t Pattern(std::size_t i, std::uint32_t seed) {
  return seed ^ static_cast<std::uint32_t>(i * 2654435761u);
}

__global__ void Fill(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    data[i] = Pattern(i, seed);
  }
}

// Sleeps about `delay_ns`, then counts the words that differ from Fill(seed).
__global__ void SlowCheck(const std::uint32_t* data, std::size_t n, std::uint32_t seed, unsigned delay_ns,
                          unsigned long long* bad) {
  for (unsigned slept = 0; slept < delay_ns; slept += 1000) __nanosleep(1000);
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    if (data[i] != Pattern(i, seed)) atomicAdd(bad, 1ull);
  }
}

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "preload_kernel_check: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const bool control = argc > 1 && std::strcmp(argv[1], "--negative-control") == 0;
  cudaStream_t s1, s2;
  if (!Ok(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "stream") ||
      !Ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "stream")) {
    return 2;
  }
  unsigned long long* bad = nullptr;
  if (!Ok(cudaMallocManaged(&bad, sizeof(*bad)), "cudaMallocManaged")) return 2;
  *bad = 0;
  cudaEvent_t filled;
  cudaEventCreateWithFlags(&filled, cudaEventDisableTiming);
  std::size_t reused_early = 0, bytes = 0;
  std::uint32_t seed = 12345;
  // Phase 1: stream-ordered frees on another stream.
  for (int round = 0; round < 50; ++round) {
    const std::size_t n = (std::size_t{1} << (12 + round % 10)) + static_cast<std::size_t>(round) * 977;
    std::uint32_t* a = nullptr;
    std::uint32_t* b = nullptr;
    if (!Ok(cudaMallocAsync(&a, n * 4, s1), "cudaMallocAsync")) return 1;
    Fill<<<128, 256, 0, s1>>>(a, n, seed);
    cudaEventRecord(filled, s1);
    cudaStreamWaitEvent(s2, filled, 0);
    SlowCheck<<<128, 256, 0, s2>>>(a, n, seed, 2'000'000, bad);  // ~2 ms before it reads
    if (!Ok(cudaFreeAsync(a, control ? s1 : s2), "cudaFreeAsync")) return 1;
    if (!Ok(cudaMallocAsync(&b, n * 4, s1), "cudaMallocAsync")) return 1;
    reused_early += b == a;
    Fill<<<128, 256, 0, s1>>>(b, n, ~seed);  // overwrites a if the block was handed out too early
    if (!Ok(cudaFreeAsync(b, s1), "cudaFreeAsync")) return 1;
    bytes += 2 * n * 4;
    ++seed;
  }
  if (!Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  const unsigned long long bad_async = *bad;
  // Phase 2: cudaMalloc / cudaFree (which waits for the device), variable sizes.
  for (int round = 0; round < 100 && !control; ++round) {
    const std::size_t n = (std::size_t{1} << (10 + round % 15)) + static_cast<std::size_t>(round) * 977;
    std::uint32_t* a = nullptr;
    if (!Ok(cudaMalloc(&a, n * 4), "cudaMalloc")) return 1;
    Fill<<<256, 256, 0, s1>>>(a, n, seed);
    SlowCheck<<<256, 256, 0, s1>>>(a, n, seed, 0, bad);
    if (!Ok(cudaFree(a), "cudaFree")) return 1;
    bytes += n * 4;
    ++seed;
  }
  if (!Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (!Ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo")) return 1;
  const unsigned long long bad_total = *bad;
  std::printf(
      "preload_kernel_check%s: %zu MiB written and checked; bad words: %llu after cross-stream frees "
      "(block handed out again at once %zu of 50 times), %llu in total; cudaMemGetInfo free %zu of %zu "
      "MiB\n",
      control ? " --negative-control" : "", bytes >> 20, bad_async, reused_early, bad_total, free_bytes >> 20,
      total_bytes >> 20);
  cudaFree(bad);
  if (control) {
    if (bad_async == 0)
      std::printf("preload_kernel_check: the control saw no bad word: the check cannot detect reuse\n");
    return bad_async > 0 ? 0 : 1;
  }
  return bad_total == 0 ? 0 : 1;
}
