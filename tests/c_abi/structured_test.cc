// The C ABI's structured inspection and pools (bucketalloc.h, "Structured inspection and pools"):
// what bucketalloc_torch's native c10 allocator is served from. In process, on the simulated device;
// ctest runs every test in its own process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/bucketalloc.h"
#include "nlohmann/json.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

cudaStream_t StreamOf(int i) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(0x1000 + i)); }

nlohmann::json Stats(int device = 0) {
  std::vector<char> buf(1 << 16);
  const ssize_t n = bucketalloc_stats_json(device, buf.data(), buf.size());
  EXPECT_GE(n, 0) << bucketalloc_last_error();
  EXPECT_LT(n, static_cast<ssize_t>(buf.size()));
  return nlohmann::json::parse(buf.data());
}

bucketalloc_device_stats StatsStruct(int device = 0) {
  bucketalloc_device_stats s{};
  EXPECT_EQ(bucketalloc_get_device_stats(device, &s, sizeof s), 0) << bucketalloc_last_error();
  return s;
}

struct Segment {
  bucketalloc_segment_info info;
  std::vector<bucketalloc_block_info> blocks;
};
std::vector<Segment> Segments(int device = 0) {
  std::vector<Segment> out;
  EXPECT_EQ(bucketalloc_visit_segments(
                device,
                [](const bucketalloc_segment_info* s, void* ctx) {
                  static_cast<std::vector<Segment>*>(ctx)->push_back(
                      Segment{*s, std::vector<bucketalloc_block_info>(s->blocks, s->blocks + s->num_blocks)});
                },
                &out),
            0)
      << bucketalloc_last_error();
  return out;
}

const bucketalloc_block_info* BlockAt(const std::vector<Segment>& segments, void* p) {
  for (const Segment& s : segments)
    for (const bucketalloc_block_info& b : s.blocks)
      if (b.address == reinterpret_cast<std::uintptr_t>(p)) return &b;
  return nullptr;
}

class CAbiStructuredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(bucketalloc_is_initialized(), 0) << "each test runs in a fresh process";
    ASSERT_EQ(bucketalloc_configure("backend:sim,capacity:256MiB,sim_total_memory:1GiB,debug_check_invariants:true"), 0)
        << bucketalloc_last_error();
  }
  void TearDown() override { EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error(); }
};

TEST_F(CAbiStructuredTest, DeviceStatsAreTheJsonStatsFieldForField) {
  void* a = bucketalloc_malloc(3 * kMiB, 0, StreamOf(0));
  void* b = bucketalloc_malloc(4096, 0, StreamOf(0));
  ASSERT_NE(a, nullptr);
  bucketalloc_free(b, 4096, 0, StreamOf(0));
  const bucketalloc_device_stats s = StatsStruct();
  const nlohmann::json j = Stats();
  const char* pools[3] = {"all", "small_pool", "large_pool"};
  int compared = 0;
#define CHECK_POOL_STAT(name, doc)                                                      \
  for (int p = 0; p < 3; ++p) {                                                         \
    const std::string key = std::string(#name ".") + pools[p] + ".";                    \
    EXPECT_EQ(s.name[p].current, j.at(key + "current").get<std::int64_t>()) << key;     \
    EXPECT_EQ(s.name[p].peak, j.at(key + "peak").get<std::int64_t>()) << key;           \
    EXPECT_EQ(s.name[p].allocated, j.at(key + "allocated").get<std::int64_t>()) << key; \
    EXPECT_EQ(s.name[p].freed, j.at(key + "freed").get<std::int64_t>()) << key;         \
    ++compared;                                                                         \
  }
  BUCKETALLOC_POOL_STATS(CHECK_POOL_STAT)
#undef CHECK_POOL_STAT
#define CHECK_COUNTER(name, doc)                               \
  EXPECT_EQ(s.name, j.at(#name).get<std::int64_t>()) << #name; \
  ++compared;
  BUCKETALLOC_COUNTERS(CHECK_COUNTER)
#undef CHECK_COUNTER
  EXPECT_GT(compared, 40);
  EXPECT_EQ(s.allocated_bytes[0].current, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_EQ(s.max_split_size, -1);
  EXPECT_EQ(s.capacity_bytes, static_cast<std::int64_t>(256 * kMiB));
  bucketalloc_free(a, 3 * kMiB, 0, StreamOf(0));
}

TEST_F(CAbiStructuredTest, AStructOfAnotherSizeIsRefusedNamingBoth) {
  bucketalloc_device_stats s{};
  EXPECT_EQ(bucketalloc_get_device_stats(0, &s, sizeof s - 8), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "struct bucketalloc_device_stats of"))
      << bucketalloc_last_error();
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), std::to_string(sizeof s))) << bucketalloc_last_error();
  bucketalloc_oom_info o{};
  EXPECT_EQ(bucketalloc_last_oom_info(0, &o, 3), -1);
  EXPECT_EQ(bucketalloc_get_device_stats(0, nullptr, sizeof s), -1);
  EXPECT_EQ(bucketalloc_get_device_stats(7, &s, sizeof s), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "device 7 is invalid")) << bucketalloc_last_error();
}

