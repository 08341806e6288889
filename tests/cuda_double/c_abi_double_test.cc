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
// CUDA IPC as PyTorch's shareIpcHandle/getIpcDevPtr use it, within one process (the double's
// memory is the process's): a cudaMalloc segment is shared by its base; a vmm segment by its
// physical pieces, which open in a second mapping that sees the same bytes.
TEST_P(CAbiDoubleTest, ASharedBlockIsItsSegmentOrItsPiecesWhichOpenWithItsBytes) {
  cudaStream_t s = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = bucketalloc_malloc(6 * kMiB, 0, s);
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  ASSERT_EQ(cudadouble_fill(s, p, 6 * kMiB, 0x5A), 0);
  bucketalloc_shared_memory shared{};
  bucketalloc_shared_piece pieces[16] = {};
  ASSERT_EQ(bucketalloc_share_block(p, &shared, sizeof shared, pieces, 16), 0) << bucketalloc_last_error();
  EXPECT_EQ(shared.base + shared.offset, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_GE(shared.bytes, shared.offset + 6 * kMiB);
  if (std::string(GetParam()) == "backend:cuda") {
    EXPECT_EQ(shared.virtual_memory, 0);
    EXPECT_EQ(shared.num_pieces, 0u);
    size_t size = 0;  // the segment, which cudaIpcGetMemHandle(base) shares
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(bucketalloc_base_alloc(p, &size)), shared.base);
    EXPECT_EQ(size, shared.bytes);
    // A receiver on backend:cuda maps what an expandable segment shared with the vmm backend of its
    // row (as torch's opens 'e' handles whatever its own setting); the pieces are checked first.
    const bucketalloc_shared_piece piece{0, 1000};
    EXPECT_EQ(bucketalloc_open_shared(0, getpid(), &piece, 1), nullptr);
    EXPECT_NE(std::string(bucketalloc_last_error()).find("granularity"), std::string::npos) << bucketalloc_last_error();
  } else {
    EXPECT_EQ(shared.virtual_memory, 1);
    ASSERT_GE(shared.num_pieces, 1u);
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < shared.num_pieces; ++i) bytes += pieces[i].bytes;
    EXPECT_EQ(bytes, shared.bytes);
    const auto reserved = Stats(0)["reserved_bytes.all.current"].get<std::int64_t>();
    void* opened = bucketalloc_open_shared(0, getpid(), pieces, shared.num_pieces);
    const std::string why = opened == nullptr ? bucketalloc_last_error() : "";
    if (why.find("no pidfd_") != std::string::npos || why.find("ptrace rules forbid") != std::string::npos) {
      bucketalloc_free(p, 6 * kMiB, 0, s);
      GTEST_SKIP() << "SKIPPED LOUDLY: this machine does not let a process read its own descriptors through a "
                      "pidfd, which opening shared memory needs: "
                   << why;
    }
    ASSERT_NE(opened, nullptr) << why;
    EXPECT_NE(reinterpret_cast<std::uintptr_t>(opened), shared.base);
    ASSERT_EQ(cudadouble_expect(s, static_cast<char*>(opened) + shared.offset, 6 * kMiB, 0x5A), 0);
    ASSERT_CUDA(cudaStreamSynchronize(s));
    EXPECT_EQ(Stats(0)["reserved_bytes.all.current"].get<std::int64_t>(), reserved)
        << "an opening is the sender's memory: not reserved here";
    ASSERT_EQ(bucketalloc_close_shared(opened), 0) << bucketalloc_last_error();
    EXPECT_EQ(bucketalloc_close_shared(opened), -1);  // closed already: named
    EXPECT_NE(std::string(bucketalloc_last_error()).find("no opening"), std::string::npos) << bucketalloc_last_error();
    EXPECT_EQ(bucketalloc_share_block(p, &shared, sizeof shared, pieces, 0), -1);  // no room for the pieces
    EXPECT_NE(std::string(bucketalloc_last_error()).find("capacity"), std::string::npos) << bucketalloc_last_error();
    EXPECT_GE(shared.num_pieces, 1u);  // but told how many there are
    const bucketalloc_shared_piece odd{pieces[0].fd, 1000};
    EXPECT_EQ(bucketalloc_open_shared(0, getpid(), &odd, 1), nullptr);  // not whole granules
    EXPECT_NE(std::string(bucketalloc_last_error()).find("granularity"), std::string::npos) << bucketalloc_last_error();
  }
  EXPECT_EQ(bucketalloc_share_block(static_cast<char*>(p) + 512, &shared, sizeof shared, pieces, 16), -1);
  EXPECT_NE(std::string(bucketalloc_last_error()).find("not a live allocation"), std::string::npos)
      << bucketalloc_last_error();
  bucketalloc_free(p, 6 * kMiB, 0, s);
  ASSERT_CUDA(cudaStreamSynchronize(s));
  ASSERT_EQ(bucketalloc_retire_stream(s), 0);
  ASSERT_CUDA(cudaStreamDestroy(s));
  ExpectAllReturned();
}

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
