// tests/cuda/cuda_backend_test.cc — the cudaMalloc and vmm backends and the allocator on a real device.
//
// Covers: cuda/ (MakeCudaBackend, MakeVmmBackend, CudaDeviceCount, CudaBackend, VmmBackend), the
// Backend contract on both (tests/backend/backend_conformance.h), and the allocator front end with
// `backend:cuda` and `backend:vmm`.
// Modes (never a silent pass):
//   * No GPU, BUCKETALLOC_EXPECT_GPU unset or 0: CudaNoGpuTest asserts the typed
//     FailedPrecondition error naming the CUDA error (both backends); the GPU tests are skipped
//     with the reason.
//   * A GPU present (with or without the variable): the GPU tests run; CudaNoGpuTest is skipped.
//   * BUCKETALLOC_EXPECT_GPU=1 (scripts/gpu_check.sh) and no GPU: every test fails.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend_conformance.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#ifdef BUCKETALLOC_CUDA_DOUBLE
#include "cuda_double.h"  // tests/cuda_double: the build that runs on the CUDA double
#endif

namespace bucketalloc {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr std::size_t k2MiB = 2 * kMiB;

using ::bucketalloc::testing::ExpectGpu;  // tests/backend/backend_conformance.h

// The number of usable devices (0 when the count fails) and the status of the query.
struct GpuProbe {
  int count = 0;
  absl::Status status;
};

GpuProbe ProbeGpu() {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return {0, count.status()};
  return {*count, absl::OkStatus()};
}

#define ASSERT_CUDA(expr)                                                                         \
  do {                                                                                            \
    cudaError_t cuda_error_ = (expr);                                                             \
    ASSERT_EQ(cuda_error_, cudaSuccess) << #expr << ": " << cudaGetErrorName(cuda_error_) << ": " \
                                        << cudaGetErrorString(cuda_error_);                       \
  } while (0)

// A test that misuses CUDA on purpose: on the CUDA double, exactly these rules were broken since
// the test began (and are forgotten, so that the run's check of every rule passes); on a GPU, nothing.
void ExpectDeliberateViolations(std::vector<std::string> rules) {
#ifdef BUCKETALLOC_CUDA_DOUBLE
  const std::string seen = cudadouble_violations();
  EXPECT_EQ(cudadouble_violation_count(), static_cast<int>(rules.size())) << seen;
  for (const std::string& rule : rules) EXPECT_THAT(seen, HasSubstr("] " + rule + ":")) << seen;
  cudadouble_clear_violations();
#else
  (void)rules;
#endif
}

// ---------------------------------------------------------------------------------------------
// Without a GPU: the clear typed error.

class CudaNoGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    probe_ = ProbeGpu();
    if (probe_.count > 0) GTEST_SKIP() << "a GPU is present: the real tests (CudaGpuTest) run";
    if (ExpectGpu()) {
      FAIL() << "BUCKETALLOC_EXPECT_GPU=1 but no CUDA device is usable: " << probe_.status;
    }
  }
  GpuProbe probe_;
};

TEST_F(CudaNoGpuTest, DeviceCountIsFailedPreconditionNamingTheCudaError) {
  const absl::Status& status = probe_.status;
  std::cout << "CudaDeviceCount() on this machine: " << status << "\n";
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), AnyOf(HasSubstr("cannot load libcuda.so.1"), HasSubstr("CUDA_ERROR_NO_DEVICE")));
  EXPECT_THAT(status.message(), HasSubstr("CUDA driver"));
}

// The backend factories and the name each one's error gives its backend.
struct BackendFactory {
  const char* name;
  absl::StatusOr<std::unique_ptr<Backend>> (*make)(int device);
};
constexpr BackendFactory kCudaFactories[] = {{"cuda", &MakeCudaBackend}, {"vmm", &MakeVmmBackend}};

TEST_F(CudaNoGpuTest, MakeCudaOrVmmBackendIsFailedPreconditionNamingTheDeviceAndError) {
  for (const BackendFactory& factory : kCudaFactories) {
    for (int device : {0, 1}) {
      absl::StatusOr<std::unique_ptr<Backend>> backend = factory.make(device);
      ASSERT_FALSE(backend.ok());
      const absl::Status& status = backend.status();
      std::cout << "the " << factory.name << " backend for device " << device << " on this machine: " << status << "\n";
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
      EXPECT_THAT(status.message(), AnyOf(HasSubstr("cannot load libcuda.so.1"), HasSubstr("CUDA_ERROR_NO_DEVICE")));
      EXPECT_THAT(status.message(), HasSubstr(std::string(factory.name) + " backend"));
      EXPECT_THAT(status.message(), HasSubstr("device " + std::to_string(device)));
    }
  }
}

TEST_F(CudaNoGpuTest, AllocatorWithCudaOrVmmBackendReportsTheMissingDriver) {
  for (const char* conf : {"backend:cuda", "backend:vmm"}) {
    SCOPED_TRACE(conf);
    absl::StatusOr<Options> options = ParseOptions(conf);
    ASSERT_TRUE(options.ok()) << options.status();
    absl::StatusOr<std::unique_ptr<Allocator>> allocator = Allocator::Create(*options);
    absl::Status status;
    if (!allocator.ok()) {
      status = allocator.status();  // Create may already probe the device
    } else {
      absl::StatusOr<void*> p = (*allocator)->Allocate(4 * kKiB, 0, nullptr);
      ASSERT_FALSE(p.ok()) << "allocated " << *p << " without a GPU";
      status = p.status();
    }
    std::cout << "the allocator with " << conf << " on this machine: " << status << "\n";
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(), AnyOf(HasSubstr("cannot load libcuda.so.1"), HasSubstr("CUDA_ERROR_NO_DEVICE")));
  }
}