TEST_F(CAbiStructuredTest, ResetAccumulatedStatsZeroesTotalsAndCountersButKeepsCurrentAndPeak) {
  void* a = bucketalloc_malloc(3 * kMiB, 0, StreamOf(0));
  void* b = bucketalloc_malloc(5 * kMiB, 0, StreamOf(0));
  bucketalloc_free(b, 5 * kMiB, 0, StreamOf(0));
  ASSERT_GT(StatsStruct().num_device_alloc, 0);
  ASSERT_EQ(bucketalloc_reset_accumulated_stats(0), 0) << bucketalloc_last_error();
  bucketalloc_device_stats s = StatsStruct();
  EXPECT_EQ(s.allocated_bytes[0].current, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_EQ(s.allocated_bytes[0].peak, static_cast<std::int64_t>(8 * kMiB));
  EXPECT_EQ(s.allocated_bytes[0].allocated, 0);
  EXPECT_EQ(s.allocated_bytes[0].freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.num_cache_hits, 0);
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();  // current == base + allocated - freed
  bucketalloc_free(a, 3 * kMiB, 0, StreamOf(0));
  s = StatsStruct();
  EXPECT_EQ(s.allocated_bytes[0].current, 0);
  EXPECT_EQ(s.allocated_bytes[0].freed, static_cast<std::int64_t>(3 * kMiB));  // counted from the reset
  EXPECT_EQ(s.allocation[0].freed, 1);
}

TEST_F(CAbiStructuredTest, SegmentsTileWithTheirBlocksAndNameTheirPool) {
  void* a = bucketalloc_malloc(3 * kMiB, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_pool_incref(0, {0, 9}), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, {0, 9}, [](cudaStream_t s) { return s == StreamOf(1); }), 0)
      << bucketalloc_last_error();
  void* in_pool = bucketalloc_malloc(1 * kMiB, 0, StreamOf(1));
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, {0, 9}), 0) << bucketalloc_last_error();
  const std::vector<Segment> segments = Segments();
  ASSERT_GE(segments.size(), 2u);
  for (const Segment& s : segments) {
    std::uintptr_t at = s.info.address;
    for (const bucketalloc_block_info& b : s.blocks) {
      EXPECT_EQ(b.address, at);
      at += b.size;
    }
    EXPECT_EQ(at, s.info.address + s.info.total_size);
    EXPECT_EQ(s.info.num_blocks, s.blocks.size());
  }
  const bucketalloc_block_info* block = BlockAt(segments, a);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(block->state, BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED);
  EXPECT_EQ(block->requested_size, 3 * kMiB);
  bool found_pool = false;
  for (const Segment& s : segments) {
    if (BlockAt({s}, in_pool) != nullptr) {
      found_pool = true;
      EXPECT_EQ(s.info.pool.first, 0u);
      EXPECT_EQ(s.info.pool.second, 9u);
    } else {
      EXPECT_EQ(s.info.pool.second, 0u);
    }
  }
  EXPECT_TRUE(found_pool);
  std::vector<std::pair<bucketalloc_pool_id, std::int64_t>> pools;
  ASSERT_EQ(bucketalloc_visit_private_pool_stats(
                0,
                [](bucketalloc_pool_id id, const bucketalloc_stat* reserved, void* ctx) {
                  static_cast<decltype(pools)*>(ctx)->emplace_back(id, reserved[0].current);
                },
                &pools),
            0);
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].first.second, 9u);
  EXPECT_GT(pools[0].second, 0);
  bucketalloc_free(in_pool, -1, 0, StreamOf(1));
  bucketalloc_free(a, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, {0, 9}), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, {0, 9}), 0);
}

TEST_F(CAbiStructuredTest, TheTraceHookSeesEveryEventWhileSetAndNothingAfter) {
  std::vector<bucketalloc_trace_event> events;
  ASSERT_EQ(bucketalloc_set_trace_hook(
                [](const bucketalloc_trace_event* e, void* ctx) {
                  static_cast<std::vector<bucketalloc_trace_event>*>(ctx)->push_back(*e);
                },
                &events),
            0);
  void* a = bucketalloc_malloc(3 * kMiB, 0, StreamOf(0));
  bucketalloc_free(a, 3 * kMiB, 0, StreamOf(0));
  ASSERT_EQ(events.size(), 4u);  // history recording is off: the hook is called all the same
  EXPECT_EQ(events[0].action, BUCKETALLOC_TRACE_SEGMENT_ALLOC);
  EXPECT_EQ(events[1].action, BUCKETALLOC_TRACE_ALLOC);
  EXPECT_EQ(events[1].addr, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(events[1].size, 3 * kMiB);
  EXPECT_EQ(events[1].stream, reinterpret_cast<std::uintptr_t>(StreamOf(0)));
  EXPECT_EQ(events[2].action, BUCKETALLOC_TRACE_FREE_REQUESTED);
  EXPECT_EQ(events[3].action, BUCKETALLOC_TRACE_FREE_COMPLETED);
  EXPECT_GT(events[1].time_us, 1'600'000'000'000'000);  // microseconds since the epoch
  void* big = bucketalloc_malloc(300 * kMiB, 0, StreamOf(0));
  EXPECT_EQ(big, nullptr);
  EXPECT_EQ(events.back().action, BUCKETALLOC_TRACE_OOM);
  EXPECT_GT(events.back().device_free, 0u);
  ASSERT_EQ(bucketalloc_set_trace_hook(nullptr, nullptr), 0);
  const std::size_t seen = events.size();
  bucketalloc_free(bucketalloc_malloc(kMiB, 0, StreamOf(0)), kMiB, 0, StreamOf(0));
  EXPECT_EQ(events.size(), seen);
  // Recording and the hook together: the ring keeps its own history.
  ASSERT_EQ(bucketalloc_record_history(1, 100), 0);
  bucketalloc_free(bucketalloc_malloc(kMiB, 0, StreamOf(0)), kMiB, 0, StreamOf(0));
  EXPECT_EQ(events.size(), seen);
}

TEST_F(CAbiStructuredTest, CacheInfoIsTheLargestFreeBlockAndWithZeroAlsoTheHeadroom) {
  void* a = bucketalloc_malloc(30 * kMiB, 0, StreamOf(0));
  void* b = bucketalloc_malloc(50 * kMiB, 0, StreamOf(0));
  bucketalloc_free(a, 30 * kMiB, 0, StreamOf(0));
  std::size_t largest = 1;
  ASSERT_EQ(bucketalloc_cache_info(0, &largest), 0) << bucketalloc_last_error();
  EXPECT_EQ(largest, 30 * kMiB);  // the cached block
  largest = 0;                    // cuDNN's call: also what the device can still give under the cap
  ASSERT_EQ(bucketalloc_cache_info(0, &largest), 0);
  EXPECT_EQ(largest, 256 * kMiB - 80 * kMiB);
  largest = 200 * kMiB;  // a larger guess stays
  ASSERT_EQ(bucketalloc_cache_info(0, &largest), 0);
  EXPECT_EQ(largest, 200 * kMiB);
  EXPECT_EQ(bucketalloc_cache_info(0, nullptr), -1);
  bucketalloc_free(b, 50 * kMiB, 0, StreamOf(0));
}

// bucketalloc_prefetch: spares created ahead of need serve a later grow (reserved does not rise),
// the cap stops it, a release gives them back; refused by name without virtual memory.
TEST(CAbiPrefetchTest, SparesServeAGrowTheCapStopsItAndErrorsAreClear) {
  ASSERT_EQ(bucketalloc_is_initialized(), 0) << "each test runs in a fresh process";
  ASSERT_EQ(bucketalloc_configure("backend:sim,capacity:64MiB,sim_total_memory:256MiB,expandable_segments:true,"
                                  "debug_check_invariants:true"),
            0)
      << bucketalloc_last_error();
  std::size_t created = 1;
  ASSERT_EQ(bucketalloc_prefetch(0, 16 * kMiB, 0, &created), 0) << bucketalloc_last_error();
  EXPECT_EQ(created, 16 * kMiB);
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, static_cast<std::int64_t>(16 * kMiB));
  void* p = bucketalloc_malloc(16 * kMiB, 0, StreamOf(0));
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, static_cast<std::int64_t>(16 * kMiB)) << "the spares, mapped";
  ASSERT_EQ(bucketalloc_prefetch(0, 32 * kMiB, 8 * kMiB, &created), 0) << bucketalloc_last_error();
  EXPECT_EQ(created, 8 * kMiB) << "at most max_create";
  ASSERT_EQ(bucketalloc_prefetch(0, kGiB, 0, nullptr), 0) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, static_cast<std::int64_t>(64 * kMiB)) << "stopped at the cap";
  EXPECT_EQ(bucketalloc_prefetch(0, 48 * kMiB, 0, &created), 0) << "the spares are enough";
  EXPECT_EQ(created, 0u);
  EXPECT_EQ(bucketalloc_prefetch(0, 50 * kMiB, 0, &created), -1);
  EXPECT_EQ(created, 0u);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "prefetch to 50.00 MiB of spare memory on device 0"))
      << bucketalloc_last_error();
  bucketalloc_free(p, 16 * kMiB, 0, StreamOf(0));
  bucketalloc_empty_cache();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
}

