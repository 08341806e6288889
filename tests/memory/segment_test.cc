#include "memory/segment.h"

#include <gtest/gtest.h>

namespace bucketalloc::internal {
namespace {

TEST(SegmentTest, SplitThenMergeRestoresTheSegment) {
  BlockPool blocks;
  Segment seg;
  seg.base = 1 << 30;
  seg.size = 20 << 20;
  Block* b = blocks.New();
  b->ptr = seg.base;
  b->size = seg.size;
  b->segment = &seg;
  seg.first = b;

  Block* rest = SplitBlock(b, 4 << 20, blocks);
  EXPECT_EQ(b->size, 4u << 20);
  EXPECT_EQ(rest->ptr, seg.base + (4 << 20));
  EXPECT_EQ(rest->size, 16u << 20);
  EXPECT_EQ(b->next, rest);
  EXPECT_EQ(rest->prev, b);
  EXPECT_EQ(rest->segment, &seg);

  Block* tail = SplitBlock(rest, 6 << 20, blocks);  // b | rest(6) | tail(10)
  EXPECT_EQ(tail->ptr, seg.base + (10 << 20));
  EXPECT_EQ(blocks.live(), 3u);

  // Merging from either side keeps the lower block.
  Block* m = MergeBlocks(tail, rest, blocks);
  EXPECT_EQ(m, rest);
  EXPECT_EQ(m->size, 16u << 20);
  EXPECT_EQ(m->next, nullptr);
  m = MergeBlocks(b, m, blocks);
  EXPECT_EQ(m, b);
  EXPECT_EQ(b->size, seg.size);
  EXPECT_EQ(b->next, nullptr);
  EXPECT_EQ(blocks.live(), 1u);
  blocks.Delete(b);
}

}  // namespace
}  // namespace bucketalloc::internal
