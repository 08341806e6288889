// The model of PyTorch's caching allocator (src/harness/replay/policy_pytorch.cc): its segment sizes,
// packing, splitting, per-stream best fit, coalescing, and release-and-retry, each checked on a case
// whose answer follows from reference/pytorch.md §1.
#include "harness/replay/policies.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/replay/pytorch_model.h"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

Stream S(int i) { return reinterpret_cast<Stream>(static_cast<std::uintptr_t>(0x100 + i)); }

std::unique_ptr<ReplayAllocator> Make(std::size_t capacity, const std::string& spec = "pytorch-policy") {
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator(spec, capacity);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST(PyTorchPolicyTest, SmallRequestsArePackedIn2MiBSegments) {
  auto a = Make(64 * kMiB);
  void* p1 = *a->Allocate(1, S(0));
  void* p2 = *a->Allocate(700, S(0));  // rounds to 1024
  void* p3 = *a->Allocate(kMiB, S(0));
  EXPECT_EQ(a->reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p2) - reinterpret_cast<std::uintptr_t>(p1), 512u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p3) - reinterpret_cast<std::uintptr_t>(p2), 1024u);
  EXPECT_EQ(a->backend_counters().allocs, 1);
}

TEST(PyTorchPolicyTest, LargeSegmentSizesAndSplitting) {
  auto a = Make(256 * kMiB);
  void* x = *a->Allocate(3 * kMiB, S(0));  // < 10 MiB: a 20 MiB segment, split (17 MiB remain)
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
  void* y = *a->Allocate(3 * kMiB, S(0));  // best fit: the 17 MiB remainder
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(y) - reinterpret_cast<std::uintptr_t>(x), 3 * kMiB);
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
  ASSERT_TRUE(a->Allocate(12 * kMiB, S(0)).ok());  // best fit: still the 14 MiB remainder
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
  ASSERT_TRUE(a->Allocate(16 * kMiB + 1, S(0)).ok());  // >= 10 MiB: its own segment, rounded to 2 MiB
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB + 18 * kMiB);
  ASSERT_TRUE(a->Allocate(3 * kMiB, S(1)).ok());  // another stream never shares a free block
  EXPECT_EQ(a->reserved_bytes(), 58 * kMiB);
}

TEST(PyTorchPolicyTest, FreedNeighboursCoalesce) {
  auto a = Make(256 * kMiB);
  void* x = *a->Allocate(3 * kMiB, S(0));
  void* y = *a->Allocate(3 * kMiB, S(0));
  ASSERT_TRUE(a->Free(x, 3 * kMiB).ok());
  ASSERT_TRUE(a->Free(y, 3 * kMiB).ok());
  // The segment is one free 20 MiB block again: 19 MiB fits it (1 MiB left is not split off).
  void* z = *a->Allocate(19 * kMiB, S(0));
  EXPECT_EQ(z, x);
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(a->backend_counters().allocs, 1);
}

TEST(PyTorchPolicyTest, AFailedDeviceAllocationReleasesWholeCachedSegmentsAndRetries) {
  auto a = Make(24 * kMiB);
  void* x = *a->Allocate(3 * kMiB, S(0));
  ASSERT_TRUE(a->Free(x, 3 * kMiB).ok());  // a cached, whole 20 MiB segment
  ASSERT_TRUE(a->Allocate(22 * kMiB, S(1)).ok()) << "released the cached segment and retried";
  const BackendCounters c = a->backend_counters();
  EXPECT_EQ(c.allocs, 2);
  EXPECT_EQ(c.failed_allocs, 1);
  EXPECT_EQ(c.frees, 1);
  EXPECT_EQ(a->reserved_bytes(), 22 * kMiB);
  EXPECT_EQ(a->peak_reserved_bytes(), 22 * kMiB);
  // A split segment in use cannot be released: that is an OOM.
  auto b = Make(24 * kMiB);
  ASSERT_TRUE(b->Allocate(3 * kMiB, S(0)).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(b->Allocate(6 * kMiB, S(1)).status()));
}

// max_split_size_mb (reference/pytorch.md §1.5, §1.6, §1.8): an oversize block is never split, serves
// no smaller request, and serves a larger one only within max_non_split_rounding; on a failed
// cudaMalloc the pool's oversize blocks go back first.
TEST(PyTorchPolicyTest, MaxSplitSizeKeepsOversizeBlocksWhole) {
  auto a = Make(512 * kMiB, "pytorch-policy:max_split_size_mb:64");
  void* big = *a->Allocate(100 * kMiB, S(0));
  ASSERT_TRUE(a->Free(big, 100 * kMiB).ok());  // a cached 100 MiB block: oversize
  ASSERT_TRUE(a->Allocate(30 * kMiB, S(0)).ok()) << "a request below max_split_size takes no oversize block";
  EXPECT_EQ(a->reserved_bytes(), 130 * kMiB);
  void* near = *a->Allocate(90 * kMiB, S(0));  // within 20 MiB of the oversize block: taken whole
  EXPECT_EQ(near, big);
  EXPECT_EQ(a->reserved_bytes(), 130 * kMiB);
  ASSERT_TRUE(a->Free(near, 90 * kMiB).ok());
  ASSERT_TRUE(a->Allocate(70 * kMiB, S(0)).ok()) << "30 MiB short of the block: a segment of its own";
  EXPECT_EQ(a->reserved_bytes(), 200 * kMiB);
  // Unlimited (the default), the 100 MiB block is split for the 30 MiB request.
  auto d = Make(512 * kMiB);
  void* p = *d->Allocate(100 * kMiB, S(0));
  ASSERT_TRUE(d->Free(p, 100 * kMiB).ok());
  EXPECT_EQ(*d->Allocate(30 * kMiB, S(0)), p);
  EXPECT_EQ(d->reserved_bytes(), 100 * kMiB);
}

