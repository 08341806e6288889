// CUDA graph capture and private pools (DeviceAllocator's capture rules, PyTorch's PrivatePool
// semantics), over every configuration: requests routed to a capture's private pool grow it during
// the capture (the backends allocate in relaxed capture mode) and reuse its freed blocks, in the
// same capture and in later captures sharing the pool; its blocks never serve other requests; no
// call CUDA forbids during capture is made (the sim backend refuses them and counts them); a
// released pool's memory goes back after a device synchronization; a failed capture recovers.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::TestStream;

constexpr GraphPoolId kPool{0, 1};

class CaptureTest : public ::bucketalloc::testing::ConfiguredAllocatorTest {
 protected:
  void SetUp() override {
    ConfiguredAllocatorTest::SetUp();
    if (HasFatalFailure()) return;
    sim_ = AsSim(*allocator_->backend(0));
  }
  void TearDown() override {
    EXPECT_EQ(sim_->counters().capture_violations, 0) << "a call CUDA forbids during capture was made";
    absl::Status s = allocator_->CheckInvariants(0);
    EXPECT_TRUE(s.ok()) << s;
  }
  // An announced capture of stream `s` into `pool` (as PyTorch's CUDAGraph::capture_begin does:
  // beginAllocateToPool, then cudaStreamBeginCapture).
  void Begin(Stream s, GraphPoolId pool = kPool) {
    ASSERT_TRUE(allocator_->BeginCapture(0, pool, [s](Stream x) { return x == s; }).ok());
    sim_->SetCapturing(s, true);
  }
  void End(Stream s, GraphPoolId pool = kPool) {
    sim_->SetCapturing(s, false);
    ASSERT_TRUE(allocator_->EndCapture(0, pool).ok());
  }
  // A decode step's allocations on `s`: intermediates freed at once, one output kept.
  void* Step(Stream s, std::vector<void*>* addresses = nullptr) {
    void* output = nullptr;
    for (std::size_t size : {std::size_t{4096}, 300000 + std::size_t{0}, 3 * kMiB, 5 * kMiB}) {
      absl::StatusOr<void*> a = allocator_->Allocate(size, 0, s);
      EXPECT_TRUE(a.ok()) << size << ": " << a.status();
      if (!a.ok()) return nullptr;
      if (addresses != nullptr) addresses->push_back(*a);
      if (output == nullptr && size == 3 * kMiB) {
        output = *a;
      } else {
        EXPECT_TRUE(allocator_->Free(*a).ok());
      }
    }
    return output;
  }
  std::int64_t Reserved() { return Stats().reserved_bytes[kAllPools].current; }
  SimBackend* sim_ = nullptr;
};

TEST_P(CaptureTest, ACaptureGrowsItsPrivatePoolAndCallsNothingCudaForbids) {
  const Stream s = TestStream(1), other = TestStream(2);
  Begin(s);
  // The capturing stream (routed to the pool) and another thread's stream (the device's own pools):
  // both grow in relaxed capture mode, as PyTorch's cudaMallocMaybeCapturing does.
  std::vector<void*> taken;
  for (Stream stream : {s, other}) {
    for (std::size_t size : {std::size_t{4096}, 5 * kMiB}) {
      absl::StatusOr<void*> p = allocator_->Allocate(size, 0, stream);
      ASSERT_TRUE(p.ok()) << p.status();
      taken.push_back(*p);
    }
  }
  EXPECT_GT(sim_->counters().allocs + sim_->counters().physical_creates, 0) << "the pools grew during the capture";
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EmptyCache())) << "no release during a capture";
  for (void* p : taken) ASSERT_TRUE(allocator_->Free(p).ok());
  End(s);
  EXPECT_EQ(Stats().num_capture_refusals, 0);
  EXPECT_EQ(Stats().num_ooms, 0);
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0) << "the released pool's memory and the cache went back";
}

