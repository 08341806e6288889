// Trace replay, its metrics and the min-capacity bisection (src/harness/replay/replay.cc), on small traces
// whose answers are known.
#include "harness/replay/replay.h"
#include "harness/replay/importers.h"
#include "harness/replay/policies.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"
#include "harness/workload/serving.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
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
  return Make({{kAlloc, 0xa, 10 * kMiB},
               {kAlloc, 0xb, 20 * kMiB},
               {kFree, 0xa, 10 * kMiB},
               {kAlloc, 0xc, 5 * kMiB},
               {kFree, 0xb, 20 * kMiB},
               {kFree, 0xc, 5 * kMiB}});
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

ReplayResult ReplayWithTimeline(const Trace& t, const std::string& allocator, std::size_t capacity,
                                std::size_t points = 2000, int repeat = 1) {
  ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.repeat = repeat;
  o.record_timeline = true;
  o.timeline_points = points;
  absl::StatusOr<ReplayResult> r = Replay(t, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayTest, TimelineIsRecordedOnlyWhenAsked) {
  ReplayResult r = ReplayAt(Abc(), "bucketalloc", 64 * kMiB);
  EXPECT_EQ(r.timeline.events, 0u);
  EXPECT_TRUE(r.timeline.points.empty());
  EXPECT_FALSE(r.peak_fragmentation.has_value());
  EXPECT_FALSE(nlohmann::json::parse(r.ToJson()).contains("timeline")) << "ToJson's keys are stable";
}

TEST(ReplayTest, TimelineHasOnePointPerEventWhenItFits) {
  // nocache reserves the live bytes rounded to 2 MiB per block (c's 5 MiB takes 6).
  ReplayResult r = ReplayWithTimeline(Abc(), "nocache", 64 * kMiB);
  EXPECT_EQ(r.timeline.events, 6u);
  EXPECT_EQ(r.timeline.bucket_events, 1u);
  ASSERT_EQ(r.timeline.points.size(), 6u);
  const std::size_t live[] = {10 * kMiB, 30 * kMiB, 20 * kMiB, 25 * kMiB, 5 * kMiB, 0};
  const std::size_t reserved[] = {10 * kMiB, 30 * kMiB, 20 * kMiB, 26 * kMiB, 6 * kMiB, 0};
  for (std::size_t i = 0; i < 6; ++i) {
    const TimelinePoint& p = r.timeline.points[i];
    EXPECT_EQ(p.event, i);
    EXPECT_EQ(p.live_bytes, live[i]) << i;
    EXPECT_EQ(p.live_min_bytes, live[i]) << i;
    EXPECT_EQ(p.reserved_bytes, reserved[i]) << i;
    EXPECT_EQ(p.ooms, 0u);
  }
}

TEST(ReplayTest, TimelineBucketsKeepTheirPeaksAndTroughs) {
  // Two points of three events: live (10, 30, 20) and (25, 5, 0) MiB; reserved (10, 30, 20) and (26, 6, 0).
  ReplayResult r = ReplayWithTimeline(Abc(), "nocache", 64 * kMiB, 2);
  EXPECT_EQ(r.timeline.bucket_events, 3u);
  ASSERT_EQ(r.timeline.points.size(), 2u);
  EXPECT_EQ(r.timeline.points[0].event, 0u);
  EXPECT_EQ(r.timeline.points[0].live_bytes, 30 * kMiB);
  EXPECT_EQ(r.timeline.points[0].live_min_bytes, 10 * kMiB);
  EXPECT_EQ(r.timeline.points[0].reserved_bytes, 30 * kMiB);
  EXPECT_EQ(r.timeline.points[1].event, 3u);
  EXPECT_EQ(r.timeline.points[1].live_bytes, 25 * kMiB);
  EXPECT_EQ(r.timeline.points[1].live_min_bytes, 0u);
  EXPECT_EQ(r.timeline.points[1].reserved_bytes, 26 * kMiB);
  // At 24 MiB the 20 MiB block fails (event 1): the OOM lands in the first point.
  r = ReplayWithTimeline(Abc(), "nocache", 24 * kMiB, 2);
  ASSERT_EQ(r.timeline.points.size(), 2u);
  EXPECT_EQ(r.timeline.points[0].ooms, 1u);
  EXPECT_EQ(r.timeline.points[1].ooms, 0u);
}

TEST(ReplayTest, LongTimelinesStayBoundedWithoutLosingThePeak) {
  // 10,000 events, a sawtooth whose one highest tooth is narrower than a bucket.
  Trace t;
  std::uint64_t pointer = 1;
  for (int tooth = 0; tooth < 50; ++tooth) {
    const int height = tooth == 37 ? 100 : 60;
    for (int i = 0; i < height; ++i) t.events.push_back({1, "", kAlloc, pointer + i, kMiB + 4096 * i, 0, 0});
    for (int i = 0; i < height; ++i) t.events.push_back({1, "", kFree, pointer + i, kMiB + 4096 * i, 0, 0});
    pointer += height;
  }
  t.events.resize(std::min<std::size_t>(t.events.size(), 10000));
  ReplayResult r = ReplayWithTimeline(t, "bucketalloc", 1024 * kMiB, 97);
  EXPECT_EQ(r.timeline.events, t.events.size());
  EXPECT_LE(r.timeline.points.size(), 97u);
  EXPECT_EQ(r.timeline.bucket_events, (t.events.size() + 96) / 97);
  std::size_t live = 0, reserved = 0;
  for (const TimelinePoint& p : r.timeline.points) {
    EXPECT_EQ(p.event % r.timeline.bucket_events, 0u);
    EXPECT_LE(p.live_min_bytes, p.live_bytes);
    live = std::max(live, p.live_bytes);
    reserved = std::max(reserved, p.reserved_bytes);
  }
  EXPECT_EQ(live, PeakLiveBytes(t));
  EXPECT_EQ(reserved, r.peak_reserved_bytes);
  // Recording changes nothing the replay measures.
  ReplayResult plain = ReplayAt(t, "bucketalloc", 1024 * kMiB);
  EXPECT_EQ(plain.peak_reserved_bytes, r.peak_reserved_bytes);
  EXPECT_EQ(plain.backend_calls, r.backend_calls);
  EXPECT_EQ(plain.ooms, r.ooms);
}

// 6 MiB a and b share a 20 MiB segment; a is freed; c (30 MiB) needs a segment of its own: reserved
// peaks at 50 MiB after event 3, with free blocks of 6 MiB (a's) and 8 MiB (the segment's tail).
Trace PeakTrace() {
  return Make({{kAlloc, 0xa, 6 * kMiB},
               {kAlloc, 0xb, 6 * kMiB},
               {kFree, 0xa, 6 * kMiB},
               {kAlloc, 0xc, 30 * kMiB},
               {kFree, 0xb, 6 * kMiB},
               {kFree, 0xc, 30 * kMiB}});
}

TEST(ReplayTest, HistogramIsTakenWhenReservedBytesFirstPeak) {
  for (const char* allocator : {"pytorch-policy", "bucketalloc"}) {
    SCOPED_TRACE(allocator);
    ReplayResult r = ReplayWithTimeline(PeakTrace(), allocator, 256 * kMiB);
    ASSERT_TRUE(r.peak_fragmentation.has_value());
    const PeakFragmentation& p = *r.peak_fragmentation;
    EXPECT_EQ(p.event, 3u);
    EXPECT_EQ(p.live_bytes, 36 * kMiB);
    const PoolFragmentation& f = p.free_blocks;
    EXPECT_EQ(f.reserved, static_cast<std::int64_t>(r.peak_reserved_bytes));
    EXPECT_EQ(f.reserved, static_cast<std::int64_t>(50 * kMiB));
    EXPECT_EQ(f.allocated, static_cast<std::int64_t>(36 * kMiB));
    EXPECT_EQ(f.requested, static_cast<std::int64_t>(36 * kMiB));
    EXPECT_EQ(f.total_free, static_cast<std::int64_t>(14 * kMiB));
    EXPECT_EQ(f.largest_free, static_cast<std::int64_t>(8 * kMiB));
    EXPECT_EQ(f.free_count[22], 1) << "6 MiB: 2^22 <= size < 2^23";
    EXPECT_EQ(f.free_bytes[22], static_cast<std::int64_t>(6 * kMiB));
    EXPECT_EQ(f.free_count[23], 1) << "8 MiB";
    std::int64_t blocks = 0;
    for (std::int64_t c : f.free_count) blocks += c;
    EXPECT_EQ(blocks, 2);
  }
}

TEST(ReplayTest, NoCacheHasNoFreeBlocksOnlyRoundingWaste) {
  Trace t = Make({{kAlloc, 0x1, 3 * kMiB}, {kAlloc, 0x2, kMiB}, {kFree, 0x1, 3 * kMiB}});
  ReplayResult r = ReplayWithTimeline(t, "nocache", 64 * kMiB);
  ASSERT_TRUE(r.peak_fragmentation.has_value());
  const PoolFragmentation& f = r.peak_fragmentation->free_blocks;
  EXPECT_EQ(r.peak_fragmentation->event, 1u);
  EXPECT_EQ(f.total_free, 0);
  for (std::int64_t c : f.free_count) EXPECT_EQ(c, 0);
  EXPECT_EQ(f.reserved, static_cast<std::int64_t>(6 * kMiB));  // 4 + 2, rounded to 2 MiB
  EXPECT_EQ(f.allocated, f.reserved);
  EXPECT_EQ(f.requested, static_cast<std::int64_t>(4 * kMiB));
}

TEST(ReplayTest, HistogramIndexCountsEveryRound) {
  // 8 MiB held each round: the peak keeps rising, so it is reached in the last round.
  Trace leak = Make({{kAlloc, 0x1, 8 * kMiB}, {kAlloc, 0x2, 3 * kMiB}, {kFree, 0x2, 3 * kMiB}});
  ReplayResult r = ReplayWithTimeline(leak, "pytorch-policy", 256 * kMiB, 2000, 3);
  EXPECT_EQ(r.timeline.events, 9u);
  ASSERT_EQ(r.timeline.points.size(), 9u);
  EXPECT_EQ(r.timeline.points[8].live_bytes, 24 * kMiB) << "the live series counts what earlier rounds still hold";
  ASSERT_TRUE(r.peak_fragmentation.has_value());
  EXPECT_GE(r.peak_fragmentation->event, 6u);
  EXPECT_EQ(r.peak_fragmentation->free_blocks.reserved, static_cast<std::int64_t>(r.peak_reserved_bytes));
  // Nothing reserved, nothing to show.
  EXPECT_FALSE(ReplayWithTimeline(Trace{}, "bucketalloc", 64 * kMiB).peak_fragmentation.has_value());
}

// roundup_power2_divisions:2 holds 40 MiB as 48 MiB and rounds 20 MiB to 24 MiB: 72 MiB rounded,
// but the 60 MiB the callers asked for fits the 64 MiB cap. The allocator's report and the
// harness's count agree: fragmentation (it was capacity for the allocator, fragmentation for the
// harness).
TEST(ReplayTest, RoundingPastTheCapIsFragmentationForTheAllocatorAndTheHarness) {
  const std::string conf = "roundup_power2_divisions:2";
  ReplayResult r =
      ReplayAt(Make({{kAlloc, 0x1, 40 * kMiB}, {kAlloc, 0x2, 20 * kMiB}}), "bucketalloc:" + conf, 64 * kMiB);
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.capacity_ooms, 0u);
  EXPECT_EQ(r.fragmentation_ooms, 1u);
  absl::StatusOr<Options> o = ParseOptions("backend:sim,capacity:64MiB,sim_memory:unbacked," + conf);
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(*o);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<void*> p = (*a)->Allocate(40 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<void*> q = (*a)->Allocate(20 * kMiB);
  ASSERT_TRUE(absl::IsResourceExhausted(q.status())) << q.status();
  EXPECT_TRUE(absl::StrContains(q.status().message(), "fragmentation:")) << q.status();
  EXPECT_TRUE(absl::StrContains(q.status().message(), "rounding alone exceeds the cap")) << q.status();
  absl::StatusOr<std::optional<OomReport>> report = (*a)->LastOomReport(0);
  ASSERT_TRUE(report.ok() && report->has_value());
  EXPECT_EQ((*report)->cause, OomCause::kFragmentation);
  ASSERT_TRUE((*a)->Free(*p).ok());
}

// A size no allocator accepts (bucketalloc refuses it; the models once wrapped it to a small block)
// is a line error for every policy, and for the min-capacity search.
TEST(ReplayTest, SizesAboveTheRequestLimitAreALineErrorForEveryPolicy) {
  for (const std::uint64_t size : {std::uint64_t{kMaxRequestBytes} + 1, ~std::uint64_t{0}}) {
    Trace t = Make({{kAlloc, 0x1, kMiB}, {kAlloc, 0x2, size}});
    t.events[1].line = 3;
    for (const char* allocator : {"bucketalloc", "pytorch-policy", "pytorch-expandable", "nocache"}) {
      ReplayOptions o;
      o.allocator = allocator;
      o.capacity = 64 * kMiB;
      absl::StatusOr<ReplayResult> r = Replay(t, o);
      EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << allocator << ": " << r.status();
      EXPECT_TRUE(absl::StrContains(r.status().message(), "trace:3: Size")) << r.status();
      EXPECT_TRUE(absl::StrContains(r.status().message(), "larger than any allocator accepts")) << r.status();
      EXPECT_TRUE(absl::IsInvalidArgument(MinCapacity(t, allocator, CostModel{}).status())) << allocator;
    }
    const std::string csv = absl::StrCat("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,", size, ",0x0\n");
    absl::Status s = ParseTrace(csv, "big.csv").status();
    EXPECT_TRUE(absl::StrContains(s.message(), "big.csv:2: Size")) << s;
  }
}

TEST(ReplayTest, BadAllocatorsAndCapacitiesAreRefused) {
  ReplayOptions o;
  o.capacity = 64 * kMiB;
  o.allocator = "jemalloc";
  absl::StatusOr<ReplayResult> r = Replay(Abc(), o);
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "accepted: bucketalloc, bucketalloc:CONF, pytorch-policy, pytorch-policy:CONF, "
                                "pytorch-expandable, pytorch-expandable:CONF, nocache"))
      << r.status();
  o.allocator = "bucketalloc:no_such_key:1";
  r = Replay(Abc(), o);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no_such_key")) << r.status();
  o.allocator = "bucketalloc";
  o.capacity = 1000;
  EXPECT_TRUE(absl::StrContains(Replay(Abc(), o).status().message(), "accepted: 2 MiB or more"));
  o.capacity = 64 * kMiB;
  o.repeat = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Replay(Abc(), o).status()));
  o.repeat = 1;
  o.record_timeline = true;
  o.timeline_points = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Replay(Abc(), o).status()));
}

