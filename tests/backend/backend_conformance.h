// tests/backend/backend_conformance.h — the contract of bucketalloc/backend.h, as one typed suite
// that every backend instantiates (RMM's and Scudo's typed-suite pattern):
//   BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(Name, Traits)
// where Traits has
//   static constexpr const char* kName;          // the backend's registry name
//   static constexpr bool kNeedsGpu;             // true: made without a GPU it is skipped, loudly
//                                                // (a failure with BUCKETALLOC_EXPECT_GPU=1)
//   static constexpr bool kHostAccessible;       // its memory can be read and written by the CPU
//   static BackendSettings Settings();           // its BUCKETALLOC_CONF keys (may be empty)
// The backend is made through the registry (src/backend/registry.h), as the allocator makes it.
// Instantiations: the simulated device (tests/backend/backend_conformance_test.cc), cuda and vmm
// (tests/cuda/cuda_backend_test.cc, which scripts/gpu_check.sh runs on a GPU).
#ifndef BUCKETALLOC_TESTS_BACKEND_BACKEND_CONFORMANCE_H_
#define BUCKETALLOC_TESTS_BACKEND_BACKEND_CONFORMANCE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "backend/registry.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/units.h"

namespace bucketalloc::testing {

// True when scripts/gpu_check.sh runs the tests: a backend that needs a GPU must then be made.
inline bool ExpectGpu() {
  const char* value = std::getenv("BUCKETALLOC_EXPECT_GPU");
  return value != nullptr && *value != '\0' && absl::string_view(value) != "0";
}

template <typename Traits>
class BackendConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    entry_ = internal::FindBackend(Traits::kName);
    ASSERT_NE(entry_, nullptr) << "backend '" << Traits::kName << "' is not in the registry";
    absl::StatusOr<std::unique_ptr<Backend>> made = entry_->make(Traits::Settings(), /*device=*/0);
    if (!made.ok() && Traits::kNeedsGpu && !ExpectGpu()) {
      GTEST_SKIP() << "SKIPPED LOUDLY: backend '" << Traits::kName << "' needs a GPU and none is usable here ("
                   << made.status() << "); scripts/gpu_check.sh runs this suite on a GPU";
    }
    ASSERT_TRUE(made.ok()) << made.status();
    backend_ = std::move(*made);
    granule_ = backend_->Granularity();
  }
  void TearDown() override {
    if (backend_ == nullptr) return;
    // Every test gives back what it took: the backend's counters balance.
    const BackendCounters c = backend_->counters();
    EXPECT_EQ(c.allocs, c.frees) << "the test leaked an allocation";
    EXPECT_EQ(c.alloc_bytes, c.free_bytes);
    EXPECT_EQ(c.physical_creates, c.physical_releases) << "the test leaked a granule";
    EXPECT_EQ(c.physical_imports, c.imported_releases) << "the test leaked an imported handle";
  }

  const internal::BackendEntry* entry_ = nullptr;
  std::unique_ptr<Backend> backend_;
  std::size_t granule_ = 0;
};

TYPED_TEST_SUITE_P(BackendConformanceTest);

// Name() is the registry name; device() the device it was made for; the granularity is a power of
// two that divides 2 MiB (the allocator's slabs and segment sizes are 2 MiB multiples).
TYPED_TEST_P(BackendConformanceTest, NamesItselfAndHasAGranularityThatDivides2MiB) {
  EXPECT_EQ(this->backend_->Name(), TypeParam::kName);
  EXPECT_EQ(this->backend_->device(), 0);
  EXPECT_GT(this->granule_, 0u);
  EXPECT_EQ(this->granule_ & (this->granule_ - 1), 0u);
  EXPECT_EQ((2 * kMiB) % this->granule_, 0u);
  absl::StatusOr<int> devices = this->entry_->device_count(TypeParam::Settings());
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_GE(*devices, 1);
}

