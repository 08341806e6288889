// The fast path's promise (docs/architecture.md, "A request's path"): a cache hit, allocation or
// free, makes no heap allocation and no backend call. Every heap allocation of this process is
// counted here: C++'s operator new (all forms) is replaced, and outside the sanitizer builds (whose
// runtimes own malloc) so are malloc, calloc, realloc and the aligned forms, which reach glibc's own
// through its __libc_* entry points. A positive control checks that the counter sees allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace {

thread_local bool t_counting = false;
thread_local std::int64_t t_allocations = 0;

void Note() {
  if (t_counting) ++t_allocations;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BUCKETALLOC_COUNT_MALLOC 0
#else
#define BUCKETALLOC_COUNT_MALLOC 1
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
void* malloc(std::size_t n) {
  Note();
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
  Note();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
  Note();
  return __libc_realloc(p, n);
}
void* memalign(std::size_t alignment, std::size_t n) {
  Note();
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  Note();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  Note();
  *out = __libc_memalign(alignment, n);
  return *out == nullptr ? 12 /* ENOMEM */ : 0;
}
void free(void* p) { __libc_free(p); }
}
#endif

void* operator new(std::size_t n) {
  Note();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  Note();
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a) {
  Note();
  void* p = nullptr;
  if (posix_memalign(&p, static_cast<std::size_t>(a), n == 0 ? 1 : n) == 0) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::TestStream;

// Heap allocations made by this thread while `f` runs.
template <typename F>
std::int64_t HeapAllocationsIn(F&& f) {
  t_allocations = 0;
  t_counting = true;
  f();
  t_counting = false;
  return t_allocations;
}

TEST(FastPathTest, TheCounterSeesHeapAllocations) {
  // The positive control: without it a test of zero could not fail.
  EXPECT_GE(HeapAllocationsIn([] { delete new int(7); }), 1);
  EXPECT_GE(HeapAllocationsIn([] { std::vector<char> v(1000); }), 1);
#if BUCKETALLOC_COUNT_MALLOC
  EXPECT_GE(HeapAllocationsIn([] { std::free(std::malloc(100)); }), 1);
#endif
  // A slow path does allocate (a new slab's metadata, a segment's blocks): it is seen.
  auto a = bucketalloc::testing::MakeAllocator("");
  ASSERT_NE(a, nullptr);
  void* p = nullptr;
  EXPECT_GE(HeapAllocationsIn([&] { p = *a->Allocate(4096); }), 1) << "a new slab, a new stream's free lists";
  ASSERT_TRUE(a->Free(p).ok());
}

class FastPathHeapTest : public ::testing::TestWithParam<bucketalloc::testing::Config> {};

// Every size class the pools serve differently: small slots, a split large block, a whole
// segment, a tier block when the configuration has tiers; on two streams; after as many live
// blocks as the loop holds (so the live map is at its high-water mark).
TEST_P(FastPathHeapTest, ACacheHitMakesNoHeapAllocationAndNoBackendCall) {
  // Without debug_check_invariants: the check after a slow path is a debugging aid that allocates.
  std::string conf = "backend:sim,sim_memory:unbacked,sim_total_memory:4GiB";
  if (!GetParam().conf.empty()) conf += "," + GetParam().conf;
  absl::StatusOr<Options> options = ParseOptions(conf);
  ASSERT_TRUE(options.ok()) << options.status();
  options->debug_check_invariants = false;
  absl::StatusOr<std::unique_ptr<Allocator>> created = Allocator::Create(*options);
  ASSERT_TRUE(created.ok()) << created.status();
  Allocator& a = **created;
  // With tenants, the requests go to a tenant's own pools (the thread's tenant), through the
  // tenant routing and its accounting.
  if (!options->tenants.empty()) {
    ASSERT_TRUE(a.SetThreadTenant(options->tenants.back().name).ok());
  }
  const std::size_t sizes[] = {512, 4096, 256 * kKiB, kMiB, 3 * kMiB, 9 * kMiB, 12 * kMiB};
  for (Stream stream : {Stream{nullptr}, TestStream(1)}) {
    for (std::size_t size : sizes) {
      // Up to 8 blocks live at once, 16 MiB in all (the tiny_capacity configuration caps at 64 MiB).
      const int kLive = static_cast<int>(std::clamp<std::size_t>(16 * kMiB / size, 1, 8));
      SCOPED_TRACE(::testing::Message() << size << " bytes on stream " << stream);
      // Warm: kLive blocks of the size on the stream, freed into the cache.
      std::vector<void*> warm;
      for (int i = 0; i < kLive; ++i) {
        absl::StatusOr<void*> p = a.Allocate(size, 0, stream);
        ASSERT_TRUE(p.ok()) << p.status();
        warm.push_back(*p);
      }
      for (void* p : warm) ASSERT_TRUE(a.Free(p, 0, size).ok());
      const DeviceStats before = *a.GetStats(0);
      const BackendCounters calls = (*a.backend(0))->counters();
      std::vector<void*> live(kLive, nullptr);  // sized before counting
      bool ok = true;
      const std::int64_t heap = HeapAllocationsIn([&] {
        for (int round = 0; round < 3; ++round) {
          for (void*& p : live) {
            absl::StatusOr<void*> r = a.Allocate(size, 0, stream);
            ok = ok && r.ok();
            p = r.ok() ? *r : nullptr;
          }
          for (void* p : live) ok = ok && a.Free(p, 0, size).ok();
        }
      });
      ASSERT_TRUE(ok);
      EXPECT_EQ(heap, 0) << "heap allocations on cache hits";
      const DeviceStats after = *a.GetStats(0);
      EXPECT_EQ(after.num_cache_hits - before.num_cache_hits, 3 * kLive) << "every allocation was a hit";
      EXPECT_EQ(after.num_cache_misses, before.num_cache_misses);
      const BackendCounters now = (*a.backend(0))->counters();
      EXPECT_EQ(now.allocs, calls.allocs);
      EXPECT_EQ(now.frees, calls.frees);
      EXPECT_EQ(now.events_recorded, calls.events_recorded);
      EXPECT_EQ(now.maps + now.unmaps + now.physical_creates, calls.maps + calls.unmaps + calls.physical_creates);
    }
  }
  EXPECT_TRUE(a.CheckInvariants(0).ok());
  if (!options->tenants.empty()) {  // the blocks were the tenant's
    const std::vector<TenantStats> tenants = *a.GetTenantStats(0);
    ASSERT_EQ(tenants.size(), options->tenants.size() + 1);
    EXPECT_GT(tenants.back().reserved, 0u);
    EXPECT_EQ(tenants.front().reserved, 0u) << "the default tenant (the device's own pools) served nothing";
    ASSERT_TRUE(a.SetThreadTenant("default").ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, FastPathHeapTest, ::testing::ValuesIn(bucketalloc::testing::AllConfigs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace bucketalloc
