// Snapshots and allocation history (src/frontend/observability/snapshot_json.cc, snapshot_walk.cc, history.cc and the
// DeviceAllocator parts that feed them), over every test configuration: the segments tile their memory, the sums agree
// with the stats, block states follow the operations, and the history ring keeps the last N events.
#include "bucketalloc/snapshot.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::TestStream;

class SnapshotTest : public ::bucketalloc::testing::ConfiguredAllocatorTest {
 protected:
  MemorySnapshot Snap() {
    absl::StatusOr<MemorySnapshot> s = allocator_->Snapshot(0);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : MemorySnapshot{};
  }
  // Checks the structure and that the totals equal the device's stats.
  void ExpectAgreesWithStats(const MemorySnapshot& snap) {
    const DeviceStats stats = *allocator_->GetStats(0);
    std::int64_t reserved = 0, allocated = 0, active = 0, requested = 0, allocations = 0;
    std::uintptr_t previous_end = 0;
    for (const SegmentSnapshot& seg : snap.segments) {
      EXPECT_GE(seg.address, previous_end) << "segments overlap or are out of order";
      previous_end = seg.address + seg.total_size;
      std::uintptr_t next = seg.address;
      std::size_t seg_allocated = 0, seg_active = 0;
      for (const BlockSnapshot& b : seg.blocks) {
        EXPECT_EQ(b.address, next) << "blocks do not tile the segment";
        next += b.size;
        if (b.state == BlockSnapshotState::kActiveAllocated) {
          seg_allocated += b.size;
          ++allocations;
          EXPECT_LE(b.requested_size, b.size);
          EXPECT_GT(b.requested_size, 0u);
        }
        if (b.state != BlockSnapshotState::kInactive) seg_active += b.size;
      }
      EXPECT_EQ(next, seg.address + seg.total_size) << "blocks do not cover the segment";
      EXPECT_EQ(seg.allocated_size, seg_allocated);
      EXPECT_EQ(seg.active_size, seg_active);
      reserved += static_cast<std::int64_t>(seg.total_size);
      allocated += static_cast<std::int64_t>(seg.allocated_size);
      active += static_cast<std::int64_t>(seg.active_size);
      requested += static_cast<std::int64_t>(seg.requested_size);
    }
    EXPECT_EQ(reserved, stats.reserved_bytes[kAllPools].current);
    EXPECT_EQ(allocated, stats.allocated_bytes[kAllPools].current);
    EXPECT_EQ(active, stats.active_bytes[kAllPools].current);
    EXPECT_EQ(allocations, stats.allocation[kAllPools].current);
    EXPECT_GE(requested, stats.requested_bytes[kAllPools].current);  // pending blocks keep their request
  }
};

TEST_P(SnapshotTest, SegmentsTileTheirMemoryAndAgreeWithTheStats) {
  ExpectAgreesWithStats(Snap());
  EXPECT_TRUE(Snap().segments.empty());
  std::vector<void*> live;
  // Fits the tiny configuration's 64 MiB cap: 4 slabs and two 20 MiB segments.
  for (std::size_t size : {std::size_t{100}, std::size_t{4096}, std::size_t{70000}, kMiB, 3 * kMiB, 5 * kMiB + 7}) {
    for (int i = 0; i < 3; ++i) live.push_back(*allocator_->Allocate(size, 0, TestStream(1)));
  }
  ExpectAgreesWithStats(Snap());
  for (std::size_t i = 0; i < live.size(); i += 2) ASSERT_TRUE(allocator_->Free(live[i]).ok());
  const MemorySnapshot snap = Snap();
  ExpectAgreesWithStats(snap);
  bool small = false, large = false;
  for (const SegmentSnapshot& seg : snap.segments) (seg.small ? small : large) = true;
  EXPECT_TRUE(small && large);
  for (std::size_t i = 1; i < live.size(); i += 2) ASSERT_TRUE(allocator_->Free(live[i]).ok());
  ExpectAgreesWithStats(Snap());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_TRUE(Snap().segments.empty());
}

