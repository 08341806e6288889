// The public API over every test configuration (tests/test_util.h): round trips, stream ordering,
// RecordStream, EmptyCache, devices, and every kind of bad input.
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::MakeAllocator;
using ::bucketalloc::testing::TestStream;

class AllocatorTest : public ::bucketalloc::testing::ConfiguredAllocatorTest {
 protected:
  void TearDown() override {
    if (HasFailure() && allocator_ != nullptr) std::cerr << *allocator_->Summary(0);
  }
  void ExpectConsistent(int device = 0) {
    absl::Status s = allocator_->CheckInvariants(device);
    EXPECT_TRUE(s.ok()) << s;
  }
  // Sizes that fit every configuration (the tiny one caps at 64 MiB).
  static std::vector<std::size_t> Sizes() {
    return {1, 511, 512, 4097, 100000, kMiB, kMiB + 1, 3 * kMiB, 9 * kMiB + 7, 25 * kMiB};
  }
};

TEST_P(AllocatorTest, RoundTripAndStats) {
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t requested = 0;
  for (std::size_t size : Sizes()) {
    absl::StatusOr<void*> p = allocator_->Allocate(size, 0, nullptr);
    ASSERT_TRUE(p.ok()) << size << ": " << p.status();
    ASSERT_NE(*p, nullptr);
    std::memset(*p, 0x5a, size);  // the whole request is usable memory
    live.emplace_back(*p, size);
    requested += size;
  }
  DeviceStats s = Stats();
  EXPECT_EQ(s.requested_bytes[kAllPools].current, static_cast<std::int64_t>(requested));
  EXPECT_GE(s.allocated_bytes[kAllPools].current, s.requested_bytes[kAllPools].current);
  EXPECT_GE(s.reserved_bytes[kAllPools].current, s.allocated_bytes[kAllPools].current);
  EXPECT_EQ(s.allocation[kAllPools].current, static_cast<std::int64_t>(live.size()));
  EXPECT_EQ(s.allocation[kSmallPool].current, 6);  // sizes up to 1 MiB
  ExpectConsistent();
  for (auto [p, size] : live) ASSERT_TRUE(allocator_->Free(p, 0, size).ok());
  s = Stats();
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 0);
  EXPECT_EQ(s.active_bytes[kAllPools].current, 0);
  EXPECT_EQ(s.cached_bytes[kAllPools].current, s.reserved_bytes[kAllPools].current);
  EXPECT_EQ(s.requested_bytes[kAllPools].peak, static_cast<std::int64_t>(requested));
  ExpectConsistent();
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  s = Stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(s.num_device_alloc, s.num_device_free);
  ExpectConsistent();
}

TEST_P(AllocatorTest, CacheHitReusesTheFreedBlock) {
  for (std::size_t size : Sizes()) {
    void* p = *allocator_->Allocate(size);
    ASSERT_TRUE(allocator_->Free(p).ok());
    const DeviceStats before = Stats();
    void* q = *allocator_->Allocate(size);
    EXPECT_EQ(q, p) << size;
    const DeviceStats after = Stats();
    EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1) << size;
    EXPECT_EQ(after.num_device_alloc, before.num_device_alloc) << size;
    ASSERT_TRUE(allocator_->Free(q).ok());
  }
  ExpectConsistent();
}

TEST_P(AllocatorTest, SizeZeroReturnsNullAndFreeOfNullIsANoOp) {
  absl::StatusOr<void*> p = allocator_->Allocate(0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, nullptr);
  EXPECT_TRUE(allocator_->Free(nullptr).ok());
  EXPECT_EQ(Stats().allocation[kAllPools].allocated, 0);
}

TEST_P(AllocatorTest, StreamOrderedReuse) {
  Stream a = TestStream(1), b = TestStream(2);
  void* p = *allocator_->Allocate(3 * kMiB, 0, a);
  ASSERT_TRUE(allocator_->Free(p).ok());
  // Another stream does not get the block freed on stream a...
  void* q = *allocator_->Allocate(3 * kMiB, 0, b);
  EXPECT_NE(q, p);
  // ...the same stream gets it at once.
  void* r = *allocator_->Allocate(3 * kMiB, 0, a);
  EXPECT_EQ(r, p);
  for (void* x : {q, r}) ASSERT_TRUE(allocator_->Free(x).ok());
  ExpectConsistent();
}

