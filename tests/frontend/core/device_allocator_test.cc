// The front end's slow paths: OOM diagnosis for each cause, release-and-retry, garbage
// collection, tier fallback, fault injection and the cap.
#include "frontend/core/device_allocator.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "internal/stat_ledger.h"
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
  EXPECT_DOUBLE_EQ(r.fragmentation.large_pool().external_fragmentation(), 1.0 - 12.0 / 36.0);
  EXPECT_EQ(r.fragmentation.large_pool().free_count[23], 3);  // three blocks in [8, 16) MiB
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
  auto a = MakeAllocator("sim_total_memory:64MiB");
  SimBackend* sim = AsSim(*a->backend(0));
  sim->SetExternalUsage(60 * kMiB);  // another process holds most of the card
  OomReport r = ExpectOom(*a, 10 * kMiB, OomCause::kDeviceExhausted);
  EXPECT_EQ(r.device_free, 4 * kMiB);
  EXPECT_EQ(r.capacity, 64 * kMiB);
  sim->SetExternalUsage(0);
  absl::StatusOr<void*> p = a->Allocate(10 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(a->Free(*p).ok());
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

// A free whose return waits (the large pool's deferred return) counts its cached bytes as of the
// free, even when another pool releases memory before anything reads the stats: the peak of all
// pools' cached bytes is the slab's 2 MiB and the freed 20 MiB segment together.
TEST(DeferredReturnTest, ItsPeaksCountAsOfTheFreeWhenAnotherPoolReleasesFirst) {
  for (const char* conf : {"slab_limit:1MiB", ""}) {
    SCOPED_TRACE(conf);
    auto a = MakeAllocator(conf);
    void* small = *a->Allocate(4096);  // a 2 MiB slab (slab_limit) or packed segment
    ASSERT_TRUE(a->Free(small).ok());  // 2 MiB cached in the small pool
    void* big = *a->Allocate(20 * kMiB);
    ASSERT_TRUE(a->ResetPeakStats(0).ok());  // peaks at the current figures: 2 MiB cached in all
    ASSERT_TRUE(a->Free(big).ok());          // its return waits: 22 MiB cached from here on
    ASSERT_TRUE(a->EmptyCache().ok());       // the small pool releases before the large one
    const DeviceStats s = *a->GetStats(0);
    EXPECT_EQ(s.cached_bytes[kAllPools].peak, static_cast<std::int64_t>(22 * kMiB));
    EXPECT_EQ(s.cached_bytes[kLargePool].peak, static_cast<std::int64_t>(20 * kMiB));
    EXPECT_EQ(s.cached_bytes[kAllPools].current, 0);
    EXPECT_EQ(s.reserved_bytes[kAllPools].current, 0);
  }
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
  void* other = *a->Allocate(70 * kMiB);             // above the largest tier: not tiered
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

// A private pool's tier blocks count with the device's: the report once kept only the last pool's.
TEST(TierTest, TierUsageAddsUpThePrivatePoolsAndTheDevicesOwn) {
  auto a = MakeAllocator("tiers:[64MiB]");
  void* own = *a->Allocate(40 * kMiB);
  const Stream s = TestStream(1);
  SimBackend* sim = AsSim(*a->backend(0));
  ASSERT_TRUE(a->BeginCapture(0, GraphPoolId{0, 7}, [s](Stream x) { return x == s; }).ok());
  sim->SetCapturing(s, true);
  void* captured = *a->Allocate(50 * kMiB, 0, s);
  sim->SetCapturing(s, false);
  ASSERT_TRUE(a->EndCapture(0, GraphPoolId{0, 7}).ok());
  FragmentationReport f = *a->GetFragmentation(0);
  ASSERT_EQ(f.tiers.size(), 1u);
  EXPECT_EQ(f.tiers[0].in_use, 2) << "the device's tier block and the private pool's";
  for (void* p : {own, captured}) ASSERT_TRUE(a->Free(p).ok());
  ASSERT_TRUE(a->ReleasePool(0, GraphPoolId{0, 7}).ok());
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

TEST(PendingFreeTest, ReleaseAndRetryReusesPendingBlocksInPartlyUsedMemory) {
  // Small pool: the slot freed with a pending event sits in a slab that is still in use.
  auto a = MakeAllocator("capacity:2MiB");
  SimBackend* sim = AsSim(*a->backend(0));
  Stream other = TestStream(5);
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(*a->Allocate(512 * kKiB));
  ASSERT_TRUE(a->RecordStream(p[0], 0, other).ok());
  sim->EnqueueWork(other);
  ASSERT_TRUE(a->Free(p[0]).ok());
  absl::StatusOr<void*> q = a->Allocate(512 * kKiB);  // waits for the event, then reuses the slot
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, p[0]);
  p[0] = *q;
  for (void* x : p) ASSERT_TRUE(a->Free(x).ok());

  // Large pool: the pending block shares a segment with a live one.
  auto b = MakeAllocator("capacity:20MiB");
  sim = AsSim(*b->backend(0));
  void* x = *b->Allocate(8 * kMiB);
  void* y = *b->Allocate(8 * kMiB);
  ASSERT_TRUE(b->RecordStream(y, 0, other).ok());
  sim->EnqueueWork(other);
  ASSERT_TRUE(b->Free(y).ok());
  absl::StatusOr<void*> z = b->Allocate(8 * kMiB);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(*z, y);
  EXPECT_EQ(b->GetStats(0)->num_sync_all_streams, 1);
  for (void* w : {x, *z}) ASSERT_TRUE(b->Free(w).ok());
}

TEST(PendingFreeTest, AFailedEventRecordDefersTheFreeUntilAnEventCanBeRecorded) {
  // The free itself must succeed: PyTorch has already forgotten the pointer when it calls free.
  auto a = MakeAllocator("");
  SimBackend* sim = AsSim(*a->backend(0));
  void* p = *a->Allocate(3 * kMiB);
  ASSERT_TRUE(a->RecordStream(p, 0, TestStream(4)).ok());
  sim->EnqueueWork(TestStream(4));
  sim->SetRecordEventFails(true);
  ASSERT_TRUE(a->Free(p).ok());
  DeviceStats s = *a->GetStats(0);
  EXPECT_EQ(s.num_deferred_frees, 1);
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(s.active_bytes[kAllPools].current, static_cast<std::int64_t>(3 * kMiB)) << "waits, not reusable";
  void* q = *a->Allocate(3 * kMiB);
  EXPECT_NE(q, p);
  EXPECT_TRUE(a->CheckInvariants(0).ok());
  sim->SetRecordEventFails(false);
  ASSERT_TRUE(a->Free(q).ok());  // arms the deferred free: the event waits for stream 4's work
  EXPECT_EQ(a->GetStats(0)->active_bytes[kAllPools].current, static_cast<std::int64_t>(3 * kMiB));
  sim->CompleteWork(TestStream(4));
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(a->GetStats(0)->reserved_bytes[kAllPools].current, 0);
  EXPECT_TRUE(a->CheckInvariants(0).ok());
}

TEST(GarbageCollectionTest, OldestFirstAcrossBothPools) {
  auto a = MakeAllocator("capacity:100MiB,garbage_collection_threshold:0.5");
  void* small = *a->Allocate(4096);       // a 2 MiB slab
  void* large = *a->Allocate(30 * kMiB);  // a 30 MiB segment
  void* keep = *a->Allocate(12 * kMiB);
  ASSERT_TRUE(a->Free(small).ok());  // the empty slab is the oldest cached memory
  ASSERT_TRUE(a->Free(large).ok());
  // reserved 44 MiB + 8 MiB > 50 MiB: releasing the slab (oldest) is enough.
  void* grow = *a->Allocate(40 * kMiB);  // does not fit the cached 30 MiB: grows by 40
  DeviceStats s = *a->GetStats(0);
  EXPECT_GE(s.num_gc_releases, 1);
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, 0);  // the slab went first
  // A request larger than the GC limit still succeeds: GC only releases cache, it never refuses.
  void* huge = *a->Allocate(45 * kMiB);
  EXPECT_NE(huge, nullptr);
  for (void* p : {keep, grow, huge}) ASSERT_TRUE(a->Free(p).ok());
}

TEST(OptionsInteractionTest, SmallNonSplitRoundingStillServesOversizeRequests) {
  auto a = MakeAllocator("max_split_size_mb:20,max_non_split_rounding_mb:0");
  absl::StatusOr<void*> p = a->Allocate(21 * kMiB + 1);  // a 22 MiB segment, oversize
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(a->GetStats(0)->oversize_allocations.current, 1);
  EXPECT_EQ(a->GetStats(0)->oversize_segments.current, 1);
  ASSERT_TRUE(a->Free(*p).ok());
  EXPECT_EQ(a->GetStats(0)->oversize_allocations.current, 0);
  EXPECT_EQ(a->GetStats(0)->oversize_allocations.peak, 1);
  // An exact fit of a cached oversize block is reused even with a rounding allowance of 0.
  void* q = *a->Allocate(22 * kMiB);
  void* r = *a->Allocate(22 * kMiB);
  ASSERT_TRUE(a->Free(r).ok());
  void* again = *a->Allocate(22 * kMiB);
  EXPECT_EQ(again, r);
  EXPECT_EQ(a->GetStats(0)->num_device_alloc, 2);
  for (void* x : {q, again}) ASSERT_TRUE(a->Free(x).ok());
}

TEST(OomDiagnosisTest, SmallRequestBlockedByPendingSlabIsCacheHeldNotFragmentation) {
  // A 4 MiB free piece sits in the large pool, but the small request needs a slab, and the only
  // slab is held by frees awaiting a stream that cannot be synchronized.
  auto a = MakeAllocator("capacity:22MiB");
  SimBackend* sim = AsSim(*a->backend(0));
  Stream other = TestStream(6);
  void* big = *a->Allocate(8 * kMiB);  // a 20 MiB segment: 16 MiB live, 4 MiB free
  void* big2 = *a->Allocate(8 * kMiB);
  std::vector<void*> slots;
  for (int i = 0; i < 2; ++i) slots.push_back(*a->Allocate(kMiB));  // one full slab
  for (void* s : slots) ASSERT_TRUE(a->RecordStream(s, 0, other).ok());
  sim->EnqueueWork(other);
  for (void* s : slots) ASSERT_TRUE(a->Free(s).ok());
  sim->SetSynchronizeFails(true);
  OomReport r = ExpectOom(*a, 4096, OomCause::kCacheHeld);
  EXPECT_EQ(r.active - r.allocated, 2 * kMiB);
  sim->SetSynchronizeFails(false);
  sim->CompleteWork(other);
  for (void* x : {big, big2}) ASSERT_TRUE(a->Free(x).ok());
}

TEST(BackendGranularityTest, GranularityAbove2MiBIsRefused) {
  absl::StatusOr<std::unique_ptr<SimBackend>> sim =
      MakeSimBackend({.total_memory = 64 * kMiB, .granularity = 4 * kMiB});
  ASSERT_TRUE(sim.ok());
  absl::StatusOr<Options> o = ParseOptions("backend:sim");
  auto a = std::move(*Allocator::CreateWithBackend(*o, std::move(*sim)));
  absl::StatusOr<void*> p = a->Allocate(4096);
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "granularity")) << p.status();
}

}  // namespace

