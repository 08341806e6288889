// Stitching through the allocator on the backed sim (its virtual memory maps real pages): a large
// request at the cap is served from the granules of free blocks, with the data of every live block
// intact and the stitched block's bytes all usable; an unmap waits for the streams that used the
// block; create, map and unmap faults lose nothing and leave the stats true.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "bucketalloc/allocator.h"
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

// 40 MiB cap: two 20 MiB segments of five 4 MiB blocks each; every other block freed leaves 24 MiB
// free in six pieces that no 12 MiB request fits.
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
  EXPECT_EQ(after.unmaps - before.unmaps, 6);
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
  EXPECT_EQ(end.maps, end.unmaps);
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
  // One more live block is freed while a kernel on another stream still uses it.
  Filled used = live.back();
  live.pop_back();
  ASSERT_TRUE(allocator_->RecordStream(used.p, 0, TestStream(2)).ok());
  sim_->EnqueueWork(TestStream(2));
  ASSERT_TRUE(allocator_->Free(used.p, 0).ok());
  // 14 MiB needs seven granules: the six free ones are not enough without the pending block's.
  // While its event cannot be waited for, its granules stay where they are, with their data.
  sim_->SetSynchronizeFails(true);
  absl::StatusOr<void*> p = allocator_->Allocate(14 * kMiB, 0, TestStream(1));
  EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  EXPECT_TRUE(Intact(used)) << "a granule still in use on stream 2 was unmapped";
  ExpectConsistent();
  // Once the wait works, the other stream's work completes first, then the granules move.
  sim_->SetSynchronizeFails(false);
  p = allocator_->Allocate(14 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GE(Stats().num_granules_stitched, 7);
  std::memset(*p, 0x77, 14 * kMiB);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b));
  ExpectConsistent();
}

TEST_F(StitchingTest, AFreeBlocksOwnStreamIsWaitedForBeforeItsGranulesMove) {
  Make("expandable_segments:true");
  std::vector<Filled> live = Fragment(TestStream(3));
  sim_->EnqueueWork(TestStream(3));  // work queued after the frees may still touch the freed blocks
  sim_->SetSynchronizeFails(true);
  EXPECT_FALSE(allocator_->Allocate(12 * kMiB, 0, TestStream(1)).ok());
  EXPECT_EQ(Stats().num_granules_stitched, 0);
  ExpectConsistent();
  sim_->SetSynchronizeFails(false);
  absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Stats().num_granules_stitched, 6);
  for (const Filled& b : live) EXPECT_TRUE(Intact(b));
}

// Fault injection: the Nth create, map or unmap from the start of the stitch fails. The request
// may fail (it may also succeed through release-and-retry), but live data and the stats stay true,
// and once the fault is gone the same request succeeds.
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
      for (const Filled& b : live) EXPECT_TRUE(Intact(b));
      ExpectConsistent();
      if (!p.ok()) {
        f.inject(sim_, 0);
        p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
        ASSERT_TRUE(p.ok()) << p.status();
      }
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

TEST_F(StitchingTest, TheSmallPoolAndCacheHitsAreUnchanged) {
  Make("expandable_segments:true");
  void* small = *allocator_->Allocate(1000, 0, TestStream(1));
  void* large = *allocator_->Allocate(4 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(allocator_->Free(large, 0).ok());
  const BackendCounters before = sim_->counters();
  void* again = *allocator_->Allocate(4 * kMiB, 0, TestStream(1));
  EXPECT_EQ(again, large) << "a cache hit reuses the block";
  const BackendCounters after = sim_->counters();
  EXPECT_EQ(after.maps + after.unmaps + after.physical_creates + after.allocs,
            before.maps + before.unmaps + before.physical_creates + before.allocs)
      << "a cache hit makes no backend call";
  EXPECT_EQ(sim_->counters().allocs, 1) << "the small pool's slab is a plain backend allocation";
  ASSERT_TRUE(allocator_->Free(small, 0).ok());
  ASSERT_TRUE(allocator_->Free(again, 0).ok());
}

}  // namespace
}  // namespace bucketalloc
