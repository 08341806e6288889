#include <cstring>

#include <gtest/gtest.h>

#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"
#include "bucketalloc/testing/sim_backend.h"

namespace bucketalloc {
namespace {

std::unique_ptr<SimBackend> Make(SimBackendOptions o) {
  absl::StatusOr<std::unique_ptr<SimBackend>> b = MakeSimBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

TEST(SimBackendTest, CapacityAndGranularity) {
  auto b = Make({.total_memory = 8 * kMiB});
  EXPECT_EQ(b->Name(), "sim");
  EXPECT_EQ(b->Granularity(), 2 * kMiB);
  absl::StatusOr<void*> p = b->Allocate(6 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % (2 * kMiB), 0u);
  absl::StatusOr<void*> q = b->Allocate(4 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(q.status())) << q.status();
  EXPECT_TRUE(absl::IsInvalidArgument(b->Allocate(3 * kMiB + 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b->Allocate(0).status()));
  absl::StatusOr<DeviceMemInfo> info = b->GetMemInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->total_bytes, 8 * kMiB);
  EXPECT_EQ(info->free_bytes, 2 * kMiB);
  EXPECT_TRUE(absl::IsInvalidArgument(b->Free(*p, 2 * kMiB)));  // wrong size
  EXPECT_TRUE(b->Free(*p, 6 * kMiB).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(b->Free(*p, 6 * kMiB)));  // double free
  EXPECT_EQ(b->used_bytes(), 0u);
  const BackendCounters c = b->counters();
  EXPECT_EQ(c.allocs, 1);
  EXPECT_EQ(c.frees, 1);
  EXPECT_EQ(c.failed_allocs, 3);
}

TEST(SimBackendTest, ExternalUsageShrinksFreeMemory) {
  auto b = Make({.total_memory = 8 * kMiB});
  b->SetExternalUsage(6 * kMiB);
  EXPECT_EQ(b->GetMemInfo()->free_bytes, 2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(b->Allocate(4 * kMiB).status()));
  b->SetExternalUsage(0);
  absl::StatusOr<void*> p = b->Allocate(4 * kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(b->Free(*p, 4 * kMiB).ok());
}

TEST(SimBackendTest, BackedMemoryIsWritable) {
  auto b = Make({.total_memory = 16 * kMiB, .memory = SimMemoryMode::kBacked});
  absl::StatusOr<void*> p = b->Allocate(4 * kMiB);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0xab, 4 * kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(*p)[4 * kMiB - 1], 0xab);
  ASSERT_TRUE(b->Free(*p, 4 * kMiB).ok());
  // Reallocated memory comes back zeroed (the pages were dropped).
  absl::StatusOr<void*> q = b->Allocate(4 * kMiB);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(static_cast<unsigned char*>(*q)[0], 0);
}

TEST(SimBackendTest, UnbackedSimulatesACardLargerThanTheHost) {
  auto b = Make({.total_memory = std::size_t{141} << 30, .memory = SimMemoryMode::kUnbacked});
  absl::StatusOr<void*> p = b->Allocate(std::size_t{120} << 30);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(b->used_bytes(), std::size_t{120} << 30);
  EXPECT_TRUE(b->Free(*p, std::size_t{120} << 30).ok());
}

TEST(SimBackendTest, AddressRangesAreReusedAfterFree) {
  auto b = Make({.total_memory = 8 * kMiB});
  void* a = *b->Allocate(2 * kMiB);
  void* c = *b->Allocate(2 * kMiB);
  ASSERT_TRUE(b->Free(a, 2 * kMiB).ok());
  ASSERT_TRUE(b->Free(c, 2 * kMiB).ok());
  // The two freed ranges coalesced: a 4 MiB allocation fits at the first address.
  absl::StatusOr<void*> d = b->Allocate(4 * kMiB);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, a);
}

TEST(SimBackendTest, FaultInjectionNth) {
  auto b = Make({.total_memory = 64 * kMiB, .fail_nth_alloc = 2});
  EXPECT_TRUE(b->Allocate(2 * kMiB).ok());
  absl::StatusOr<void*> second = b->Allocate(2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status()));
  EXPECT_NE(second.status().message().find("injected"), absl::string_view::npos);
  EXPECT_TRUE(b->Allocate(2 * kMiB).ok());
  b->FailNthAlloc(1);
  EXPECT_FALSE(b->Allocate(2 * kMiB).ok());
  EXPECT_TRUE(b->Allocate(2 * kMiB).ok());
}

TEST(SimBackendTest, FaultInjectionFractionIsSeeded) {
  auto count_failures = [](std::uint64_t seed) {
    auto b =
        Make({.total_memory = 1024 * kMiB, .memory = SimMemoryMode::kUnbacked, .fail_fraction = 0.3, .seed = seed});
    int failures = 0;
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<void*> p = b->Allocate(2 * kMiB);
      if (!p.ok()) {
        ++failures;
      } else {
        EXPECT_TRUE(b->Free(*p, 2 * kMiB).ok());
      }
    }
    return failures;
  };
  const int f = count_failures(7);
  EXPECT_EQ(f, count_failures(7));
  EXPECT_GT(f, 30);
  EXPECT_LT(f, 90);
}

