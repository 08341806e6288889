// tests/cuda_double/c_abi_double_test.cc — the C ABI (plugins/c_abi/c_abi.cc) with backend:cuda and
// backend:vmm on the CUDA double: what a C host or PyTorch's CUDAPluggableAllocator does through it
// (two streams with kernels, record_stream, retiring a stream, empty_cache, a capture, per-thread
// default streams), with every CUDA call checked against CUDA's rules. ctest runs every test in its
// own process, so each configures the process allocator itself.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "bucketalloc/bucketalloc.h"
#include "cuda_double.h"
#include "nlohmann/json.hpp"

namespace {

constexpr ssize_t kMiB = 1 << 20;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

nlohmann::json Stats(int device) {
  std::string buf(1 << 16, '\0');
  const ssize_t n = bucketalloc_stats_json(device, buf.data(), buf.size());
  EXPECT_GT(n, 0) << bucketalloc_last_error();
  buf.resize(static_cast<std::size_t>(n));
  return nlohmann::json::parse(buf);
}

class CAbiDoubleTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    cudadouble_clear_violations();
    ASSERT_EQ(bucketalloc_is_initialized(), 0) << "each test runs in a fresh process";
    ASSERT_EQ(bucketalloc_configure(GetParam()), 0) << bucketalloc_last_error();
    ASSERT_CUDA(cudaSetDevice(0));
  }
  void TearDown() override {
    EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
    EXPECT_EQ(cudadouble_violation_count(), 0) << "CUDA rules broken:\n" << cudadouble_violations();
    EXPECT_EQ(cudadouble_corruptions(), 0u) << cudadouble_first_corruption();
  }
  // Everything back: nothing reserved, the device has its memory back.
  static void ExpectAllReturned() {
    ASSERT_CUDA(cudaDeviceSynchronize());
    bucketalloc_empty_cache();
    EXPECT_EQ(Stats(0)["reserved_bytes.all.current"], 0);
    EXPECT_EQ(cudadouble_used_bytes(0), 0u);
  }
};

TEST_P(CAbiDoubleTest, TwoStreamsRecordStreamRetireAndEmptyCache) {
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t order = nullptr;
  ASSERT_CUDA(cudaEventCreateWithFlags(&order, cudaEventDisableTiming));
  for (int round = 0; round < 200; ++round) {
    const ssize_t size = (round % 7 + 1) * 3 * kMiB + round;
    void* p = bucketalloc_malloc(size, 0, a);
    ASSERT_NE(p, nullptr) << bucketalloc_last_error();
    const auto tag = static_cast<std::uint8_t>(round % 250 + 1);
    ASSERT_EQ(cudadouble_fill(a, p, static_cast<size_t>(size), tag), 0);
    ASSERT_CUDA(cudaEventRecord(order, a));
    ASSERT_CUDA(cudaStreamWaitEvent(b, order, 0));
    ASSERT_EQ(cudadouble_expect(b, p, static_cast<size_t>(size), tag), 0);  // b reads it: record_stream
    bucketalloc_record_stream(p, b);
    bucketalloc_free(p, size, 0, a);
    if (round % 50 == 49) {
      ASSERT_CUDA(cudaStreamSynchronize(b));
    }
  }
  for (cudaStream_t s : {a, b}) {
    ASSERT_EQ(bucketalloc_retire_stream(s), 0) << bucketalloc_last_error();
    ASSERT_CUDA(cudaStreamDestroy(s));
  }
  ASSERT_CUDA(cudaEventDestroy(order));
  ExpectAllReturned();
}