TEST_P(AllocatorTest, RecordStreamDefersReuseUntilTheStreamsWorkCompletes) {
  SimBackend* sim = AsSim(*allocator_->backend(0));
  ASSERT_NE(sim, nullptr);
  Stream a = TestStream(1), b = TestStream(2);
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    void* p = *allocator_->Allocate(size, 0, a);
    ASSERT_TRUE(allocator_->RecordStream(p, 0, b).ok());
    ASSERT_TRUE(allocator_->RecordStream(p, 0, a).ok());  // the allocation stream: nothing to do
    sim->EnqueueWork(b);                                  // a kernel on b still reads p
    ASSERT_TRUE(allocator_->Free(p).ok());
    DeviceStats s = Stats();
    EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0);
    EXPECT_GT(s.active_bytes[kAllPools].current, 0);  // pending, not reusable
    ExpectConsistent();
    void* q = *allocator_->Allocate(size, 0, a);
    EXPECT_NE(q, p) << "reused while stream b may still use it";
    sim->CompleteWork(b);
    ASSERT_TRUE(allocator_->Free(q).ok());  // frees poll the pending events
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0);
    void* r1 = *allocator_->Allocate(size, 0, a);
    void* r2 = *allocator_->Allocate(size, 0, a);
    EXPECT_TRUE(r1 == p || r2 == p) << size;  // the block is reusable again
    ASSERT_TRUE(allocator_->Free(r1).ok());
    ASSERT_TRUE(allocator_->Free(r2).ok());
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0);
    ExpectConsistent();
  }
}

TEST_P(AllocatorTest, BadFreesAreRejectedAndLeaveTheStateUntouched) {
  void* p = *allocator_->Allocate(5 * kMiB);
  void* small = *allocator_->Allocate(1000);
  std::memset(p, 0x77, 5 * kMiB);
  const std::string before = StatsToJson(Stats());
  auto expect_invalid = [&](absl::Status s, absl::string_view needle) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), needle)) << s.message();
  };
  int local = 0;
  expect_invalid(allocator_->Free(&local), "not allocated by bucketalloc");
  expect_invalid(allocator_->Free(static_cast<char*>(p) + 4096), "pointer into a block");
  expect_invalid(allocator_->Free(p, 0, 5 * kMiB + 1), "size mismatch");
  expect_invalid(allocator_->Free(small, 0, 999), "size mismatch");
  expect_invalid(allocator_->RecordStream(&local, 0, TestStream(3)), "no live allocation");
  // A null pointer is no live block (the live map's empty key is 0: it once matched an empty slot).
  expect_invalid(allocator_->RecordStream(nullptr, TestStream(3)), "not a live allocation");
  expect_invalid(allocator_->RecordStream(nullptr, 0, TestStream(3)), "no live allocation");
  expect_invalid(allocator_->BaseAllocation(nullptr).status(), "not a live allocation");
  EXPECT_FALSE(allocator_->DeviceOf(nullptr).ok());
  expect_invalid(allocator_->Free(p, 7), "device 7 is invalid");
  expect_invalid(allocator_->Allocate(kMaxRequestBytes + 1).status(), "is invalid");
  expect_invalid(allocator_->Allocate(static_cast<std::size_t>(-1)).status(), "negative");
  expect_invalid(allocator_->Allocate(10, -1).status(), "device -1 is invalid");
  // Nothing changed but the count of rejected frees.
  DeviceStats now = Stats();
  EXPECT_EQ(now.num_invalid_frees, 4);
  now.num_invalid_frees = 0;
  EXPECT_EQ(StatsToJson(now), before);
  EXPECT_EQ(static_cast<unsigned char*>(p)[5 * kMiB - 1], 0x77);
  ExpectConsistent();
  ASSERT_TRUE(allocator_->Free(p, 0, 5 * kMiB).ok());
  ASSERT_TRUE(allocator_->Free(small, 0, 1000).ok());
  expect_invalid(allocator_->Free(p), "double free");
  expect_invalid(allocator_->Free(small), "double free");
  ExpectConsistent();
}

TEST_P(AllocatorTest, PeakStatsReset) {
  void* p = *allocator_->Allocate(3 * kMiB);
  ASSERT_TRUE(allocator_->Free(p).ok());
  EXPECT_GT(Stats().allocated_bytes[kAllPools].peak, 0);
  ASSERT_TRUE(allocator_->ResetPeakStats(0).ok());
  EXPECT_EQ(Stats().allocated_bytes[kAllPools].peak, 0);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].peak, Stats().reserved_bytes[kAllPools].current);
}