TEST_F(CAbiStructuredTest, PrefetchWithoutVirtualMemoryIsRefusedByName) {
  std::size_t created = 1;
  EXPECT_EQ(bucketalloc_prefetch(0, 8 * kMiB, 0, &created), -1);
  EXPECT_EQ(created, 0u);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: backend:vmm")) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
}

TEST_F(CAbiStructuredTest, AMemPoolsUseCountAndItsCacheGoBackOnlyOnceFreeable) {
  const bucketalloc_pool_id pool{0, 3};
  EXPECT_EQ(bucketalloc_pool_use_count(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0) << bucketalloc_last_error();  // MemPool()
  EXPECT_EQ(bucketalloc_pool_use_count(0, pool), 1);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);  // use_mem_pool
  EXPECT_EQ(bucketalloc_pool_use_count(0, pool), 2);
  void* p = bucketalloc_malloc(8 * kMiB, 0, StreamOf(0));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(bucketalloc_pool_empty_cache(0, pool), -1);  // refused while the context routes
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  EXPECT_EQ(bucketalloc_pool_use_count(0, pool), 1);
  bucketalloc_free(p, -1, 0, StreamOf(0));
  const std::int64_t reserved = StatsStruct().reserved_bytes[0].current;
  ASSERT_GT(reserved, 0);
  ASSERT_EQ(bucketalloc_pool_empty_cache(0, pool), 0) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, reserved);  // in use: its free blocks stay
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);            // ~MemPool
  EXPECT_EQ(bucketalloc_pool_use_count(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_empty_cache(-1, pool), 0);  // every device created so far
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
  EXPECT_EQ(bucketalloc_pool_incref(0, {0, 0}), -1);  // the device's own pools are not a MemPool
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: any other id")) << bucketalloc_last_error();
}

TEST_F(CAbiStructuredTest, AUseOnOomPoolLendsItsCachedBlockInsteadOfAnOom) {
  const bucketalloc_pool_id lender{0, 6};
  ASSERT_EQ(bucketalloc_pool_incref(0, lender), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, lender, [](cudaStream_t) { return true; }), 0);
  void* x = bucketalloc_malloc(200 * kMiB, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, lender), 0);
  bucketalloc_free(x, -1, 0, StreamOf(0));
  EXPECT_EQ(bucketalloc_malloc(150 * kMiB, 0, StreamOf(0)), nullptr);  // not a lender yet: an OOM
  EXPECT_EQ(StatsStruct().num_ooms, 1);
  ASSERT_EQ(bucketalloc_pool_set_use_on_oom(0, lender, 1), 0);
  void* y = bucketalloc_malloc(150 * kMiB, 0, StreamOf(0));
  ASSERT_NE(y, nullptr) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().num_ooms, 1);
  const std::vector<Segment> segments = Segments();
  for (const Segment& s : segments) {
    if (BlockAt({s}, y) != nullptr) {
      EXPECT_EQ(s.info.pool.second, 6u);  // the lender's block
    }
  }
  bucketalloc_free(y, -1, 0, StreamOf(0));  // back to the lender
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_pool_set_use_on_oom(0, lender, 0), 0);
  EXPECT_EQ(bucketalloc_malloc(150 * kMiB, 0, StreamOf(0)), nullptr);
  ASSERT_EQ(bucketalloc_release_pool_id(0, lender), 0);
}

