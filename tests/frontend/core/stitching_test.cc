// Stitching through the allocator on the backed sim (its virtual memory maps real pages): a large
// request at the cap is served from the granules of free blocks, with the data of every live block
// intact and the stitched block's bytes all usable; an unmap waits for the streams that used the
// block; create, map and unmap faults lose nothing and leave the stats true.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::MakeAllocator;
using ::bucketalloc::testing::TestStream;

struct Filled {
  unsigned char* p;
  std::size_t size;
  unsigned char seed;
};

void Fill(const Filled& b) {
  for (std::size_t i = 0; i < b.size; i += 4096) b.p[i] = static_cast<unsigned char>(b.seed + i / 4096);
  b.p[b.size - 1] = b.seed;
}

bool Intact(const Filled& b) {
  for (std::size_t i = 0; i < b.size; i += 4096) {
    if (b.p[i] != static_cast<unsigned char>(b.seed + i / 4096)) return false;
  }
  return b.p[b.size - 1] == b.seed;
}

// 40 MiB cap: two 20 MiB segments of five 4 MiB blocks each; every other block freed leaves 20 MiB
// free in five pieces (ten whole granules) that no 12 MiB request fits.
constexpr const char* kConf = "capacity:40MiB,sim_total_memory:64MiB";

class StitchingTest : public ::testing::Test {
 protected:
  void Make(const std::string& extra) {
    allocator_ = MakeAllocator(absl::StrCat(kConf, extra.empty() ? "" : ",", extra));
    ASSERT_NE(allocator_, nullptr);
    sim_ = AsSim(*allocator_->backend(0));
  }
  // Returns the live (odd) blocks, filled.
  std::vector<Filled> Fragment(Stream stream = TestStream(1)) {
    std::vector<Filled> blocks;
    for (int i = 0; i < 10; ++i) {
      absl::StatusOr<void*> p = allocator_->Allocate(4 * kMiB, 0, stream);
      EXPECT_TRUE(p.ok()) << p.status();
      if (!p.ok()) return {};
      blocks.push_back({static_cast<unsigned char*>(*p), 4 * kMiB, static_cast<unsigned char>(17 * i + 1)});
      Fill(blocks.back());
    }
    std::vector<Filled> live;
    for (int i = 0; i < 10; ++i) {
      if (i % 2 == 0) {
        EXPECT_TRUE(allocator_->Free(blocks[i].p, 0).ok());
      } else {
        live.push_back(blocks[i]);
      }
    }
    return live;
  }
  DeviceStats Stats() { return *allocator_->GetStats(0); }
  void ExpectConsistent() {
    absl::Status s = allocator_->CheckInvariants(0);
    EXPECT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<Allocator> allocator_;
  SimBackend* sim_ = nullptr;
};

TEST_F(StitchingTest, WithoutStitchingTheFragmentedCacheFailsARequest) {
  Make("");
  std::vector<Filled> live = Fragment();
  absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(absl::IsResourceExhausted(p.status())) << "the baseline this test suite improves on";
  EXPECT_EQ((*allocator_->LastOomReport(0))->cause, OomCause::kFragmentation);
}

TEST_F(StitchingTest, AStitchedBlockIsAllUsableAndLiveBlocksKeepTheirData) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment();
  const BackendCounters before = sim_->counters();
  absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  const DeviceStats s = Stats();
  EXPECT_EQ(s.num_stitches, 1);
  EXPECT_EQ(s.num_granules_stitched, 6);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<std::int64_t>(40 * kMiB)) << "moved, not added";
  const BackendCounters after = sim_->counters();
  EXPECT_EQ(after.physical_creates, before.physical_creates);
  EXPECT_EQ(after.unmaps - before.unmaps, 3) << "one call per freed block, for its two granules";
  EXPECT_EQ(after.maps - before.maps, 6);
  Filled big{static_cast<unsigned char*>(*p), 12 * kMiB, 99};
  // Every byte of the stitched range is writable (across the granule seams) and reads back.
  std::memset(big.p, 0x5a, big.size);
  for (std::size_t i = 0; i < big.size; i += 512 * kKiB) ASSERT_EQ(big.p[i], 0x5a) << i;
  Fill(big);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b)) << "a live block changed";
  EXPECT_TRUE(Intact(big));
  ExpectConsistent();
  // The snapshot shows the mapped runs only; a free of everything and empty_cache leave nothing.
  ASSERT_TRUE(allocator_->Free(big.p, 0).ok());
  for (const Filled& b : live) ASSERT_TRUE(allocator_->Free(b.p, 0).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(sim_->used_bytes(), 0u);
  const BackendCounters end = sim_->counters();
  EXPECT_EQ(end.physical_creates, end.physical_releases);
  // Every address reservation went back, which the sim refuses while anything is mapped in it.
  EXPECT_EQ(end.address_reserves, end.address_releases);
  ExpectConsistent();
}