TEST_P(CAbiDoubleTest, AnAnnouncedCaptureMakesNoForbiddenCall) {
  cudaStream_t s = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* warm = bucketalloc_malloc(8 * kMiB, 0, s);
  ASSERT_NE(warm, nullptr);
  bucketalloc_free(warm, 8 * kMiB, 0, s);
  ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(bucketalloc_capture_begin(0, 11, s), 0) << bucketalloc_last_error();
  // The graph's private pool grows in relaxed capture mode (as PyTorch's does) and reuses its
  // freed blocks within the capture; nothing invalidates the global-mode capture.
  void* in_graph = bucketalloc_malloc(8 * kMiB, 0, s);
  ASSERT_NE(in_graph, nullptr) << bucketalloc_last_error();
  EXPECT_NE(in_graph, warm) << "the device's cache does not serve the graph's pool";
  void* big = bucketalloc_malloc(512 * kMiB, 0, s);
  ASSERT_NE(big, nullptr) << bucketalloc_last_error();
  bucketalloc_free(big, 512 * kMiB, 0, s);
  void* again = bucketalloc_malloc(512 * kMiB, 0, s);
  EXPECT_EQ(again, big) << "reused inside the pool during the capture";
  bucketalloc_free(again, 512 * kMiB, 0, s);
  bucketalloc_free(in_graph, 8 * kMiB, 0, s);
  ASSERT_EQ(bucketalloc_capture_end(0, 11), 0) << bucketalloc_last_error();
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamEndCapture(s, &graph));  // valid
  ASSERT_CUDA(cudaGraphDestroy(graph));
  ASSERT_EQ(bucketalloc_release_pool(0, 11), 0) << bucketalloc_last_error();
  bucketalloc_empty_cache();  // the released pool's memory goes back after a device synchronization
  ASSERT_EQ(bucketalloc_retire_stream(s), 0);
  ASSERT_CUDA(cudaStreamDestroy(s));
  ExpectAllReturned();
}

TEST_P(CAbiDoubleTest, PerThreadDefaultStreamsOfTwoThreadsAreTwoStreams) {
  constexpr ssize_t kSize = 6 * kMiB;
  std::thread([&] {
    ASSERT_CUDA(cudaSetDevice(0));
    void* p = bucketalloc_malloc(kSize, 0, cudaStreamPerThread);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(cudadouble_fill(cudaStreamPerThread, p, kSize, 0x51), 0);
    ASSERT_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    ASSERT_EQ(cudadouble_expect(cudaStreamPerThread, p, kSize, 0x51), 0);  // still queued
    bucketalloc_free(p, kSize, 0, cudaStreamPerThread);
  }).join();
  std::thread([&] {
    ASSERT_CUDA(cudaSetDevice(0));
    void* p = bucketalloc_malloc(kSize, 0, cudaStreamPerThread);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(cudadouble_fill(cudaStreamPerThread, p, kSize, 0x52), 0);
    ASSERT_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    bucketalloc_free(p, kSize, 0, cudaStreamPerThread);
  }).join();
  ExpectAllReturned();
}

// fork(2) after the device was set up: CUDA's contexts are not copied into the child, so every
// request there fails naming fork and what to do instead (the free too: it would queue CUDA
// work); the parent goes on as before.
TEST_P(CAbiDoubleTest, AForkChildGetsAClearErrorForEveryRequest) {
  void* p = bucketalloc_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    int code = 0;
    if (bucketalloc_malloc(kMiB, 0, nullptr) != nullptr) code |= 1;
    if (std::string(bucketalloc_last_error()).find("child of fork") == std::string::npos) code |= 2;
    if (std::string(bucketalloc_last_error()).find("spawn") == std::string::npos) code |= 4;
    bucketalloc_free(p, 3 * kMiB, 0, nullptr);
    if (std::string(bucketalloc_last_error()).find("child of fork") == std::string::npos) code |= 8;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: allocated, 2/4/8: the error did not name fork and spawn";
  bucketalloc_free(p, 3 * kMiB, 0, nullptr);
  EXPECT_STREQ(bucketalloc_last_error(), "");
  ExpectAllReturned();
}

// The version report (python -m bucketalloc_torch --version): the double is the process's
// libcuda.so.1, and its cuDriverGetVersion says 13.0, or CUDA_DOUBLE_DRIVER_VERSION (ctest runs the
// suite again as a 12.2 driver); reading it creates no allocator and needs no cuInit.
TEST(CAbiVersions, TheDriverVersionIsReadWithoutCreatingTheAllocator) {
  const char* env = std::getenv("CUDA_DOUBLE_DRIVER_VERSION");
  EXPECT_EQ(bucketalloc_cuda_driver_version(), env != nullptr ? std::atoi(env) : 13000) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_is_initialized(), 0);
  EXPECT_EQ(bucketalloc_cuda_headers_version(), CUDART_VERSION);  // the toolkit this test built with
  EXPECT_EQ(cudadouble_violation_count(), 0) << cudadouble_violations();
}

INSTANTIATE_TEST_SUITE_P(Backends, CAbiDoubleTest, ::testing::Values("backend:cuda", "backend:vmm"),
                         [](const auto& info) { return std::string(info.param).substr(8); });

}  // namespace
