// Graph captures and their pools (src/frontend/graph_captures.cc): tags, nesting, release, slot
// reuse, errors, and the check that catches a wrong block count.
#include "frontend/graph_captures.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "test_util.h"

namespace bucketalloc::internal {
namespace {

using ::bucketalloc::testing::TestStream;

CaptureFilter Only(Stream s) {
  return [s](Stream x) { return x == s; };
}

TEST(GraphCapturesTest, TagsFollowTheLatestMatchingCapture) {
  GraphCaptures c;
  EXPECT_FALSE(c.running());
  ASSERT_TRUE(c.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  ASSERT_TRUE(c.Begin({2, 2}, Only(TestStream(2)), 0).ok());  // nested, another pool
  EXPECT_TRUE(c.running());
  const std::uint16_t t1 = c.TagFor(TestStream(1)), t2 = c.TagFor(TestStream(2));
  EXPECT_NE(t1, 0);
  EXPECT_NE(t2, 0);
  EXPECT_NE(t1, t2);
  EXPECT_EQ(c.TagFor(TestStream(3)), 0);
  c.Tag(t1);
  EXPECT_TRUE(c.Holds(t1));
  EXPECT_FALSE(c.Holds(0));
  std::vector<std::int64_t> blocks(c.num_tags());
  blocks[t1] = 1;
  EXPECT_TRUE(c.CheckInvariants(blocks).ok());
  blocks[t1] = 0;
  EXPECT_FALSE(c.CheckInvariants(blocks).ok()) << "the pool counts a block no entry carries";
  ASSERT_TRUE(c.End({2, 2}, 0).ok());
  ASSERT_TRUE(c.End({1, 1}, 0).ok());
  EXPECT_FALSE(c.running());
  EXPECT_TRUE(*c.Release({1, 1}, 0));
  EXPECT_FALSE(c.Holds(t1)) << "a released pool holds nothing";
  c.Untag(t1);
  EXPECT_TRUE(*c.Release({2, 2}, 0));
  // Both slots are free again: a new pool reuses the first.
  ASSERT_TRUE(c.Begin({3, 3}, Only(TestStream(1)), 0).ok());
  EXPECT_EQ(c.TagFor(TestStream(1)), t1);
  EXPECT_EQ(c.num_tags(), 3u);
}

TEST(GraphCapturesTest, MisuseIsAClearErrorAndChangesNothing) {
  GraphCaptures c;
  absl::Status s = c.Begin({1, 1}, nullptr, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_TRUE(absl::StrContains(s.message(), "needs a stream filter")) << s;
  EXPECT_TRUE(absl::IsNotFound(c.End({9, 9}, 4)));
  EXPECT_TRUE(absl::StrContains(c.End({9, 9}, 4).message(), "graph pool (9, 9) on device 4")) << c.End({9, 9}, 4);
  EXPECT_FALSE(*c.Release({9, 9}, 0)) << "a pool that never captured is no error";
  ASSERT_TRUE(c.Begin({1, 1}, Only(TestStream(1)), 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(c.Release({1, 1}, 0).status())) << "a capture into it runs";
  ASSERT_TRUE(c.End({1, 1}, 0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(c.End({1, 1}, 0))) << "no capture into it runs";
  std::vector<std::int64_t> blocks(c.num_tags());
  EXPECT_TRUE(c.CheckInvariants(blocks).ok());
}

}  // namespace
}  // namespace bucketalloc::internal