TEST(SimBackendTest, StreamsAndEvents) {
  auto b = Make({.total_memory = 8 * kMiB});
  Stream s1 = reinterpret_cast<Stream>(1);
  Stream s2 = reinterpret_cast<Stream>(2);
  b->EnqueueWork(s1);
  absl::StatusOr<Event> e1 = b->RecordEvent(s1);
  absl::StatusOr<Event> e2 = b->RecordEvent(s2);  // nothing queued on s2: complete at once
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_FALSE(*b->QueryEvent(*e1));
  EXPECT_TRUE(*b->QueryEvent(*e2));
  b->EnqueueWork(s1);  // later work does not delay e1 once the earlier work completes
  EXPECT_TRUE(b->SynchronizeEvent(*e1).ok());
  EXPECT_TRUE(*b->QueryEvent(*e1));
  absl::StatusOr<Event> e3 = b->RecordEvent(s1);
  EXPECT_FALSE(*b->QueryEvent(*e3));
  b->SetSynchronizeFails(true);
  EXPECT_FALSE(b->SynchronizeEvent(*e3).ok());
  b->SetSynchronizeFails(false);
  b->CompleteWork(s1);
  EXPECT_TRUE(*b->QueryEvent(*e3));
  for (Event e : {*e1, *e2, *e3}) b->DestroyEvent(e);
  EXPECT_EQ(b->counters().events_recorded, 3);
}

// Fills `bytes` at `p` with a pattern that depends on `seed` and the offset.
void Fill(std::uintptr_t p, std::size_t bytes, std::uint32_t seed) {
  auto* w = reinterpret_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) w[i] = seed * 2654435761u + static_cast<std::uint32_t>(i);
}
bool Holds(std::uintptr_t p, std::size_t bytes, std::uint32_t seed) {
  const auto* w = reinterpret_cast<const std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    if (w[i] != seed * 2654435761u + static_cast<std::uint32_t>(i)) return false;
  }
  return true;
}