TEST_F(StitchingTest, EmptyCacheGivesBackTheFreeGranulesOfPartlyUsedSegments) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment();
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  // The five live 4 MiB blocks keep their granules; the free ones went back to the device.
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(sim_->used_bytes(), 20 * kMiB);
  EXPECT_EQ(Stats().num_granules_released, 10);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b));
  ExpectConsistent();
  // The holes are not memory: the snapshot's segments are the mapped runs.
  absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot();
  ASSERT_TRUE(snap.ok());
  std::size_t total = 0;
  for (const SegmentSnapshot& seg : snap->segments) {
    EXPECT_TRUE(seg.expandable);
    total += seg.total_size;
  }
  EXPECT_EQ(total, 20 * kMiB);
}

TEST_F(StitchingTest, AnUnmapWaitsForPendingCrossStreamUse) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment();
  // One more block is freed while a kernel on stream 2 still uses it (record_stream).
  Filled used = live.back();
  live.pop_back();
  ASSERT_TRUE(allocator_->RecordStream(used.p, 0, TestStream(2)).ok());
  sim_->EnqueueWork(TestStream(2));
  ASSERT_TRUE(allocator_->Free(used.p, 0).ok());
  // 22 MiB needs eleven granules: the ten free ones are not enough without the pending block's two.
  // While stream 2 cannot be waited for, they stay mapped under the block, with its data; the
  // free blocks' granules (stream 1) may go.
  sim_->SetStreamSynchronizeFails(TestStream(2), true);
  absl::StatusOr<void*> p = allocator_->Allocate(22 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  EXPECT_EQ((*allocator_->LastOomReport(0))->cause, OomCause::kCacheHeld);
  EXPECT_TRUE(Intact(used)) << "a granule still in use on stream 2 was unmapped";
  EXPECT_EQ(Stats().active_bytes[kAllPools].current - Stats().allocated_bytes[kAllPools].current,
            static_cast<std::int64_t>(4 * kMiB))
      << "the block still waits for stream 2";
  ExpectConsistent();
  // Once stream 2 can be waited for, its work completes first, then the granules are free to go.
  sim_->SetStreamSynchronizeFails(TestStream(2), false);
  p = allocator_->Allocate(22 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0x77, 22 * kMiB);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b));
  ExpectConsistent();
}

TEST_F(StitchingTest, AFreeBlocksOwnStreamIsWaitedForBeforeItsGranulesMove) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment(TestStream(3));
  sim_->EnqueueWork(TestStream(3));  // work queued after the frees may still touch the freed blocks
  // Stream 3 hangs: none of its free blocks' granules may move (a request on stream 1 is refused),
  // and none is released either.
  sim_->SetStreamSynchronizeFails(TestStream(3), true);
  EXPECT_TRUE(absl::IsResourceExhausted(allocator_->Allocate(12 * kMiB, 0, TestStream(1)).status()));
  EXPECT_EQ(Stats().num_granules_stitched, 0);
  EXPECT_EQ(Stats().num_granules_released, 0);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(40 * kMiB));
  ExpectConsistent();
  sim_->SetStreamSynchronizeFails(TestStream(3), false);
  absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Stats().num_granules_stitched, 6);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b));
}

