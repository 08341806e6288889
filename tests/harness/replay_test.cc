// Trace replay, its metrics and the min-capacity bisection (src/harness/replay.cc), on small traces
// whose answers are known.
#include "harness/replay.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

Trace Make(std::initializer_list<std::tuple<TraceAction, std::uint64_t, std::size_t>> events) {
  Trace t;
  for (const auto& [action, pointer, size] : events) t.events.push_back({1, "", action, pointer, size, 0, 0});
  return t;
}
constexpr TraceAction kAlloc = TraceAction::kAllocate;
constexpr TraceAction kFree = TraceAction::kFree;

// A 10 MiB and a 20 MiB block live together (30 MiB), then a 5 MiB one.
Trace Abc() {
  return Make({{kAlloc, 0xa, 10 * kMiB}, {kAlloc, 0xb, 20 * kMiB}, {kFree, 0xa, 10 * kMiB},
               {kAlloc, 0xc, 5 * kMiB}, {kFree, 0xb, 20 * kMiB}, {kFree, 0xc, 5 * kMiB}});
}

ReplayResult ReplayAt(const Trace& t, const std::string& allocator, std::size_t capacity, int repeat = 1) {
  ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.repeat = repeat;
  absl::StatusOr<ReplayResult> r = Replay(t, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayTest, PeakLiveIsTheTracesOwnPeak) {
  EXPECT_EQ(PeakLiveBytes(Abc()), 30 * kMiB);
  // Frees of unknown pointers and logged failures do not count.
  Trace t = Make({{kFree, 0x99, 4 * kMiB}, {TraceAction::kAllocateFailure, 0, 64 * kMiB}, {kAlloc, 0x1, kMiB}});
  EXPECT_EQ(PeakLiveBytes(t), kMiB);
}

TEST(ReplayTest, NoCacheMakesOneBackendCallPerRequestPricedByTheCostModel) {
  ReplayResult r = ReplayAt(Abc(), "nocache", 64 * kMiB);
  EXPECT_EQ(r.allocations, 3u);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.backend_calls, 6u);
  EXPECT_DOUBLE_EQ(r.simulated_backend_ms, (3 * 50.0 + 3 * 10.0) / 1000.0);
  EXPECT_EQ(r.peak_live_bytes, 30 * kMiB);
  EXPECT_EQ(r.peak_reserved_bytes, 30 * kMiB);  // 10 + 20, both 2 MiB multiples
  EXPECT_DOUBLE_EQ(r.reserved_over_live, 1.0);
}

TEST(ReplayTest, OomsAreSplitIntoCapacityAndFragmentation) {
  // 24 MiB: the 20 MiB block cannot join the live 10 MiB one whatever the allocator (capacity).
  ReplayResult r = ReplayAt(Abc(), "nocache", 24 * kMiB);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.capacity_ooms, 1u);
  EXPECT_EQ(r.fragmentation_ooms, 0u);
  // 4 MiB, three 1-byte blocks: 3 bytes fit the card, but nocache spends 2 MiB on each (fragmentation).
  Trace tiny = Make({{kAlloc, 0x1, 1}, {kAlloc, 0x2, 1}, {kAlloc, 0x3, 1}});
  r = ReplayAt(tiny, "nocache", 4 * kMiB);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.fragmentation_ooms, 1u);
  // bucketalloc packs them in one slab.
  r = ReplayAt(tiny, "bucketalloc", 4 * kMiB);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_reserved_bytes, 2 * kMiB);
}

TEST(ReplayTest, RepeatTellsALeakFromSettling) {
  ReplayResult stable = ReplayAt(Abc(), "bucketalloc", 256 * kMiB, 4);
  EXPECT_EQ(stable.per_round_peak_reserved_bytes.size(), 4u);
  EXPECT_EQ(stable.verdict, "stable");
  Trace leak = Make({{kAlloc, 0x1, 8 * kMiB}, {kAlloc, 0x2, 3 * kMiB}, {kFree, 0x2, 3 * kMiB}});
  ReplayResult rising = ReplayAt(leak, "bucketalloc", 256 * kMiB, 4);
  EXPECT_EQ(rising.verdict, "rising");
  EXPECT_LT(rising.per_round_peak_reserved_bytes.front(), rising.per_round_peak_reserved_bytes.back())
      << "4 x 8 MiB held: the card's peak grows";
  EXPECT_EQ(ReplayAt(Abc(), "bucketalloc", 256 * kMiB).verdict, "single round");
}

TEST(ReplayTest, MinCapacityIsTheSmallestCardWithoutOoms) {
  absl::StatusOr<MinCapacityResult> m = MinCapacity(Abc(), "nocache", CostModel{});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->min_capacity_bytes, 30 * kMiB);
  EXPECT_DOUBLE_EQ(m->min_capacity_over_live, 1.0);
  EXPECT_EQ(m->at_min.ooms, 0u);
  EXPECT_GT(ReplayAt(Abc(), "nocache", 28 * kMiB).ooms, 0u) << "2 MiB less must fail";
  absl::StatusOr<MinCapacityResult> b = MinCapacity(Abc(), "bucketalloc", CostModel{});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GE(b->min_capacity_bytes, 30 * kMiB);
  EXPECT_EQ(ReplayAt(Abc(), "bucketalloc", b->min_capacity_bytes).ooms, 0u);
  EXPECT_GT(ReplayAt(Abc(), "bucketalloc", b->min_capacity_bytes - 2 * kMiB).ooms, 0u);
  const nlohmann::json j = nlohmann::json::parse(b->ToJson());
  for (const char* key : {"peak_live_bytes", "peak_reserved_bytes", "reserved_over_live", "ooms", "capacity_ooms",
                          "fragmentation_ooms", "min_capacity_bytes", "min_capacity_over_live", "p50_ns", "p99_ns",
                          "backend_calls", "simulated_backend_ms", "per_round_peak_reserved_bytes", "verdict"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(ReplayTest, BadAllocatorsAndCapacitiesAreRefused) {
  ReplayOptions o;
  o.capacity = 64 * kMiB;
  o.allocator = "jemalloc";
  absl::StatusOr<ReplayResult> r = Replay(Abc(), o);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "accepted: bucketalloc, bucketalloc:CONF, pytorch-policy, nocache")) << r.status();
  o.allocator = "bucketalloc:no_such_key:1";
  r = Replay(Abc(), o);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no_such_key")) << r.status();
  o.allocator = "bucketalloc";
  o.capacity = 1000;
  EXPECT_TRUE(absl::StrContains(Replay(Abc(), o).status().message(), "accepted: 2 MiB or more"));
  o.capacity = 64 * kMiB;
  o.repeat = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Replay(Abc(), o).status()));
}

}  // namespace
}  // namespace bucketalloc::harness
