// The size tree of free blocks (src/memory/block_tree.h): against std::set's lower_bound over
// (size, ptr), which is what PyTorch's best fit reads, after random inserts and erases; its order
// and heap checks; and a depth of O(log n) whatever the order of inserts.
#include "memory/block_tree.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <tuple>
#include <vector>

namespace bucketalloc::internal {
namespace {

struct ByKey {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->size, a->ptr) < std::tie(b->size, b->ptr);
  }
};

TEST(BlockTreeTest, LowerBoundIsTheSmallestFitThenTheLowestAddress) {
  std::vector<Block> blocks(6);
  const std::size_t sizes[] = {4096, 8192, 8192, 8192, 65536, 512};
  const std::uintptr_t ptrs[] = {0x9000, 0x7000, 0x3000, 0x5000, 0x1000, 0xb000};
  BlockTree tree;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].ptr = ptrs[i];
    blocks[i].size = sizes[i];
    tree.Insert(&blocks[i]);
  }
  EXPECT_EQ(tree.LowerBound(5000), &blocks[2]) << "8 KiB, the lowest of the three";
  EXPECT_EQ(tree.LowerBound(512), &blocks[5]);
  EXPECT_EQ(tree.LowerBound(65537), nullptr);
  tree.Erase(&blocks[2]);
  EXPECT_EQ(tree.LowerBound(5000), &blocks[3]);
  EXPECT_FALSE(blocks[2].tree_node.linked);
  EXPECT_EQ(tree.size(), 5u);
  EXPECT_EQ(tree.Check(), nullptr);
}

TEST(BlockTreeTest, AgreesWithAnOrderedSetUnderRandomChurn) {
  std::mt19937_64 rng(17);
  std::vector<Block> blocks(4000);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].ptr = 0x100000 + i * 4096;
    blocks[i].size = 512 * (1 + rng() % 64);  // many equal sizes: the address breaks ties
  }
  BlockTree tree;
  std::set<Block*, ByKey> reference;
  for (int step = 0; step < 100000; ++step) {
    Block* b = &blocks[rng() % blocks.size()];
    if (b->tree_node.linked) {
      tree.Erase(b);
      reference.erase(b);
    } else {
      tree.Insert(b);
      reference.insert(b);
    }
    const std::size_t want = 512 * (rng() % 66);
    Block key;
    key.size = want;
    key.ptr = 0;
    auto it = reference.lower_bound(&key);
    ASSERT_EQ(tree.LowerBound(want), it == reference.end() ? nullptr : *it) << "step " << step;
  }
  EXPECT_EQ(tree.size(), reference.size());
  EXPECT_EQ(tree.Check(), nullptr);
  std::vector<Block*> order;
  tree.ForEach([&](Block* b) { order.push_back(b); });
  EXPECT_EQ(order, std::vector<Block*>(reference.begin(), reference.end()));
}

TEST(BlockTreeTest, DepthStaysLogarithmicForSortedInserts) {
  // 65,536 blocks of one size inserted in address order (a plain search tree would be a list).
  std::vector<Block> blocks(65536);
  BlockTree tree;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].ptr = 0x100000 + i * 512;
    blocks[i].size = 512;
    tree.Insert(&blocks[i]);
  }
  EXPECT_LT(tree.Depth(), 64) << "expected about 2.5 x log2(65536) = 40";
  EXPECT_EQ(tree.LowerBound(512), &blocks[0]);
  for (std::size_t i = 0; i < blocks.size(); i += 2) tree.Erase(&blocks[i]);
  EXPECT_EQ(tree.LowerBound(512), &blocks[1]);
  EXPECT_EQ(tree.Check(), nullptr);
}

}  // namespace
}  // namespace bucketalloc::internal