TEST_F(StitchingTest, ReleasingAWhollyFreeSegmentWaitsForItsStream) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment(TestStream(3));
  for (const Filled& b : live) ASSERT_TRUE(allocator_->Free(b.p, 0).ok());
  sim_->EnqueueWork(TestStream(3));
  sim_->SetStreamSynchronizeFails(TestStream(3), true);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(40 * kMiB))
      << "unmapped while stream 3 may still use the memory";
  ExpectConsistent();
  sim_->SetStreamSynchronizeFails(TestStream(3), false);
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(sim_->used_bytes(), 0u);
}

TEST_F(StitchingTest, AnUnmapFaultOnATierBlockNeverHandsOutASmallerBlock) {
  Make("capacity:24MiB,expandable_segments:true,tiers:[8MiB]");
  void* t1 = *allocator_->Allocate(8 * kMiB, 0, TestStream(1));
  Filled t2{static_cast<unsigned char*>(*allocator_->Allocate(8 * kMiB, 0, TestStream(1))), 8 * kMiB, 5};
  Filled x{static_cast<unsigned char*>(*allocator_->Allocate(3 * kMiB, 0, TestStream(1))), 3 * kMiB, 9};
  Fill(t2);
  Fill(x);
  ASSERT_TRUE(allocator_->Free(t1, 0).ok());
  // A 10 MiB request stitches the free tier block's granules; the second unmap fails part-way.
  sim_->FailNthUnmap(2);
  absl::StatusOr<void*> p = allocator_->Allocate(10 * kMiB, 0, TestStream(1));
  if (p.ok()) {
    ASSERT_TRUE(allocator_->Free(*p, 0).ok());
  }
  ExpectConsistent();
  // What stayed of the tier block is plain free memory now: a tier request gets a whole 8 MiB.
  const std::int64_t before = Stats().allocated_bytes[kAllPools].current;
  absl::StatusOr<void*> t3 = allocator_->Allocate(8 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_GE(Stats().allocated_bytes[kAllPools].current - before, static_cast<std::int64_t>(8 * kMiB));
  std::memset(*t3, 0x33, 8 * kMiB);
  EXPECT_TRUE(Intact(t2));
  EXPECT_TRUE(Intact(x));
  ExpectConsistent();
}

// Fault injection: the Nth create, map or unmap from the start of the stitch fails. The caller
// sees nothing of it: the stitch undoes itself and release-and-retry serves the request; live data
// and the stats stay true.
TEST_F(StitchingTest, CreateMapAndUnmapFaultsLoseNothing) {
  struct Fault {
    const char* what;
    void (*inject)(SimBackend*, int);
  };
  const Fault faults[] = {
      {"create", [](SimBackend* s, int n) { s->FailNthAlloc(n); }},
      {"map", [](SimBackend* s, int n) { s->FailNthMap(n); }},
      {"unmap", [](SimBackend* s, int n) { s->FailNthUnmap(n); }},
  };
  for (const Fault& f : faults) {
    for (int n : {1, 2, 4, 6}) {
      SCOPED_TRACE(absl::StrCat(f.what, " #", n));
      // With 2 MiB of headroom: the stitch creates one granule and moves five.
      allocator_ = MakeAllocator("capacity:42MiB,sim_total_memory:64MiB,expandable_segments:true");
      ASSERT_NE(allocator_, nullptr);
      sim_ = AsSim(*allocator_->backend(0));
      std::vector<Filled> live = Fragment();
      f.inject(sim_, n);
      absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
      ASSERT_TRUE(p.ok()) << p.status();
      for (const Filled& b : live) EXPECT_TRUE(Intact(b));
      ExpectConsistent();
      std::memset(*p, 0x33, 12 * kMiB);
      for (const Filled& b : live) EXPECT_TRUE(Intact(b));
      ExpectConsistent();
      ASSERT_TRUE(allocator_->Free(*p, 0).ok());
      for (const Filled& b : live) ASSERT_TRUE(allocator_->Free(b.p, 0).ok());
      ASSERT_TRUE(allocator_->EmptyCache().ok());
      EXPECT_EQ(sim_->used_bytes(), 0u);
      ExpectConsistent();
    }
  }
}

TEST_F(StitchingTest, TheSmallPoolMapsGranulesAndACacheHitCallsNothing) {
  Make("expandable_segments:true");
  void* small = *allocator_->Allocate(1000, 0, TestStream(1));
  DeviceStats s = Stats();
  EXPECT_EQ(sim_->counters().allocs, 0) << "no plain allocation: the small pool maps granules too";
  EXPECT_EQ(s.reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(2 * kMiB)) << "one 2 MiB granule";
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 0);
  std::vector<void*> more;  // small requests (at most 1 MiB) past the first granule
  for (int i = 0; i < 3; ++i) more.push_back(*allocator_->Allocate(900 * 1024, 0, TestStream(1)));
  EXPECT_EQ(Stats().reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(4 * kMiB))
      << "the small segment grew in place by a granule";
  EXPECT_EQ(Stats().segment[kSmallPool].current, 1);
  void* large = *allocator_->Allocate(4 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(allocator_->Free(large, 0).ok());
  const BackendCounters before = sim_->counters();
  void* again = *allocator_->Allocate(4 * kMiB, 0, TestStream(1));
  EXPECT_EQ(again, large) << "a cache hit reuses the block";
  const BackendCounters after = sim_->counters();
  EXPECT_EQ(after.maps + after.unmaps + after.physical_creates + after.allocs,
            before.maps + before.unmaps + before.physical_creates + before.allocs)
      << "a cache hit makes no backend call";
  ExpectConsistent();
  ASSERT_TRUE(allocator_->Free(small, 0).ok());
  for (void* p : more) ASSERT_TRUE(allocator_->Free(p, 0).ok());
  ASSERT_TRUE(allocator_->Free(again, 0).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  s = Stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 0) << "an empty cache unmaps and releases both pools' granules";
  EXPECT_EQ(sim_->counters().frees, 0) << "no cudaFree (a device synchronization): unmaps after stream waits";
  ExpectConsistent();
}

// Prefetch: physical memory created ahead of need as spares, which a later grow maps instead of
// creating (no create on the request's path), counted as reserved and cached, stopped by the cap,
// given back by a release; refused without virtual memory.
TEST_F(StitchingTest, PrefetchedMemoryServesLaterGrowsWithoutACreate) {
  Make("expandable_segments:true");
  const BackendCounters before = sim_->counters();
  // At most 4 MiB per call, then up to the target: whole granules, never more than asked.
  absl::StatusOr<std::size_t> created = allocator_->Prefetch(0, 24 * kMiB + 12345, 4 * kMiB + 1);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, 4 * kMiB);
  created = allocator_->Prefetch(0, 24 * kMiB + 12345);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, 20 * kMiB);
  created = allocator_->Prefetch(0, 24 * kMiB);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, 0u) << "the spares are enough";
  EXPECT_EQ(sim_->counters().physical_creates - before.physical_creates, 12);
  DeviceStats s = Stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB));
  EXPECT_EQ(s.cached_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB));
  ExpectConsistent();

  // Three 8 MiB requests grow the pool from the spares: maps and access grants, no create.
  const BackendCounters spares = sim_->counters();
  std::vector<Filled> blocks;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(8 * kMiB, 0, TestStream(1));
    ASSERT_TRUE(p.ok()) << p.status();
    blocks.push_back({static_cast<unsigned char*>(*p), 8 * kMiB, static_cast<unsigned char>(31 * i + 5)});
    Fill(blocks.back());
  }
  const BackendCounters grown = sim_->counters();
  EXPECT_EQ(grown.physical_creates, spares.physical_creates) << "a grow took the spares";
  EXPECT_EQ(grown.maps - spares.maps, 12);
  s = Stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB)) << "taken, not added";
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB));
  for (const Filled& b : blocks) EXPECT_TRUE(Intact(b));
  ExpectConsistent();

  // The cap stops it: 16 MiB are left under the 40 MiB cap of the 64 asked; then nothing can be made.
  created = allocator_->Prefetch(0, 64 * kMiB);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, 16 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(40 * kMiB));
  created = allocator_->Prefetch(0, 18 * kMiB);
  ASSERT_FALSE(created.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(created.status())) << created.status();
  EXPECT_TRUE(absl::StrContains(created.status().message(), "prefetch to 18.00 MiB of spare memory on device 0"))
      << created.status();
  ExpectConsistent();

  // A release gives the spares back with the free memory.
  for (const Filled& b : blocks) ASSERT_TRUE(allocator_->Free(b.p, 0).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(sim_->used_bytes(), 0u);
  const BackendCounters end = sim_->counters();
  EXPECT_EQ(end.physical_creates, end.physical_releases);
  ExpectConsistent();
}