// The segments of `pool` (pool.second), each with its blocks.
std::vector<Segment> PoolSegments(std::uint64_t second) {
  std::vector<Segment> out;
  for (Segment& s : Segments())
    if (s.info.pool.first == 0 && s.info.pool.second == second) out.push_back(std::move(s));
  return out;
}

TEST_F(CAbiStructuredTest, ANoSplitPoolHandsOutEveryAllocationAsWholeSegments) {
  const bucketalloc_pool_id pool{0, 8};
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0);  // MemPool(no_split=True): incref, then setNoSplit
  ASSERT_EQ(bucketalloc_pool_set_no_split(0, pool), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);
  void* tiny = bucketalloc_malloc(512, 0, StreamOf(0));
  void* mid = bucketalloc_malloc(3 * kMiB, 0, StreamOf(0));
  void* big = bucketalloc_malloc(30 * kMiB, 0, StreamOf(0));
  ASSERT_TRUE(tiny != nullptr && mid != nullptr && big != nullptr) << bucketalloc_last_error();
  std::vector<Segment> segments = PoolSegments(8);
  ASSERT_EQ(segments.size(), 3u);
  for (const Segment& s : segments) {
    ASSERT_EQ(s.blocks.size(), 1u) << "a no-split segment holds one block";
    EXPECT_EQ(s.blocks[0].size, s.info.total_size);
    EXPECT_EQ(s.blocks[0].state, BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED);
  }
  EXPECT_EQ(BlockAt(segments, tiny)->size, 2 * kMiB);  // a small request takes a whole small segment
  EXPECT_GE(BlockAt(segments, mid)->size, 3 * kMiB);
  // A freed whole block serves a smaller request whole, not split.
  bucketalloc_free(mid, -1, 0, StreamOf(0));
  void* again = bucketalloc_malloc(2 * kMiB + 1, 0, StreamOf(0));
  EXPECT_EQ(again, mid);
  segments = PoolSegments(8);
  EXPECT_EQ(segments.size(), 3u);
  for (const Segment& s : segments) EXPECT_EQ(s.blocks.size(), 1u);
  // The device's own pools still split: two small requests share one slab.
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  void* own1 = bucketalloc_malloc(512, 0, StreamOf(0));
  void* own2 = bucketalloc_malloc(512, 0, StreamOf(0));
  EXPECT_LT(static_cast<char*>(own2) - static_cast<char*>(own1), static_cast<std::ptrdiff_t>(2 * kMiB));
  for (void* p : {own1, own2, tiny, again, big}) bucketalloc_free(p, -1, 0, StreamOf(0));
  // Once it holds memory its setting cannot change: its blocks were made with it.
  const bucketalloc_pool_id other{0, 9};
  ASSERT_EQ(bucketalloc_pool_incref(0, other), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, other, [](cudaStream_t) { return true; }), 0);
  void* q = bucketalloc_malloc(kMiB, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, other), 0);
  EXPECT_EQ(bucketalloc_pool_set_no_split(0, other), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "already holds memory")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_pool_set_no_split(0, {0, 77}), -1);  // no such pool
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "no such pool")) << bucketalloc_last_error();
  bucketalloc_free(q, -1, 0, StreamOf(0));
  for (bucketalloc_pool_id id : {pool, other}) {
    ASSERT_EQ(bucketalloc_release_pool_id(0, id), 0);  // the routing's use
    ASSERT_EQ(bucketalloc_release_pool_id(0, id), 0);  // ~MemPool
  }
  bucketalloc_empty_cache();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
}

// A MemPool's own allocator, as vLLM's CuMemAllocator is to torch: host memory stands for it here
// (the simulated device never touches the bytes).
struct HostSegments {
  std::vector<std::pair<void*, std::size_t>> live;
  int allocs = 0, frees = 0, releases = 0, refusals = 0;
  bool refuse = false;
};
void* HostAlloc(size_t bytes, int device, cudaStream_t, void* ctx) {
  auto* h = static_cast<HostSegments*>(ctx);
  EXPECT_EQ(device, 0);
  if (h->refuse) {
    ++h->refusals;
    return nullptr;
  }
  void* p = std::aligned_alloc(2 * kMiB, bytes);
  h->live.emplace_back(p, bytes);
  ++h->allocs;
  return p;
}
void HostFree(void* p, size_t bytes, int, void* ctx) {
  auto* h = static_cast<HostSegments*>(ctx);
  auto it = std::find(h->live.begin(), h->live.end(), std::make_pair(p, static_cast<std::size_t>(bytes)));
  EXPECT_NE(it, h->live.end()) << "freed a segment it did not give, or with another size";
  if (it != h->live.end()) h->live.erase(it);
  std::free(p);
  ++h->frees;
}
void HostRelease(void* ctx) { ++static_cast<HostSegments*>(ctx)->releases; }

