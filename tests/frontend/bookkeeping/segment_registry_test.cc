// The segment registry and cap (src/frontend/bookkeeping/segment_registry.cc) over the simulated device: the
// cap, the stats and history it keeps, refusal during a capture, the collector, virtual-memory
// ranges, lookups, and the check against the backend's own counts.
#include "frontend/bookkeeping/segment_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/testing/sim_backend.h"
#include "bucketalloc/units.h"

namespace bucketalloc::internal {
namespace {

class SegmentRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimBackend>> made = MakeSimBackend({.total_memory = 64 * kMiB});
    ASSERT_TRUE(made.ok());
    sim_ = std::move(*made);
    registry_ = std::make_unique<SegmentRegistry>(sim_.get(), &ledger_, &history_);
    registry_->set_cap(20 * kMiB);
    EXPECT_TRUE(history_.Reset(100).ok());
  }
  DeviceStats Stats() const { return ledger_.Snapshot(); }
  StatLedger ledger_;
  HistoryRing history_;
  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<SegmentRegistry> registry_;
};

TEST_F(SegmentRegistryTest, AllocationsCountAgainstTheCapAndAreRegistered) {
  absl::StatusOr<std::uintptr_t> a = registry_->AllocateSegment(16 * kMiB, kLargePool);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::uintptr_t> b = registry_->AllocateSegment(2 * kMiB, kSmallPool);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(registry_->Headroom(), 2 * kMiB);
  absl::StatusOr<std::uintptr_t> c = registry_->AllocateSegment(4 * kMiB, kLargePool);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status()));
  EXPECT_TRUE(absl::StrContains(c.status().message(), "would exceed the cap of 20971520 bytes")) << c.status();
  EXPECT_EQ(sim_->counters().allocs, 2) << "refused before the backend call";
  const DeviceStats s = Stats();
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(s.segment[kAllPools].current, 2);
  EXPECT_EQ(s.num_device_alloc, 2);
  ASSERT_TRUE(registry_->Holding(*a + 5 * kMiB).has_value());
  EXPECT_EQ(registry_->Holding(*a + 5 * kMiB)->base, *a);
  EXPECT_FALSE(registry_->Holding(*a + 15 * kMiB, 2 * kMiB).has_value()) << "a range that crosses its end";
  EXPECT_EQ(registry_->At(*b)->pool, kSmallPool);
  EXPECT_EQ(registry_->LargeRangesOver(10 * kMiB), 1);
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
  EXPECT_TRUE(registry_->ReleaseSegment(*a, 16 * kMiB, kLargePool));
  EXPECT_EQ(Stats().num_device_free, 1);
  EXPECT_FALSE(registry_->Holding(*a).has_value());
  ASSERT_EQ(history_.Entries().size(), 3u);
  EXPECT_EQ(history_.Entries()[2].action, TraceAction::kSegmentFree);
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
}

// The device-wide check's linear walks: blocks inside the ranges, and the pools' units exactly the
// ranges (in any order); each difference named.
TEST_F(SegmentRegistryTest, TheLinearChecksOfBlocksAndUnitsNameWhatDiffers) {
  absl::StatusOr<std::uintptr_t> a = registry_->AllocateSegment(8 * kMiB, kLargePool);
  absl::StatusOr<std::uintptr_t> b = registry_->AllocateSegment(2 * kMiB, kSmallPool);
  ASSERT_TRUE(a.ok() && b.ok());
  using Block = std::pair<std::uintptr_t, std::size_t>;
  std::vector<Block> blocks = {{*a, kMiB}, {*a + kMiB, 7 * kMiB}, {*b + 512, 512}};
  std::sort(blocks.begin(), blocks.end());
  EXPECT_TRUE(registry_->CheckHolds(blocks).ok());
  std::vector<Block> across = {{*a + 7 * kMiB, 2 * kMiB}};  // past the range's end
  absl::Status s = registry_->CheckHolds(across);
  EXPECT_TRUE(absl::StrContains(s.message(), "does not lie inside one registered segment")) << s;
  std::vector<Block> outside = {{*a + 64 * kMiB, 512}};
  EXPECT_FALSE(registry_->CheckHolds(outside).ok());
  using Range = SegmentRegistry::Range;
  const Range large{.base = *a, .bytes = 8 * kMiB, .pool = kLargePool, .mapped = 8 * kMiB};
  const Range small{.base = *b, .bytes = 2 * kMiB, .pool = kSmallPool, .mapped = 2 * kMiB};
  EXPECT_TRUE(registry_->CheckUnits(std::vector<Range>{small, large}).ok()) << "in any order";
  Range wrong_pool = small;
  wrong_pool.pool = kLargePool;
  s = registry_->CheckUnits(std::vector<Range>{large, wrong_pool});
  EXPECT_TRUE(absl::StrContains(s.message(), "does not match its registered range")) << s;
  Range shorter = large;
  shorter.bytes = 6 * kMiB;
  EXPECT_FALSE(registry_->CheckUnits(std::vector<Range>{shorter, small}).ok());
  s = registry_->CheckUnits(std::vector<Range>{large, large});
  EXPECT_TRUE(absl::StrContains(s.message(), "name the same registered range")) << s;
  s = registry_->CheckUnits(std::vector<Range>{large});
  EXPECT_TRUE(absl::StrContains(s.message(), "2 ranges are registered for 1 segments")) << s;
}