TEST(ReplayTest, AllocatorListsKeepTheirConfsCommas) {
  EXPECT_EQ(*SplitAllocatorList("bucketalloc,pytorch-policy,nocache"),
            (std::vector<std::string>{"bucketalloc", "pytorch-policy", "nocache"}));
  EXPECT_EQ(*SplitAllocatorList("bucketalloc,bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048,nocache"),
            (std::vector<std::string>{"bucketalloc", "bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048",
                                      "nocache"}));
  // An unknown name stays a piece of its own, so MakeReplayAllocator names it.
  EXPECT_EQ(*SplitAllocatorList("pytorch-policy,cub"), (std::vector<std::string>{"pytorch-policy", "cub"}));
  EXPECT_EQ(*SplitAllocatorList("bucketalloc:max_split_size_mb:256,,nocache"),
            (std::vector<std::string>{"bucketalloc:max_split_size_mb:256", "nocache"}));
}

TEST(ReplayTest, MinCapacityLooksBelowAnAnswerThatIsNotMonotone) {
  // pytorch-policy serves this at 76 MiB but not at 90 MiB: with room to spare it never releases its
  // cache, and the 4 MiB block split from the cached 40 MiB segment pins it when 56 MiB arrives.
  // Bisection alone lands on 96 MiB; the grid below the answer finds 76 MiB.
  absl::StatusOr<Trace> t = ParseTrace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,t,allocate,0x1000,41943040,0x0\n1,t,free,0x1000,41943040,0x0\n"
      "1,t,allocate,0x2000,52428800,0x0\n1,t,allocate,0x3000,4194304,0x0\n1,t,free,0x2000,52428800,0x0\n"
      "1,t,allocate,0x4000,58720256,0x0\n1,t,free,0x4000,58720256,0x0\n1,t,free,0x3000,4194304,0x0\n");
  ASSERT_TRUE(t.ok());
  ReplayOptions o;
  o.allocator = "pytorch-policy";
  o.capacity = 90 * kMiB;
  absl::StatusOr<ReplayResult> at90 = Replay(*t, o);
  ASSERT_TRUE(at90.ok());
  ASSERT_GT(at90->ooms, 0u) << "the trace must stay non-monotone for this test to mean anything";
  absl::StatusOr<MinCapacityResult> m = MinCapacity(*t, "pytorch-policy", CostModel{});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->min_capacity_bytes, 76 * kMiB);
  EXPECT_EQ(m->at_min.ooms, 0u);
}