// Allocate takes a positive multiple of the granularity; anything else is InvalidArgument, counted
// as a failed allocation, and takes nothing.
TYPED_TEST_P(BackendConformanceTest, AllocateRefusesSizesThatAreNotGranuleMultiples) {
  for (std::size_t bytes : {std::size_t{0}, this->granule_ + 512}) {
    const BackendCounters before = this->backend_->counters();
    absl::StatusOr<void*> p = this->backend_->Allocate(bytes);
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << bytes << ": " << p.status();
    const BackendCounters after = this->backend_->counters();
    EXPECT_EQ(after.failed_allocs, before.failed_allocs + 1);
    EXPECT_EQ(after.allocs, before.allocs);
  }
}

// Allocate and Free count calls and bytes; distinct allocations do not overlap.
TYPED_TEST_P(BackendConformanceTest, AllocateAndFreeCountCallsAndBytes) {
  const std::size_t sizes[] = {this->granule_, 2 * kMiB, 6 * kMiB};
  std::vector<std::pair<std::uintptr_t, std::size_t>> held;
  const BackendCounters before = this->backend_->counters();
  for (std::size_t bytes : sizes) {
    absl::StatusOr<void*> p = this->backend_->Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_NE(*p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % 256, 0u) << "CUDA allocations are at least 256-byte aligned";
    held.emplace_back(reinterpret_cast<std::uintptr_t>(*p), bytes);
  }
  for (std::size_t i = 0; i < held.size(); ++i) {
    for (std::size_t j = i + 1; j < held.size(); ++j) {
      EXPECT_TRUE(held[i].first + held[i].second <= held[j].first || held[j].first + held[j].second <= held[i].first)
          << "allocations " << i << " and " << j << " overlap";
    }
  }
  BackendCounters mid = this->backend_->counters();
  EXPECT_EQ(mid.allocs, before.allocs + 3);
  EXPECT_EQ(mid.alloc_bytes, before.alloc_bytes + static_cast<std::int64_t>(this->granule_ + 8 * kMiB));
  for (auto [ptr, bytes] : held) ASSERT_TRUE(this->backend_->Free(reinterpret_cast<void*>(ptr), bytes).ok());
  const BackendCounters after = this->backend_->counters();
  EXPECT_EQ(after.frees, before.frees + 3);
  EXPECT_EQ(after.free_bytes - before.free_bytes, mid.alloc_bytes - before.alloc_bytes);
}

// More than the device has is ResourceExhausted (the allocator's cue to release and retry), and
// the backend serves the next allocation.
TYPED_TEST_P(BackendConformanceTest, MoreThanTheDeviceHasIsResourceExhausted) {
  absl::StatusOr<DeviceMemInfo> info = this->backend_->GetMemInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->total_bytes, 0u);
  EXPECT_LE(info->free_bytes, info->total_bytes);
  const std::size_t too_much = (info->total_bytes / this->granule_ + 1) * this->granule_;
  absl::StatusOr<void*> p = this->backend_->Allocate(too_much);
  EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  absl::StatusOr<void*> q = this->backend_->Allocate(this->granule_);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(this->backend_->Free(*q, this->granule_).ok());
}

// An event recorded on a stream with no pending work completes; a synchronized one has completed;
// destroyed events are recycled or freed, and IsCapturing is false outside captures.
TYPED_TEST_P(BackendConformanceTest, EventsCompleteWhenTheirStreamsWorkHas) {
  const BackendCounters before = this->backend_->counters();
  absl::StatusOr<Event> e = this->backend_->RecordEvent(nullptr);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(this->backend_->SynchronizeEvent(*e).ok());
  absl::StatusOr<bool> done = this->backend_->QueryEvent(*e);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  this->backend_->DestroyEvent(*e);
  EXPECT_EQ(this->backend_->counters().events_recorded, before.events_recorded + 1);
  absl::StatusOr<bool> capturing = this->backend_->IsCapturing(nullptr);
  ASSERT_TRUE(capturing.ok()) << capturing.status();
  EXPECT_FALSE(*capturing);
  EXPECT_TRUE(this->backend_->SynchronizeDevice().ok());
}

