// tests/preload/preload_double_program.cc — a CUDA program (linked against the shared libcudart)
// that tests/preload/check_preload_double.sh runs on the CUDA double (tests/cuda_double), with and
// without the LD_PRELOAD shim, and scripts/gpu_check.sh runs on a real GPU under the shim. On the
// double (the process's libcudart; its controls found with dlsym) the writes and checks are its fake
// kernels and every CUDA rule is checked; on a GPU the writes are cudaMemsetAsync and the checks
// stream-ordered copies to the host, compared after a device synchronization, and contexts are read
// with the driver's cuDevicePrimaryCtxGetState. Each scenario exits 0 only when every CUDA call
// succeeded as the runtime documents, no CUDA rule was broken and no check found another stream's
// data.
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
#include <string_view>
#include <thread>
#include <vector>

namespace {

int failures = 0;

#define CHECK(expr)                                                                           \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, cudaGetErrorName(e_)); \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

bool on_double = false;

template <typename F>
F Control(const char* name) {
  void* f = dlsym(RTLD_DEFAULT, name);
  if (f == nullptr) {
    std::printf("FAIL: %s not found: the CUDA double is not this process's libcudart\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(f);
}

// On a GPU: the checks queued so far (the first bytes of each range, copied in stream order).
struct HostCheck {
  std::vector<uint8_t> bytes;
  uint8_t value;
};
std::vector<HostCheck*> host_checks;
constexpr size_t kCheckedBytes = 64 << 10;

int Fill(void* stream, void* ptr, size_t bytes, uint8_t value) {
  if (on_double) return Control<int (*)(void*, void*, size_t, uint8_t)>("cudadouble_fill")(stream, ptr, bytes, value);
  return cudaMemsetAsync(ptr, value, bytes, static_cast<cudaStream_t>(stream));
}

int Expect(void* stream, const void* ptr, size_t bytes, uint8_t value) {
  if (on_double) {
    return Control<int (*)(void*, const void*, size_t, uint8_t)>("cudadouble_expect")(stream, ptr, bytes, value);
  }
  auto* check = new HostCheck{std::vector<uint8_t>(bytes < kCheckedBytes ? bytes : kCheckedBytes), value};
  host_checks.push_back(check);
  return cudaMemcpyAsync(check->bytes.data(), ptr, check->bytes.size(), cudaMemcpyDeviceToHost,
                         static_cast<cudaStream_t>(stream));
}

// Checks that found another stream's data (the double counts its own).
uint64_t Corruptions() {
  if (on_double) return Control<uint64_t (*)()>("cudadouble_corruptions")();
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  uint64_t bad = 0;
  for (const HostCheck* c : host_checks) {
    for (uint8_t b : c->bytes) {
      if (b != c->value) {
        ++bad;
        break;
      }
    }
  }
  return bad;
}

// Whether `device` has a primary context (the double counts creations; a GPU reports its state).
bool HasContext(int device) {
  if (on_double) return Control<int (*)(int)>("cudadouble_contexts_created")(device) != 0;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
  auto state = lib != nullptr
                   ? reinterpret_cast<int (*)(int, unsigned*, int*)>(dlsym(lib, "cuDevicePrimaryCtxGetState"))
                   : nullptr;
  unsigned flags = 0;
  int active = 0;
  if (state == nullptr || state(device, &flags, &active) != 0) {
    std::printf("FAIL: cannot read device %d's primary context state\n", device);
    ++failures;
    return true;
  }
  return active != 0;
}

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
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("device1: SKIPPED LOUDLY: needs 2 devices, this machine has %d\n", count);
    return;
  }
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
  })
      .join();
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  if (HasContext(0)) {
    std::printf("FAIL: a context was created on device 0, which the program never used\n");
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
  // `before` now belongs to the graph (never launched here); under the shim it stays allocated.
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
  on_double = dlsym(RTLD_DEFAULT, "cudadouble_fill") != nullptr;
  std::printf("%s: on %s\n", argv[1], on_double ? "the CUDA double" : "the real CUDA runtime and driver");
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
  const int violations = on_double ? Control<int (*)()>("cudadouble_violation_count")() : 0;
  const uint64_t corruptions = Corruptions();
  if (violations != 0) {
    std::printf("FAIL: %d CUDA rule violation(s):\n%s", violations,
                Control<const char* (*)()>("cudadouble_violations")());
  }
  if (corruptions != 0) {
    std::printf("FAIL: %llu check(s) found another stream's data%s%s\n", static_cast<unsigned long long>(corruptions),
                on_double ? ": " : "", on_double ? Control<const char* (*)()>("cudadouble_first_corruption")() : "");
  }
  const bool ok = failures == 0 && violations == 0 && corruptions == 0;
  std::printf("%s: %s\n", argv[1], ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