TEST_P(CaptureTest, APoolReusesItsFreedBlocksInTheCaptureAndServesNothingElse) {
  const Stream s = TestStream(1);
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    Begin(s);
    void* intermediate = *allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(allocator_->Free(intermediate).ok());  // freed inside the graph: reused inside it
    absl::StatusOr<void*> output = allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(output.ok()) << output.status();
    EXPECT_EQ(*output, intermediate) << "PyTorch reuses a private pool's freed block in the same capture";
    End(s);
    ASSERT_TRUE(allocator_->Free(*output).ok());  // a graph output freed after the capture: back to the pool
    // Eager work after the capture does not get the pool's blocks.
    void* eager = *allocator_->Allocate(size, 0, s);
    EXPECT_NE(eager, *output) << "a private pool's block served a request outside the pool";
    ASSERT_TRUE(allocator_->Free(eager).ok());
    // empty_cache keeps a pool in use; the snapshot names the pool of its segments.
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_GT(Reserved(), 0);
    absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot(0);
    ASSERT_TRUE(snap.ok());
    ASSERT_FALSE(snap->segments.empty());
    for (const SegmentSnapshot& seg : snap->segments) EXPECT_EQ(seg.pool_id, kPool);
    ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());  // the graph is destroyed
    EXPECT_GT(Reserved(), 0) << "freed at the next release, as in PyTorch";
    const std::int64_t syncs = sim_->counters().device_syncs;
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(sim_->counters().device_syncs, syncs + 1) << "a released pool's memory waits for the device";
    EXPECT_EQ(Reserved(), 0);
  }
}

TEST_P(CaptureTest, NCapturesSharingAPoolCostAboutOneCapture) {
  const Stream s = TestStream(1);
  constexpr int kGraphs = 8;
  std::vector<void*> outputs;
  std::vector<std::int64_t> reserved;
  for (int g = 0; g < kGraphs; ++g) {
    Begin(s);  // every graph into kPool: graph_pool_handle() shared
    outputs.push_back(Step(s));
    End(s);
    ASSERT_TRUE(allocator_->Free(outputs.back()).ok()) << "the output is the next graph's input, then dropped";
    reserved.push_back(Reserved());
  }
  EXPECT_EQ(reserved.back(), reserved.front()) << "each later capture reused the first one's blocks";
  // All of it is the pool's own (PyTorch's reserved_bytes_by_private_pools).
  const DeviceStats stats = Stats();
  ASSERT_EQ(stats.reserved_bytes_by_private_pools.size(), 1u);
  EXPECT_EQ(stats.reserved_bytes_by_private_pools[0].id_second, kPool.second);
  EXPECT_EQ(stats.reserved_bytes_by_private_pools[0].reserved_bytes[kAllPools].current, reserved.back());
  for (int g = 0; g < kGraphs; ++g) ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
  EXPECT_TRUE(Stats().reserved_bytes_by_private_pools.empty()) << "the pool is forgotten";
}

TEST_P(CaptureTest, TwoGraphsSharingAPoolReleaseInEitherOrder) {
  const Stream s = TestStream(1);
  for (bool first_released_first : {true, false}) {
    std::vector<void*> g1_blocks, g2_blocks;
    Begin(s);
    void* out1 = Step(s, &g1_blocks);
    End(s);
    Begin(s);
    void* out2 = Step(s, &g2_blocks);
    End(s);
    // g2 replays while g1 is reset: nothing of the pool may serve other requests meanwhile.
    ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    std::set<void*> pool_blocks(g1_blocks.begin(), g1_blocks.end());
    pool_blocks.insert(g2_blocks.begin(), g2_blocks.end());
    std::vector<void*> eager;
    for (std::size_t size : {std::size_t{4096}, 300000 + std::size_t{0}, 3 * kMiB, 5 * kMiB}) {
      eager.push_back(*allocator_->Allocate(size, 0, s));
      EXPECT_EQ(pool_blocks.count(eager.back()), 0u) << "a block of a pool still in use served an eager tensor";
    }
    for (void* p : eager) ASSERT_TRUE(allocator_->Free(p).ok());
    ASSERT_TRUE(allocator_->Free(first_released_first ? out1 : out2).ok());
    ASSERT_TRUE(allocator_->Free(first_released_first ? out2 : out1).ok());
    ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());  // the last use
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(Reserved(), 0);
  }
}

