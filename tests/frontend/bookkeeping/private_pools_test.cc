// Private pools and the routings into them (src/frontend/bookkeeping/private_pools.cc): routing to the latest
// matching routing, use counts (PyTorch's), freeable pools and slot reuse, abandoned captures,
// errors, and the check that catches an entry of an erased pool.
#include "frontend/bookkeeping/private_pools.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "test_util.h"

namespace bucketalloc::internal {
namespace {

using ::bucketalloc::testing::TestStream;

CaptureFilter Only(Stream s) {
  return [s](Stream x) { return x == s; };
}

class PrivatePoolsTest : public ::testing::Test {
 protected:
  PrivatePoolsTest()
      : pools_([this](const PrivatePoolSettings&) {
          return std::make_unique<Pools>(ctx_, PoolsConfig{.slab_limit = kMaxSmallSize});
        }) {}
  std::uint16_t Tag(Stream s, bool capturing = true) {
    return pools_.TagFor(s, [&](Stream) { return capturing; });
  }
  StatLedger stats_;
  std::uint64_t clock_ = 0;
  PoolContext ctx_{&stats_, nullptr, &clock_};
  PrivatePools pools_;
};

TEST_F(PrivatePoolsTest, RequestsFollowTheLatestMatchingRoutingAndUseCountsDecideFreeable) {
  EXPECT_FALSE(pools_.routing());
  ASSERT_TRUE(pools_.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  ASSERT_TRUE(pools_.Begin({2, 2}, Only(TestStream(2)), 0).ok());  // another pool, concurrently
  EXPECT_TRUE(pools_.routing());
  const std::uint16_t t1 = Tag(TestStream(1)), t2 = Tag(TestStream(2));
  EXPECT_NE(t1, 0);
  EXPECT_NE(t2, 0);
  EXPECT_NE(t1, t2);
  EXPECT_EQ(Tag(TestStream(3)), 0) << "the device's own pools";
  ASSERT_TRUE(pools_.End({2, 2}, 0).ok());
  ASSERT_TRUE(pools_.End({1, 1}, 0).ok());
  EXPECT_FALSE(pools_.routing());
  // A second graph shares pool 1 (graph_pool_handle()): two uses.
  ASSERT_TRUE(pools_.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  EXPECT_EQ(Tag(TestStream(1)), t1);
  ASSERT_TRUE(pools_.End({1, 1}, 0).ok());
  EXPECT_EQ(pools_.at(t1).use_count, 2);
  EXPECT_EQ(pools_.Release({1, 1}), 0) << "one graph still uses it";
  EXPECT_EQ(pools_.Release({1, 1}), t1) << "the last use: freeable";
  EXPECT_TRUE(pools_.at(t1).freeable());
  EXPECT_EQ(pools_.Release({1, 1}), 0) << "a freeable pool is no longer in use";
  std::vector<std::int64_t> blocks(pools_.num_tags());
  EXPECT_TRUE(pools_.CheckInvariants(blocks).ok());
  EXPECT_TRUE(pools_.ForgetIfEmpty(t1));
  blocks[t1] = 1;
  EXPECT_FALSE(pools_.CheckInvariants(blocks).ok()) << "an entry of an erased pool";
  // The erased slot is reused by a new pool.
  ASSERT_TRUE(pools_.Begin({3, 3}, Only(TestStream(1)), 0).ok());
  EXPECT_EQ(Tag(TestStream(1)), t1);
  EXPECT_EQ(pools_.num_tags(), 3u);
}

TEST_F(PrivatePoolsTest, AnAbandonedCaptureEndsAtReleaseOrWhenItsStreamsStopCapturing) {
  ASSERT_TRUE(pools_.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  ASSERT_NE(Tag(TestStream(1)), 0);
  EXPECT_EQ(pools_.EndAbandoned([](Stream) { return true; }), 0) << "still capturing";
  EXPECT_EQ(pools_.EndAbandoned([](Stream) { return false; }), 1);
  EXPECT_FALSE(pools_.routing());
  EXPECT_NE(pools_.Release({1, 1}), 0);
  // A MemPool context (its streams never capture) is never taken for an abandoned capture.
  ASSERT_TRUE(pools_.Begin({2, 2}, Only(TestStream(2)), 0).ok());
  ASSERT_NE(Tag(TestStream(2), /*capturing=*/false), 0);
  EXPECT_EQ(pools_.EndAbandoned([](Stream) { return false; }), 0);
  // Released while its routing still runs (cudaStreamEndCapture threw): the routing ends.
  EXPECT_NE(pools_.Release({2, 2}), 0);
  EXPECT_FALSE(pools_.routing());
}

TEST_F(PrivatePoolsTest, MisuseIsAClearErrorAndChangesNothing) {
  absl::Status s = pools_.Begin({1, 1}, nullptr, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_TRUE(absl::StrContains(s.message(), "needs a stream filter")) << s;
  EXPECT_TRUE(absl::IsNotFound(pools_.End({9, 9}, 4)));
  EXPECT_TRUE(absl::StrContains(pools_.End({9, 9}, 4).message(), "private pool (9, 9) on device 4"))
      << pools_.End({9, 9}, 4);
  EXPECT_EQ(pools_.Release({9, 9}), 0) << "a pool never used here is no error";
  ASSERT_TRUE(pools_.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(pools_.Begin({1, 1}, Only(TestStream(2)), 0))) << "already routed to";
  ASSERT_TRUE(pools_.End({1, 1}, 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(pools_.End({1, 1}, 0))) << "no capture into it runs";
  std::vector<std::int64_t> blocks(pools_.num_tags());
  EXPECT_TRUE(pools_.CheckInvariants(blocks).ok());
}

}  // namespace
}  // namespace bucketalloc::internal