TEST_F(CAbiStructuredTest, AMemPoolWithItsOwnAllocatorCachesItsSegmentsAndCountsThem) {
  HostSegments host;
  const bucketalloc_pool_id pool{0, 10};
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_set_segment_allocator(0, pool, HostAlloc, HostFree, HostRelease, &host), 0)
      << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);
  void* a = bucketalloc_malloc(4 * kMiB, 0, StreamOf(0));
  void* b = bucketalloc_malloc(4 * kMiB, 0, StreamOf(0));  // the same segment: split, as any pool
  void* c = bucketalloc_malloc(1000, 0, StreamOf(0));      // a small segment of its own
  ASSERT_TRUE(a != nullptr && b != nullptr && c != nullptr) << bucketalloc_last_error();
  EXPECT_EQ(host.allocs, 2);
  std::size_t given = 0;
  for (const auto& [p, bytes] : host.live) given += bytes;
  // Its segments are the pool's, counted as reserved, and shown by address.
  const std::vector<Segment> segments = PoolSegments(10);
  ASSERT_EQ(segments.size(), 2u);
  for (const Segment& s : segments) {
    EXPECT_TRUE(std::any_of(host.live.begin(), host.live.end(), [&](const auto& l) {
      return reinterpret_cast<std::uintptr_t>(l.first) == s.info.address;
    }));
  }
  EXPECT_EQ(static_cast<std::size_t>(StatsStruct().reserved_bytes[0].current), given);
  // A freed block is cached: the next request takes it without asking the allocator.
  bucketalloc_free(a, -1, 0, StreamOf(0));
  EXPECT_EQ(bucketalloc_malloc(4 * kMiB, 0, StreamOf(0)), a);
  EXPECT_EQ(host.allocs, 2);
  // When the allocator has no memory, the request fails as an OOM naming it; nothing is lost.
  host.refuse = true;
  EXPECT_EQ(bucketalloc_malloc(100 * kMiB, 0, StreamOf(0)), nullptr);
  EXPECT_GE(host.refusals, 1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "segment allocator")) << bucketalloc_last_error();
  host.refuse = false;
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  for (void* p : {a, b, c}) bucketalloc_free(p, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  EXPECT_EQ(host.frees, 0);  // in use (the MemPool lives): its cache stays
  EXPECT_EQ(host.releases, 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);  // ~MemPool
  ASSERT_EQ(bucketalloc_pool_empty_cache(0, pool), 0);
  EXPECT_EQ(host.frees, 2);
  EXPECT_TRUE(host.live.empty());
  EXPECT_EQ(host.releases, 1);  // the pool is forgotten: its allocator released once
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
  // Refused: NULL functions (the context is released), a pool not in use.
  HostSegments unused;
  EXPECT_EQ(bucketalloc_pool_set_segment_allocator(0, {0, 11}, nullptr, HostFree, HostRelease, &unused), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "NULL")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_pool_set_segment_allocator(0, {0, 11}, HostAlloc, HostFree, HostRelease, &unused), -1);
  EXPECT_EQ(unused.releases, 2);
}

// A MemPool allocator's answers are checked (issue 42 item 5): a pointer it returns twice, one inside
// a segment it gave, or one not 512-byte aligned fails the request naming it; nothing is registered
// (the stats, the invariants and the blocks are as before), a misaligned one goes back through its
// free, an overlapping one does not (its free could release memory live blocks use), and releasing
// the pool later frees each real segment once.
struct ScriptedSegments {
  enum class Answer { kFresh, kFirstAgain, kInsideFirst, kMisaligned } next = Answer::kFresh;
  std::vector<std::pair<void*, std::size_t>> fresh;  // what it allocated, in order
  std::vector<std::pair<void*, std::size_t>> freed;
  void* spare = nullptr;  // the buffer a misaligned answer points into
};
void* ScriptedAlloc(size_t bytes, int, cudaStream_t, void* ctx) {
  auto* h = static_cast<ScriptedSegments*>(ctx);
  switch (h->next) {
    case ScriptedSegments::Answer::kFresh: {
      void* p = std::aligned_alloc(2 * kMiB, bytes);
      h->fresh.emplace_back(p, bytes);
      return p;
    }
    case ScriptedSegments::Answer::kFirstAgain:
      return h->fresh.front().first;
    case ScriptedSegments::Answer::kInsideFirst:
      return static_cast<char*>(h->fresh.front().first) + 2 * kMiB;
    case ScriptedSegments::Answer::kMisaligned:
      h->spare = std::aligned_alloc(2 * kMiB, bytes + 2 * kMiB);
      return static_cast<char*>(h->spare) + 256;
  }
  return nullptr;
}
void ScriptedFree(void* p, size_t bytes, int, void* ctx) {
  auto* h = static_cast<ScriptedSegments*>(ctx);
  h->freed.emplace_back(p, bytes);
  if (h->spare != nullptr && p == static_cast<char*>(h->spare) + 256) {
    std::free(h->spare);
    h->spare = nullptr;
    return;
  }
  std::free(p);
}

TEST_F(CAbiStructuredTest, AMemPoolAllocatorsRepeatedOverlappingOrMisalignedMemoryIsRefused) {
  ScriptedSegments host;
  const bucketalloc_pool_id pool{0, 12};
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_set_segment_allocator(0, pool, ScriptedAlloc, ScriptedFree, nullptr, &host), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);
  void* first = bucketalloc_malloc(16 * kMiB, 0, StreamOf(0));
  ASSERT_NE(first, nullptr) << bucketalloc_last_error();
  ASSERT_EQ(host.fresh.size(), 1u);
  const bucketalloc_device_stats before = StatsStruct();
  const std::size_t segments_before = Segments().size();
  struct Case {
    ScriptedSegments::Answer answer;
    const char* says;
    bool given_back;
  };
  for (const Case& c :
       {Case{ScriptedSegments::Answer::kFirstAgain, "which overlaps the segment it gave before", false},
        Case{ScriptedSegments::Answer::kInsideFirst, "which overlaps the segment it gave before", false},
        Case{ScriptedSegments::Answer::kMisaligned, "which is not 512-byte aligned", true}}) {
    host.next = c.answer;
    const std::size_t freed = host.freed.size();
    EXPECT_EQ(bucketalloc_malloc(64 * kMiB, 0, StreamOf(0)), nullptr);  // needs a segment of its own
    EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(),
                                  "a private pool's segment allocator (MemPool(allocator)) returned 0x"))
        << bucketalloc_last_error();
    EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), c.says)) << bucketalloc_last_error();
    EXPECT_EQ(host.freed.size(), freed + (c.given_back ? 1 : 0));
    EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
    EXPECT_EQ(StatsStruct().reserved_bytes[0].current, before.reserved_bytes[0].current);
    EXPECT_EQ(StatsStruct().segment[0].current, before.segment[0].current);
    EXPECT_EQ(Segments().size(), segments_before);
  }
  EXPECT_EQ(host.spare, nullptr) << "the misaligned answer was given back";
  // The pool goes on serving from good answers, and gives each real segment back once.
  host.next = ScriptedSegments::Answer::kFresh;
  void* second = bucketalloc_malloc(64 * kMiB, 0, StreamOf(0));
  ASSERT_NE(second, nullptr) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  for (void* p : {first, second}) bucketalloc_free(p, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_empty_cache(0, pool), 0);
  std::vector<std::pair<void*, std::size_t>> real(host.freed.end() - static_cast<std::ptrdiff_t>(host.fresh.size()),
                                                  host.freed.end());
  std::sort(real.begin(), real.end());
  std::vector<std::pair<void*, std::size_t>> given = host.fresh;
  std::sort(given.begin(), given.end());
  EXPECT_EQ(real, given);
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, 0);
}