// Without virtual memory every call of the family is Unimplemented naming the backend; with it,
// a range takes granules mapped side by side, and everything is given back in order.
TYPED_TEST_P(BackendConformanceTest, VirtualMemoryFamilyIsAllOrNothing) {
  Backend& b = *this->backend_;
  const std::size_t g = this->granule_;
  if (!b.SupportsVirtualMemory()) {
    for (absl::Status s : {b.ReserveAddressRange(2 * g, g).status(), b.CreatePhysical(g).status()}) {
      EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), TypeParam::kName)) << s;
    }
    return;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(b.ReserveAddressRange(g + 512, g).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b.CreatePhysical(g + 512).status()));
  absl::StatusOr<std::uintptr_t> va = b.ReserveAddressRange(2 * g, g);
  ASSERT_TRUE(va.ok()) << va.status();
  EXPECT_EQ(*va % g, 0u) << "a range is granule-aligned";
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<PhysicalHandle> h = b.CreatePhysical(g);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_NE(*h, 0u) << "a handle is never 0";
    handles.push_back(*h);
    ASSERT_TRUE(b.Map(*va + static_cast<std::uintptr_t>(i) * g, g, *h).ok());
  }
  if (TypeParam::kHostAccessible) {
    std::memset(reinterpret_cast<void*>(*va), 0x5a, 2 * g);  // the two granules are one range
    EXPECT_EQ(reinterpret_cast<const unsigned char*>(*va)[2 * g - 1], 0x5a);
  }
  BackendCounters c = b.counters();
  EXPECT_EQ(c.maps, 2);
  ASSERT_TRUE(b.Unmap(*va, 2 * g).ok()) << "one unmap of whole mappings";
  for (PhysicalHandle h : handles) ASSERT_TRUE(b.ReleasePhysical(h).ok());
  ASSERT_TRUE(b.ReleaseAddressRange(*va, 2 * g).ok());
  c = b.counters();
  EXPECT_EQ(c.physical_creates, 2);
  EXPECT_EQ(c.physical_releases, 2);
  EXPECT_EQ(c.unmaps, 1);
}

// A granule moved from one range to another keeps its bytes (what stitching relies on).
TYPED_TEST_P(BackendConformanceTest, AGranuleRemappedKeepsItsBytes) {
  Backend& b = *this->backend_;
  if (!b.SupportsVirtualMemory() || !TypeParam::kHostAccessible) {
    GTEST_SKIP() << "backend '" << TypeParam::kName << "' has no host-visible virtual memory: "
                 << (b.SupportsVirtualMemory() ? "its data is checked on the GPU by cuda_backend_test (VmmGpuTest)"
                                               : "it has no virtual memory (see VirtualMemoryFamilyIsAllOrNothing)");
  }
  const std::size_t g = this->granule_;
  absl::StatusOr<std::uintptr_t> a = b.ReserveAddressRange(g, g);
  absl::StatusOr<std::uintptr_t> z = b.ReserveAddressRange(g, g);
  absl::StatusOr<PhysicalHandle> h = b.CreatePhysical(g);
  ASSERT_TRUE(a.ok() && z.ok() && h.ok());
  ASSERT_TRUE(b.Map(*a, g, *h).ok());
  std::memset(reinterpret_cast<void*>(*a), 0xc3, g);
  ASSERT_TRUE(b.Unmap(*a, g).ok());
  ASSERT_TRUE(b.Map(*z, g, *h).ok());
  const auto* bytes = reinterpret_cast<const unsigned char*>(*z);
  EXPECT_EQ(bytes[0], 0xc3);
  EXPECT_EQ(bytes[g - 1], 0xc3);
  ASSERT_TRUE(b.Unmap(*z, g).ok());
  ASSERT_TRUE(b.ReleasePhysical(*h).ok());
  ASSERT_TRUE(b.ReleaseAddressRange(*a, g).ok());
  ASSERT_TRUE(b.ReleaseAddressRange(*z, g).ok());
}