// A grow that takes spares and then cannot create the rest (the cap) keeps them as spares: the
// stitch after it maps them, moves what it must and creates only within the headroom, instead of
// giving the spares back and creating them again on the request's path.
TEST_F(StitchingTest, AGrowThatFailsAtTheCapKeepsItsSpares) {
  Make("expandable_segments:true");
  // 16 MiB live, 8 MiB free between live blocks, 4 MiB live; 8 MiB of spares: 36 of the 40 MiB cap.
  void* a = *allocator_->Allocate(16 * kMiB, 0, TestStream(1));
  void* b = *allocator_->Allocate(8 * kMiB, 0, TestStream(1));
  void* d = *allocator_->Allocate(4 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(allocator_->Free(b, 0).ok());
  ASSERT_EQ(*allocator_->Prefetch(0, 8 * kMiB), 8 * kMiB);
  const BackendCounters before = sim_->counters();
  // 20 MiB: the grow takes the 8 MiB of spares, creates 4 of the 12 it lacks and fails at the cap;
  // the stitch then maps the spares, moves the free block's 8 MiB and creates 4 in the headroom.
  absl::StatusOr<void*> c = allocator_->Allocate(20 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(c.ok()) << c.status();
  const BackendCounters after = sim_->counters();
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(40 * kMiB));
  EXPECT_EQ(after.physical_creates - before.physical_creates, 4) << "the failed grow's 2 granules, the stitch's 2";
  EXPECT_EQ(after.physical_releases - before.physical_releases, 2)
      << "only what the failed grow created went back; its spares stayed spares";
  Filled big{static_cast<unsigned char*>(*c), 20 * kMiB, 77};
  Fill(big);
  EXPECT_TRUE(Intact(big));
  ExpectConsistent();
  for (void* p : {*c, a, d}) ASSERT_TRUE(allocator_->Free(p, 0).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(sim_->used_bytes(), 0u);
  ExpectConsistent();
}

TEST_F(StitchingTest, PrefetchNeedsVirtualMemoryAndNothingChangesWithoutIt) {
  Make("");
  absl::StatusOr<std::size_t> created = allocator_->Prefetch(0, 8 * kMiB);
  ASSERT_FALSE(created.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(created.status())) << created.status();
  EXPECT_TRUE(absl::StrContains(created.status().message(), "accepted: backend:vmm")) << created.status();
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(sim_->counters().physical_creates, 0);
  EXPECT_FALSE(allocator_->Prefetch(7, 8 * kMiB).ok()) << "no such device";
  // Zero bytes (or less than a granule) is nothing to do.
  Make("expandable_segments:true");
  created = allocator_->Prefetch(0, kMiB);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, 0u);
  ExpectConsistent();
}

}  // namespace
}  // namespace bucketalloc
