// The model of PyTorch's expandable segments (src/harness/replay/policy_pytorch_expandable.cc): pages,
// growth at the lowest address, best fit by expandable size, splitting, release of whole free pages
// and its driver calls, each checked on a case computed by hand from reference/pytorch.md §1.9 and
// CUDACachingAllocator.cpp; and the two cases the issue names: one where PyTorch's native policy
// runs out of memory and expandable segments do not, and one where partly used 20 MiB pages make
// them need more than the native policy.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "harness/replay/policies.h"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

Stream S(int i) { return reinterpret_cast<Stream>(static_cast<std::uintptr_t>(0x100 + i)); }

std::unique_ptr<ReplayAllocator> Make(const char* spec, std::size_t capacity) {
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator(spec, capacity);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

std::uintptr_t U(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The driver calls of the count: 2 x (pages mapped + pages unmapped) + one access call per map.
std::int64_t DriverCalls(const BackendCounters& c) {
  return c.physical_creates + c.maps + c.unmaps + c.physical_releases + c.access_grants;
}

TEST(PyTorchExpandableTest, SmallRequestsTileOneSegmentThatGrowsByTwoMiBPages) {
  auto a = Make("pytorch-expandable", 64 * kMiB);
  void* p1 = *a->Allocate(1, S(0));     // 512 B: one 2 MiB page mapped, the rest split off
  void* p2 = *a->Allocate(kMiB, S(0));  // the free rest of the page
  void* p3 = *a->Allocate(kMiB, S(0));  // 512 B short: the next page, merged with the free rest
  EXPECT_EQ(U(p2) - U(p1), 512u);
  EXPECT_EQ(U(p3) - U(p2), kMiB) << "the new page extends the segment at its end";
  EXPECT_EQ(a->reserved_bytes(), 4 * kMiB);
  const BackendCounters c = a->backend_counters();
  EXPECT_EQ(c.address_reserves, 1);
  EXPECT_EQ(c.physical_creates, 2);
  EXPECT_EQ(c.maps, 2);
  EXPECT_EQ(c.access_grants, 2);
  EXPECT_EQ(c.allocs, 0) << "no cudaMalloc in expandable mode";
}

TEST(PyTorchExpandableTest, LargeRequestsMapWhole20MiBPagesAndShareThem) {
  auto a = Make("pytorch-expandable", 256 * kMiB);
  void* x = *a->Allocate(3 * kMiB, S(0));  // one 20 MiB page; 17 MiB split off
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
  void* y = *a->Allocate(17 * kMiB, S(0));  // the free rest, exactly
  EXPECT_EQ(U(y) - U(x), 3 * kMiB);
  void* z = *a->Allocate(21 * kMiB, S(0));  // two more pages, in one map with one access grant
  EXPECT_EQ(U(z) - U(y), 17 * kMiB);
  EXPECT_EQ(a->reserved_bytes(), 60 * kMiB);
  BackendCounters c = a->backend_counters();
  EXPECT_EQ(c.physical_creates, 3);
  EXPECT_EQ(c.maps, 3);
  EXPECT_EQ(c.access_grants, 2);
  ASSERT_TRUE(a->Allocate(3 * kMiB, S(1)).ok());  // another stream: a segment of its own
  EXPECT_EQ(a->reserved_bytes(), 80 * kMiB);
  EXPECT_EQ(a->backend_counters().address_reserves, 2);
}

// get_free_block: a free block followed by unmapped pages counts their size too, so a larger free
// block elsewhere in the segment is taken before the one at the segment's end.
TEST(PyTorchExpandableTest, BestFitPrefersABlockWithoutAnUnmappedTail) {
  auto a = Make("pytorch-expandable", 64 * kMiB);
  void* p = *a->Allocate(4 * kMiB, S(0));          // [p 4 | free 16 | unmapped]
  ASSERT_TRUE(a->Allocate(2 * kMiB, S(0)).ok());   // [p | q 2 | free 14 | unmapped]
  ASSERT_TRUE(a->Allocate(11 * kMiB, S(0)).ok());  // [p | q | r 11 | free 3 | unmapped]
  ASSERT_TRUE(a->Free(p, 4 * kMiB).ok());          // [free 4 | q | r | free 3 | unmapped]
  void* s = *a->Allocate(3 * kMiB, S(0));
  EXPECT_EQ(s, p) << "the 4 MiB block, not the 3 MiB one before the unmapped pages";
  EXPECT_EQ(a->reserved_bytes(), 20 * kMiB);
}

// The first case of the issue: PyTorch's native policy keeps a 20 MiB segment split by a live 6 MiB
// block, cannot release it, and a 22 MiB request does not fit a 40 MiB card; expandable segments map
// one more page after the free 8 MiB at the end of the first and serve it.
TEST(PyTorchExpandableTest, WhereTheNativePolicyRunsOutExpandableSegmentsGrow) {
  for (const char* spec : {"pytorch-policy", "pytorch-expandable", "pytorch-expandable:large_page_mb=2"}) {
    SCOPED_TRACE(spec);
    auto a = Make(spec, 40 * kMiB);
    void* x = *a->Allocate(6 * kMiB, S(0));
    void* y = *a->Allocate(6 * kMiB, S(0));
    ASSERT_TRUE(a->Free(x, 6 * kMiB).ok());
    absl::StatusOr<void*> z = a->Allocate(22 * kMiB, S(0));
    if (std::string(spec) == "pytorch-policy") {
      EXPECT_TRUE(absl::IsResourceExhausted(z.status())) << "20 MiB segment split and in use, + 22 MiB > 40 MiB";
      continue;
    }
    ASSERT_TRUE(z.ok()) << z.status();
    EXPECT_EQ(U(*z) - U(y), 6 * kMiB) << "right after y, over the free end of its page and the new pages";
    // 20 MiB pages: 2 of them (the 6 MiB rest of the second stays free); 2 MiB pages: 6 + 6 + 22 MiB.
    EXPECT_EQ(a->reserved_bytes(), std::string(spec) == "pytorch-expandable" ? 40 * kMiB : 34 * kMiB);
  }
}

// The second case of the issue: a 22 MiB request takes two 20 MiB pages, so a 30 MiB card that
// serves it natively (a 22 MiB segment) cannot; and pages shared with live blocks cannot be given
// back at the cap, where the native policy releases a whole free segment.
TEST(PyTorchExpandableTest, PartlyUsed20MiBPagesNeedMoreThanTheNativePolicy) {
  auto native = Make("pytorch-policy", 30 * kMiB);
  EXPECT_TRUE(native->Allocate(22 * kMiB, S(0)).ok());
  auto small_pages = Make("pytorch-expandable:large_page_mb=2", 30 * kMiB);
  EXPECT_TRUE(small_pages->Allocate(22 * kMiB, S(0)).ok());
  EXPECT_EQ(small_pages->reserved_bytes(), 22 * kMiB);
  auto a = Make("pytorch-expandable", 30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(a->Allocate(22 * kMiB, S(0)).status()));
  BackendCounters c = a->backend_counters();
  // Each of the two tries creates the first page, is refused the second and releases the first.
  EXPECT_EQ(c.physical_creates, 2);
  EXPECT_EQ(c.failed_physical_creates, 2);
  EXPECT_EQ(c.physical_releases, 2);
  EXPECT_EQ(c.maps, 0);
  EXPECT_EQ(a->reserved_bytes(), 0u);

  // [a 10 | free 10] [b 25 (over two pages) | free 5]; a freed leaves 10 MiB free in the first page
  // and 5 MiB in the second, no whole page: a 20 MiB request on another stream does not fit a 50 MiB
  // card (live: 45 MiB). Natively a and b are segments of 10 and 26 MiB, a's is released, and it fits.
  for (const char* spec : {"pytorch-policy", "pytorch-expandable"}) {
    SCOPED_TRACE(spec);
    auto d = Make(spec, 50 * kMiB);
    void* p = *d->Allocate(10 * kMiB, S(0));
    ASSERT_TRUE(d->Allocate(25 * kMiB, S(0)).ok());
    ASSERT_TRUE(d->Free(p, 10 * kMiB).ok());
    absl::StatusOr<void*> q = d->Allocate(20 * kMiB, S(1));
    if (std::string(spec) == "pytorch-policy") {
      EXPECT_TRUE(q.ok()) << q.status();
      EXPECT_EQ(d->reserved_bytes(), 46 * kMiB);
    } else {
      EXPECT_TRUE(absl::IsResourceExhausted(q.status())) << "no whole free page to unmap";
      EXPECT_EQ(d->backend_counters().unmaps, 0);
      EXPECT_EQ(d->reserved_bytes(), 40 * kMiB);
    }
  }
}

// release_cached_blocks: at the cap every free block gives back its whole pages (one unmap and one
// release each), a segment left all unmapped gives back its address range, and the request is
// tried again.
TEST(PyTorchExpandableTest, AtTheCapWholeFreePagesAreUnmappedAndTheRequestRetried) {
  auto a = Make("pytorch-expandable", 64 * kMiB);
  void* x = *a->Allocate(50 * kMiB, S(0));  // 3 pages
  ASSERT_TRUE(a->Free(x, 50 * kMiB).ok());  // 60 MiB free in stream 0's segment
  void* y = *a->Allocate(30 * kMiB, S(1));  // 2 pages: 60 + 20 > 64, so release, then map
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(a->reserved_bytes(), 40 * kMiB);
  EXPECT_EQ(a->peak_reserved_bytes(), 60 * kMiB);
  const BackendCounters c = a->backend_counters();
  EXPECT_EQ(c.physical_creates, 5);
  EXPECT_EQ(c.failed_physical_creates, 1);
  EXPECT_EQ(c.physical_releases, 3);
  EXPECT_EQ(c.unmaps, 3);
  EXPECT_EQ(c.maps, 5);
  EXPECT_EQ(c.access_grants, 2);
  EXPECT_EQ(c.address_reserves, 2);
  EXPECT_EQ(c.address_releases, 1) << "stream 0's segment, all unmapped";
  EXPECT_EQ(DriverCalls(c), 2 * (5 + 3) + 2);
  // Stream 0 grows again from a new segment.
  ASSERT_TRUE(a->Allocate(3 * kMiB, S(0)).ok());
  EXPECT_EQ(a->backend_counters().address_reserves, 3);
  EXPECT_EQ(a->reserved_bytes(), 60 * kMiB);
}

TEST(PyTorchExpandableTest, FreedNeighboursCoalesceAcrossPages) {
  auto a = Make("pytorch-expandable:large_page_mb=2", 64 * kMiB);
  void* x = *a->Allocate(3 * kMiB, S(0));  // 2 pages: [x 3 | free 1]
  void* y = *a->Allocate(5 * kMiB, S(0));  // [x | y 5 (the free 1 and 2 new pages)]
  EXPECT_EQ(U(y) - U(x), 3 * kMiB);
  ASSERT_TRUE(a->Free(x, 3 * kMiB).ok());
  ASSERT_TRUE(a->Free(y, 5 * kMiB).ok());
  void* z = *a->Allocate(8 * kMiB, S(0));  // the whole 8 MiB, one free block again
  EXPECT_EQ(z, x);
  EXPECT_EQ(a->reserved_bytes(), 8 * kMiB);
  const PoolFragmentation f = a->Fragmentation();
  EXPECT_EQ(f.total_free, 0);
  EXPECT_EQ(f.reserved, static_cast<std::int64_t>(8 * kMiB));
}

TEST(PyTorchExpandableTest, TheLargePageIsAnEvenNumberOfMiB) {
  for (const char* ok : {"pytorch-expandable:large_page_mb=2", "pytorch-expandable:large_page_mb:64"}) {
    EXPECT_TRUE(MakeReplayAllocator(ok, 64 * kMiB).ok()) << ok;
  }
  for (const char* bad :
       {"pytorch-expandable:large_page_mb=3", "pytorch-expandable:large_page_mb=0",
        "pytorch-expandable:large_page_mb=2048", "pytorch-expandable:page=2", "pytorch-expandable:large_page_mb=x"}) {
    absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator(bad, 64 * kMiB);
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << bad;
    EXPECT_TRUE(absl::StrContains(a.status().message(), "accepted large_page_mb=N")) << a.status();
  }
}

// A request larger than a segment's range (1 1/8 x the card) is an OOM without a reservation, so a
// replay that goes on after such OOMs does not pile up address ranges.
TEST(PyTorchExpandableTest, ARequestLargerThanASegmentsRangeIsAnOomWithoutAReservation) {
  auto a = Make("pytorch-expandable", 64 * kMiB);  // ranges of 4 pages of 20 MiB
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(absl::IsResourceExhausted(a->Allocate(81 * kMiB, S(0)).status()));
  EXPECT_EQ(a->backend_counters().address_reserves, 0);
  EXPECT_TRUE(a->Allocate(60 * kMiB, S(0)).ok()) << "what fits is still served";
}

TEST(PyTorchExpandableTest, FreeOfAnUnknownPointerIsRefused) {
  auto a = Make("pytorch-expandable", 64 * kMiB);
  void* x = *a->Allocate(kMiB, S(0));
  EXPECT_TRUE(absl::IsInvalidArgument(a->Free(reinterpret_cast<void*>(U(x) + 512), kMiB)));
  EXPECT_TRUE(a->Free(x, kMiB).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a->Free(x, kMiB))) << "a second free";
}

}  // namespace
}  // namespace bucketalloc::harness
