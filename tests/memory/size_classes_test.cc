#include "memory/size_classes.h"

#include <gtest/gtest.h>

#include <vector>

namespace bucketalloc::internal {
namespace {

TEST(SmallSizeClassesTest, EverySizeFitsItsClassAndTheClassIsTheSmallest) {
  for (std::size_t size = 1; size <= kMaxSmallSize; size += (size < 8192 ? 1 : 97)) {
    const int c = SmallSizeClasses::ClassOf(size);
    ASSERT_GE(SmallSizeClasses::ClassSize(c), size) << size;
    if (c > 0) {
      ASSERT_LT(SmallSizeClasses::ClassSize(c - 1), size) << size;
    }
  }
  EXPECT_EQ(SmallSizeClasses::ClassOf(kMaxSmallSize), SmallSizeClasses::kNumClasses - 1);
}

TEST(SmallSizeClassesTest, ClassesAscendAreAlignedAndFitTwiceInASlab) {
  std::size_t prev = 0;
  for (std::size_t s : SmallSizeClasses::Sizes()) {
    EXPECT_GT(s, prev);
    EXPECT_EQ(s % kMinBlockSize, 0u);
    EXPECT_GE(kSlabBytes / s, 2u);
    prev = s;
  }
}

TEST(SmallSizeClassesTest, WorstCaseWasteIsBounded) {
  // The documented bound (docs/architecture.md): rounding plus slab tail wastes at most half of a
  // block's footprint, and that only below 4 KiB where PyTorch's 512-byte rounding wastes the same.
  const double waste = SmallSizeClasses::WorstCaseWaste();
  EXPECT_LT(waste, 0.5);
  // Above 4 KiB the waste is at most 1/5 of the footprint plus the slab tail share.
  double worst_above = 0;
  std::size_t prev = 4096;
  for (int c = 0; c < SmallSizeClasses::kNumClasses; ++c) {
    const std::size_t size = SmallSizeClasses::ClassSize(c);
    if (size <= 4096) continue;
    const double occupied = static_cast<double>(kSlabBytes) / static_cast<double>(kSlabBytes / size);
    worst_above = std::max(worst_above, 1.0 - static_cast<double>(prev + 1) / occupied);
    prev = size;
  }
  EXPECT_LT(worst_above, 0.34);  // the 699 KiB -> 1 MiB step dominates: 2 blocks per slab either way
}

TEST(RoundLargeSizeTest, MatchesPyTorch) {
  const std::vector<std::uint32_t> none(16, 0);
  EXPECT_EQ(RoundLargeSize(1, none), 512u);
  EXPECT_EQ(RoundLargeSize(3 * kMiB + 1, none), 3 * kMiB + 512);
  std::vector<std::uint32_t> four(16, 4);
  EXPECT_EQ(RoundLargeSize(3 * kMiB + 1, four), 3 * kMiB + kMiB / 2);  // steps of 512 KiB in [2, 4) MiB
  EXPECT_EQ(RoundLargeSize(4 * kMiB, four), 4 * kMiB);                 // powers of two unchanged
  EXPECT_EQ(RoundLargeSize(1200, four), 1536u);                        // below 512 x div: 512 rounding
  std::vector<std::uint32_t> one(16, 1);
  EXPECT_EQ(RoundLargeSize(3 * kMiB + 1, one), 3 * kMiB + 512);
}

TEST(LargeSegmentSizeTest, MatchesPyTorch) {
  EXPECT_EQ(LargeSegmentSize(2 * kMiB, 20 * kMiB), 20 * kMiB);
  EXPECT_EQ(LargeSegmentSize(9 * kMiB, 20 * kMiB), 20 * kMiB);
  EXPECT_EQ(LargeSegmentSize(10 * kMiB, 20 * kMiB), 10 * kMiB);
  EXPECT_EQ(LargeSegmentSize(11 * kMiB + 1, 20 * kMiB), 12 * kMiB);
}

}  // namespace
}  // namespace bucketalloc::internal
