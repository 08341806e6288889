#include <cstring>

#include <gtest/gtest.h>

#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"

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
    auto b = Make({.total_memory = 1024 * kMiB, .memory = SimMemoryMode::kUnbacked, .fail_fraction = 0.3, .seed = seed});
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

TEST(SimBackendTest, VirtualMemoryIsNotClaimed) {
  auto b = Make({.total_memory = 8 * kMiB});
  EXPECT_FALSE(b->SupportsVirtualMemory());
  EXPECT_TRUE(absl::IsUnimplemented(b->ReserveAddressRange(2 * kMiB, 2 * kMiB).status()));
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