namespace internal {

// Reaches into a device state to corrupt it, so that each kind of check is seen to fire.
class DeviceAllocatorTestPeer {
 public:
  static StatLedger& Stats(DeviceAllocator& d) { return d.stats_; }
  static LargePool& Large(DeviceAllocator& d) { return d.pools_.large(); }
  template <typename F>
  static void WithLock(DeviceAllocator& d, F&& f) {
    MutexLock lock(d.mu_);
    f();
  }
};

namespace {

std::unique_ptr<DeviceAllocator> MakeDevice() {
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend({.total_memory = 256 * kMiB});
  absl::StatusOr<Options> o = ParseOptions("backend:sim");
  return std::move(*DeviceAllocator::Create(*o, std::move(*sim), 0));
}

TEST(CheckInvariantsTest, DetectsCorruptedStats) {
  auto d = MakeDevice();
  void* p = *d->Allocate(3 * kMiB, nullptr);
  ASSERT_TRUE(d->CheckInvariants().ok());
  // A gauge that disagrees with the blocks.
  DeviceAllocatorTestPeer::WithLock(
      *d, [&] { DeviceAllocatorTestPeer::Stats(*d).Increase(&DeviceStats::allocated_bytes, kLargePool, 512); });
  absl::Status s = d->CheckInvariants();
  EXPECT_TRUE(absl::IsInternal(s));
  EXPECT_TRUE(absl::StrContains(s.message(), "allocated_bytes.large_pool is")) << s;
  // A gauge that is inconsistent in itself (below zero): the ledger's own check.
  DeviceAllocatorTestPeer::WithLock(*d, [&] {
    DeviceAllocatorTestPeer::Stats(*d).Decrease(&DeviceStats::allocated_bytes, kLargePool, 512);
    DeviceAllocatorTestPeer::Stats(*d).Decrease(&DeviceStats::requested_bytes, kSmallPool, 1);
  });
  s = d->CheckInvariants();
  EXPECT_TRUE(absl::StrContains(s.message(), "requested_bytes.small_pool is inconsistent")) << s;
  DeviceAllocatorTestPeer::WithLock(
      *d, [&] { DeviceAllocatorTestPeer::Stats(*d).Increase(&DeviceStats::requested_bytes, kSmallPool, 1); });
  EXPECT_TRUE(d->CheckInvariants().ok());
  ASSERT_TRUE(d->Free(p, std::nullopt).ok());
}

TEST(CheckInvariantsTest, DetectsACorruptedSegment) {
  auto d = MakeDevice();
  void* p = *d->Allocate(3 * kMiB, nullptr);  // splits a 20 MiB segment: 3 MiB live, 17 MiB free
  Block* free_block = nullptr;
  DeviceAllocatorTestPeer::Large(*d).ForEachSegment([&](const Segment& seg) { free_block = seg.first->next; });
  ASSERT_NE(free_block, nullptr);
  ASSERT_EQ(free_block->state, BlockState::kFree);
  // Shrink the free block: the segment is no longer tiled.
  DeviceAllocatorTestPeer::WithLock(*d, [&] { free_block->size -= 512; });
  absl::Status s = d->CheckInvariants();
  EXPECT_TRUE(absl::StrContains(s.message(), "do not reach its end")) << s;
  DeviceAllocatorTestPeer::WithLock(*d, [&] { free_block->size += 512; });
  // Take the free block out of its free list: it is free but in no list.
  DeviceAllocatorTestPeer::WithLock(*d, [&] { free_block->state = BlockState::kAllocated; });
  s = d->CheckInvariants();
  EXPECT_FALSE(s.ok());
  DeviceAllocatorTestPeer::WithLock(*d, [&] { free_block->state = BlockState::kFree; });
  EXPECT_TRUE(d->CheckInvariants().ok());
  ASSERT_TRUE(d->Free(p, std::nullopt).ok());
}

}  // namespace
}  // namespace internal
}  // namespace bucketalloc