// A segment allocator that calls into bucketalloc (issue 42 item 6) would wait for the device's lock
// forever: the call is refused with an error that says so, and the request goes on.
struct ReentrantSegments {
  void* got = reinterpret_cast<void*>(1);  // what bucketalloc_malloc returned inside the callback
  int stats_rc = 0;
  ssize_t metrics_rc = 0;
  std::string error, free_error, empty_cache_error;
  void* outside = nullptr;  // a block of the device's own pools, freed from inside the free callback
  std::vector<void*> live;
};
void* ReentrantAlloc(size_t bytes, int, cudaStream_t, void* ctx) {
  auto* h = static_cast<ReentrantSegments*>(ctx);
  h->got = bucketalloc_malloc(4096, 0, StreamOf(0));
  h->error = bucketalloc_last_error();
  bucketalloc_device_stats s{};
  h->stats_rc = bucketalloc_get_device_stats(0, &s, sizeof s);
  // Those that never create the allocator, and the void ones, are refused too.
  char text[64];
  h->metrics_rc = bucketalloc_metrics_text(text, sizeof text);
  bucketalloc_empty_cache();
  h->empty_cache_error = bucketalloc_last_error();
  bucketalloc_set_memory_fraction(0.5, 0);
  void* p = std::aligned_alloc(2 * kMiB, bytes);
  h->live.push_back(p);
  return p;
}
void ReentrantFree(void* p, size_t, int, void* ctx) {
  auto* h = static_cast<ReentrantSegments*>(ctx);
  bucketalloc_free(h->outside, -1, 0, StreamOf(0));  // refused (and printed): the block stays live
  h->free_error = bucketalloc_last_error();
  h->live.erase(std::find(h->live.begin(), h->live.end(), p));
  std::free(p);
}

TEST_F(CAbiStructuredTest, ACallIntoBucketallocFromASegmentAllocatorIsRefusedNotADeadlock) {
  ReentrantSegments host;
  host.outside = bucketalloc_malloc(4096, 0, StreamOf(0));
  ASSERT_NE(host.outside, nullptr);
  const bucketalloc_pool_id pool{0, 13};
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_set_segment_allocator(0, pool, ReentrantAlloc, ReentrantFree, nullptr, &host), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);
  void* p = bucketalloc_malloc(8 * kMiB, 0, StreamOf(0));
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  EXPECT_EQ(host.got, nullptr);
  EXPECT_EQ(host.stats_rc, -1);
  EXPECT_TRUE(absl::StrContains(host.error, "called from inside a private pool's segment allocator")) << host.error;
  EXPECT_TRUE(absl::StrContains(host.error, "would wait for that lock forever")) << host.error;
  EXPECT_EQ(host.metrics_rc, -1);
  EXPECT_TRUE(absl::StrContains(host.empty_cache_error, "called from inside a private pool's segment allocator"))
      << host.empty_cache_error;
  EXPECT_EQ(StatsStruct().capacity_bytes, static_cast<std::int64_t>(256 * kMiB)) << "the fraction was refused";
  // Outside the callback every call works again.
  bucketalloc_device_stats s{};
  EXPECT_EQ(bucketalloc_get_device_stats(0, &s, sizeof s), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  bucketalloc_free(p, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  ASSERT_EQ(bucketalloc_pool_empty_cache(0, pool), 0);
  EXPECT_TRUE(host.live.empty()) << "the free callback ran";
  EXPECT_TRUE(absl::StrContains(host.free_error, "called from inside a private pool's segment allocator"))
      << host.free_error;
  EXPECT_EQ(StatsStruct().allocated_bytes[0].current, 4096) << "the refused free freed nothing";
  bucketalloc_free(host.outside, -1, 0, StreamOf(0));
  EXPECT_EQ(StatsStruct().allocated_bytes[0].current, 0);
}

// torch 2.15's CUDAGraph marks its captures: a use_mem_pool context is then not a capture, and a
// miss in it releases the device's cache and retries; a marked capture still may not.
TEST_F(CAbiStructuredTest, WithMarkedCapturesAMemPoolContextReleasesAndRetriesButACaptureDoesNot) {
  void* cached = bucketalloc_malloc(200 * kMiB, 0, StreamOf(0));
  ASSERT_NE(cached, nullptr);
  bucketalloc_free(cached, -1, 0, StreamOf(0));  // 200 of the 256 MiB cap cached by the device's own pools
  const bucketalloc_pool_id pool{0, 14};
  ASSERT_EQ(bucketalloc_pool_incref(0, pool), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }), 0);
  // No marks yet: every routing may be a capture, during which nothing is released.
  EXPECT_EQ(bucketalloc_malloc(150 * kMiB, 0, StreamOf(0)), nullptr);
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, static_cast<std::int64_t>(200 * kMiB));
  // A capture marked and ended: from now on only marked captures restrict.
  ASSERT_EQ(bucketalloc_mark_capture(0, 1), 0);
  EXPECT_EQ(bucketalloc_malloc(150 * kMiB, 0, StreamOf(0)), nullptr);  // underway: still no release
  ASSERT_EQ(bucketalloc_mark_capture(0, 0), 0);
  void* p = bucketalloc_malloc(150 * kMiB, 0, StreamOf(0));  // the MemPool context: release, retry
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().reserved_bytes[0].current, static_cast<std::int64_t>(150 * kMiB));
  // empty_cache in a MemPool context stays a refusal (PyTorch skips it there too).
  EXPECT_EQ(bucketalloc_pool_empty_cache(0, {0, 0}), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "MemPool context")) << bucketalloc_last_error();
  // A capture marked but never ended (it failed between its marks) restricts only while a routing
  // runs: the marks are forgotten with the last routing.
  ASSERT_EQ(bucketalloc_mark_capture(0, 1), 0);
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, pool), 0);
  bucketalloc_free(p, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, pool), 0);  // freeable: its 150 MiB go at the next release
  const bucketalloc_pool_id next{0, 15};
  ASSERT_EQ(bucketalloc_pool_incref(0, next), 0);
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, next, [](cudaStream_t) { return true; }), 0);
  void* q = bucketalloc_malloc(200 * kMiB, 0, StreamOf(0));  // releases the freeable pool, retries
  EXPECT_NE(q, nullptr) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, next), 0);
  bucketalloc_free(q, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_release_pool_id(0, next), 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, next), 0);
  EXPECT_EQ(bucketalloc_mark_capture(5, 1), -1);  // a device that does not exist: refused, named
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "5")) << bucketalloc_last_error();
}