TEST(SimBackendTest, VirtualMemoryStitchesRealPages) {
  auto b = Make({.total_memory = 16 * kMiB});
  ASSERT_TRUE(b->SupportsVirtualMemory());
  absl::StatusOr<std::uintptr_t> a = b->ReserveAddressRange(8 * kMiB, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a % (2 * kMiB), 0u);
  absl::StatusOr<PhysicalHandle> h1 = b->CreatePhysical(2 * kMiB), h2 = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(h1.ok() && h2.ok());
  EXPECT_EQ(b->used_bytes(), 4 * kMiB);
  // Two granules stitched into one contiguous range, in the opposite order to their creation.
  ASSERT_TRUE(b->Map(*a, 2 * kMiB, *h2).ok());
  ASSERT_TRUE(b->Map(*a + 2 * kMiB, 2 * kMiB, *h1).ok());
  Fill(*a, 4 * kMiB, 7);
  ASSERT_TRUE(Holds(*a, 4 * kMiB, 7));
  // The same granule mapped at a second address shows the same bytes, both ways.
  absl::StatusOr<std::uintptr_t> c = b->ReserveAddressRange(2 * kMiB, 4 * kMiB);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c % (4 * kMiB), 0u);
  ASSERT_TRUE(b->Map(*c, 2 * kMiB, *h1).ok());
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(*c), reinterpret_cast<void*>(*a + 2 * kMiB), 2 * kMiB), 0);
  Fill(*c, 2 * kMiB, 9);
  EXPECT_TRUE(Holds(*a + 2 * kMiB, 2 * kMiB, 9));
  // Moved: unmapped from the first range, the granule keeps its data in the second, and the old
  // range holds nothing stale: reading it faults.
  ASSERT_TRUE(b->Unmap(*a + 2 * kMiB, 2 * kMiB).ok());
  EXPECT_TRUE(Holds(*c, 2 * kMiB, 9));
  EXPECT_TRUE(Holds(*a, 2 * kMiB, 7)) << "the other granule of the range is untouched";
  const std::uintptr_t stale = *a + 2 * kMiB;
  EXPECT_DEATH(
      {
        volatile std::uint32_t v = *reinterpret_cast<volatile std::uint32_t*>(stale);
        (void)v;
      },
      "");
  // Released and created again, physical memory reads zeros.
  ASSERT_TRUE(b->Unmap(*c, 2 * kMiB).ok());
  ASSERT_TRUE(b->ReleasePhysical(*h1).ok());
  absl::StatusOr<PhysicalHandle> h3 = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(h3.ok());
  ASSERT_TRUE(b->Map(*a + 2 * kMiB, 2 * kMiB, *h3).ok());
  EXPECT_EQ(reinterpret_cast<const std::uint32_t*>(*a + 2 * kMiB)[12345], 0u);
  ASSERT_TRUE(b->Unmap(*a, 4 * kMiB).ok()) << "one call may unmap several whole mappings";
  for (PhysicalHandle h : {*h2, *h3}) ASSERT_TRUE(b->ReleasePhysical(h).ok());
  ASSERT_TRUE(b->ReleaseAddressRange(*a, 8 * kMiB).ok());
  ASSERT_TRUE(b->ReleaseAddressRange(*c, 2 * kMiB).ok());
  EXPECT_EQ(b->used_bytes(), 0u);
  const BackendCounters n = b->counters();
  EXPECT_EQ(n.physical_creates, 3);
  EXPECT_EQ(n.physical_releases, 3);
  EXPECT_EQ(n.maps, 4);
  EXPECT_EQ(n.unmaps, 3);
  EXPECT_EQ(n.access_grants, 4) << "a Map is a cuMemMap and a cuMemSetAccess";
  EXPECT_EQ(n.address_reserves, 2);
  EXPECT_EQ(n.address_releases, 2);
}