TEST_P(CaptureTest, AFailedCaptureRecoversInEveryOrder) {
  const Stream s = TestStream(1);
  // (1) cudaStreamEndCapture failed, and the host releases the pool without ending (older torch).
  Begin(s);
  void* lost = Step(s);
  sim_->SetCapturing(s, false);  // the capture was invalidated; endAllocateToPool never comes
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok()) << "no capture runs any more";
  ASSERT_TRUE(allocator_->Free(lost).ok());
  // (2) torch 2.15's reset(): end, then release.
  Begin(s);
  void* out = Step(s);
  sim_->SetCapturing(s, false);
  ASSERT_TRUE(allocator_->EndCapture(0, kPool).ok());
  ASSERT_TRUE(allocator_->Free(out).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  // (3) the graph object lingers: neither end nor release. The next slow path sees that the
  // routing's stream no longer captures and ends it.
  Begin(s);
  out = Step(s);
  sim_->SetCapturing(s, false);
  void* big = *allocator_->Allocate(40 * kMiB / 4, 0, TestStream(2));  // a slow path
  EXPECT_EQ(Stats().num_abandoned_captures, 1);
  EXPECT_TRUE(allocator_->EmptyCache().ok()) << "the device is out of capture mode";
  void* eager = *allocator_->Allocate(3 * kMiB, 0, s);
  EXPECT_NE(eager, out);
  for (void* p : {big, eager, out}) ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

TEST_P(CaptureTest, CrossStreamFreesDuringCaptureRecordTheirEventsAfterIt) {
  const Stream s = TestStream(1), other = TestStream(2), worker = TestStream(3);
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    void* p = *allocator_->Allocate(size, 0, worker);  // not part of the graph
    ASSERT_TRUE(allocator_->RecordStream(p, 0, other).ok());
    sim_->EnqueueWork(other);
    const std::int64_t events = sim_->counters().events_recorded;
    const std::int64_t deferred = Stats().num_deferred_frees;
    Begin(s);
    ASSERT_TRUE(allocator_->Free(p).ok());
    EXPECT_EQ(sim_->counters().events_recorded, events) << "an event recorded during capture never completes";
    EXPECT_EQ(Stats().num_deferred_frees, deferred + 1);
    End(s);
    // After the capture the events are recorded on the next free or slow path; `other` still runs.
    std::vector<void*> taken;
    for (int i = 0; i < 3; ++i) taken.push_back(*allocator_->Allocate(size, 0, worker));
    ASSERT_TRUE(allocator_->Free(taken.back()).ok());
    taken.pop_back();
    EXPECT_GT(sim_->counters().events_recorded, events) << "armed by the free";
    for (int i = 0; i < 2; ++i) taken.push_back(*allocator_->Allocate(size, 0, worker));
    for (void* t : taken) EXPECT_NE(t, p) << "reused while `other` may still use it";
    sim_->CompleteWork(other);
    for (void* t : taken) ASSERT_TRUE(allocator_->Free(t).ok());
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0);
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  }
}

TEST_P(CaptureTest, OnlyTheCapturedStreamsBlocksBelongToThePool) {
  const Stream s = TestStream(1), other = TestStream(2);
  void* warm = *allocator_->Allocate(4096, 0, other);
  ASSERT_TRUE(allocator_->Free(warm).ok());
  Begin(s);
  void* p = *allocator_->Allocate(4096, 0, other);  // another thread's eager work during the capture
  EXPECT_EQ(p, warm) << "served from the device's own cache";
  ASSERT_TRUE(allocator_->Free(p).ok());
  End(s);
  void* q = *allocator_->Allocate(4096, 0, other);
  EXPECT_EQ(q, warm) << "not the pool's: reusable by anyone on its stream";
  ASSERT_TRUE(allocator_->Free(q).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
}

TEST_P(CaptureTest, BadCaptureCallsAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->BeginCapture(0, kPool, nullptr)));
  EXPECT_TRUE(absl::IsNotFound(allocator_->EndCapture(0, kPool)));
  EXPECT_TRUE(allocator_->ReleasePool(0, GraphPoolId{7, 7}).ok()) << "a pool never used here: nothing to do";
  Begin(TestStream(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->BeginCapture(0, kPool, [](Stream) { return true; })))
      << "already allocating to it";
  End(TestStream(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EndCapture(0, kPool))) << "ended twice";
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  EXPECT_TRUE(absl::IsNotFound(allocator_->EndCapture(0, kPool))) << "released: no longer in use";
}