TEST_F(CAbiStructuredTest, TheLastOomAsNumbers) {
  bucketalloc_oom_info o{};
  ASSERT_EQ(bucketalloc_last_oom_info(0, &o, sizeof o), 0);
  EXPECT_EQ(o.present, 0);
  void* a = bucketalloc_malloc(100 * kMiB, 0, StreamOf(0));
  EXPECT_EQ(bucketalloc_malloc(200 * kMiB, 0, StreamOf(0)), nullptr);
  ASSERT_EQ(bucketalloc_last_oom_info(0, &o, sizeof o), 0);
  EXPECT_EQ(o.present, 1);
  EXPECT_EQ(o.requested, 200 * kMiB);
  EXPECT_EQ(o.segment, 200 * kMiB);
  EXPECT_EQ(o.allocated, 100 * kMiB);
  EXPECT_EQ(o.capacity, 256 * kMiB);
  EXPECT_EQ(o.device_total, 1024 * kMiB);
  EXPECT_EQ(o.cause, 0);  // capacity
  EXPECT_EQ(o.rejected, 0);
  bucketalloc_free(a, -1, 0, StreamOf(0));
}

TEST_F(CAbiStructuredTest, RawDeleteFindsTheDeviceAndRefusesAnUnknownPointer) {
  void* a = bucketalloc_malloc(kMiB, 0, StreamOf(0));
  int x = 0;
  EXPECT_EQ(bucketalloc_raw_delete(&x), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "was not allocated by bucketalloc"))
      << bucketalloc_last_error();
  EXPECT_EQ(StatsStruct().allocation[0].current, 1);
  EXPECT_EQ(bucketalloc_raw_delete(a), 0) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_raw_delete(nullptr), 0);
  EXPECT_EQ(StatsStruct().allocation[0].current, 0);
}

TEST_F(CAbiStructuredTest, TheMemoryFractionIsTheOneSet) {
  EXPECT_EQ(bucketalloc_memory_fraction(0), 1.0);
  bucketalloc_set_memory_fraction(0.125, 0);
  EXPECT_EQ(bucketalloc_memory_fraction(0), 0.125);
  EXPECT_EQ(StatsStruct().capacity_bytes, static_cast<std::int64_t>(128 * kMiB));
  EXPECT_EQ(bucketalloc_memory_fraction(9), -1.0);
}

}  // namespace

