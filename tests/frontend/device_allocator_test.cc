// The front end's slow paths: OOM diagnosis for each cause, release-and-retry, garbage
// collection, tier fallback, fault injection and the cap.
#include "frontend/device_allocator.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::MakeAllocator;
using ::bucketalloc::testing::TestStream;

OomReport ExpectOom(Allocator& a, std::size_t size, OomCause cause, Stream stream = nullptr) {
  absl::StatusOr<void*> p = a.Allocate(size, 0, stream);
  EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  absl::StatusOr<std::optional<OomReport>> r = a.LastOomReport(0);
  EXPECT_TRUE(r.ok() && r->has_value());
  if (!r.ok() || !r->has_value()) return {};
  const OomReport& report = **r;
  EXPECT_EQ(report.cause, cause) << report.ToString();
  EXPECT_TRUE(absl::StrContains(p.status().message(), report.diagnosis));
  EXPECT_TRUE(absl::StartsWith(report.diagnosis, OomCauseName(cause))) << report.diagnosis;
  EXPECT_TRUE(a.CheckInvariants(0).ok());
  return report;
}

TEST(OomDiagnosisTest, Capacity) {
  auto a = MakeAllocator("capacity:64MiB");
  void* p = *a->Allocate(40 * kMiB);
  OomReport r = ExpectOom(*a, 30 * kMiB, OomCause::kCapacity);
  EXPECT_EQ(r.requested, 30 * kMiB);
  EXPECT_EQ(r.capacity, 64 * kMiB);
  EXPECT_EQ(r.allocated, 40 * kMiB);
  EXPECT_EQ(a->GetStats(0)->num_ooms, 1);
  EXPECT_EQ(a->GetStats(0)->num_alloc_retries, 1);
  ASSERT_TRUE(a->Free(p).ok());
  absl::StatusOr<void*> q = a->Allocate(30 * kMiB);  // the allocator is still usable
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(a->Free(*q).ok());
}

TEST(OomDiagnosisTest, Fragmentation) {
  // Three 20 MiB segments, each holding 8 MiB live and a 12 MiB hole: 36 MiB free, none fits 16 MiB.
  auto a = MakeAllocator("capacity:60MiB");
  std::vector<void*> keep, drop;
  for (int i = 0; i < 3; ++i) {
    keep.push_back(*a->Allocate(8 * kMiB));
    drop.push_back(*a->Allocate(8 * kMiB));
  }
  EXPECT_EQ(a->GetStats(0)->segment[kLargePool].current, 3);
  for (void* p : drop) ASSERT_TRUE(a->Free(p).ok());
  OomReport r = ExpectOom(*a, 16 * kMiB, OomCause::kFragmentation);
  EXPECT_EQ(r.largest_free, 12 * kMiB);
  EXPECT_EQ(r.cached, 36 * kMiB);
  EXPECT_DOUBLE_EQ(r.fragmentation.large_pool.external_fragmentation(), 1.0 - 12.0 / 36.0);
  EXPECT_EQ(r.fragmentation.large_pool.free_count[23], 3);  // three blocks in [8, 16) MiB
  EXPECT_TRUE(absl::StrContains(r.ToString(), "external fragmentation 66.7%")) << r.ToString();
  for (void* p : keep) ASSERT_TRUE(a->Free(p).ok());
}

TEST(OomDiagnosisTest, CacheHeldByBlocksAwaitingStreamEvents) {
  auto a = MakeAllocator("capacity:40MiB");
  SimBackend* sim = AsSim(*a->backend(0));
  Stream other = TestStream(9);
  void* p = *a->Allocate(30 * kMiB);
  ASSERT_TRUE(a->RecordStream(p, 0, other).ok());
  sim->EnqueueWork(other);
  ASSERT_TRUE(a->Free(p).ok());
  sim->SetSynchronizeFails(true);  // the stream cannot be waited for
  ExpectOom(*a, 30 * kMiB, OomCause::kCacheHeld);
  sim->SetSynchronizeFails(false);
  // Now release-and-retry synchronizes the event and the memory comes back.
  absl::StatusOr<void*> q = a->Allocate(30 * kMiB);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_GE(a->GetStats(0)->num_sync_all_streams, 1);
  ASSERT_TRUE(a->Free(*q).ok());
}

TEST(OomDiagnosisTest, DeviceExhaustedByMemoryOutsideTheAllocator) {
  // No debug invariant checks: the backend is shared with an outside user here on purpose.
  absl::StatusOr<Options> o = ParseOptions("backend:sim,sim_total_memory:64MiB");
  auto a = std::move(*Allocator::Create(*o));
  Backend* backend = *a->backend(0);
  void* outside = *backend->Allocate(60 * kMiB);
  absl::StatusOr<void*> p = a->Allocate(10 * kMiB);
  ASSERT_TRUE(absl::IsResourceExhausted(p.status()));
  OomReport r = **a->LastOomReport(0);
  EXPECT_EQ(r.cause, OomCause::kDeviceExhausted) << r.ToString();
  EXPECT_EQ(r.device_free, 4 * kMiB);
  ASSERT_TRUE(backend->Free(outside, 60 * kMiB).ok());
  EXPECT_TRUE(a->CheckInvariants(0).ok());
}