TEST(ReplayTest, ACapacityOrDeviceInTheConfIsRefused) {
  for (const char* spec : {"bucketalloc:sim_total_memory:10GiB", "bucketalloc:backend:cuda",
                           "bucketalloc:max_split_size_mb:64,capacity:1GiB"}) {
    absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator(spec, 64 * kMiB);
    ASSERT_FALSE(a.ok()) << spec;
    EXPECT_TRUE(absl::StrContains(a.status().message(), "from --capacity and --device")) << a.status();
  }
  EXPECT_EQ(*SplitAllocatorList(" bucketalloc , nocache"), (std::vector<std::string>{"bucketalloc", "nocache"}));
  // The list splits as the option table splits a CONF: unbalanced brackets are an error that says so.
  absl::StatusOr<std::vector<std::string>> stray = SplitAllocatorList("bucketalloc:x],pytorch-policy");
  EXPECT_TRUE(absl::StrContains(stray.status().message(), "unbalanced brackets")) << stray.status();
  // A policy without options takes no CONF.
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> nocache = MakeReplayAllocator("nocache:capacity:1GiB", 64 * kMiB);
  EXPECT_TRUE(absl::StrContains(nocache.status().message(), "nocache takes no CONF")) << nocache.status();
}

// Fragmentation that only stitching serves: two 20 MiB segments of five 4 MiB blocks, every other
// one freed (20 MiB free in pieces), then a 12 MiB request at a 40 MiB cap.
Trace Fragmenting() {
  Trace t;
  for (std::uint64_t i = 0; i < 10; ++i) t.events.push_back({1, "", kAlloc, 0x100 + i, 4 * kMiB, 0, 0});
  for (std::uint64_t i = 0; i < 10; i += 2) t.events.push_back({1, "", kFree, 0x100 + i, 4 * kMiB, 0, 0});
  t.events.push_back({1, "", kAlloc, 0x200, 12 * kMiB, 0, 0});
  return t;
}