TEST_P(SnapshotTest, BlockStatesFollowAllocateFreeAndPendingFree) {
  SimBackend* sim = AsSim(*allocator_->backend(0));
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    void* p = *allocator_->Allocate(size, 0, TestStream(1));
    auto state_of = [&](void* ptr) {
      for (const SegmentSnapshot& seg : Snap().segments) {
        for (const BlockSnapshot& b : seg.blocks) {
          if (b.address == reinterpret_cast<std::uintptr_t>(ptr)) return std::optional(b);
        }
      }
      return std::optional<BlockSnapshot>();
    };
    ASSERT_TRUE(state_of(p).has_value());
    EXPECT_EQ(state_of(p)->state, BlockSnapshotState::kActiveAllocated);
    EXPECT_EQ(state_of(p)->requested_size, size);
    ASSERT_TRUE(allocator_->RecordStream(p, 0, TestStream(2)).ok());
    sim->EnqueueWork(TestStream(2));
    ASSERT_TRUE(allocator_->Free(p).ok());
    EXPECT_EQ(state_of(p)->state, BlockSnapshotState::kActivePendingFree);
    ExpectAgreesWithStats(Snap());
    sim->CompleteWork(TestStream(2));
    ASSERT_TRUE(allocator_->EmptyCache().ok());  // retires the pending free
    EXPECT_FALSE(state_of(p).has_value()) << "released with the cache";
  }
}