TEST_P(AllocatorTest, SummaryAndFragmentationReport) {
  void* p = *allocator_->Allocate(3 * kMiB);
  void* q = *allocator_->Allocate(2000);
  absl::StatusOr<std::string> summary = allocator_->Summary(0);
  ASSERT_TRUE(summary.ok());
  EXPECT_TRUE(absl::StrContains(*summary, "| Allocated memory")) << *summary;  // torch's table
  EXPECT_TRUE(absl::StrContains(*summary, "bucketalloc memory summary")) << *summary;
  EXPECT_TRUE(absl::StrContains(*summary, "external fragmentation"));
  FragmentationReport f = *allocator_->GetFragmentation(0);
  EXPECT_EQ(f.all().allocated, Stats().allocated_bytes[kAllPools].current);
  EXPECT_EQ(f.all().total_free, Stats().cached_bytes[kAllPools].current);
  if (f.tiers.empty()) {
    EXPECT_GT(f.large_pool().total_free, 0);  // the rest of the 20 MiB segment
  } else {
    EXPECT_EQ(f.tiers[1].in_use, 1);  // 3 MiB rounds up to the 4 MiB tier, a whole segment
    EXPECT_EQ(f.large_pool().total_free, 0);
  }
  EXPECT_LE(f.all().largest_free, f.all().total_free);
  for (void* x : {p, q}) ASSERT_TRUE(allocator_->Free(x).ok());
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(AllocatorTest);

TEST(AllocatorDevicesTest, EachDeviceHasItsOwnState) {
  auto allocator = MakeAllocator("sim_devices:2,sim_total_memory:256MiB");
  ASSERT_NE(allocator, nullptr);
  EXPECT_EQ(allocator->device_count(), 2);
  void* p0 = *allocator->Allocate(3 * kMiB, 0);
  void* p1 = *allocator->Allocate(3 * kMiB, 1);
  EXPECT_EQ(allocator->GetStats(0)->allocation[kAllPools].current, 1);
  EXPECT_EQ(allocator->GetStats(1)->allocation[kAllPools].current, 1);
  // Freeing with the wrong device is refused and says which device owns the pointer.
  absl::Status wrong = allocator->Free(p1, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(wrong));
  EXPECT_TRUE(absl::StrContains(wrong.message(), "live allocation of device 1")) << wrong;
  ASSERT_TRUE(allocator->Free(p1, 1).ok());
  ASSERT_TRUE(allocator->Free(p0, 0).ok());
  ASSERT_TRUE(allocator->EmptyCache().ok());
  EXPECT_EQ(allocator->GetStats(1)->reserved_bytes[kAllPools].current, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(allocator->GetStats(2).status()));
}

// A cap under one granule would fail every allocation: device creation and set_memory_fraction
// refuse it naming both settings, and a refused fraction leaves the cap as it was.
TEST(AllocatorCreateTest, AFractionThatLeavesLessThanAGranuleIsRefused) {
  std::unique_ptr<Allocator> a = ::bucketalloc::testing::MakeAllocator("memory_fraction:1e-300");
  ASSERT_NE(a, nullptr);
  absl::StatusOr<void*> p = a->Allocate(kMiB);
  ASSERT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "memory_fraction:1e-300")) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "less than one 2.00 MiB granule")) << p.status();
  std::unique_ptr<Allocator> b = ::bucketalloc::testing::MakeAllocator("capacity:64MiB");
  ASSERT_NE(b, nullptr);
  void* q = *b->Allocate(kMiB);
  absl::Status s = b->SetMemoryFraction(1e-9, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "a cap of")) << s;
  EXPECT_EQ(b->GetStats(0)->capacity_bytes, static_cast<std::int64_t>(64 * kMiB)) << "the cap stays";
  ASSERT_TRUE(b->Free(q).ok());
}

TEST(AllocatorCreateTest, InvalidOptionsAreRefused) {
  Options o;
  o.backend = "sim";
  o.memory_fraction = 2.0;
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(a.status()));
  EXPECT_TRUE(absl::StrContains(a.status().message(), "memory_fraction"));
}

}  // namespace
}  // namespace bucketalloc