TEST(ReplayTest, BackendVmmStitchesOnTheReplayDeviceAndCountsTheGranules) {
  const ReplayResult plain = ReplayAt(Fragmenting(), "bucketalloc", 40 * kMiB);
  EXPECT_EQ(plain.fragmentation_ooms, 1u);
  EXPECT_EQ(plain.granules_stitched, 0u);
  for (const char* spec : {"bucketalloc:backend:vmm", "bucketalloc:expandable_segments:true"}) {
    const ReplayResult vmm = ReplayAt(Fragmenting(), spec, 40 * kMiB);
    EXPECT_EQ(vmm.ooms, 0u) << spec;
    EXPECT_EQ(vmm.granules_stitched, 6u) << spec;
    EXPECT_EQ(vmm.peak_reserved_bytes, 40 * kMiB) << spec;
    // 20 granules created and mapped, two by two as each request grows the segment in place (one
    // access grant each), then 6 unmapped (one call for each freed block's two) and mapped again into
    // a new segment (one grant); a plain segment's range is a whole address reservation of the
    // cap's size: the first is all mapped, so the stitch's segment needs a second.
    EXPECT_EQ(vmm.backend_calls, 20u + 20u + 10u + 3u + 6u + 1u + 2u) << spec;
    const nlohmann::json j = nlohmann::json::parse(vmm.ToJson());
    EXPECT_TRUE(j.contains("granules_stitched"));
    const nlohmann::json& c = j["backend_call_counts"];
    EXPECT_EQ(c["creates"], 20);
    EXPECT_EQ(c["maps"], 26);
    EXPECT_EQ(c["access_grants"], 11);
    EXPECT_EQ(c["unmaps"], 3);
    EXPECT_EQ(c["releases"], 0);
    EXPECT_EQ(c["address_reserves"], 2);
    EXPECT_EQ(c["allocs"], 0);
  }
  // A policy CONF goes with it.
  EXPECT_EQ(ReplayAt(Fragmenting(), "bucketalloc:backend:vmm,max_split_size_mb:64", 40 * kMiB).ooms, 0u);
}