TEST_P(SnapshotTest, HistoryRecordsEachEventInOrder) {
  ASSERT_TRUE(allocator_->RecordHistory(true, 1000).ok());
  void* p = *allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  const MemorySnapshot snap = Snap();
  ASSERT_EQ(snap.device_traces.size(), 1u);
  // With stitching, the range's pieces are mapped after segment_alloc (one entry each) and
  // unmapped before segment_free (one entry per unmap call), PyTorch's segment_map and
  // segment_unmap.
  std::vector<TraceEntry> t;
  int maps = 0, unmaps = 0;
  for (const TraceEntry& e : snap.device_traces[0]) {
    if (e.action == TraceAction::kSegmentMap) {
      ++maps;
      EXPECT_EQ(unmaps, 0) << "a map after an unmap";
    } else if (e.action == TraceAction::kSegmentUnmap) {
      ++unmaps;
    } else {
      t.push_back(e);
    }
  }
  const bool stitching = absl::StrContains(GetParam().conf, "expandable_segments:true");
  EXPECT_EQ(maps, stitching ? 1 : 0) << "3 MiB rounds to its 4 MiB tier, whose segment is one piece";
  EXPECT_EQ(unmaps, maps);
  std::vector<std::string> actions;
  for (const TraceEntry& e : t) actions.emplace_back(TraceActionName(e.action));
  EXPECT_EQ(actions,
            (std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"}));
  EXPECT_EQ(t[1].addr, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(t[1].size, 3 * kMiB) << "the requested size, as PyTorch records it";
  EXPECT_EQ(t[1].stream, reinterpret_cast<std::uintptr_t>(TestStream(1)));
  EXPECT_EQ(t[0].stream, t[1].stream);
  EXPECT_EQ(t[4].addr, t[0].addr);
  EXPECT_EQ(t[2].size, t[1].size) << "free_requested: the same size as alloc";
  EXPECT_EQ(t[3].size, t[1].size) << "free_completed: the same size, not that of what the block merged into";
  EXPECT_EQ(t[3].stream, t[1].stream);
  for (std::size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i].time_us, t[i - 1].time_us);
  EXPECT_GT(t[0].time_us, 1'600'000'000'000'000) << "epoch microseconds";
  ASSERT_TRUE(allocator_->RecordHistory(false, 0).ok());
  EXPECT_TRUE(Snap().device_traces[0].empty());
}

TEST_P(SnapshotTest, HistoryIsARingOfTheLastEntries) {
  ASSERT_TRUE(allocator_->RecordHistory(true, 5).ok());
  std::vector<void*> ptrs;
  for (int i = 0; i < 20; ++i) ptrs.push_back(*allocator_->Allocate(4096, 0, TestStream(1)));
  const std::vector<TraceEntry> t = Snap().device_traces[0];
  ASSERT_EQ(t.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(TraceActionName(t[i].action), "alloc");
    EXPECT_EQ(t[i].addr, reinterpret_cast<std::uintptr_t>(ptrs[15 + i])) << i;
  }
  // Turning it on again starts a new history.
  ASSERT_TRUE(allocator_->RecordHistory(true, 5).ok());
  EXPECT_TRUE(Snap().device_traces[0].empty());
  for (void* p : ptrs) ASSERT_TRUE(allocator_->Free(p).ok());
  EXPECT_EQ(Snap().device_traces[0].size(), 5u);
}

TEST_P(SnapshotTest, BadHistorySizesAreRefused) {
  for (std::size_t n : {std::size_t{0}, kMaxHistoryEntries + 1}) {
    absl::Status s = allocator_->RecordHistory(true, n);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << n;
    EXPECT_TRUE(absl::StrContains(s.message(), "accepted: 1 to")) << s;
  }
}

TEST_P(SnapshotTest, AnOomIsRecordedWithTheDevicesFreeMemory) {
  ASSERT_TRUE(allocator_->RecordHistory(true, 100).ok());
  absl::StatusOr<void*> p = allocator_->Allocate(std::size_t{64} << 30, 0, TestStream(1));
  ASSERT_TRUE(absl::IsResourceExhausted(p.status()));
  const std::vector<TraceEntry> t = Snap().device_traces[0];
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(TraceActionName(t.back().action), "oom");
  EXPECT_EQ(t.back().size, std::size_t{64} << 30);
  EXPECT_GT(t.back().device_free, 0u);
}

TEST_P(SnapshotTest, JsonHasPyTorchsLayout) {
  ASSERT_TRUE(allocator_->RecordHistory(true, 100).ok());
  void* a = *allocator_->Allocate(1000, 0, TestStream(1));
  void* b = *allocator_->Allocate(5 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(allocator_->Free(a).ok());
  const nlohmann::json j = nlohmann::json::parse(SnapshotToJson(Snap()));
  ASSERT_TRUE(j.contains("segments") && j.contains("device_traces") && j.contains("allocator_settings"));
  std::map<std::string, int> types;
  for (const auto& seg : j["segments"]) {
    for (const char* key : {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}) {
      EXPECT_TRUE(seg.contains(key)) << key;
    }
    ++types[seg["segment_type"].get<std::string>()];
    for (const auto& block : seg["blocks"]) {
      for (const char* key : {"address", "size", "requested_size", "state", "frames"}) EXPECT_TRUE(block.contains(key));
      // An active block says that no stack was recorded (one frame), a free one has none.
      EXPECT_EQ(block["frames"].size(), block["state"] == "inactive" ? 0u : 1u) << block.dump();
    }
  }
  EXPECT_EQ(types["small"], 1);
  EXPECT_GE(types["large"], 1);
  const auto& trace = j["device_traces"][0];
  ASSERT_FALSE(trace.empty());
  for (const auto& e : trace) {
    for (const char* key : {"action", "addr", "size", "stream", "time_us", "frames"}) EXPECT_TRUE(e.contains(key));
    ASSERT_EQ(e["frames"].size(), 1u);
    EXPECT_EQ(e["frames"][0]["filename"], "<bucketalloc>");
  }
  EXPECT_EQ(j["allocator_settings"]["BUCKETALLOC_CONF"].get<std::string>(), FormatOptions(allocator_->options()));
  ASSERT_TRUE(allocator_->Free(b).ok());
}

TEST_P(SnapshotTest, BaseAllocationAndDeviceOfFindTheOwningSegment) {
  void* small = *allocator_->Allocate(1000, 0, TestStream(1));
  void* large = *allocator_->Allocate(5 * kMiB, 0, TestStream(1));
  for (void* p : {small, large}) {
    absl::StatusOr<std::pair<void*, std::size_t>> base = allocator_->BaseAllocation(p);
    ASSERT_TRUE(base.ok()) << base.status();
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const auto start = reinterpret_cast<std::uintptr_t>(base->first);
    EXPECT_LE(start, addr);
    EXPECT_LT(addr, start + base->second);
    EXPECT_EQ(*allocator_->DeviceOf(p), 0);
    ASSERT_TRUE(allocator_->RecordStream(p, TestStream(2)).ok());
  }
  void* inside = static_cast<char*>(large) + 64;
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->BaseAllocation(inside).status()));
  EXPECT_EQ(*allocator_->DeviceHolding(inside), 0) << "an interior pointer lies in reserved memory";
  int local = 0;
  EXPECT_TRUE(absl::IsNotFound(allocator_->DeviceHolding(&local).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->RecordStream(inside, TestStream(2))));
  ASSERT_TRUE(allocator_->Free(small).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->DeviceOf(small).status()));
  EXPECT_EQ(*allocator_->DeviceHolding(small), 0) << "freed but still cached";
  ASSERT_TRUE(allocator_->Free(large).ok());
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(SnapshotTest);

}  // namespace
}  // namespace bucketalloc