TEST(ReleaseAndRetryTest, ReleasesCachedSegmentsOfOtherStreams) {
  auto a = MakeAllocator("capacity:64MiB");
  void* p = *a->Allocate(40 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(a->Free(p).ok());  // cached on stream 1
  absl::StatusOr<void*> q = a->Allocate(40 * kMiB, 0, TestStream(2));
  ASSERT_TRUE(q.ok()) << q.status();
  const DeviceStats s = *a->GetStats(0);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_ooms, 0);
  ASSERT_TRUE(a->Free(*q).ok());
}

TEST(ReleaseAndRetryTest, InjectedBackendFailureIsRetriedOnce) {
  auto a = MakeAllocator("sim_fail_nth_alloc:2");
  void* p = *a->Allocate(3 * kMiB);
  absl::StatusOr<void*> q = a->Allocate(30 * kMiB);  // 2nd backend call fails, the retry succeeds
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(a->GetStats(0)->num_alloc_retries, 1);
  for (void* x : {p, *q}) ASSERT_TRUE(a->Free(x).ok());
}

TEST(ReleaseAndRetryTest, LargeSegmentFallsBackToTheExactSize) {
  // 3 MiB prefers a 20 MiB segment; with 10 MiB of room it gets a 4 MiB segment instead.
  auto a = MakeAllocator("capacity:30MiB");
  void* big = *a->Allocate(20 * kMiB);
  absl::StatusOr<void*> p = a->Allocate(3 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(a->GetStats(0)->reserved_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB));
  for (void* x : {big, *p}) ASSERT_TRUE(a->Free(x).ok());
}

TEST(GarbageCollectionTest, ReleasesOldestCachedSegmentsAboveTheThreshold) {
  auto a = MakeAllocator("capacity:100MiB,garbage_collection_threshold:0.9");
  void* x = *a->Allocate(30 * kMiB);
  void* v = *a->Allocate(14 * kMiB);
  void* y = *a->Allocate(12 * kMiB);
  ASSERT_TRUE(a->Free(x).ok());  // the oldest cached segment
  ASSERT_TRUE(a->Free(v).ok());
  // Growing by 40 MiB would pass 90 MiB reserved (56 + 40): only the oldest (x) is released.
  void* z = *a->Allocate(40 * kMiB);
  DeviceStats s = *a->GetStats(0);
  EXPECT_EQ(s.num_gc_releases, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<std::int64_t>(66 * kMiB));
  // v is still cached: a 14 MiB request is a hit.
  void* w = *a->Allocate(14 * kMiB);
  EXPECT_EQ(w, v);
  EXPECT_EQ(a->GetStats(0)->num_device_alloc, s.num_device_alloc);
  for (void* p : {y, z, w}) ASSERT_TRUE(a->Free(p).ok());
}

TEST(TierTest, TierRequestsFallBackToTheirExactSizeBeforeOom) {
  auto a = MakeAllocator("capacity:120MiB,tiers:[64MiB]");
  void* other = *a->Allocate(70 * kMiB);  // above the largest tier: not tiered
  absl::StatusOr<void*> p = a->Allocate(40 * kMiB);  // tier 64 MiB does not fit; 40 MiB does
  ASSERT_TRUE(p.ok()) << p.status();
  DeviceStats s = *a->GetStats(0);
  EXPECT_EQ(s.num_tier_fallbacks, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, static_cast<std::int64_t>(110 * kMiB));
  for (void* x : {other, *p}) ASSERT_TRUE(a->Free(x).ok());
  // With room, the same request takes a tier block.
  ASSERT_TRUE(a->EmptyCache().ok());
  void* q = *a->Allocate(40 * kMiB);
  FragmentationReport f = *a->GetFragmentation(0);
  EXPECT_EQ(f.tiers[0].in_use, 1);
  ASSERT_TRUE(a->Free(q).ok());
}

TEST(CapTest, MemoryFractionLowersTheCap) {
  auto a = MakeAllocator("sim_total_memory:128MiB");
  ASSERT_TRUE(a->SetMemoryFraction(0.25, 0).ok());
  EXPECT_EQ(a->GetStats(0)->capacity_bytes, static_cast<std::int64_t>(32 * kMiB));
  ExpectOom(*a, 40 * kMiB, OomCause::kCapacity);
  EXPECT_TRUE(absl::IsInvalidArgument(a->SetMemoryFraction(0, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(a->SetMemoryFraction(1.5, 0)));
  ASSERT_TRUE(a->SetMemoryFraction(1.0, 0).ok());
  absl::StatusOr<void*> p = a->Allocate(40 * kMiB);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(a->Free(*p).ok());
}

TEST(SmallPoolOomTest, SmallRequestsAreDiagnosedToo) {
  auto a = MakeAllocator("capacity:4MiB,sim_total_memory:64MiB");
  std::vector<void*> live;
  for (int i = 0; i < 4; ++i) live.push_back(*a->Allocate(kMiB));  // two 2 MiB slabs
  ExpectOom(*a, 1000, OomCause::kCapacity);
  ASSERT_TRUE(a->Free(live[0]).ok());
  absl::StatusOr<void*> p = a->Allocate(kMiB);  // the freed slot is reused
  ASSERT_TRUE(p.ok());
  live[0] = *p;
  for (void* x : live) ASSERT_TRUE(a->Free(x).ok());
}

}  // namespace
}  // namespace bucketalloc
