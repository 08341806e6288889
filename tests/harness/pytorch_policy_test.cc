// The model of PyTorch's caching allocator (src/harness/replay/policy_pytorch.cc): its segment sizes,
// packing, splitting, per-stream best fit, coalescing, and release-and-retry, each checked on a case
// whose answer follows from reference/pytorch.md §1.
#include "harness/replay/policies.h"

#include <gtest/gtest.h>

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

Stream S(int i) { return reinterpret_cast<Stream>(static_cast<std::uintptr_t>(0x100 + i)); }

std::unique_ptr<ReplayAllocator> Make(std::size_t capacity) {
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator("pytorch-policy", capacity);
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

}  // namespace
}  // namespace bucketalloc::harness