// IPC of virtual memory is the vmm backend's alone: every other backend (sim, cuda) reports
// Unimplemented naming itself. On vmm, an exported handle (one descriptor, however often asked)
// imports, through a duplicate of the descriptor, as a second handle of the same memory, counted
// apart from the creates; both are released.
TYPED_TEST_P(BackendConformanceTest, OnlyTheVmmBackendSharesPhysicalAllocations) {
  Backend& b = *this->backend_;
  if (absl::string_view(TypeParam::kName) != "vmm") {
    for (absl::Status s : {b.ExportPhysical(1).status(), b.ImportPhysical(0).status()}) {
      EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), TypeParam::kName)) << s;
    }
    return;
  }
  const std::size_t g = this->granule_;
  absl::StatusOr<PhysicalHandle> h = b.CreatePhysical(g);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<int> fd = b.ExportPhysical(*h);
  if (absl::IsFailedPrecondition(fd.status())) {
    ASSERT_TRUE(b.ReleasePhysical(*h).ok());
    GTEST_SKIP() << "SKIPPED LOUDLY: this device creates no shareable handles: " << fd.status();
  }
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::StatusOr<int> again = b.ExportPhysical(*h);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *fd) << "one descriptor per handle";
  // A duplicate names the same open file, as the importing process's pidfd_getfd does
  // (tests/cuda_double/vmm_ipc_double_test.cc takes that path).
  const int dup_fd = dup(*fd);
  ASSERT_GE(dup_fd, 0) << std::strerror(errno);
  absl::StatusOr<PhysicalHandle> imported = b.ImportPhysical(dup_fd);
  close(dup_fd);  // the caller's: the imported handle does not need it
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_NE(*imported, 0u);
  if (TypeParam::kHostAccessible) {
    absl::StatusOr<std::uintptr_t> a = b.ReserveAddressRange(g, g);
    absl::StatusOr<std::uintptr_t> z = b.ReserveAddressRange(g, g);
    ASSERT_TRUE(a.ok() && z.ok());
    ASSERT_TRUE(b.Map(*a, g, *h).ok());
    ASSERT_TRUE(b.Map(*z, g, *imported).ok());
    std::memset(reinterpret_cast<void*>(*a), 0x3e, g);
    EXPECT_EQ(reinterpret_cast<const unsigned char*>(*z)[g - 1], 0x3e) << "the import is the same memory";
    ASSERT_TRUE(b.Unmap(*a, g).ok());
    ASSERT_TRUE(b.Unmap(*z, g).ok());
    ASSERT_TRUE(b.ReleaseAddressRange(*a, g).ok());
    ASSERT_TRUE(b.ReleaseAddressRange(*z, g).ok());
  }
  ASSERT_TRUE(b.ReleasePhysical(*imported).ok());
  ASSERT_TRUE(b.ReleasePhysical(*h).ok());
  const BackendCounters c = b.counters();
  EXPECT_EQ(c.physical_creates, 1);
  EXPECT_EQ(c.physical_releases, 1);
  EXPECT_EQ(c.physical_imports, 1);
  EXPECT_EQ(c.imported_releases, 1);
}

REGISTER_TYPED_TEST_SUITE_P(BackendConformanceTest, NamesItselfAndHasAGranularityThatDivides2MiB,
                            AllocateRefusesSizesThatAreNotGranuleMultiples, AllocateAndFreeCountCallsAndBytes,
                            MoreThanTheDeviceHasIsResourceExhausted, EventsCompleteWhenTheirStreamsWorkHas,
                            VirtualMemoryFamilyIsAllOrNothing, AGranuleRemappedKeepsItsBytes,
                            OnlyTheVmmBackendSharesPhysicalAllocations);

}  // namespace bucketalloc::testing

#define BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(name, traits) \
  INSTANTIATE_TYPED_TEST_SUITE_P(name, BackendConformanceTest, ::testing::Types<traits>)

#endif  // BUCKETALLOC_TESTS_BACKEND_BACKEND_CONFORMANCE_H_