// ---------------------------------------------------------------------------------------------
// With a GPU: the real tests.

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    probe_ = ProbeGpu();
    if (probe_.count == 0) {
      if (ExpectGpu()) {
        FAIL() << "BUCKETALLOC_EXPECT_GPU=1 but no CUDA device is usable: " << probe_.status;
      }
      GTEST_SKIP() << "no GPU (" << probe_.status << "); CudaNoGpuTest checks the typed error instead";
    }
    ASSERT_CUDA(cudaSetDevice(0));
  }

  std::unique_ptr<Backend> MakeBackend(int device) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(device);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  static int CurrentDevice() {
    int device = -1;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    return device;
  }

  GpuProbe probe_;
};

// Fills `bytes` at `ptr` with `value`, then reads back the first and last MiB (all of it when
// small) and checks every byte; also writes a pattern from the host in the middle and reads it.
void WriteAndVerify(void* ptr, std::size_t bytes, unsigned char value) {
  ASSERT_CUDA(cudaMemset(ptr, value, bytes));
  const std::size_t chunk = bytes < kMiB ? bytes : kMiB;
  std::vector<unsigned char> host(chunk);
  for (std::size_t offset : {std::size_t{0}, bytes - chunk}) {
    ASSERT_CUDA(cudaMemcpy(host.data(), static_cast<char*>(ptr) + offset, chunk, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < chunk; ++i) {
      ASSERT_EQ(host[i], value) << "byte " << offset + i << " of " << bytes;
    }
  }
  std::vector<std::uint32_t> pattern(4096);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = 0x9E3779B9u * (i + 1);
  const std::size_t pattern_bytes = pattern.size() * sizeof(pattern[0]);
  if (bytes < 2 * pattern_bytes + kMiB) return;  // the pattern fits in the middle of large blocks only
  char* middle = static_cast<char*>(ptr) + (bytes / 2 / 4096) * 4096;
  ASSERT_CUDA(cudaMemcpy(middle, pattern.data(), pattern_bytes, cudaMemcpyHostToDevice));
  std::vector<std::uint32_t> back(pattern.size());
  ASSERT_CUDA(cudaMemcpy(back.data(), middle, pattern_bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, pattern);
}

TEST_F(CudaGpuTest, DeviceCountAndRangeChecks) {
  ASSERT_GT(probe_.count, 0);
  for (int device = 0; device < probe_.count; ++device) {
    std::unique_ptr<Backend> backend = MakeBackend(device);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->Name(), "cuda");
    EXPECT_EQ(backend->device(), device);
    EXPECT_EQ(backend->Granularity(), k2MiB);
    EXPECT_FALSE(backend->SupportsVirtualMemory());
  }
  for (int device : {-1, probe_.count}) {
    for (const BackendFactory& factory : kCudaFactories) {
      absl::StatusOr<std::unique_ptr<Backend>> backend = factory.make(device);
      ASSERT_FALSE(backend.ok());
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << backend.status();
      EXPECT_THAT(backend.status().message(), HasSubstr("device " + std::to_string(device)));
      EXPECT_THAT(backend.status().message(), HasSubstr(std::to_string(probe_.count)));
    }
  }
}

TEST_F(CudaGpuTest, AllocateWriteReadFreeSeveralSizes) {
  std::unique_ptr<Backend> backend = MakeBackend(0);
  ASSERT_NE(backend, nullptr);
  const std::vector<std::size_t> sizes = {k2MiB, 64 * kMiB, kGiB};
  unsigned char value = 0x11;
  for (std::size_t size : sizes) {
    absl::StatusOr<void*> p = backend->Allocate(size);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_NE(*p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % 256, 0u);
    WriteAndVerify(*p, size, value);
    value += 0x22;
    ASSERT_TRUE(backend->Free(*p, size).ok());
  }
  BackendCounters counters = backend->counters();
  EXPECT_EQ(counters.allocs, 3);
  EXPECT_EQ(counters.frees, 3);
  EXPECT_EQ(counters.failed_allocs, 0);
}

TEST_F(CudaGpuTest, InvalidSizesAreInvalidArgument) {
  std::unique_ptr<Backend> backend = MakeBackend(0);
  ASSERT_NE(backend, nullptr);
  for (std::size_t size : {std::size_t{0}, k2MiB + 1, kMiB}) {
    absl::StatusOr<void*> p = backend->Allocate(size);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  }
  EXPECT_EQ(backend->counters().failed_allocs, 3);
  EXPECT_EQ(backend->counters().allocs, 0);
}

TEST_F(CudaGpuTest, TooLargeIsResourceExhaustedAndTheNextAllocationSucceeds) {
  std::unique_ptr<Backend> backend = MakeBackend(0);
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<DeviceMemInfo> info = backend->GetMemInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::size_t huge = (info->total_bytes / k2MiB + 1) * k2MiB * 2;
  absl::StatusOr<void*> p = backend->Allocate(huge);
  ASSERT_FALSE(p.ok()) << "allocated " << huge << " bytes on a " << info->total_bytes << "-byte device";
  std::cout << "oversized allocation: " << p.status() << "\n";
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_THAT(p.status().message(), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_THAT(p.status().message(), HasSubstr("cuMemAlloc(" + std::to_string(huge) + " bytes)"));
  EXPECT_THAT(p.status().message(), HasSubstr("device 0"));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the out-of-memory error was left pending";
  EXPECT_EQ(backend->counters().failed_allocs, 1);

  absl::StatusOr<void*> q = backend->Allocate(64 * kMiB);
  ASSERT_TRUE(q.ok()) << q.status();
  WriteAndVerify(*q, 64 * kMiB, 0x5A);
  EXPECT_TRUE(backend->Free(*q, 64 * kMiB).ok());
}

TEST_F(CudaGpuTest, MemInfoIsConsistent) {
  std::unique_ptr<Backend> backend = MakeBackend(0);
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<DeviceMemInfo> before = backend->GetMemInfo();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->total_bytes, 0u);
  EXPECT_LE(before->free_bytes, before->total_bytes);
  ASSERT_GE(before->free_bytes, 2 * kGiB) << "too little free memory for the test";

  absl::StatusOr<void*> p = backend->Allocate(kGiB);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<DeviceMemInfo> during = backend->GetMemInfo();
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->total_bytes, before->total_bytes);
  // Free memory dropped by about 1 GiB (some slack for other users of the device).
  EXPECT_LE(during->free_bytes + (kGiB - 64 * kMiB), before->free_bytes)
      << "before " << before->free_bytes << ", during " << during->free_bytes;

  ASSERT_TRUE(backend->Free(*p, kGiB).ok());
  absl::StatusOr<DeviceMemInfo> after = backend->GetMemInfo();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->free_bytes, during->free_bytes + (kGiB - 64 * kMiB))
      << "during " << during->free_bytes << ", after " << after->free_bytes;
}