TEST_F(SegmentRegistryTest, DuringACaptureItGrowsWithoutCollectingAndTheCollectorRunsBeforeGrowthOtherwise) {
  std::size_t collected = 0;
  registry_->set_collector([&](std::size_t incoming) { collected += incoming; });
  registry_->set_capturing(true);
  EXPECT_TRUE(registry_->Capturing());
  absl::StatusOr<std::uintptr_t> a = registry_->AllocateSegment(2 * kMiB, kLargePool);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::uintptr_t> va = registry_->ReserveRange(2 * kMiB, 2 * kMiB, kLargePool);
  ASSERT_TRUE(va.ok()) << va.status();
  EXPECT_EQ(collected, 0u) << "no release during a capture";
  EXPECT_EQ(sim_->counters().allocs, 1);
  registry_->set_capturing(false);
  ASSERT_TRUE(registry_->AllocateSegment(2 * kMiB, kLargePool).ok());
  EXPECT_EQ(collected, 2 * kMiB);
  registry_->ReleaseRange(*va, 2 * kMiB);
}

TEST_F(SegmentRegistryTest, RangesCountTheirMappedPieces) {
  absl::StatusOr<std::uintptr_t> va = registry_->ReserveRange(8 * kMiB, 8 * kMiB, kLargePool);
  ASSERT_TRUE(va.ok()) << va.status();
  absl::StatusOr<PhysicalHandle> g = registry_->CreatePhysical(2 * kMiB, kLargePool);
  absl::StatusOr<PhysicalHandle> h = registry_->CreatePhysical(4 * kMiB, kLargePool);
  ASSERT_TRUE(g.ok() && h.ok());
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_TRUE(absl::IsResourceExhausted(registry_->CreatePhysical(16 * kMiB, kLargePool).status())) << "past the cap";
  std::size_t mapped = 0;
  const PhysicalPiece pieces[] = {{*g, 2 * kMiB}, {*h, 4 * kMiB}};
  ASSERT_TRUE(registry_->MapPieces(*va, pieces, &mapped).ok());
  EXPECT_EQ(mapped, 2u);
  EXPECT_EQ(registry_->At(*va)->mapped, 6 * kMiB);
  EXPECT_EQ(registry_->totals().ranges, 1u);
  EXPECT_EQ(sim_->counters().access_grants, 1) << "one access grant for the run";
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
  ASSERT_TRUE(registry_->Unmap(*va, 6 * kMiB).ok());
  EXPECT_EQ(sim_->counters().unmaps, 1) << "one unmap for both pieces";
  EXPECT_FALSE(registry_->CheckInvariants(0).ok()) << "unmapped pieces that are not counted as spares";
  EXPECT_TRUE(registry_->CheckInvariants(6 * kMiB).ok());
  EXPECT_TRUE(registry_->ReleasePhysical(pieces[0], kLargePool));
  EXPECT_TRUE(registry_->CheckInvariants(4 * kMiB).ok());
  EXPECT_TRUE(registry_->ReleasePhysical(pieces[1], kLargePool));
  registry_->ReleaseRange(*va, 8 * kMiB);
  EXPECT_EQ(Stats().segment[kLargePool].current, 0);
  EXPECT_EQ(Stats().reserved_bytes[kLargePool].current, 0);
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
}