// release_available_cached_blocks before release_cached_blocks: only the oversize block goes back,
// and the other whole cached segment stays (release_cached_blocks alone would free both).
TEST(PyTorchPolicyTest, AFailedDeviceAllocationReleasesOversizeBlocksFirst) {
  auto a = Make(190 * kMiB, "pytorch-policy:max_split_size_mb:64");
  void* big = *a->Allocate(100 * kMiB, S(0));   // oversize: its own segment, never split
  void* other = *a->Allocate(30 * kMiB, S(0));  // not oversize: its own 30 MiB segment
  ASSERT_TRUE(a->Free(big, 100 * kMiB).ok());
  ASSERT_TRUE(a->Free(other, 30 * kMiB).ok());
  // 70 MiB: the cached 100 MiB block is 30 MiB too large for it (max_non_split_rounding 20), the
  // 30 MiB one too small; 60 MiB are left on the card. The oversize block goes back, and only it.
  ASSERT_TRUE(a->Allocate(70 * kMiB, S(0)).ok());
  EXPECT_EQ(a->backend_counters().frees, 1);
  EXPECT_EQ(a->reserved_bytes(), 100 * kMiB) << "the 30 MiB segment stays cached";
  // Unlimited max_split_size: nothing is oversize, and release_cached_blocks frees every whole
  // cached segment.
  auto b = Make(190 * kMiB);
  void* p = *b->Allocate(100 * kMiB, S(0));
  void* q = *b->Allocate(30 * kMiB, S(0));
  ASSERT_TRUE(b->Free(p, 100 * kMiB).ok());
  ASSERT_TRUE(b->Free(q, 30 * kMiB).ok());
  ASSERT_TRUE(b->Allocate(110 * kMiB, S(1)).ok());
  EXPECT_EQ(b->backend_counters().frees, 2);
  EXPECT_EQ(b->reserved_bytes(), 110 * kMiB);
}

// roundup_power2_divisions (reference/pytorch.md §1.4): sizes above 512 x div round to 1/div steps
// of their power-of-two interval (3000 B with 4: steps 2048/2560/3072/3584 -> 3072); powers of two
// stay; sizes up to 512 x div round to 512-byte multiples (1200 -> 1536).
TEST(PyTorchPolicyTest, RoundupPower2DivisionsRoundToTheIntervalsSteps) {
  const std::vector<std::uint32_t> four(16, 4);
  EXPECT_EQ(pytorch_model::RoundSize(1200, four), 1536u);
  EXPECT_EQ(pytorch_model::RoundSize(3000, four), 3072u);
  EXPECT_EQ(pytorch_model::RoundSize(2600, four), 3072u);
  EXPECT_EQ(pytorch_model::RoundSize(2560, four), 2560u);
  EXPECT_EQ(pytorch_model::RoundSize(33 * kMiB, four), 40 * kMiB);
  EXPECT_EQ(pytorch_model::RoundSize(64 * kMiB, four), 64 * kMiB);
  EXPECT_EQ(pytorch_model::RoundSize(64 * kMiB + 1, four), 80 * kMiB);
  EXPECT_EQ(pytorch_model::RoundSize(33 * kMiB, {}), 33 * kMiB);
  auto a = Make(512 * kMiB, "pytorch-policy:roundup_power2_divisions:4");
  ASSERT_TRUE(a->Allocate(33 * kMiB, S(0)).ok());
  EXPECT_EQ(a->reserved_bytes(), 40 * kMiB);
  // The per-interval list: 1 (none) for the 32 MiB interval, 4 above.
  auto b = Make(512 * kMiB, "pytorch-policy:roundup_power2_divisions:[32:1,>:4]");
  ASSERT_TRUE(b->Allocate(33 * kMiB, S(0)).ok());
  EXPECT_EQ(b->reserved_bytes(), 34 * kMiB);
  ASSERT_TRUE(b->Allocate(65 * kMiB, S(0)).ok());
  EXPECT_EQ(b->reserved_bytes(), 34 * kMiB + 80 * kMiB);
}

TEST(PyTorchPolicyTest, LargeSegmentSizeSetsTheSharedSegment) {
  auto a = Make(512 * kMiB, "pytorch-policy:large_segment_size_mb:32");
  ASSERT_TRUE(a->Allocate(3 * kMiB, S(0)).ok());
  EXPECT_EQ(a->reserved_bytes(), 32 * kMiB);
}

TEST(PyTorchPolicyTest, AConfOfAKeyTheModelDoesNotFollowIsRefusedNamingTheKeys) {
  for (const char* spec : {"pytorch-policy:expandable_segments:True", "pytorch-policy:tiers:[64MiB]",
                           "pytorch-policy:max_split_size_mb:banana", "pytorch-policy:max_split_size_mb:4",
                           "pytorch-policy:large_segment_size_mb:2", "pytorch-policy:large_segment_size_mb:10",
                           "pytorch-policy:max_non_split_rounding_mb:0"}) {
    absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator(spec, 64 * kMiB);
    ASSERT_FALSE(a.ok()) << spec;
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << spec;
    EXPECT_NE(a.status().message().find("max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions"),
              std::string::npos)
        << a.status();
  }
}

}  // namespace
}  // namespace bucketalloc::harness