TEST_F(CudaGpuTest, EventsTrackStreamWorkAndAreRecycled) {
  std::unique_ptr<Backend> backend = MakeBackend(0);
  ASSERT_NE(backend, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<void*> buffer = backend->Allocate(kGiB);
  ASSERT_TRUE(buffer.ok()) << buffer.status();

  // Queue some milliseconds of kernel-free work: repeated memsets of 1 GiB.
  constexpr int kMemsets = 16;
  for (int i = 0; i < kMemsets; ++i) ASSERT_CUDA(cudaMemsetAsync(*buffer, i, kGiB, stream));
  absl::StatusOr<Event> event = backend->RecordEvent(stream);
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_NE(*event, nullptr);
  absl::StatusOr<bool> first = backend->QueryEvent(*event);
  ASSERT_TRUE(first.ok()) << first.status();
  std::cout << "event complete right after recording: " << (*first ? "yes" : "no") << "\n";

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<bool> query = backend->QueryEvent(*event);
    ASSERT_TRUE(query.ok()) << query.status();
    done = *query;
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ASSERT_TRUE(done) << "the event did not complete within 30 s";
  EXPECT_TRUE(backend->SynchronizeEvent(*event).ok());
  unsigned char byte = 0;
  ASSERT_CUDA(cudaMemcpy(&byte, static_cast<char*>(*buffer) + kGiB - 1, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(byte, kMemsets - 1);

  // Synchronize, then Query is true at once.
  for (int i = 0; i < 4; ++i) ASSERT_CUDA(cudaMemsetAsync(*buffer, 0x7F, kGiB, stream));
  absl::StatusOr<Event> second = backend->RecordEvent(stream);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*second, *event);
  ASSERT_TRUE(backend->SynchronizeEvent(*second).ok());
  absl::StatusOr<bool> query = backend->QueryEvent(*second);
  ASSERT_TRUE(query.ok()) << query.status();
  EXPECT_TRUE(*query);

  // Destroyed events are recycled: the next record reuses one of them.
  backend->DestroyEvent(*event);
  backend->DestroyEvent(*second);
  absl::StatusOr<Event> third = backend->RecordEvent(stream);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(*third == *event || *third == *second) << "a new event was created";
  // The legacy default stream works too.
  absl::StatusOr<Event> fourth = backend->RecordEvent(nullptr);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_TRUE(*fourth == *event || *fourth == *second) << "a new event was created";
  EXPECT_TRUE(backend->SynchronizeEvent(*third).ok());
  EXPECT_TRUE(backend->SynchronizeEvent(*fourth).ok());
  backend->DestroyEvent(*third);
  backend->DestroyEvent(*fourth);
  EXPECT_EQ(backend->counters().events_recorded, 4);

  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_TRUE(backend->Free(*buffer, kGiB).ok());
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

// Returns the device that owns `ptr`, or -1.
int PointerDevice(void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) return -1;
  return attributes.type == cudaMemoryTypeDevice ? attributes.device : -1;
}

TEST_F(CudaGpuTest, EachCallUsesTheBackendsDeviceAndRestoresTheCurrentOne) {
  std::unique_ptr<Backend> backend0 = MakeBackend(0);
  ASSERT_NE(backend0, nullptr);
  ASSERT_CUDA(cudaSetDevice(0));
  absl::StatusOr<void*> p = backend0->Allocate(k2MiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(PointerDevice(*p), 0);
  EXPECT_EQ(CurrentDevice(), 0);
  EXPECT_TRUE(backend0->Free(*p, k2MiB).ok());
  EXPECT_EQ(CurrentDevice(), 0);

  if (probe_.count < 2) {
    std::cout << "one GPU: the cross-device part of this test does not apply\n";
    return;
  }
  std::unique_ptr<Backend> backend1 = MakeBackend(1);
  ASSERT_NE(backend1, nullptr);
  ASSERT_CUDA(cudaSetDevice(0));
  absl::StatusOr<void*> q = backend1->Allocate(64 * kMiB);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(PointerDevice(*q), 1);
  EXPECT_EQ(CurrentDevice(), 0);
  absl::StatusOr<DeviceMemInfo> info = backend1->GetMemInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(CurrentDevice(), 0);

  // An event on a device-1 stream while device 0 is current.
  cudaStream_t stream1 = nullptr;
  ASSERT_CUDA(cudaSetDevice(1));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream1, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaMemsetAsync(*q, 3, 64 * kMiB, stream1));
  ASSERT_CUDA(cudaSetDevice(0));
  absl::StatusOr<Event> event = backend1->RecordEvent(stream1);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(backend1->SynchronizeEvent(*event).ok());
  absl::StatusOr<bool> done = backend1->QueryEvent(*event);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  backend1->DestroyEvent(*event);
  EXPECT_EQ(CurrentDevice(), 0);

  // And the other way round: device 1 current, backend 0 used.
  ASSERT_CUDA(cudaSetDevice(1));
  absl::StatusOr<void*> r = backend0->Allocate(k2MiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(PointerDevice(*r), 0);
  EXPECT_EQ(CurrentDevice(), 1);
  EXPECT_TRUE(backend0->Free(*r, k2MiB).ok());
  EXPECT_EQ(CurrentDevice(), 1);

  ASSERT_CUDA(cudaStreamDestroy(stream1));
  EXPECT_TRUE(backend1->Free(*q, 64 * kMiB).ok());
  ASSERT_CUDA(cudaSetDevice(0));
}

// ---------------------------------------------------------------------------------------------
// The vmm backend on a real device: the driver's virtual memory management through the Backend
// interface.

class VmmGpuTest : public CudaGpuTest {
 protected:
  void SetUp() override {
    CudaGpuTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeVmmBackend(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    granule_ = backend_->Granularity();
  }

  std::unique_ptr<Backend> backend_;
  std::size_t granule_ = 0;
};

void* AsPointer(std::uintptr_t va) { return reinterpret_cast<void*>(va); }

// The virtual-memory counters of `backend` as one comparable value.
struct VmmCounts {
  std::int64_t creates, releases, failed_creates, maps, unmaps;
  bool operator==(const VmmCounts&) const = default;
  friend std::ostream& operator<<(std::ostream& os, const VmmCounts& c) {
    return os << "{creates " << c.creates << ", releases " << c.releases << ", failed creates " << c.failed_creates
              << ", maps " << c.maps << ", unmaps " << c.unmaps << "}";
  }
};
VmmCounts CountsOf(const Backend& backend) {
  const BackendCounters c = backend.counters();
  return {c.physical_creates, c.physical_releases, c.failed_physical_creates, c.maps, c.unmaps};
}

// A pattern of `bytes` that differs for every word and every `seed`.
std::vector<std::uint32_t> Pattern(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::uint32_t> words(bytes / sizeof(std::uint32_t));
  for (std::size_t i = 0; i < words.size(); ++i) {
    words[i] = (0x9E3779B9u * static_cast<std::uint32_t>(i + 1)) ^ seed;
  }
  return words;
}

TEST_F(VmmGpuTest, NameGranularityAndTheCudaBackendsCalls) {
  EXPECT_EQ(backend_->Name(), "vmm");
  EXPECT_EQ(backend_->device(), 0);
  EXPECT_TRUE(backend_->SupportsVirtualMemory());
  std::cout << "vmm minimum granularity on device 0: " << granule_ << " bytes\n";
  ASSERT_GT(granule_, 0u);
  EXPECT_EQ(granule_ & (granule_ - 1), 0u) << granule_ << " is not a power of two";
  EXPECT_EQ(k2MiB % granule_, 0u) << granule_ << " does not divide 2 MiB";

  // Allocate, Free and the events are the cuda backend's.
  absl::StatusOr<void*> p = backend_->Allocate(k2MiB);
  ASSERT_TRUE(p.ok()) << p.status();
  WriteAndVerify(*p, k2MiB, 0x3C);
  ASSERT_TRUE(backend_->Free(*p, k2MiB).ok());
  absl::StatusOr<Event> event = backend_->RecordEvent(nullptr);
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(backend_->SynchronizeEvent(*event).ok());
  backend_->DestroyEvent(*event);
  const BackendCounters counters = backend_->counters();
  EXPECT_EQ(counters.allocs, 1);
  EXPECT_EQ(counters.frees, 1);
  EXPECT_EQ(counters.events_recorded, 1);
  EXPECT_EQ(CountsOf(*backend_), (VmmCounts{0, 0, 0, 0, 0}));
}

TEST_F(VmmGpuTest, AGranuleMovesFromOneRangeToAnotherWithItsData) {
  const std::size_t range = 4 * granule_;
  absl::StatusOr<std::uintptr_t> a = backend_->ReserveAddressRange(range, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::uintptr_t> b = backend_->ReserveAddressRange(range, 2 * range);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a % granule_, 0u);
  EXPECT_EQ(*b % (2 * range), 0u) << "the alignment was not honoured";
  EXPECT_TRUE(*a + range <= *b || *b + range <= *a) << "the two ranges overlap";
  absl::StatusOr<PhysicalHandle> handle = backend_->CreatePhysical(granule_);
  ASSERT_TRUE(handle.ok()) << handle.status();

  // The granule as the second granule of A: write a pattern through A.
  const std::uintptr_t in_a = *a + granule_;
  absl::Status map_a = backend_->Map(in_a, granule_, *handle);
  ASSERT_TRUE(map_a.ok()) << map_a;
  const std::vector<std::uint32_t> pattern = Pattern(granule_, 0xA5A5F00Du);
  ASSERT_CUDA(cudaMemcpy(AsPointer(in_a), pattern.data(), granule_, cudaMemcpyHostToDevice));
  absl::Status unmap_a = backend_->Unmap(in_a, granule_);
  ASSERT_TRUE(unmap_a.ok()) << unmap_a;

  // The same granule as the last granule of B: the pattern reads back through B.
  const std::uintptr_t in_b = *b + range - granule_;
  absl::Status map_b = backend_->Map(in_b, granule_, *handle);
  ASSERT_TRUE(map_b.ok()) << map_b;
  std::vector<std::uint32_t> back(pattern.size());
  ASSERT_CUDA(cudaMemcpy(back.data(), AsPointer(in_b), granule_, cudaMemcpyDeviceToHost));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < back.size(); ++i) mismatches += back[i] != pattern[i];
  EXPECT_EQ(mismatches, 0u) << "words that did not follow the granule from A to B";
  // And the device writes through B.
  ASSERT_CUDA(cudaMemset(AsPointer(in_b), 0x5A, granule_));
  unsigned char last = 0;
  ASSERT_CUDA(cudaMemcpy(&last, AsPointer(in_b + granule_ - 1), 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(last, 0x5A);

  absl::Status unmap_b = backend_->Unmap(in_b, granule_);
  ASSERT_TRUE(unmap_b.ok()) << unmap_b;
  absl::Status release = backend_->ReleasePhysical(*handle);
  ASSERT_TRUE(release.ok()) << release;
  absl::Status free_a = backend_->ReleaseAddressRange(*a, range);
  EXPECT_TRUE(free_a.ok()) << free_a;
  absl::Status free_b = backend_->ReleaseAddressRange(*b, range);
  EXPECT_TRUE(free_b.ok()) << free_b;

  EXPECT_EQ(CountsOf(*backend_), (VmmCounts{1, 1, 0, 2, 2}));
  EXPECT_EQ(backend_->counters().allocs, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// What the stitching large pool does: granules mapped side by side form one block the device
// writes across; they are unmapped one at a time (and, as the Backend contract allows, a range of
// whole mappings at once).
TEST_F(VmmGpuTest, GranulesMappedSideBySideFormOneBlock) {
  constexpr int kGranules = 4;
  const std::size_t range = kGranules * granule_;
  absl::StatusOr<std::uintptr_t> va = backend_->ReserveAddressRange(range, 0);
  ASSERT_TRUE(va.ok()) << va.status();
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < kGranules; ++i) {
    absl::StatusOr<PhysicalHandle> handle = backend_->CreatePhysical(granule_);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
    absl::Status map = backend_->Map(*va + i * granule_, granule_, *handle);
    ASSERT_TRUE(map.ok()) << map;
  }
  WriteAndVerify(AsPointer(*va), range, 0x6B);
  const std::vector<std::uint32_t> pattern = Pattern(2 * granule_, 0x1234u);
  const std::uintptr_t across = *va + granule_ / 2;  // straddles granules 0, 1 and 2
  ASSERT_CUDA(cudaMemcpy(AsPointer(across), pattern.data(), 2 * granule_, cudaMemcpyHostToDevice));
  std::vector<std::uint32_t> back(pattern.size());
  ASSERT_CUDA(cudaMemcpy(back.data(), AsPointer(across), 2 * granule_, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == pattern) << "a copy across granule boundaries did not read back";

  absl::Status two = backend_->Unmap(*va, 2 * granule_);  // two whole mappings in one call
  EXPECT_TRUE(two.ok()) << two;
  for (int i = 2; i < kGranules; ++i) {
    absl::Status unmap = backend_->Unmap(*va + i * granule_, granule_);
    EXPECT_TRUE(unmap.ok()) << unmap;
  }
  for (PhysicalHandle handle : handles) {
    absl::Status release = backend_->ReleasePhysical(handle);
    EXPECT_TRUE(release.ok()) << release;
  }
  absl::Status free_range = backend_->ReleaseAddressRange(*va, range);
  EXPECT_TRUE(free_range.ok()) << free_range;
  EXPECT_EQ(CountsOf(*backend_), (VmmCounts{kGranules, kGranules, 0, kGranules, kGranules - 1}));
}

TEST_F(VmmGpuTest, MisuseAndOutOfMemoryAreTypedErrorsNamingTheCall) {
  // Refused before the driver: sizes off the granularity, an alignment that is not a power of two.
  for (std::size_t bytes : {std::size_t{0}, granule_ + 1}) {
    absl::StatusOr<PhysicalHandle> handle = backend_->CreatePhysical(bytes);
    ASSERT_FALSE(handle.ok());
    EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument) << handle.status();
  }
  absl::StatusOr<std::uintptr_t> odd = backend_->ReserveAddressRange(granule_, 3 * granule_);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument) << odd.status();

  // More physical memory than the device has: ResourceExhausted, and the next create succeeds.
  absl::StatusOr<DeviceMemInfo> info = backend_->GetMemInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::size_t huge = (info->total_bytes / granule_ + 1) * granule_;
  absl::StatusOr<PhysicalHandle> too_big = backend_->CreatePhysical(huge);
  ASSERT_FALSE(too_big.ok()) << "created " << huge << " bytes on a " << info->total_bytes << "-byte device";
  std::cout << "oversized cuMemCreate: " << too_big.status() << "\n";
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_THAT(too_big.status().message(), HasSubstr("cuMemCreate(" + std::to_string(huge) + " bytes"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("device 0"));
  EXPECT_EQ(CountsOf(*backend_), (VmmCounts{0, 0, 3, 0, 0}));

  // Left to the driver: unmapping what is not mapped, mapping an unknown handle.
  absl::StatusOr<std::uintptr_t> va = backend_->ReserveAddressRange(granule_, 0);
  ASSERT_TRUE(va.ok()) << va.status();
  absl::Status unmap = backend_->Unmap(*va, granule_);
  ASSERT_FALSE(unmap.ok()) << "unmapped a range with nothing mapped";
  std::cout << "cuMemUnmap of a bare reservation: " << unmap << "\n";
  EXPECT_THAT(unmap.message(), HasSubstr("cuMemUnmap("));
  EXPECT_THAT(unmap.message(), HasSubstr("device 0"));
  absl::Status map = backend_->Map(*va, granule_, /*handle=*/0);
  ASSERT_FALSE(map.ok()) << "mapped handle 0";
  std::cout << "cuMemMap of handle 0: " << map << "\n";
  EXPECT_THAT(map.message(), HasSubstr("cuMemMap("));
  ExpectDeliberateViolations({"vmm-unmap-whole", "vmm-live-handle"});

  absl::StatusOr<PhysicalHandle> handle = backend_->CreatePhysical(granule_);
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::Status mapped = backend_->Map(*va, granule_, *handle);
  ASSERT_TRUE(mapped.ok()) << mapped;
  WriteAndVerify(AsPointer(*va), granule_, 0x77);
  EXPECT_TRUE(backend_->Unmap(*va, granule_).ok());
  EXPECT_TRUE(backend_->ReleasePhysical(*handle).ok());
  EXPECT_TRUE(backend_->ReleaseAddressRange(*va, granule_).ok());
  EXPECT_EQ(CountsOf(*backend_), (VmmCounts{1, 1, 3, 1, 1}));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a driver error was left as the runtime's last error";
}

// ---------------------------------------------------------------------------------------------
// The allocator through the public API on a real device.

class CudaAllocatorTest : public CudaGpuTest {
 protected:
  void SetUp() override {
    CudaGpuTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    absl::StatusOr<Options> options = ParseOptions("backend:cuda");
    ASSERT_TRUE(options.ok()) << options.status();
    absl::StatusOr<std::unique_ptr<Allocator>> allocator = Allocator::Create(*options);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s1_, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s2_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (s1_ != nullptr) cudaStreamDestroy(s1_);
    if (s2_ != nullptr) cudaStreamDestroy(s2_);
  }

  DeviceStats Stats() {
    absl::StatusOr<DeviceStats> stats = allocator_->GetStats(0);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : DeviceStats();
  }

  std::unique_ptr<Allocator> allocator_;
  cudaStream_t s1_ = nullptr;
  cudaStream_t s2_ = nullptr;
};

struct Live {
  void* ptr;
  std::size_t size;
  cudaStream_t stream;
};

TEST_F(CudaAllocatorTest, MixedSizesOnTwoStreamsThenEmptyCacheReleasesEverything) {
  absl::StatusOr<Backend*> backend = allocator_->backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Name(), "cuda");
  absl::StatusOr<DeviceMemInfo> start = (*backend)->GetMemInfo();
  ASSERT_TRUE(start.ok()) << start.status();

  const std::vector<std::size_t> sizes = {4 * kKiB, 12 * kKiB,      100 * kKiB, 512 * kKiB, kMiB,      kMiB + 1,
                                          3 * kMiB, 7 * kMiB + 123, 20 * kMiB,  64 * kMiB,  256 * kMiB};
  std::vector<Live> live;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      cudaStream_t stream = (i + round) % 2 == 0 ? s1_ : s2_;
      absl::StatusOr<void*> p = allocator_->Allocate(sizes[i], 0, stream);
      ASSERT_TRUE(p.ok()) << sizes[i] << ": " << p.status();
      ASSERT_NE(*p, nullptr);
      EXPECT_EQ(PointerDevice(*p), 0);
      ASSERT_CUDA(cudaMemsetAsync(*p, static_cast<int>(i), sizes[i], stream));
      live.push_back({*p, sizes[i], stream});
    }
    // Free every other live allocation (stream-ordered reuse on the same stream is immediate).
    std::vector<Live> kept;
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 0) {
        ASSERT_TRUE(allocator_->Free(live[i].ptr, 0, live[i].size).ok());
      } else {
        kept.push_back(live[i]);
      }
    }
    live = kept;
    absl::Status invariants = allocator_->CheckInvariants(0);
    ASSERT_TRUE(invariants.ok()) << invariants;
  }

  DeviceStats stats = Stats();
  std::size_t live_bytes = 0;
  for (const Live& l : live) live_bytes += l.size;
  EXPECT_EQ(stats.allocation[kAllPools].current, static_cast<std::int64_t>(live.size()));
  EXPECT_EQ(stats.requested_bytes[kAllPools].current, static_cast<std::int64_t>(live_bytes));
  EXPECT_GE(stats.allocated_bytes[kAllPools].current, stats.requested_bytes[kAllPools].current);
  EXPECT_GE(stats.reserved_bytes[kAllPools].current, stats.allocated_bytes[kAllPools].current);
  EXPECT_GT(stats.num_device_alloc, 0);

  // Read back one byte of every live block once the streams are done.
  ASSERT_CUDA(cudaStreamSynchronize(s1_));
  ASSERT_CUDA(cudaStreamSynchronize(s2_));
  for (const Live& l : live) {
    unsigned char byte = 0xFF;
    ASSERT_CUDA(cudaMemcpy(&byte, static_cast<char*>(l.ptr) + l.size - 1, 1, cudaMemcpyDeviceToHost));
    std::size_t index = 0;
    while (index < sizes.size() && sizes[index] != l.size) ++index;
    EXPECT_EQ(byte, index) << "block of " << l.size << " bytes";
  }

  for (const Live& l : live) ASSERT_TRUE(allocator_->Free(l.ptr, 0, l.size).ok());
  absl::Status invariants = allocator_->CheckInvariants(0);
  ASSERT_TRUE(invariants.ok()) << invariants;
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  invariants = allocator_->CheckInvariants(0);
  ASSERT_TRUE(invariants.ok()) << invariants;

  stats = Stats();
  EXPECT_EQ(stats.allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(stats.reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(stats.segment[kAllPools].current, 0);
  EXPECT_EQ(stats.num_device_alloc, stats.num_device_free);
  BackendCounters counters = (*backend)->counters();
  EXPECT_EQ(counters.allocs, counters.frees);
  absl::StatusOr<DeviceMemInfo> end = (*backend)->GetMemInfo();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_GE(end->free_bytes + 256 * kMiB, start->free_bytes)
      << "memory was not given back to the device: start " << start->free_bytes << ", end " << end->free_bytes;
}

// A host callback that holds its stream until the test opens the gate (or 60 s pass, so that a
// broken test cannot hang the stream forever).
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
};
void CUDART_CB WaitForGate(void* arg) {
  auto* gate = static_cast<Gate*>(arg);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!gate->open.load()) {
    if (std::chrono::steady_clock::now() > deadline) {
      gate->timed_out.store(true);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}
// Opens the gate and waits for the stream on every exit (also a failed ASSERT), so that the
// callback never outlives the gate and no work is left blocked.
struct OpenOnExit {
  Gate& gate;
  cudaStream_t stream;
  ~OpenOnExit() {
    gate.open.store(true);
    cudaStreamSynchronize(stream);
  }
};

TEST_F(CudaAllocatorTest, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  constexpr std::size_t kSize = 48 * kMiB;
  absl::StatusOr<void*> q = allocator_->Allocate(kSize, 0, s1_);
  ASSERT_TRUE(q.ok()) << q.status();
  // A second block of the same size, cached: while s2 is held the allocator needs no cudaMalloc
  // (which could wait for the device) and has an exact fit other than q to hand out.
  absl::StatusOr<void*> spare = allocator_->Allocate(kSize, 0, s1_);
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_NE(*spare, *q);
  ASSERT_CUDA(cudaMemsetAsync(*q, 1, kSize, s1_));
  ASSERT_CUDA(cudaStreamSynchronize(s1_));
  ASSERT_TRUE(allocator_->Free(*spare, 0, kSize).ok());
  {
    Gate gate;
    OpenOnExit open_on_exit{gate, s2_};
    // s2 is held by the gate, then uses q: q must not be reused on s1 before that work runs.
    ASSERT_CUDA(cudaLaunchHostFunc(s2_, WaitForGate, &gate));
    ASSERT_CUDA(cudaMemsetAsync(*q, 2, kSize, s2_));
    ASSERT_TRUE(allocator_->RecordStream(*q, 0, s2_).ok());
    ASSERT_TRUE(allocator_->Free(*q, 0, kSize).ok());
    DeviceStats stats = Stats();
    EXPECT_GE(stats.active_bytes[kAllPools].current, static_cast<std::int64_t>(kSize))
        << "the freed block awaiting s2 should still be active";
    absl::StatusOr<void*> r = allocator_->Allocate(kSize, 0, s1_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(*r, *q) << "reused a block whose RecordStream work is still pending";
    EXPECT_EQ(*r, *spare) << "the cached exact fit was not used";
    absl::Status invariants = allocator_->CheckInvariants(0);
    EXPECT_TRUE(invariants.ok()) << invariants;
    EXPECT_FALSE(gate.timed_out.load()) << "s2 was released by the 60 s safety timeout";
    gate.open.store(true);
    ASSERT_CUDA(cudaStreamSynchronize(s2_));
    // Now the block of q is free again and is the only cached fit for the same size.
    absl::StatusOr<void*> again = allocator_->Allocate(kSize, 0, s1_);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *q) << "the block was not reused after the recorded stream's work ended";
    unsigned char byte = 0;
    ASSERT_CUDA(cudaMemcpy(&byte, static_cast<char*>(*again) + kSize - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(byte, 2) << "s2's write was not complete when the block was handed out";
    ASSERT_TRUE(allocator_->Free(*again, 0, kSize).ok());
    ASSERT_TRUE(allocator_->Free(*r, 0, kSize).ok());
  }
  absl::Status invariants = allocator_->CheckInvariants(0);
  ASSERT_TRUE(invariants.ok()) << invariants;
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  DeviceStats stats = Stats();
  EXPECT_EQ(stats.reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(stats.active_bytes[kAllPools].current, 0);
}

// ---------------------------------------------------------------------------------------------
// The allocator with backend:vmm: the large pool's segments are reserved ranges with granules
// mapped in them, and at the cap free granules are stitched into new blocks.

// Makes an allocator from `conf`, or fails the test.
std::unique_ptr<Allocator> MakeAllocator(absl::string_view conf) {
  absl::StatusOr<Options> options = ParseOptions(conf);
  EXPECT_TRUE(options.ok()) << conf << ": " << options.status();
  if (!options.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Allocator>> allocator = Allocator::Create(*options);
  EXPECT_TRUE(allocator.ok()) << conf << ": " << allocator.status();
  return allocator.ok() ? std::move(*allocator) : nullptr;
}

// Checks that the allocator gave everything back: no reserved bytes, and every granule created
// was released and every map undone.
void ExpectAllReleased(Allocator& allocator) {
  absl::Status invariants = allocator.CheckInvariants(0);
  EXPECT_TRUE(invariants.ok()) << invariants;
  ASSERT_TRUE(allocator.EmptyCache().ok());
  absl::StatusOr<DeviceStats> stats = allocator.GetStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(stats->reserved_bytes[kAllPools].current, 0);
  absl::StatusOr<Backend*> backend = allocator.backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const BackendCounters counters = (*backend)->counters();
  std::cout << "vmm backend calls: " << counters.physical_creates << " creates, " << counters.maps << " maps, "
            << counters.unmaps << " unmaps, " << counters.allocs << " cudaMalloc\n";
  EXPECT_GT(counters.maps, 0) << "the large pool did not use the virtual-memory family";
  EXPECT_EQ(counters.physical_creates, counters.physical_releases);
  EXPECT_EQ(counters.address_reserves, counters.address_releases) << "every reservation freed, so nothing is mapped";
  EXPECT_EQ(counters.allocs, counters.frees);
}

TEST_F(CudaGpuTest, AllocatorWithVmmBackendServesLargeBlocksWithTheirData) {
  std::unique_ptr<Allocator> allocator = MakeAllocator("backend:vmm");
  ASSERT_NE(allocator, nullptr);
  absl::StatusOr<Backend*> backend = allocator->backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Name(), "vmm");

  const std::vector<std::size_t> sizes = {64 * kMiB, 100 * kMiB + 1, 512 * kMiB, 20 * kMiB, 3 * kMiB, 4 * kKiB};
  std::vector<void*> ptrs;
  unsigned char value = 0x21;
  for (std::size_t size : sizes) {
    absl::StatusOr<void*> p = allocator->Allocate(size, 0, nullptr);
    ASSERT_TRUE(p.ok()) << size << ": " << p.status();
    EXPECT_EQ(PointerDevice(*p), 0);
    WriteAndVerify(*p, size, value++);
    ptrs.push_back(*p);
  }
  // The first blocks still hold their bytes after the later ones were written.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    unsigned char byte = 0;
    ASSERT_CUDA(cudaMemcpy(&byte, static_cast<char*>(ptrs[i]) + sizes[i] - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(byte, 0x21 + i) << "block of " << sizes[i] << " bytes";
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) ASSERT_TRUE(allocator->Free(ptrs[i], 0, sizes[i]).ok());
  // Reuse from the cache, then a size the cache does not hold.
  for (std::size_t size : {64 * kMiB, 640 * kMiB}) {
    absl::StatusOr<void*> p = allocator->Allocate(size, 0, nullptr);
    ASSERT_TRUE(p.ok()) << size << ": " << p.status();
    WriteAndVerify(*p, size, 0x4D);
    ASSERT_TRUE(allocator->Free(*p, 0, size).ok());
  }
  ExpectAllReleased(*allocator);
}

TEST_F(CudaGpuTest, AllocatorWithVmmBackendStitchesFreeGranulesAtTheCap) {
  // Four 64 MiB segments fill the 256 MiB cap; with two non-adjacent ones freed, a 128 MiB request
  // fits only in their granules, mapped side by side into a new range.
  std::unique_ptr<Allocator> allocator = MakeAllocator("backend:vmm,capacity:256MiB");
  ASSERT_NE(allocator, nullptr);
  constexpr std::size_t kBlock = 64 * kMiB;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<void*> p = allocator->Allocate(kBlock, 0, nullptr);
    ASSERT_TRUE(p.ok()) << "block " << i << ": " << p.status();
    ASSERT_CUDA(cudaMemset(*p, 0x10 + i, kBlock));
    blocks.push_back(*p);
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE(allocator->Free(blocks[0], 0, kBlock).ok());
  ASSERT_TRUE(allocator->Free(blocks[2], 0, kBlock).ok());

  absl::StatusOr<void*> big = allocator->Allocate(2 * kBlock, 0, nullptr);
  ASSERT_TRUE(big.ok()) << "128 MiB under a 256 MiB cap with 128 MiB free: " << big.status();
  WriteAndVerify(*big, 2 * kBlock, 0x99);
  // The live blocks kept their bytes (the granules taken were the freed blocks' only).
  for (int i : {1, 3}) {
    std::vector<unsigned char> host(kMiB);
    for (std::size_t offset : {std::size_t{0}, kBlock - kMiB}) {
      ASSERT_CUDA(cudaMemcpy(host.data(), static_cast<char*>(blocks[i]) + offset, kMiB, cudaMemcpyDeviceToHost));
      std::size_t wrong = 0;
      for (unsigned char byte : host) wrong += byte != 0x10 + i;
      EXPECT_EQ(wrong, 0u) << "block " << i << " at offset " << offset;
    }
  }
  absl::StatusOr<DeviceStats> stats = allocator->GetStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_LE(stats->reserved_bytes[kAllPools].current, static_cast<std::int64_t>(4 * kBlock));
  absl::Status invariants = allocator->CheckInvariants(0);
  EXPECT_TRUE(invariants.ok()) << invariants;

  ASSERT_TRUE(allocator->Free(*big, 0, 2 * kBlock).ok());
  ASSERT_TRUE(allocator->Free(blocks[1], 0, kBlock).ok());
  ASSERT_TRUE(allocator->Free(blocks[3], 0, kBlock).ok());
  ExpectAllReleased(*allocator);
}

// The Backend contract (tests/backend/backend_conformance.h) on both CUDA backends. Without a GPU
// every case is skipped with the reason (a failure under BUCKETALLOC_EXPECT_GPU=1).
struct CudaTraits {
  static constexpr const char* kName = "cuda";
  static constexpr bool kNeedsGpu = true;
#ifdef BUCKETALLOC_CUDA_DOUBLE
  static constexpr bool kHostAccessible = true;  // the double's device memory is host memory
#else
  static constexpr bool kHostAccessible = false;
#endif
  static BackendSettings Settings() { return {}; }
};
struct VmmTraits {
  static constexpr const char* kName = "vmm";
  static constexpr bool kNeedsGpu = true;
#ifdef BUCKETALLOC_CUDA_DOUBLE
  static constexpr bool kHostAccessible = true;  // the double's device memory is host memory
#else
  static constexpr bool kHostAccessible = false;
#endif
  static BackendSettings Settings() { return {}; }
};

}  // namespace
}  // namespace bucketalloc

namespace bucketalloc::testing {
BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(Cuda, ::bucketalloc::CudaTraits);
BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(Vmm, ::bucketalloc::VmmTraits);
}  // namespace bucketalloc::testing

#ifdef BUCKETALLOC_CUDA_DOUBLE
// On the CUDA double (tests/cuda_double): every CUDA call of every test is checked against CUDA's
// rules; the run fails if any was broken, naming the test and the rule.
namespace {

class LabelViolations : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& test) override {
    cudadouble_set_label((std::string(test.test_suite_name()) + "." + test.name()).c_str());
  }
};

class NoRuleBroken : public ::testing::Environment {
 public:
  void TearDown() override {
    EXPECT_EQ(cudadouble_violation_count(), 0) << "CUDA rules broken:\n" << cudadouble_violations();
  }
};

const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new LabelViolations);
  ::testing::AddGlobalTestEnvironment(new NoRuleBroken);
  return true;
}();

}  // namespace
#endif  // BUCKETALLOC_CUDA_DOUBLE