// Ranges are carved from reservations of 1 1/4 x the cap (top down), not reserved one by one; a
// range larger than that gets a reservation of its own; empty_cache's trim gives back the unused.
TEST_F(SegmentRegistryTest, RangesAreCarvedFromFewReservations) {
  std::vector<std::uintptr_t> ranges;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::uintptr_t> va = registry_->ReserveRange(4 * kMiB, 0, kLargePool);
    ASSERT_TRUE(va.ok()) << va.status();
    if (!ranges.empty()) {
      EXPECT_EQ(*va + 4 * kMiB, ranges.back()) << "each below the one before";
    }
    ranges.push_back(*va);
  }
  EXPECT_EQ(sim_->counters().address_reserves, 1) << "five 4 MiB ranges from one 25 MiB reservation";
  absl::StatusOr<std::uintptr_t> big = registry_->ReserveRange(24 * kMiB, 0, kLargePool);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(sim_->counters().address_reserves, 2);
  EXPECT_EQ(Stats().segment[kLargePool].current, 6);
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
  // A range given back is carved again; a wholly free reservation goes back at a trim only.
  registry_->ReleaseRange(ranges[2], 4 * kMiB);
  absl::StatusOr<std::uintptr_t> again = registry_->ReserveRange(4 * kMiB, 0, kLargePool);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, ranges[2]);
  EXPECT_EQ(sim_->counters().address_reserves, 2);
  registry_->ReleaseRange(*big, 24 * kMiB);
  EXPECT_EQ(sim_->counters().address_releases, 0);
  registry_->TrimAddressSpace();
  EXPECT_EQ(sim_->counters().address_releases, 1) << "the big one's reservation; the other is in use";
  ranges[2] = *again;
  for (std::uintptr_t va : ranges) registry_->ReleaseRange(va, 4 * kMiB);
  registry_->TrimAddressSpace();
  EXPECT_EQ(sim_->counters().address_releases, 2);
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
}

TEST_F(SegmentRegistryTest, TheCheckCatchesMemoryTakenBehindItsBack) {
  ASSERT_TRUE(registry_->AllocateSegment(2 * kMiB, kLargePool).ok());
  absl::StatusOr<void*> stray = sim_->Allocate(2 * kMiB);  // not through the registry
  ASSERT_TRUE(stray.ok());
  absl::Status s = registry_->CheckInvariants(0);
  EXPECT_TRUE(absl::StrContains(s.message(), "the backend holds 2 allocations")) << s;
  ASSERT_TRUE(sim_->Free(*stray, 2 * kMiB).ok());
  EXPECT_TRUE(registry_->CheckInvariants(0).ok());
}

// A backend of an embedder (Allocator::CreateWithBackend) that counts calls but not bytes, as
// backends written before BackendCounters had bytes do: its allocations are checked by count.
class CallsOnlyBackend final : public Backend {
 public:
  explicit CallsOnlyBackend(std::unique_ptr<SimBackend> sim) : sim_(std::move(sim)) {}
  absl::string_view Name() const override { return "calls-only"; }
  int device() const override { return 0; }
  std::size_t Granularity() const override { return sim_->Granularity(); }
  absl::StatusOr<void*> Allocate(std::size_t bytes) override { return sim_->Allocate(bytes); }
  absl::Status Free(void* p, std::size_t bytes) override { return sim_->Free(p, bytes); }
  absl::StatusOr<DeviceMemInfo> GetMemInfo() override { return sim_->GetMemInfo(); }
  absl::StatusOr<Event> RecordEvent(Stream s) override { return sim_->RecordEvent(s); }
  absl::StatusOr<bool> QueryEvent(Event e) override { return sim_->QueryEvent(e); }
  absl::Status SynchronizeEvent(Event e) override { return sim_->SynchronizeEvent(e); }
  void DestroyEvent(Event e) override { sim_->DestroyEvent(e); }
  BackendCounters counters() const override {
    const BackendCounters c = sim_->counters();
    BackendCounters calls;
    calls.allocs = c.allocs;
    calls.frees = c.frees;
    return calls;
  }

 private:
  std::unique_ptr<SimBackend> sim_;
};

TEST(SegmentRegistryBackendTest, ABackendThatCountsNoBytesIsCheckedByCount) {
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend({.total_memory = 64 * kMiB});
  ASSERT_TRUE(sim.ok());
  CallsOnlyBackend backend(std::move(*sim));
  StatLedger ledger;
  HistoryRing history;
  SegmentRegistry registry(&backend, &ledger, &history);
  registry.set_cap(64 * kMiB);
  absl::StatusOr<std::uintptr_t> a = registry.AllocateSegment(4 * kMiB, kLargePool);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(registry.CheckInvariants(0).ok()) << registry.CheckInvariants(0);
  absl::StatusOr<void*> stray = backend.Allocate(2 * kMiB);  // its count still catches a stray allocation
  ASSERT_TRUE(stray.ok());
  EXPECT_FALSE(registry.CheckInvariants(0).ok());
  ASSERT_TRUE(backend.Free(*stray, 2 * kMiB).ok());
  EXPECT_TRUE(registry.ReleaseSegment(*a, 4 * kMiB, kLargePool));
  EXPECT_TRUE(registry.CheckInvariants(0).ok());
}

}  // namespace
}  // namespace bucketalloc::internal