// AllocateAt (PyTorch's setCheckpointPoolState, cudagraph trees): a pool's blocks, freed, come back
// at their checkpointed addresses and block sizes as live allocations (stats, history, invariants,
// Free as usual); a range over a live block, an unknown or freeable pool, another stream's memory,
// bad sizes and addresses no memory of the pool holds are refused and change nothing.
TEST_P(CaptureTest, CheckpointedBlocksComeBackAtTheirAddressesWithAllocateAt) {
  const Stream s = TestStream(1);
  ASSERT_TRUE(allocator_->RecordHistory(true, 1000).ok());
  Begin(s);
  std::vector<void*> live;
  for (std::size_t size : {std::size_t{4096}, std::size_t{300000}, 3 * kMiB, 5 * kMiB}) {
    absl::StatusOr<void*> p = allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(p.ok()) << p.status();
    live.push_back(*p);
  }
  End(s);
  // The checkpoint: each block's address and block size, from the pool's segments.
  std::vector<std::pair<void*, std::size_t>> checkpoint;
  absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  for (const SegmentSnapshot& seg : snap->segments) {
    if (seg.pool_id != kPool) continue;
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.state == BlockSnapshotState::kActiveAllocated)
        checkpoint.emplace_back(reinterpret_cast<void*>(b.address), b.size);
    }
  }
  ASSERT_EQ(checkpoint.size(), live.size());
  const DeviceStats at_checkpoint = Stats();
  for (void* p : live) ASSERT_TRUE(allocator_->Free(p).ok());
  EXPECT_EQ(Stats().allocation[kAllPools].current, 0);

  for (const auto& [addr, block] : checkpoint) {
    absl::StatusOr<void*> p = allocator_->AllocateAt(0, kPool, addr, block, block, s);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, addr);
    ASSERT_TRUE(allocator_->CheckInvariants(0).ok()) << allocator_->CheckInvariants(0);
  }
  const DeviceStats restored = Stats();
  EXPECT_EQ(restored.allocation[kAllPools].current, static_cast<std::int64_t>(checkpoint.size()));
  EXPECT_EQ(restored.allocated_bytes[kAllPools].current, at_checkpoint.allocated_bytes[kAllPools].current);
  EXPECT_EQ(restored.active_bytes[kAllPools].current, at_checkpoint.active_bytes[kAllPools].current);
  EXPECT_EQ(restored.reserved_bytes[kAllPools].current, at_checkpoint.reserved_bytes[kAllPools].current);
  snap = allocator_->Snapshot(0);
  ASSERT_TRUE(snap.ok());
  ASSERT_FALSE(snap->device_traces[0].empty());
  const TraceEntry& last = snap->device_traces[0].back();
  EXPECT_EQ(last.action, TraceAction::kAlloc);
  EXPECT_EQ(last.addr, reinterpret_cast<std::uintptr_t>(checkpoint.back().first));
  EXPECT_EQ(last.size, checkpoint.back().second);

  // Refusals change nothing.
  auto refused = [&](auto call, absl::StatusCode code, const char* why) {
    const DeviceStats before = Stats();
    absl::StatusOr<void*> r = call();
    EXPECT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), code) << why << ": " << r.status();
    const DeviceStats now = Stats();
    EXPECT_EQ(now.allocation[kAllPools].current, before.allocation[kAllPools].current) << why;
    EXPECT_EQ(now.active_bytes[kAllPools].current, before.active_bytes[kAllPools].current) << why;
    EXPECT_EQ(now.num_splits, before.num_splits) << why;
  };
  void* const a0 = checkpoint[2].first;  // not a structured binding: the lambdas below capture them
  const std::size_t b0 = checkpoint[2].second;
  refused([&] { return allocator_->AllocateAt(0, kPool, a0, b0, b0, s); }, absl::StatusCode::kFailedPrecondition,
          "a live block");
  refused(
      [&] {
        return allocator_->AllocateAt(0, GraphPoolId{5, 5}, a0, b0, b0, s);
      },
      absl::StatusCode::kFailedPrecondition, "an unknown pool");
  refused([&] { return allocator_->AllocateAt(0, kPool, a0, b0, b0 + 1, s); }, absl::StatusCode::kInvalidArgument,
          "requested above the block");
  refused([&] { return allocator_->AllocateAt(0, kPool, a0, b0, 0, s); }, absl::StatusCode::kInvalidArgument,
          "requested 0");
  ASSERT_TRUE(allocator_->Free(a0).ok());
  refused([&] { return allocator_->AllocateAt(0, kPool, a0, b0, b0, TestStream(2)); },
          absl::StatusCode::kFailedPrecondition, "another stream");
  refused([&] { return allocator_->AllocateAt(0, kPool, static_cast<char*>(a0) + 1, b0, b0, s); },
          absl::StatusCode::kInvalidArgument, "misaligned");
  absl::StatusOr<void*> own = allocator_->Allocate(kMiB, 0, s);  // the device's own pools
  ASSERT_TRUE(own.ok());
  refused([&] { return allocator_->AllocateAt(0, kPool, *own, kMiB, kMiB, s); }, absl::StatusCode::kNotFound,
          "memory of another pool");
  // Back, then Free works as for any allocation, with the size it was requested with.
  ASSERT_TRUE(allocator_->AllocateAt(0, kPool, a0, b0, 1000, s).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->Free(a0, 0, b0))) << "requested 1000, not the block size";
  ASSERT_TRUE(allocator_->Free(a0, 0, 1000).ok());
  // The device's own pools ({0, 0}) too.
  ASSERT_TRUE(allocator_->Free(*own).ok());
  absl::StatusOr<void*> again = allocator_->AllocateAt(0, GraphPoolId{}, *own, kMiB, kMiB, s);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(allocator_->Free(*again).ok());
  // Block size 0: the pool's rounding of the request (allocateWithAddress).
  again = allocator_->AllocateAt(0, GraphPoolId{}, *own, 0, kMiB - 100, s);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Stats().allocated_bytes[kAllPools].current - Stats().requested_bytes[kAllPools].current,
            restored.allocated_bytes[kAllPools].current - restored.requested_bytes[kAllPools].current + 100);
  ASSERT_TRUE(allocator_->Free(*again).ok());
  for (std::size_t i = 0; i < checkpoint.size(); ++i) {
    if (i == 2) continue;  // a0, freed above
    ASSERT_TRUE(allocator_->Free(checkpoint[i].first).ok());
  }
  // A freeable pool (no graph uses it) is refused.
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
  refused([&] { return allocator_->AllocateAt(0, kPool, a0, b0, b0, s); }, absl::StatusCode::kFailedPrecondition,
          "a freeable pool");
}

