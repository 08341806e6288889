// tests/cuda_double/cuda_double_test.cc — the CUDA double enforces what it claims: each rule of its
// table, broken once, returns CUDA's documented error and is recorded as a violation; what CUDA
// allows is not (so a suite that finds 0 violations on it has shown something).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cuda_double.h"
#include "gtest/gtest.h"

namespace {

constexpr std::size_t k2MiB = std::size_t{2} << 20;

class CudaDoubleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cudadouble_clear_violations();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  }
  // Expects exactly one new violation of `rule` and clears it.
  void ExpectViolation(const char* rule) {
    const std::string text = cudadouble_violations();
    EXPECT_EQ(cudadouble_violation_count(), 1) << text;
    EXPECT_EQ(text.rfind(rule, 0), 0u) << "expected a '" << rule << "' violation, got: " << text;
    EXPECT_TRUE(text.find(".h:") != std::string::npos || text.find("Programming Guide") != std::string::npos)
        << "the violation cites no header line: " << text;
    cudadouble_clear_violations();
  }
  void ExpectNoViolation() { EXPECT_EQ(cudadouble_violation_count(), 0) << cudadouble_violations(); }
};

TEST_F(CudaDoubleTest, ReportsItsConfiguredDriverVersion) {
  int v = 0;
  ASSERT_EQ(cuDriverGetVersion(&v), CUDA_SUCCESS);
  const char* env = std::getenv("CUDA_DOUBLE_DRIVER_VERSION");
  EXPECT_EQ(v, env != nullptr ? std::atoi(env) : 13000);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_EQ(cuGetProcAddress_v2("cuMemMap", &fn, 10020, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemMap));
  // An ABI older than the symbol's: success, no function, the reason in the status (cuda.h:24303).
  EXPECT_EQ(cuGetProcAddress_v2("cuMemMap", &fn, 10000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  ExpectNoViolation();
  // A version newer than the driver: CUDA_ERROR_INVALID_VALUE (cuda.h:24296).
  EXPECT_EQ(cuGetProcAddress_v2("cuMemMap", &fn, v + 10, 0, &status), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("driver-version");
}

TEST_F(CudaDoubleTest, ContextsAreCreatedOnlyWhereTheProgramAsks) {
  std::thread([&] {
    int device = -1;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);  // reports 0, creates nothing
    EXPECT_EQ(device, 0);
    const int before = cudadouble_contexts_created(0);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // CUDA 12+: device 1's primary context, current at once
    EXPECT_EQ(cudadouble_contexts_created(0), before);
    EXPECT_GE(cudadouble_contexts_created(1), 1);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
    EXPECT_NE(ctx, nullptr);
  }).join();
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, DriverCallsNeedACurrentContext) {
  std::thread([&] {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc_v2(&p, k2MiB), CUDA_ERROR_INVALID_CONTEXT);
  }).join();
  ExpectViolation("context-current");
}

TEST_F(CudaDoubleTest, DestroyedStreamsAndEventsAreInvalidHandles) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  ExpectViolation("live-stream");
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
  ExpectViolation("live-event");
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, StreamHandlesAreReusedAfterDestroy) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(a), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&b), cudaSuccess);
  EXPECT_EQ(a, b) << "real drivers hand a destroyed stream's handle value out again; the double does too";
  ASSERT_EQ(cudaStreamDestroy(b), cudaSuccess);
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, EventAndStreamMustShareAContext) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaEvent_t e0 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
  ExpectViolation("event-stream-same-context");
  ASSERT_EQ(cudaEventDestroy(e0), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, WorkRunsOnlyWhenSomethingWaitsForIt) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, k2MiB), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudadouble_fill(s, p, 4096, 0xAB), 0);
  EXPECT_EQ(static_cast<unsigned char*>(p)[0], 0) << "queued work ran before anything waited for it";
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess) << "polling makes progress";
  EXPECT_EQ(static_cast<unsigned char*>(p)[0], 0xAB);
  // Early reuse shows as a corruption: a kernel expecting its data finds another stream's.
  ASSERT_EQ(cudadouble_expect(s, p, 4096, 0xAB), 0);
  std::memset(p, 0xCD, 4096);  // as if another stream had been handed the block and written it
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudadouble_corruptions(), 1u);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, TheLegacyStreamWaitsForBlockingStreams) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, k2MiB), cudaSuccess);
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudadouble_fill(blocking, p, 16, 0x11), 0);
  unsigned char host = 0;
  ASSERT_EQ(cudaMemcpy(&host, p, 1, cudaMemcpyDeviceToHost), cudaSuccess);  // on the legacy stream
  EXPECT_EQ(host, 0x11);
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, GlobalCaptureProhibitsUnsafeCallsOnOtherThreads) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, k2MiB), cudaErrorStreamCaptureUnsupported);
    // In relaxed mode the same thread may.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&p, k2MiB), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    // cudaMallocAsync is legal during a capture.
    cudaStream_t other = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMallocAsync(&p, 4096, other), cudaSuccess);
    EXPECT_EQ(cudaFreeAsync(p, other), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
  }).join();
  ExpectViolation("capture-unsafe-call");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated) << "the prohibited call invalidates";
  EXPECT_EQ(graph, nullptr);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, ThreadLocalCaptureIgnoresOtherThreadsAndCapturedEventsCannotBeQueried) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, k2MiB), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&relaxed), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(e), cudaErrorStreamCaptureUnsupported) << "even relaxed mode cannot query it";
  }).join();
  ExpectViolation("capture-captured-event");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, TheLegacyStreamIsUnusableDuringABlockingCapture) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);  // blocking
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cudaStreamCaptureStatus status{};
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaErrorStreamCaptureImplicit);
  ExpectNoViolation();  // documented answer; the capture stays valid
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e, nullptr), cudaErrorStreamCaptureImplicit);
  ExpectViolation("capture-legacy-stream");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, ACapturingStreamCannotBeSynchronizedNorEndedOnAnotherThread) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::thread([&] {
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureWrongThread);
  }).join();
  ExpectViolation("capture-end-thread");
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  ExpectViolation("capture-sync-or-query");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CudaDoubleTest, AValidCaptureProducesAGraph) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_NE(graph, nullptr);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, VirtualMemoryRules) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t g = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  ASSERT_EQ(g, k2MiB);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(cuMemCreate(&h, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-create-granularity");
  ASSERT_EQ(cuMemCreate(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(va, g / 2, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-map-granularity");
  EXPECT_EQ(cuMemMap(va + 3 * g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-map-reserved");
  // The second granule of the handle on its own: cuMemMap takes no offset but zero.
  EXPECT_EQ(cuMemMap(va + 2 * g, g, g, h, 0), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-map-offset");
  ASSERT_EQ(cuMemMap(va, 2 * g, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemMap(va + g, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-map-unmapped");
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(cuMemSetAccess(va, 3 * g, &access, 1), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-access-mapped");
  // Before access is set, a kernel may not touch the mapping.
  ASSERT_EQ(cudadouble_fill(nullptr, reinterpret_cast<void*>(va), 64, 1), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectViolation("kernel-access");
  ASSERT_EQ(cuMemSetAccess(va, 2 * g, &access, 1), CUDA_SUCCESS);
  // Device 1 has no access until it is granted.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudadouble_fill(nullptr, reinterpret_cast<void*>(va), 64, 1), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectViolation("kernel-access");
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-unmap-whole");
  EXPECT_EQ(cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-free-mapped");
  // Released while mapped: allowed; the memory goes with the last mapping.
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cudadouble_used_bytes(0), 2 * g);
  ASSERT_EQ(cuMemUnmap(va, 2 * g), CUDA_SUCCESS);
  EXPECT_EQ(cudadouble_used_bytes(0), 0u);
  EXPECT_EQ(cuMemAddressFree(va, 4 * g), CUDA_SUCCESS);
  ExpectNoViolation();
}

// Export only of a live handle whose cuMemCreate requested the type; import only of a descriptor
// an export made (any duplicate of it); every handle of the allocation is a reference to it.
TEST_F(CudaDoubleTest, ShareableHandleRules) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle plain = 0;
  ASSERT_EQ(cuMemCreate(&plain, k2MiB, &prop, 0), CUDA_SUCCESS);
  int fd = -1;
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-export-requested");
  ASSERT_EQ(cuMemRelease(plain), CUDA_SUCCESS);
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-live-handle");

  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, k2MiB, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  ASSERT_GE(fd, 0);
  const int copy = dup(fd);
  ASSERT_GE(copy, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_EQ(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<std::uintptr_t>(copy)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  EXPECT_NE(imported, h);
  close(copy);
  close(fd);
  const int never = memfd_create("never_exported", 0);
  ASSERT_GE(never, 0);
  CUmemGenericAllocationHandle bad = 0;
  EXPECT_EQ(cuMemImportFromShareableHandle(&bad, reinterpret_cast<void*>(static_cast<std::uintptr_t>(never)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE);
  ExpectViolation("vmm-import-exported");
  close(never);
  // Released by its creator, the allocation lives on in the import (mapped, written, read back).
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(cudadouble_used_bytes(0), k2MiB);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, k2MiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, k2MiB, 0, imported, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(imported), CUDA_SUCCESS);
  EXPECT_EQ(cudadouble_used_bytes(0), k2MiB) << "freed while still mapped";
  ASSERT_EQ(cuMemUnmap(va, k2MiB), CUDA_SUCCESS);
  EXPECT_EQ(cudadouble_used_bytes(0), 0u) << "not freed with its last reference and mapping";
  EXPECT_EQ(cuMemAddressFree(va, k2MiB), CUDA_SUCCESS);

  // A device without POSIX descriptor handles refuses the type at cuMemCreate: not a violation.
  cudadouble_set_posix_fd_handles(0);
  int supported = -1;
  ASSERT_EQ(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(supported, 0);
  EXPECT_EQ(cuMemCreate(&h, k2MiB, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  cudadouble_set_posix_fd_handles(1);
  ExpectNoViolation();
}

TEST_F(CudaDoubleTest, AnotherDevicesMemoryNeedsPeerAccess) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, k2MiB), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudadouble_fill(nullptr, p, 64, 1), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectViolation("peer-access");
  ASSERT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
  ASSERT_EQ(cudadouble_fill(nullptr, p, 64, 1), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectNoViolation();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CudaDoubleTest, MemGetInfoCountsPhysicalMemory) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * k2MiB), cudaSuccess);
  std::size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_before - free_after, 3 * k2MiB);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total), cudaErrorMemoryAllocation);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
  ExpectViolation("free-unknown");
  (void)cudaGetLastError();
}

}  // namespace
