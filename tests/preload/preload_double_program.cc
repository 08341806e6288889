// tests/preload/preload_double_program.cc — a CUDA program (linked against the shared libcudart)
// that tests/preload/check_preload_double.sh runs on the CUDA double (tests/cuda_double), with and
// without the LD_PRELOAD shim. The double is the process's libcudart; its controls are found with
// dlsym. Each scenario exits 0 only when every CUDA call succeeded as the runtime documents, no
// CUDA rule was broken and no kernel found another stream's data.
//
//   exhaust    allocate until the device is full (cudaMalloc and cudaMallocAsync), free it all, then
//              a 3 GiB cudaMalloc must succeed (the shim gives its cache back on the way)
//   device1    only device 1 is used, and a side thread that never chose a device frees: no context
//              may appear on device 0
//   capture    one thread captures in global mode while another allocates (cache misses included)
//              and a block is freed on the capturing stream: the capture stays valid
//   destroy    a stream is destroyed with work queued on memory it freed; a new stream gets the
//              same handle and allocates: it must not see that memory before the work ran
//   perthread  two threads allocate on cudaStreamPerThread: distinct streams, distinct blocks
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {

int failures = 0;

#define CHECK(expr)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (expr);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(e_)); \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

template <typename F>
F Control(const char* name) {
  void* f = dlsym(RTLD_DEFAULT, name);
  if (f == nullptr) {
    std::printf("FAIL: %s not found: the CUDA double is not this process's libcudart\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(f);
}

int (*Fill)(void*, void*, size_t, uint8_t);
int (*Expect)(void*, const void*, size_t, uint8_t);

constexpr size_t kMiB = size_t{1} << 20;

void Exhaust() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::pair<void*, bool>> blocks;  // (ptr, async)
  for (int i = 0;; ++i) {
    void* p = nullptr;
    const bool async = i % 2 == 1;
    const cudaError_t e = async ? cudaMallocAsync(&p, 64 * kMiB, s) : cudaMalloc(&p, 64 * kMiB);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      break;
    }
    CHECK(e);
    if (e != cudaSuccess) return;
    blocks.emplace_back(p, async);
  }
  std::printf("exhaust: %zu blocks of 64 MiB before the device was full\n", blocks.size());
  for (auto& [p, async] : blocks) CHECK(async ? cudaFreeAsync(p, s) : cudaFree(p));
  CHECK(cudaStreamSynchronize(s));
  void* big = nullptr;
  CHECK(cudaMalloc(&big, 3 * 1024 * kMiB));
  CHECK(cudaFree(big));
  CHECK(cudaStreamDestroy(s));
}

void Device1() {
  void* p = nullptr;
  cudaStream_t s = nullptr;
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&p, 8 * kMiB));
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, 8 * kMiB, s));
  std::thread([&] {  // never chooses a device
    CHECK(cudaFree(p));
    CHECK(cudaFreeAsync(q, s));
  }).join();
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  const int created = Control<int (*)(int)>("cudadouble_contexts_created")(0);
  if (created != 0) {
    std::printf("FAIL: %d context(s) created on device 0, which the program never used\n", created);
    ++failures;
  }
}

void Capture() {
  CHECK(cudaSetDevice(0));
  cudaStream_t capture = nullptr, other = nullptr;
  CHECK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* before = nullptr;  // bucketalloc's, made on another stream before the capture
  CHECK(cudaMallocAsync(&before, 4 * kMiB, other));
  CHECK(cudaStreamSynchronize(other));
  CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  std::thread([&] {
    CHECK(cudaSetDevice(0));
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, 256 * kMiB, other));  // a cache miss: device memory while another thread captures
    CHECK(cudaFreeAsync(p, other));
  }).join();
  void* in_graph = nullptr;
  CHECK(cudaMallocAsync(&in_graph, 2 * kMiB, capture));  // captured: the runtime's graph allocation
  CHECK(cudaFreeAsync(in_graph, capture));
  CHECK(cudaFreeAsync(before, capture));  // freed inside the capture, on the capturing stream
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(capture, &graph));
  if (graph != nullptr) CHECK(cudaGraphDestroy(graph));
  CHECK(cudaGetLastError());
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kMiB));
  CHECK(cudaFree(p));  // a device synchronization: the block freed in the capture is released
  CHECK(cudaStreamDestroy(capture));
  CHECK(cudaStreamDestroy(other));
}

void Destroy() {
  CHECK(cudaSetDevice(0));
  cudaStream_t s1 = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, 8 * kMiB, s1));
  Fill(s1, p, 8 * kMiB, 0x31);
  CHECK(cudaStreamSynchronize(s1));
  Expect(s1, p, 8 * kMiB, 0x31);  // still queued when the stream is destroyed
  CHECK(cudaFreeAsync(p, s1));
  CHECK(cudaStreamDestroy(s1));
  cudaStream_t s2 = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  std::printf("destroy: the new stream's handle is %s the old one's\n", s2 == s1 ? "the same as" : "not");
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, 8 * kMiB, s2));
  Fill(s2, q, 8 * kMiB, 0x32);
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaFreeAsync(q, s2));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaDeviceSynchronize());
}

void PerThread() {
  void* first = nullptr;
  std::thread([&] {
    CHECK(cudaSetDevice(0));
    CHECK(cudaMallocAsync(&first, 6 * kMiB, cudaStreamPerThread));
    Fill(cudaStreamPerThread, first, 6 * kMiB, 0x41);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    Expect(cudaStreamPerThread, first, 6 * kMiB, 0x41);  // queued on this thread's stream
    CHECK(cudaFreeAsync(first, cudaStreamPerThread));
  }).join();
  std::thread([&] {
    CHECK(cudaSetDevice(0));
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, 6 * kMiB, cudaStreamPerThread));
    Fill(cudaStreamPerThread, p, 6 * kMiB, 0x42);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(cudaFreeAsync(p, cudaStreamPerThread));
  }).join();
  CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: %s exhaust|device1|capture|destroy|perthread\n", argv[0]);
    return 2;
  }
  Fill = Control<int (*)(void*, void*, size_t, uint8_t)>("cudadouble_fill");
  Expect = Control<int (*)(void*, const void*, size_t, uint8_t)>("cudadouble_expect");
  const std::string_view what = argv[1];
  if (what == "exhaust") {
    Exhaust();
  } else if (what == "device1") {
    Device1();
  } else if (what == "capture") {
    Capture();
  } else if (what == "destroy") {
    Destroy();
  } else if (what == "perthread") {
    PerThread();
  } else {
    std::printf("unknown scenario '%s'\n", argv[1]);
    return 2;
  }
  const int violations = Control<int (*)()>("cudadouble_violation_count")();
  const auto corruptions = Control<uint64_t (*)()>("cudadouble_corruptions")();
  if (violations != 0) {
    std::printf("FAIL: %d CUDA rule violation(s):\n%s", violations, Control<const char* (*)()>("cudadouble_violations")());
  }
  if (corruptions != 0) {
    std::printf("FAIL: %llu kernel(s) found another stream's data: %s\n", static_cast<unsigned long long>(corruptions),
                Control<const char* (*)()>("cudadouble_first_corruption")());
  }
  const bool ok = failures == 0 && violations == 0 && corruptions == 0;
  std::printf("%s: %s\n", argv[1], ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