// MapRun maps each piece (handles of any granule multiple, mixed) and grants access once for the
// run, as the vmm backend calls the driver; one Unmap takes several whole mappings side by side;
// physical memory never fragments, backed or not: handles of mixed sizes freed in any order leave
// every byte usable, with their bytes intact.
TEST(SimBackendTest, MapRunGrantsAccessOncePerRun) {
  for (SimMemoryMode mode : {SimMemoryMode::kBacked, SimMemoryMode::kUnbacked}) {
    auto b = Make({.total_memory = 64 * kMiB, .memory = mode});
    absl::StatusOr<std::uintptr_t> va = b->ReserveAddressRange(64 * kMiB, 0);
    ASSERT_TRUE(va.ok());
    std::vector<PhysicalPiece> pieces;
    for (std::size_t bytes : {20 * kMiB, 2 * kMiB, 20 * kMiB}) pieces.push_back({*b->CreatePhysical(bytes), bytes});
    std::size_t mapped = 0;
    ASSERT_TRUE(b->MapRun(*va, pieces, &mapped).ok());
    EXPECT_EQ(mapped, 3u);
    EXPECT_EQ(b->counters().maps, 3);
    EXPECT_EQ(b->counters().access_grants, 1);
    if (mode == SimMemoryMode::kBacked) {
      Fill(*va, 42 * kMiB, 3);
      EXPECT_TRUE(Holds(*va, 42 * kMiB, 3));
    }
    // A run stops at the first piece it cannot map: here one whose size is not its handle's.
    const PhysicalPiece again[] = {{*b->CreatePhysical(2 * kMiB), 2 * kMiB}, {*b->CreatePhysical(4 * kMiB), 2 * kMiB}};
    EXPECT_FALSE(b->MapRun(*va + 42 * kMiB, again, &mapped).ok());
    EXPECT_EQ(mapped, 1u);
    EXPECT_EQ(b->counters().access_grants, 2) << "the mapped prefix is made accessible";
    // One unmap for the two 20 MiB mappings would cut the 2 MiB one between them: refused. The
    // three side by side go in one call.
    EXPECT_FALSE(b->Unmap(*va, 21 * kMiB).ok());
    ASSERT_TRUE(b->Unmap(*va, 44 * kMiB).ok());
    EXPECT_EQ(b->counters().unmaps, 1);
    for (const PhysicalPiece& p : pieces) ASSERT_TRUE(b->ReleasePhysical(p.handle).ok());
    ASSERT_TRUE(b->ReleasePhysical(again[0].handle).ok());
    ASSERT_TRUE(b->ReleasePhysical(again[1].handle).ok());
    // 2 MiB and 20 MiB handles freed in any order leave every byte usable: 32 MiB free in 2 MiB
    // pieces make a 30 MiB handle, which holds what is written to it.
    std::vector<PhysicalHandle> small;
    for (int i = 0; i < 32; ++i) small.push_back(*b->CreatePhysical(2 * kMiB));
    for (int i = 0; i < 32; i += 2) ASSERT_TRUE(b->ReleasePhysical(small[i]).ok());
    absl::StatusOr<PhysicalHandle> big = b->CreatePhysical(30 * kMiB);
    ASSERT_TRUE(big.ok()) << big.status();
    ASSERT_TRUE(b->Map(*va, 30 * kMiB, *big).ok());
    if (mode == SimMemoryMode::kBacked) {
      Fill(*va, 30 * kMiB, 7);
      EXPECT_TRUE(Holds(*va, 30 * kMiB, 7));
    }
    ASSERT_TRUE(b->Unmap(*va, 30 * kMiB).ok());
    ASSERT_TRUE(b->ReleasePhysical(*big).ok());
    for (int i = 1; i < 32; i += 2) ASSERT_TRUE(b->ReleasePhysical(small[i]).ok());
    ASSERT_TRUE(b->ReleaseAddressRange(*va, 64 * kMiB).ok());
  }
}

TEST(SimBackendTest, PhysicalMemoryCountsAgainstTheDevice) {
  for (SimMemoryMode mode : {SimMemoryMode::kBacked, SimMemoryMode::kUnbacked}) {
    auto b = Make({.total_memory = 8 * kMiB, .memory = mode});
    absl::StatusOr<void*> p = b->Allocate(4 * kMiB);
    ASSERT_TRUE(p.ok());
    absl::StatusOr<PhysicalHandle> h = b->CreatePhysical(4 * kMiB);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(absl::IsResourceExhausted(b->CreatePhysical(2 * kMiB).status()));
    EXPECT_TRUE(absl::IsResourceExhausted(b->Allocate(2 * kMiB).status()));
    EXPECT_EQ(b->GetMemInfo()->free_bytes, 0u);
    ASSERT_TRUE(b->ReleasePhysical(*h).ok());
    EXPECT_TRUE(b->CreatePhysical(4 * kMiB).ok());
    EXPECT_EQ(b->counters().failed_physical_creates, 1);
    ASSERT_TRUE(b->Free(*p, 4 * kMiB).ok());
  }
}

