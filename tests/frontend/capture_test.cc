// CUDA stream capture (the DeviceAllocator's capture rules): while the allocating stream captures,
// requests are served from the cache only and a miss fails clearly; no backend call CUDA forbids
// during capture is made (the sim backend refuses and counts them, as CUDA's global mode does);
// frees of blocks used on other streams wait for the capture to end before recording their events.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::TestStream;

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
  SimBackend* sim_ = nullptr;
};

TEST_P(CaptureTest, WarmedUpSizesAreServedFromTheCacheDuringCapture) {
  const Stream s = TestStream(1);
  const std::vector<std::size_t> sizes = {512, 4096, 300000, 3 * kMiB, 9 * kMiB + 7};
  std::vector<void*> warm;
  for (std::size_t size : sizes) warm.push_back(*allocator_->Allocate(size, 0, s));
  for (void* p : warm) ASSERT_TRUE(allocator_->Free(p).ok());
  const std::int64_t device_allocs = sim_->counters().allocs;
  sim_->SetCapturing(s, true);
  std::vector<void*> during;
  for (std::size_t size : sizes) {
    absl::StatusOr<void*> p = allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(p.ok()) << size << ": " << p.status();
    during.push_back(*p);
  }
  for (void* p : during) ASSERT_TRUE(allocator_->Free(p).ok());
  sim_->SetCapturing(s, false);
  EXPECT_EQ(sim_->counters().allocs, device_allocs);
  EXPECT_EQ(Stats().num_capture_refusals, 0);
}

TEST_P(CaptureTest, AMissDuringCaptureFailsClearlyAndCallsNoBackend) {
  const Stream s = TestStream(1);
  sim_->SetCapturing(s, true);
  for (std::size_t size : {std::size_t{4096}, 5 * kMiB}) {
    absl::StatusOr<void*> p = allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(absl::IsFailedPrecondition(p.status())) << p.status();
    EXPECT_TRUE(absl::StrContains(p.status().message(), "during CUDA stream capture")) << p.status();
    EXPECT_TRUE(absl::StrContains(p.status().message(), "before capturing")) << p.status();
  }
  EXPECT_EQ(sim_->counters().allocs, 0);
  EXPECT_EQ(Stats().num_capture_refusals, 2);
  EXPECT_EQ(Stats().num_ooms, 0) << "a capture miss is not an out-of-memory";
  // Other streams are not capturing: they grow as usual once the capture ends.
  sim_->SetCapturing(s, false);
  void* p = *allocator_->Allocate(5 * kMiB, 0, s);
  ASSERT_TRUE(allocator_->Free(p).ok());
}

TEST_P(CaptureTest, CrossStreamFreesDuringCaptureWaitForItToEnd) {
  const Stream s = TestStream(1), other = TestStream(2);
  for (std::size_t size : {std::size_t{4096}, 3 * kMiB}) {
    void* p = *allocator_->Allocate(size, 0, s);
    ASSERT_TRUE(allocator_->RecordStream(p, 0, other).ok());
    sim_->EnqueueWork(other);
    sim_->SetCapturing(s, true);
    const std::int64_t events = sim_->counters().events_recorded;
    ASSERT_TRUE(allocator_->Free(p).ok());
    EXPECT_EQ(sim_->counters().events_recorded, events) << "an event recorded during capture never completes";
    EXPECT_EQ(Stats().num_capture_deferred_frees, size == 4096 ? 1 : 2);
    // Not reusable during the capture, even on its own stream.
    absl::StatusOr<void*> q = allocator_->Allocate(size, 0, s);
    EXPECT_FALSE(q.ok() && *q == p);
    if (q.ok()) {
      ASSERT_TRUE(allocator_->Free(*q).ok());
    }
    EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->EmptyCache())) << "empty_cache during capture";
    sim_->SetCapturing(s, false);
    // After the capture the events are recorded on the next slow path; `other` still runs.
    std::vector<void*> taken;
    for (int i = 0; i < 3; ++i) taken.push_back(*allocator_->Allocate(size, 0, s));
    for (void* t : taken) EXPECT_NE(t, p) << "reused while `other` may still use it";
    sim_->CompleteWork(other);
    for (void* t : taken) ASSERT_TRUE(allocator_->Free(t).ok());
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    EXPECT_EQ(Stats().active_bytes[kAllPools].current, 0);
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  }
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(CaptureTest);

}  // namespace
}  // namespace bucketalloc