// A no-split pool (PyTorch's MemPool(no_split=True)), in a capture as in a MemPool context: every
// block is a whole segment, never split and never stitched, in every configuration.
TEST_P(CaptureTest, ANoSplitPoolsBlocksAreWholeSegmentsInEveryConfiguration) {
  const Stream s = TestStream(1);
  ASSERT_TRUE(allocator_->IncrefPool(0, kPool).ok());
  ASSERT_TRUE(allocator_->ConfigurePool(0, kPool, PrivatePoolSettings{.no_split = true}).ok());
  Begin(s);
  std::vector<void*> kept;
  for (int round = 0; round < 2; ++round) {  // the second round reuses the first round's blocks
    std::vector<void*> addresses;
    kept.push_back(Step(s, &addresses));
  }
  End(s);
  absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot(0);
  ASSERT_TRUE(snap.ok()) << snap.status();
  int pool_segments = 0;
  for (const SegmentSnapshot& seg : snap->segments) {
    if (seg.pool_id != kPool) continue;
    ++pool_segments;
    ASSERT_EQ(seg.blocks.size(), 1u) << "a no-split segment holds one block";
    EXPECT_FALSE(seg.expandable);
  }
  EXPECT_GE(pool_segments, 2);
  // Too late once it holds memory.
  EXPECT_EQ(allocator_->ConfigurePool(0, kPool, PrivatePoolSettings{}).code(), absl::StatusCode::kFailedPrecondition);
  for (void* p : kept) ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());  // the capture's use
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());  // the MemPool's
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(CaptureTest);

}  // namespace
}  // namespace bucketalloc