TEST(SimBackendTest, VirtualMemoryMisuseIsRefusedAndChangesNothing) {
  auto b = Make({.total_memory = 16 * kMiB});
  absl::StatusOr<std::uintptr_t> a = b->ReserveAddressRange(4 * kMiB, 0);
  absl::StatusOr<PhysicalHandle> h = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(a.ok() && h.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(b->ReserveAddressRange(3 * kMiB, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b->ReserveAddressRange(2 * kMiB, 3 * kMiB).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b->CreatePhysical(kMiB).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(b->Map(*a + kMiB, 2 * kMiB, *h))) << "unaligned";
  EXPECT_TRUE(absl::IsInvalidArgument(b->Map(*a + 4 * kMiB, 2 * kMiB, *h))) << "outside the reservation";
  EXPECT_TRUE(absl::IsInvalidArgument(b->Map(*a, 4 * kMiB, *h))) << "not the handle's size";
  EXPECT_TRUE(absl::IsInvalidArgument(b->Map(*a, 2 * kMiB, 999))) << "no such handle";
  ASSERT_TRUE(b->Map(*a, 2 * kMiB, *h).ok());
  absl::StatusOr<PhysicalHandle> other = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(b->Map(*a, 2 * kMiB, *other))) << "already mapped";
  EXPECT_TRUE(absl::IsInvalidArgument(b->Unmap(*a, kMiB))) << "cuts a mapping";
  EXPECT_TRUE(absl::IsInvalidArgument(b->Unmap(*a + 2 * kMiB, 2 * kMiB))) << "nothing mapped";
  EXPECT_TRUE(absl::IsFailedPrecondition(b->ReleasePhysical(*h)));
  EXPECT_TRUE(absl::IsFailedPrecondition(b->ReleaseAddressRange(*a, 4 * kMiB)));
  EXPECT_TRUE(absl::IsInvalidArgument(b->ReleaseAddressRange(*a, 2 * kMiB)));
  // The refused calls left the mapping intact.
  Fill(*a, 2 * kMiB, 3);
  EXPECT_TRUE(Holds(*a, 2 * kMiB, 3));
  EXPECT_EQ(b->counters().maps, 1);
  // While a stream captures, creating and mapping succeed (the vmm backend calls them in relaxed
  // capture mode, as CUDA allows); unmapping and releasing are refused (as CUDA refuses them).
  b->SetCapturing(nullptr, true);
  absl::StatusOr<PhysicalHandle> third = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(b->Map(*a + 2 * kMiB, 2 * kMiB, *other).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(b->Unmap(*a + 2 * kMiB, 2 * kMiB)));
  EXPECT_EQ(b->counters().capture_violations, 1);
  b->SetCapturing(nullptr, false);
  ASSERT_TRUE(b->Unmap(*a, 2 * kMiB).ok());
  ASSERT_TRUE(b->Unmap(*a + 2 * kMiB, 2 * kMiB).ok());
  ASSERT_TRUE(b->ReleasePhysical(*h).ok());
  ASSERT_TRUE(b->ReleasePhysical(*other).ok());
  ASSERT_TRUE(b->ReleasePhysical(*third).ok());
  ASSERT_TRUE(b->ReleaseAddressRange(*a, 4 * kMiB).ok());
}

TEST(SimBackendTest, VirtualMemoryFaultInjection) {
  auto b = Make({.total_memory = 16 * kMiB});
  absl::StatusOr<std::uintptr_t> a = b->ReserveAddressRange(4 * kMiB, 0);
  ASSERT_TRUE(a.ok());
  b->FailNthAlloc(2);
  absl::StatusOr<PhysicalHandle> h = b->CreatePhysical(2 * kMiB);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(b->CreatePhysical(2 * kMiB).status()));
  EXPECT_EQ(b->used_bytes(), 2 * kMiB) << "a failed create takes nothing";
  b->FailNthMap(1);
  EXPECT_TRUE(absl::IsResourceExhausted(b->Map(*a, 2 * kMiB, *h)));
  EXPECT_TRUE(b->Map(*a, 2 * kMiB, *h).ok()) << "a failed map leaves the range free to map";
  Fill(*a, 2 * kMiB, 5);
  EXPECT_TRUE(Holds(*a, 2 * kMiB, 5));
  ASSERT_TRUE(b->Unmap(*a, 2 * kMiB).ok());
  ASSERT_TRUE(b->ReleasePhysical(*h).ok());
  ASSERT_TRUE(b->ReleaseAddressRange(*a, 4 * kMiB).ok());
}

TEST(SimBackendTest, BadOptionsAreRejected) {
  EXPECT_TRUE(absl::IsInvalidArgument(MakeSimBackend({.total_memory = 0}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeSimBackend({.total_memory = 8 * kMiB, .granularity = 3000}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeSimBackend({.total_memory = 3 * kMiB}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeSimBackend({.total_memory = 8 * kMiB, .fail_fraction = 2}).status()));
  EXPECT_EQ(AsSim(Make({.total_memory = 8 * kMiB}).get()) != nullptr, true);
}

}  // namespace
}  // namespace bucketalloc
