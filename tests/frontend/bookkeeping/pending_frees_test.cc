// Pending frees and stream uses (src/frontend/bookkeeping/pending_frees.cc) on the simulated device's streams:
// which blocks retire in each mode, deferred frees armed later, and the
// checks of the invariants.
#include "frontend/bookkeeping/pending_frees.h"

// GCC 12 warns that moving an empty absl::InlinedVector reads its uninitialized heap pointer: a
// false positive (only the inline size is read).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <gtest/gtest.h>

#include <vector>

#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace bucketalloc::internal {
namespace {

using ::bucketalloc::testing::TestStream;

class PendingFreesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimBackend>> made = MakeSimBackend({.total_memory = 64 * kMiB});
    ASSERT_TRUE(made.ok());
    sim_ = std::move(*made);
    pending_ = std::make_unique<PendingFrees>(sim_.get());
  }
  // Holds a block at `ptr` used on `stream` (work queued there), its event recorded now.
  void HoldUsedOn(std::uintptr_t ptr, Stream stream) {
    sim_->EnqueueWork(stream);
    pending_->AddUse(ptr, stream);
    PendingFrees::Uses uses = pending_->TakeUses(ptr);
    ASSERT_EQ(uses.size(), 1u);
    PendingFrees::Events events;
    ASSERT_TRUE(pending_->RecordEvents(uses, &events).ok());
    pending_->Hold(ptr, LiveEntry{LargePool::Handle{}, 100, 0}, std::move(events), std::move(uses));
  }
  // Retires in `mode`; the addresses done, in order.
  std::vector<std::uintptr_t> Retire(PendingFrees::Mode mode, bool may_arm = true) {
    std::vector<std::uintptr_t> done;
    pending_->Retire(mode, may_arm, [&](std::uintptr_t ptr, const LiveEntry&) { done.push_back(ptr); });
    return done;
  }
  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<PendingFrees> pending_;
};

TEST_F(PendingFreesTest, UsesAreRecordedOncePerStreamAndTakenAtTheFree) {
  pending_->AddUse(0x10, TestStream(1));
  pending_->AddUse(0x10, TestStream(1));
  pending_->AddUse(0x10, TestStream(2));
  EXPECT_TRUE(pending_->has_uses());
  EXPECT_EQ(pending_->TakeUses(0x10).size(), 2u);
  EXPECT_FALSE(pending_->has_uses());
  EXPECT_TRUE(pending_->TakeUses(0x20).empty());
}

TEST_F(PendingFreesTest, PollUntilBusyStopsAtTheFirstBusyBlockAndPollAllDoesNot) {
  HoldUsedOn(0x100, TestStream(1));
  HoldUsedOn(0x200, TestStream(2));
  sim_->CompleteWork(TestStream(2));  // the second is done, the first is not
  EXPECT_TRUE(Retire(PendingFrees::Mode::kPollUntilBusy).empty()) << "stops at the busy first block";
  EXPECT_EQ(Retire(PendingFrees::Mode::kPollAll), (std::vector<std::uintptr_t>{0x200}));
  EXPECT_TRUE(pending_->Contains(0x100));
  EXPECT_EQ(Retire(PendingFrees::Mode::kSynchronize), (std::vector<std::uintptr_t>{0x100})) << "waiting completes it";
  EXPECT_TRUE(pending_->empty());
}

TEST_F(PendingFreesTest, ADeferredFreeIsArmedLaterAndDoesNotStopThePolling) {
  sim_->EnqueueWork(TestStream(1));
  PendingFrees::Uses uses{TestStream(1)};
  sim_->SetRecordEventFails(true);
  PendingFrees::Events events;
  EXPECT_FALSE(pending_->RecordEvents(uses, &events).ok());
  EXPECT_TRUE(events.empty()) << "a failed recording keeps no event";
  pending_->Hold(0x300, LiveEntry{LargePool::Handle{}, 1, 0}, std::move(events), uses);  // deferred: no events yet
  EXPECT_TRUE(pending_->CheckInvariants([](std::uintptr_t) { return false; }).ok());
  sim_->SetRecordEventFails(false);
  HoldUsedOn(0x400, TestStream(2));  // after the deferred one, done
  sim_->CompleteWork(TestStream(2));
  // Arming is not allowed (a capture runs): the deferred block waits without stopping the polling.
  EXPECT_EQ(Retire(PendingFrees::Mode::kPollUntilBusy, /*may_arm=*/false), (std::vector<std::uintptr_t>{0x400}));
  // Armed now: its event waits for stream 1's work.
  EXPECT_TRUE(Retire(PendingFrees::Mode::kPollAll, true).empty());
  sim_->CompleteWork(TestStream(1));
  EXPECT_EQ(Retire(PendingFrees::Mode::kPollAll, true), (std::vector<std::uintptr_t>{0x300}));
  EXPECT_TRUE(pending_->empty());
}

TEST_F(PendingFreesTest, TheChecksCatchAUseOfNoLiveBlockAndAFreeWaitingForNothing) {
  pending_->AddUse(0x500, TestStream(1));
  EXPECT_FALSE(pending_->CheckInvariants([](std::uintptr_t) { return false; }).ok());
  EXPECT_TRUE(pending_->CheckInvariants([](std::uintptr_t p) { return p == 0x500; }).ok());
  pending_->TakeUses(0x500);
  PendingFrees::Events none;
  PendingFrees::Uses no_uses;
  pending_->Hold(0x600, LiveEntry{LargePool::Handle{}, 1, 0}, std::move(none), std::move(no_uses));
  EXPECT_FALSE(pending_->CheckInvariants([](std::uintptr_t) { return true; }).ok());
}

}  // namespace
}  // namespace bucketalloc::internal