namespace {

// throw_on_cudamalloc_oom (PyTorch's key): with True, growth the cap refuses fails at once, without
// releasing the cache and retrying; with False the cached 100 MiB are released and the request fits.
void RunCapRefusal(bool throw_on_oom) {
  ASSERT_EQ(bucketalloc_is_initialized(), 0) << "each test runs in a fresh process";
  ASSERT_EQ(bucketalloc_configure(throw_on_oom ? "backend:sim,capacity:256MiB,throw_on_cudamalloc_oom:True"
                                               : "backend:sim,capacity:256MiB,throw_on_cudamalloc_oom:False"),
            0)
      << bucketalloc_last_error();
  void* cached = bucketalloc_malloc(100 * kMiB, 0, StreamOf(0));
  bucketalloc_free(cached, -1, 0, StreamOf(0));  // 100 MiB cached, on stream 0's lists
  void* p = bucketalloc_malloc(200 * kMiB, 0, StreamOf(1));
  const bucketalloc_device_stats s = StatsStruct();
  EXPECT_GE(s.num_oom_rejections, 1);
  bucketalloc_oom_info o{};
  ASSERT_EQ(bucketalloc_last_oom_info(0, &o, sizeof o), 0);
  if (throw_on_oom) {
    EXPECT_EQ(o.rejected, 1);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(s.num_alloc_retries, 0);
    EXPECT_EQ(s.num_ooms, 1);
    EXPECT_EQ(s.reserved_bytes[0].current, static_cast<std::int64_t>(100 * kMiB));  // the cache stayed
  } else {
    EXPECT_NE(p, nullptr) << bucketalloc_last_error();
    EXPECT_EQ(s.num_alloc_retries, 1);
    EXPECT_EQ(s.num_ooms, 0);
    bucketalloc_free(p, -1, 0, StreamOf(1));
  }
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
}

TEST(CAbiCapRefusalTest, ThrowOnCudaMallocOomFailsAtOnceWithoutReleasingTheCache) { RunCapRefusal(true); }
TEST(CAbiCapRefusalTest, WithoutItTheCacheIsReleasedAndTheRequestRetried) { RunCapRefusal(false); }

// bucketalloc_allocate_at (PyTorch's setCheckpointPoolState and allocateWithAddress): blocks of a
// private pool, freed, come back at their addresses and block sizes, live; a range over a live
// block is refused, naming it, and nothing changes.
TEST_F(CAbiStructuredTest, AllocateAtPutsFreedPoolBlocksBackAtTheirAddresses) {
  constexpr bucketalloc_pool_id kPool{0, 9};
  ASSERT_EQ(bucketalloc_begin_allocate_to_pool(0, kPool, [](cudaStream_t s) { return s == StreamOf(1); }), 0)
      << bucketalloc_last_error();
  void* a = bucketalloc_malloc(3 * kMiB, 0, StreamOf(1));
  void* b = bucketalloc_malloc(5 * kMiB + 100, 0, StreamOf(1));
  ASSERT_EQ(bucketalloc_end_allocate_to_pool(0, kPool), 0) << bucketalloc_last_error();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // The checkpoint: addresses, block sizes and the stream, as the torch adapter records them.
  std::vector<Segment> segments = Segments();
  const bucketalloc_block_info* ba = BlockAt(segments, a);
  const bucketalloc_block_info* bb = BlockAt(segments, b);
  ASSERT_TRUE(ba != nullptr && bb != nullptr);
  const std::size_t size_a = ba->size, size_b = bb->size;
  for (const Segment& seg : segments) {
    if (BlockAt({seg}, a) != nullptr) {
      EXPECT_EQ(seg.info.pool.second, 9u);
      EXPECT_EQ(seg.info.stream, reinterpret_cast<std::uintptr_t>(StreamOf(1)));
    }
  }
  const bucketalloc_device_stats at_checkpoint = StatsStruct();
  bucketalloc_free(a, -1, 0, StreamOf(1));
  bucketalloc_free(b, -1, 0, StreamOf(1));
  EXPECT_EQ(StatsStruct().allocation[0].current, 0);

  ASSERT_EQ(bucketalloc_allocate_at(0, kPool, b, size_b, size_b, StreamOf(1)), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_allocate_at(0, kPool, a, size_a, size_a, StreamOf(1)), 0) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
  segments = Segments();
  for (void* p : {a, b}) {
    const bucketalloc_block_info* block = BlockAt(segments, p);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(block->state, BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED);
    EXPECT_EQ(block->size, p == a ? size_a : size_b);
  }
  const bucketalloc_device_stats restored = StatsStruct();
  EXPECT_EQ(restored.allocation[0].current, 2);
  EXPECT_EQ(restored.allocated_bytes[0].current, at_checkpoint.allocated_bytes[0].current);

  // A range overlapping a live block is refused, naming it; nothing changes.
  EXPECT_EQ(bucketalloc_allocate_at(0, kPool, static_cast<char*>(a) + kMiB, kMiB, kMiB, StreamOf(1)), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "in use")) << bucketalloc_last_error();
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "0x")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_allocate_at(0, kPool, a, size_a, size_a, StreamOf(1)), -1);
  EXPECT_EQ(bucketalloc_allocate_at(0, bucketalloc_pool_id{3, 3}, a, size_a, size_a, StreamOf(1)), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "unknown")) << bucketalloc_last_error();
  const bucketalloc_device_stats after = StatsStruct();
  EXPECT_EQ(after.allocation[0].current, restored.allocation[0].current);
  EXPECT_EQ(after.active_bytes[0].current, restored.active_bytes[0].current);
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();

  // Freed as any allocation; the device's own pools ({0, 0}) serve allocate_at too.
  bucketalloc_free(a, -1, 0, StreamOf(1));
  bucketalloc_free(b, -1, 0, StreamOf(1));
  void* own = bucketalloc_malloc(2 * kMiB, 0, StreamOf(0));
  ASSERT_NE(own, nullptr);
  const std::size_t own_size = BlockAt(Segments(), own)->size;
  bucketalloc_free(own, -1, 0, StreamOf(0));
  ASSERT_EQ(bucketalloc_allocate_at(0, bucketalloc_pool_id{0, 0}, own, own_size, 2 * kMiB, StreamOf(0)), 0)
      << bucketalloc_last_error();
  bucketalloc_free(own, -1, 0, StreamOf(0));
  // Block size 0 (allocateWithAddress): the block the pool rounds the request to.
  ASSERT_EQ(bucketalloc_allocate_at(0, bucketalloc_pool_id{0, 0}, own, 0, 2 * kMiB - 1000, StreamOf(0)), 0)
      << bucketalloc_last_error();
  EXPECT_EQ(BlockAt(Segments(), own)->requested_size, 2 * kMiB - 1000);
  EXPECT_EQ(bucketalloc_allocate_at(0, bucketalloc_pool_id{0, 0}, own, 0, kMiB, StreamOf(0)), -1) << "live";
  bucketalloc_free(own, -1, 0, StreamOf(0));
  EXPECT_EQ(StatsStruct().allocation[0].current, 0);
  ASSERT_EQ(bucketalloc_release_pool_id(0, kPool), 0);
}

}  // namespace
