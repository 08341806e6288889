// CUDA graph capture (DeviceAllocator's capture rules), over every configuration. While a capture
// runs, requests are served from the cache only and a miss fails clearly; no backend call CUDA
// forbids during capture is made by any stream's slow path or free (the sim backend refuses them
// and counts them, as CUDA's global mode does); cross-stream frees record their events after the
// capture; and blocks of a graph pool are held until the pool is released.
#include <gtest/gtest.h>

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
  // An announced capture of stream `s` into kPool (as PyTorch's hooks announce it).
  void Begin(Stream s) {
    ASSERT_TRUE(allocator_->BeginCapture(0, kPool, [s](Stream x) { return x == s; }).ok());
    sim_->SetCapturing(s, true);
  }
  void End(Stream s) {
    sim_->SetCapturing(s, false);
    ASSERT_TRUE(allocator_->EndCapture(0, kPool).ok());
  }
  SimBackend* sim_ = nullptr;
};

const std::vector<std::size_t>& Sizes() {
  static const std::vector<std::size_t> sizes = {512, 4096, 300000, 3 * kMiB, 9 * kMiB + 7};
  return sizes;
}

TEST_P(CaptureTest, WarmedUpSizesAreServedFromTheCacheDuringCapture) {
  for (bool announced : {true, false}) {  // hooks, or only the stream's own capture status
    const Stream s = TestStream(announced ? 1 : 2);
    std::vector<void*> warm;
    for (std::size_t size : Sizes()) warm.push_back(*allocator_->Allocate(size, 0, s));
    for (void* p : warm) ASSERT_TRUE(allocator_->Free(p).ok());
    const std::int64_t device_allocs = sim_->counters().allocs;
    if (announced)
      Begin(s);
    else
      sim_->SetCapturing(s, true);
    std::vector<void*> during;
    for (std::size_t size : Sizes()) {
      absl::StatusOr<void*> p = allocator_->Allocate(size, 0, s);
      ASSERT_TRUE(p.ok()) << size << ": " << p.status();
      during.push_back(*p);
    }
    if (announced)
      End(s);
    else
      sim_->SetCapturing(s, false);
    for (void* p : during) ASSERT_TRUE(allocator_->Free(p).ok());
    EXPECT_EQ(sim_->counters().allocs, device_allocs);
    EXPECT_EQ(Stats().num_capture_refusals, 0);
  }
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
}

TEST_P(CaptureTest, AMissDuringCaptureFailsClearlyOnEveryStreamAndCallsNoBackend) {
  const Stream s = TestStream(1), other = TestStream(2);
  Begin(s);
  // The capturing stream, and another thread's stream: CUDA's global mode forbids both to grow.
  for (Stream stream : {s, other}) {
    for (std::size_t size : {std::size_t{4096}, 5 * kMiB}) {
      absl::StatusOr<void*> p = allocator_->Allocate(size, 0, stream);
      ASSERT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
      EXPECT_TRUE(absl::StrContains(p.status().message(), "during CUDA graph capture")) << p.status();
      EXPECT_TRUE(absl::StrContains(p.status().message(), "before capturing")) << p.status();
    }
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EmptyCache()));
  End(s);
  EXPECT_EQ(sim_->counters().allocs, 0);
  EXPECT_EQ(Stats().num_capture_refusals, 4);
  EXPECT_EQ(Stats().num_ooms, 0) << "a capture miss is not an out-of-memory";
  void* p = *allocator_->Allocate(5 * kMiB, 0, s);  // after the capture: grows as usual
  ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->EmptyCache().ok());
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

TEST_P(CaptureTest, GraphBlocksAreHeldUntilTheirPoolIsReleased) {
  const Stream s = TestStream(1);
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    // Warm two blocks on s, so that the capture can allocate twice.
    void* w1 = *allocator_->Allocate(size, 0, s);
    void* w2 = *allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(allocator_->Free(w1).ok());
    ASSERT_TRUE(allocator_->Free(w2).ok());
    Begin(s);
    void* intermediate = *allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(allocator_->Free(intermediate).ok());  // freed inside the graph: replays still write it
    absl::StatusOr<void*> output = allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(output.ok()) << output.status();
    EXPECT_NE(*output, intermediate) << "a graph's freed block was reused";
    End(s);
    const std::int64_t graph_bytes = Stats().active_bytes[kAllPools].current;  // one held, one live
    EXPECT_EQ(graph_bytes, 2 * Stats().allocated_bytes[kAllPools].current);
    ASSERT_TRUE(allocator_->Free(*output).ok());  // a graph output freed after the capture: also held
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, graph_bytes) << "both graph blocks are held";
    // Eager work after the capture does not get them.
    void* eager = *allocator_->Allocate(size, 0, s);
    EXPECT_NE(eager, intermediate);
    EXPECT_NE(eager, *output);
    ASSERT_TRUE(allocator_->Free(eager).ok());
    ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());  // the graph is destroyed
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0);
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  }
}

TEST_P(CaptureTest, OnlyTheCapturedStreamsBlocksBelongToTheGraph) {
  const Stream s = TestStream(1), other = TestStream(2);
  void* warm = *allocator_->Allocate(4096, 0, other);
  ASSERT_TRUE(allocator_->Free(warm).ok());
  Begin(s);
  void* p = *allocator_->Allocate(4096, 0, other);  // another thread's eager work during the capture
  ASSERT_TRUE(allocator_->Free(p).ok());
  EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0) << "not held: it is not the graph's";
  End(s);
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
}

TEST_P(CaptureTest, BadCaptureCallsAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(allocator_->BeginCapture(0, kPool, nullptr)));
  EXPECT_TRUE(absl::IsNotFound(allocator_->EndCapture(0, kPool)));
  EXPECT_TRUE(allocator_->ReleasePool(0, GraphPoolId{7, 7}).ok()) << "a pool never captured here: nothing to do";
  Begin(TestStream(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->ReleasePool(0, kPool))) << "still capturing";
  End(TestStream(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EndCapture(0, kPool))) << "ended twice";
  ASSERT_TRUE(allocator_->ReleasePool(0, kPool).ok());
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(CaptureTest);

}  // namespace
}  // namespace bucketalloc
