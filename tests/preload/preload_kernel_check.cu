// tests/preload/preload_kernel_check.cu — a CUDA program (shared libcudart) whose kernels write and
// check every buffer it gets from cudaMalloc / cudaMallocAsync, freed with cudaFree / cudaFreeAsync on
// the same or another stream. scripts/gpu_check.sh runs it under libbucketalloc_preload.so on a real
// GPU: reused blocks must never be handed out while a kernel still uses them. Exits 0 when every
// buffer held exactly what its kernel wrote.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdint>
#include <vector>

namespace {

__global__ void Fill(std::uint32_t* data, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    data[i] = seed ^ static_cast<std::uint32_t>(i * 2654435761u);
  }
}

// Counts the words that differ from what Fill(seed) wrote.
__global__ void Check(const std::uint32_t* data, std::size_t n, std::uint32_t seed, unsigned long long* bad) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    if (data[i] != (seed ^ static_cast<std::uint32_t>(i * 2654435761u))) atomicAdd(bad, 1ull);
  }
}

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "preload_kernel_check: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  cudaStream_t s1, s2;
  if (!Ok(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "stream") ||
      !Ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "stream")) {
    return 2;
  }
  unsigned long long* bad = nullptr;
  if (!Ok(cudaMallocManaged(&bad, sizeof(*bad)), "cudaMallocManaged")) return 2;
  *bad = 0;
  std::size_t buffers = 0, bytes = 0;
  std::uint32_t seed = 12345;
  for (int round = 0; round < 200; ++round) {
    // Variable sizes: 4 KiB to ~96 MiB.
    const std::size_t n = (std::size_t{1} << (10 + round % 15)) + static_cast<std::size_t>(round) * 977;
    std::uint32_t* a = nullptr;
    std::uint32_t* b = nullptr;
    if (!Ok(cudaMalloc(&a, n * 4), "cudaMalloc") || !Ok(cudaMallocAsync(&b, n * 4, s1), "cudaMallocAsync")) return 1;
    Fill<<<256, 256, 0, s1>>>(a, n, seed);
    Fill<<<256, 256, 0, s1>>>(b, n, seed + 1);
    Check<<<256, 256, 0, s1>>>(a, n, seed, bad);
    Check<<<256, 256, 0, s1>>>(b, n, seed + 1, bad);
    // b is also read on s2, then freed there: its reuse must wait for s2.
    cudaEvent_t ready;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventRecord(ready, s1);
    cudaStreamWaitEvent(s2, ready, 0);
    Check<<<256, 256, 0, s2>>>(b, n, seed + 1, bad);
    if (!Ok(cudaFreeAsync(b, s2), "cudaFreeAsync") || !Ok(cudaFree(a), "cudaFree")) return 1;
    cudaEventDestroy(ready);
    buffers += 2;
    bytes += 2 * n * 4;
    seed += 2;
  }
  if (!Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (!Ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo")) return 1;
  std::printf("preload_kernel_check: %zu buffers (%zu MiB written and checked), %llu bad words; "
              "cudaMemGetInfo free %zu MiB of %zu MiB\n",
              buffers, bytes >> 20, *bad, free_bytes >> 20, total_bytes >> 20);
  const bool good = *bad == 0;
  cudaFree(bad);
  return good ? 0 : 1;
}