// Stitching needs at most what PyTorch's expandable segments with 2 MiB pages need (+ 0.002 x peak
// live), with at most 1.05 x their driver calls at their own min capacity, and never more than
// their 20 MiB-page form: on the vendored real GPU trace and on a paged serving trace (Qwen2.5-7B
// with 400 Azure conversations), where granule-sized segments once left 0.005 x peak live free in
// granules shared with live blocks (docs/vmm.md).
TEST(ReplayTest, StitchingNeedsAtMostTwoMiBPageExpandableSegments) {
  std::vector<std::pair<std::string, Trace>> traces;
  absl::StatusOr<Trace> gpu = ReadRecording(std::string(BUCKETALLOC_SOURCE_DIR) +
                                            "/data/traces/hta_kineto_trace_v100_rank1_profile_memory.json.gz");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  traces.emplace_back("gpu_kineto_v100", std::move(*gpu));
  absl::StatusOr<RequestSet> requests =
      ReadRequestsFile(std::string(BUCKETALLOC_SOURCE_DIR) + "/data/requests/azure_llm_inference_trace_2023_conv.csv",
                       {.limit = 400, .time_scale = 0.1});
  ASSERT_TRUE(requests.ok()) << requests.status();
  absl::StatusOr<ModelSpec> qwen =
      ReadModelConfig(std::string(BUCKETALLOC_SOURCE_DIR) + "/data/models/Qwen2.5-7B-Instruct.config.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  ServingOptions o;
  o.kv_layout = KvLayout::kPaged;
  absl::StatusOr<ServingTrace> paged = GenerateServingTrace(requests->requests, *qwen, o);
  ASSERT_TRUE(paged.ok()) << paged.status();
  traces.emplace_back("azure_qwen25_7b_paged", std::move(paged->trace));
  for (const auto& named : traces) {
    SCOPED_TRACE(named.first);
    const Trace& trace = named.second;
    const double live = static_cast<double>(PeakLiveBytes(trace));
    auto min = [&](const char* allocator) {
      absl::StatusOr<MinCapacityResult> m = MinCapacity(trace, allocator, CostModel{});
      EXPECT_TRUE(m.ok()) << m.status();
      return m.ok() ? *m : MinCapacityResult{};
    };
    const MinCapacityResult vmm = min("bucketalloc:backend:vmm"), pages2 = min("pytorch-expandable:large_page_mb=2"),
                            pages20 = min("pytorch-expandable");
    EXPECT_LE(static_cast<double>(vmm.min_capacity_bytes),
              static_cast<double>(pages2.min_capacity_bytes) + 0.002 * live);
    EXPECT_LE(vmm.min_capacity_bytes, pages20.min_capacity_bytes);
    EXPECT_LE(static_cast<double>(vmm.at_min.backend_calls), 1.05 * static_cast<double>(pages2.at_min.backend_calls));
  }
}

TEST(ReplayTest, PeakLiveCountsWhatEarlierRoundsNeverFreed) {
  absl::StatusOr<Trace> t = ParseTrace(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,t,allocate,0x1,4194304,0x0\n1,t,allocate,0x2,8388608,0x0\n1,t,free,0x2,8388608,0x0\n");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(PeakLiveBytes(*t), 12 * kMiB);
  EXPECT_EQ(PeakLiveBytes(*t, 4), 12 * kMiB + 3 * 4 * kMiB);
  ReplayOptions o;
  o.allocator = "nocache";
  o.capacity = 64 * kMiB;
  o.repeat = 4;
  absl::StatusOr<ReplayResult> r = Replay(*t, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->peak_live_bytes, 24 * kMiB);
  EXPECT_EQ(r->verdict, "rising");
}

}  // namespace
}  // namespace bucketalloc::harness

namespace bucketalloc::harness {
namespace {

// Abc() at one event per second of trace time (HH:MM:SS.ffffff), then a 1 GiB request at 6 s.
Trace TimedAbc() {
  Trace t = Abc();
  t.events.push_back({1, "", kAlloc, 0xd, 1024 * kMiB, 0, 0});
  for (std::size_t i = 0; i < t.events.size(); ++i) t.events[i].time = absl::StrCat("00:00:0", i, ".000000");
  return t;
}

TEST(ReplayTest, TheTimelineSamplesAtTheTracesTimeForEveryPolicy) {
  for (const char* allocator : {"bucketalloc", "pytorch-policy"}) {
    SCOPED_TRACE(allocator);
    ReplayOptions o;
    o.allocator = allocator;
    o.capacity = 64 * kMiB;
    o.sample_interval_s = 2.0;
    absl::StatusOr<ReplayResult> r = Replay(TimedAbc(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    // Samples at 0, 2, 4 and 6 s (the last event's), each after the events up to its time.
    std::vector<double> times;
    for (const TimelineSample& s : r->samples) times.push_back(s.time_s);
    EXPECT_EQ(times, (std::vector<double>{0, 2, 4, 6}));
    const TimelineSample& at2 = r->samples[1];  // after the events of 0, 1 and 2 s: 20 MiB live
    EXPECT_EQ(at2.allocated_bytes, static_cast<std::int64_t>(20 * kMiB));
    EXPECT_EQ(at2.capacity_bytes, static_cast<std::int64_t>(64 * kMiB));
    EXPECT_GE(at2.reserved_bytes, at2.allocated_bytes);
    EXPECT_EQ(at2.live_allocations, 1);
    // The 1 GiB request at 6 s: a capacity OOM, listed once.
    std::size_t listed = 0;
    for (const TimelineSample& s : r->samples) {
      for (const OomEvent& e : s.ooms) {
        ++listed;
        EXPECT_EQ(e.time_s, 6.0);
        EXPECT_EQ(e.size, 1024 * kMiB);
        EXPECT_EQ(e.cause, OomCause::kCapacity);
      }
    }
    EXPECT_EQ(listed, 1u);
    EXPECT_EQ(r->samples.back().ooms_total[static_cast<int>(OomCause::kCapacity)], 1);
    EXPECT_EQ(r->samples.back().allocated_bytes, 0) << "the trace freed everything by 6 s";
    // The lines read back.
    std::string text;
    for (const TimelineSample& s : r->samples) absl::StrAppend(&text, TimelineToJsonLine(s), "\n");
    absl::StatusOr<std::vector<TimelineSample>> read = ReadTimeline(text, "replay");
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->size(), r->samples.size());
  }
}

TEST(ReplayTest, RoundsOfARepeatFollowOneAnotherOnTheTimeline) {
  ReplayOptions o;
  o.capacity = 2048 * kMiB;
  o.repeat = 2;
  o.sample_interval_s = 1.0;
  absl::StatusOr<ReplayResult> r = Replay(TimedAbc(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  // Round 1 starts one interval after round 0's last event (6 s): at 7 s; it ends at 13 s.
  EXPECT_EQ(r->samples.back().time_s, 13.0);
  EXPECT_EQ(r->samples.size(), 14u);  // 0..13 s
}

TEST(ReplayTest, ATimelineNeedsTimesItCanRead) {
  ReplayOptions o;
  o.capacity = 64 * kMiB;
  o.sample_interval_s = 1.0;
  absl::StatusOr<ReplayResult> r = Replay(Abc(), o);  // no times
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_TRUE(absl::StrContains(r.status().message(), "accepted: HH:MM:SS.ffffff (hours 0 to 1000000, minutes 0 to 59"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "or whole microseconds")) << r.status();
  Trace micros = Abc();
  for (std::size_t i = 0; i < micros.events.size(); ++i) micros.events[i].time = absl::StrCat(1669783687404093 + i);
  o.sample_interval_s = 1e-6;
  r = Replay(micros, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples.size(), micros.events.size());
}

// A sample shows the state at its time, never an event after it; the last sample comes before the
// replay frees what the trace never freed; RMM times that wrap past midnight go on the next day.
TEST(ReplayTest, SamplesNeverShowTheFutureAndTheLastKeepsWhatTheTraceHeld) {
  Trace t = Make({{kAlloc, 0xa, 100 * kMiB}, {kFree, 0xa, 100 * kMiB}, {kAlloc, 0xb, 10 * kMiB}});
  t.events[0].time = "23:59:50.000000";
  t.events[1].time = "00:00:00.000000";  // ten seconds later, the next day
  t.events[2].time = "00:00:05.000000";
  ReplayOptions o;
  o.capacity = 1024 * kMiB;
  o.sample_interval_s = 1.0;
  absl::StatusOr<ReplayResult> r = Replay(t, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->samples.size(), 16u);  // 0..15 s
  EXPECT_EQ(r->samples[9].time_s, 9.0);
  EXPECT_EQ(r->samples[9].allocated_bytes, static_cast<std::int64_t>(100 * kMiB)) << "the free at 10 s is later";
  EXPECT_EQ(r->samples[10].allocated_bytes, 0);
  EXPECT_EQ(r->samples.back().time_s, 15.0);
  EXPECT_EQ(r->samples.back().allocated_bytes, static_cast<std::int64_t>(10 * kMiB)) << "never freed: still held";
}

// A trace's time span is not a loop count (issue 42): a 303-byte RMM trace whose second time has a
// huge minutes field kept the doctor busy for minutes, stepping a day at a time towards it. Such a
// time is refused naming its line; a time many days before the one it follows moves on by whole
// days at once; an interval that would give more samples than a timeline holds over the span is
// refused before the replay starts.
TEST(ReplayTest, ATracesTimeSpanIsNotALoopCount) {
  ReplayOptions o;
  o.capacity = 1024 * kMiB;
  o.sample_interval_s = 1.0;
  Trace huge = Make({{kAlloc, 0xa, kMiB}, {kAlloc, 0xb, kMiB}, {kFree, 0xa, kMiB}});
  huge.events[0].time = "00:00:00.000001";
  huge.events[1].time = absl::StrCat("00:00", std::string(200, '7'), ":00.000002");
  huge.events[1].line = 3;
  huge.events[2].time = "00:00:00.000003";
  absl::StatusOr<ReplayResult> r = Replay(huge, o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "line 3: time \"00:00777")) << r.status();
  for (const char* bad : {"00:60:00", "00:00:61.5", "1000001:00:00", "-1:00:00", "00:00:nan", "00:00:inf"}) {
    huge.events[1].time = bad;
    EXPECT_TRUE(absl::IsInvalidArgument(Replay(huge, o).status())) << bad;
  }
  for (double interval : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    o.sample_interval_s = interval;
    EXPECT_TRUE(absl::StrContains(Replay(Abc(), o).status().message(), "accepted: 0 (no timeline) or a number"))
        << interval;
  }
  // The largest hour, then midnight: the next event is the first midnight that is not more than 12 h
  // before it (41,667 days on: 1,000,008 h, 8 h after the first).
  Trace days = Make({{kAlloc, 0xa, kMiB}, {kFree, 0xa, kMiB}});
  days.events[0].time = "1000000:00:00.000000";
  days.events[1].time = "00:00:00.000000";
  o.sample_interval_s = 3600.0;
  r = Replay(days, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples.back().time_s, 8.0 * 3600.0);
  // 1,000,000 h at 1 s: 3.6e9 samples, refused before the replay.
  days.events[0].time = "00:00:00.000000";
  days.events[1].time = "1000000:00:00.000000";
  o.sample_interval_s = 1.0;
  r = Replay(days, o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "would have more than 1000000 samples; accepted: an interval of "
                                "at least 3600"))
      << r.status();
}

// The address space this process has mapped now (VmSize), 0 when /proc does not say.
std::size_t MappedBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  std::size_t kib = 0;
  while (status >> key) {
    if (key == "VmSize:" && status >> kib) return kib << 10;
  }
  return 0;
}

// Issue 27 item 7: a simulated device that cannot reserve its address space (as under `ulimit -v`)
// made bucketalloc's replay count every request as an OOM and then abort (a StatusOr's value of
// that error); pytorch-policy reported it. Every policy reports it now, the same way.
TEST(ReplayTest, ADeviceThatCannotBeMadeIsAnErrorForEveryPolicyNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory needs more address space than the limit leaves";
#else
  const std::size_t mapped = MappedBytes();
  if (mapped == 0) GTEST_SKIP() << "no /proc/self/status";
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  // 2 GiB more than is mapped: a replay device of 1 TiB (it reserves several times that) cannot be made.
  const rlim_t limit = mapped + (rlim_t{2} << 30);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < limit) GTEST_SKIP() << "the hard limit is lower already";
  rlimit lowered = saved;
  lowered.rlim_cur = limit;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  std::vector<std::pair<std::string, absl::Status>> got;
  for (const char* allocator :
       {"bucketalloc", "bucketalloc:backend:vmm", "pytorch-policy", "pytorch-expandable", "nocache"}) {
    ReplayOptions o;
    o.allocator = allocator;
    o.capacity = std::size_t{1} << 40;
    absl::StatusOr<ReplayResult> r = Replay(Abc(), o);
    got.emplace_back(allocator, r.status());
  }
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  for (const auto& [allocator, status] : got) {
    EXPECT_TRUE(absl::IsFailedPrecondition(status)) << allocator << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "the simulated replay device of 1024GiB cannot be made"))
        << allocator << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "accepted: a --capacity whose address space")) << status;
  }
#endif
}

}  // namespace
}  // namespace bucketalloc::harness
