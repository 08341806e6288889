// The tuner (src/harness/planning/tuner.cc).
// TunerSearchTest (the unsanitized build only: tests/CMakeLists.txt says why): its answers on
// generated serving traces of each KV layout (tiered: the trace's own tiers found, tried, and better
// than the default; growth: no tiers; paged: within noise of the default), on the vendored GPU
// trace, on held-out data of its own and of another shape (the veto), on one thread and on two.
// TunerTest (every build): bad input, the split of a trace, a snapshot's history, and one whole
// search of a small workload.
#include "harness/planning/tuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bucketalloc/options.h"
#include "bucketalloc/units.h"
#include "harness/replay/importers.h"
#include "harness/replay/policies.h"
#include "harness/replay/snapshot_import.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"
#include "harness/workload/serving.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

std::string Data(const std::string& path) { return std::string(BUCKETALLOC_SOURCE_DIR) + "/data/" + path; }

struct Generated {
  ServingTrace trace;
  std::string tiers_conf;  // TieredBucketallocConf: the trace's own tiers (tiered only)
};

// The first `n` requests of the vendored Azure conversation trace on Llama-3.1-8B, in `layout`.
Generated Serving(KvLayout layout, int n = 60) {
  absl::StatusOr<ModelSpec> m = ReadModelConfig(Data("models/Llama-3.1-8B-Instruct.config.json"));
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RequestSet> r = ReadRequestsFile(Data("requests/azure_llm_inference_trace_2023_conv.csv"), {});
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<Request> requests(r->requests.begin(),
                                r->requests.begin() + std::min<std::size_t>(n, r->requests.size()));
  ServingOptions o;
  o.kv_layout = layout;
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(requests, *m, o);
  EXPECT_TRUE(t.ok()) << t.status();
  return {*t, TieredBucketallocConf(*t, *m, o)};
}

TuneResult MustTune(const Trace& trace, TuneOptions o = {}) {
  o.jobs = 2;
  absl::StatusOr<TuneResult> r = Tune(trace, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TuneResult{};
}

const TunePoint& Recommended(const TuneResult& r) { return r.points[r.bucketalloc.point]; }
const TunePoint& Default(const TuneResult& r) { return r.points[r.bucketalloc.default_point]; }

// Every recommendation is an allocator string the replay takes as it is, and no worse than its
// family's default on the held-out part.
void ExpectUsableAndNoWorse(const TuneResult& r) {
  for (const TuneChoice* c : {&r.bucketalloc, &r.pytorch}) {
    const TunePoint& p = r.points[c->point];
    const TunePoint& d = r.points[c->default_point];
    EXPECT_TRUE(MakeReplayAllocator(p.allocator, 64 << 20).ok()) << p.allocator;
    ASSERT_TRUE(p.held_out.has_value() && d.held_out.has_value()) << p.allocator;
    const std::size_t tolerance =
        c == &r.bucketalloc ? ReplayCapacity(static_cast<std::size_t>(0.002 * r.held_out_peak_live_bytes)) : 0;
    EXPECT_LE(p.held_out->min_capacity_bytes, d.held_out->min_capacity_bytes + tolerance) << p.allocator;
  }
  const nlohmann::json j = nlohmann::json::parse(r.ToJson());
  EXPECT_EQ(j["recommended"]["bucketalloc"], r.points[r.bucketalloc.point].allocator);
  EXPECT_EQ(j["recommended"]["pytorch"], r.points[r.pytorch.point].allocator);
  EXPECT_FALSE(j["front"].empty());
  // The front: exactly the measured points that no other beats in memory, driver time on requests'
  // path and synchronizations at once.
  auto axes = [](const TuneFigures& f) {
    return std::array<double, 3>{static_cast<double>(f.min_capacity_bytes), f.driver_time.request_path_ms,
                                 static_cast<double>(f.driver_time.synchronizations)};
  };
  for (const TunePoint& p : r.points) {
    if (!p.tune.has_value()) continue;
    bool dominated = false;
    for (const TunePoint& q : r.points) {
      if (&q == &p || !q.tune.has_value()) continue;
      const auto a = axes(*q.tune), b = axes(*p.tune);
      dominated =
          dominated || (a[0] <= b[0] && a[1] <= b[1] && a[2] <= b[2] && (a[0] < b[0] || a[1] < b[1] || a[2] < b[2]));
    }
    EXPECT_EQ(p.on_front, !dominated) << p.allocator << ": " << TuneFiguresText(p.tune);
  }
}

TEST(TunerSearchTest, ATieredTraceGetsItsOwnTiers) {
  const Generated g = Serving(KvLayout::kTiered, 150);  // enough requests for the K/V tiers to recur most
  ASSERT_FALSE(g.tiers_conf.empty());
  absl::StatusOr<Options> own = ParseOptions(absl::StripPrefix(g.tiers_conf, "bucketalloc:"));
  ASSERT_TRUE(own.ok()) << own.status();
  std::vector<std::size_t> tiers;
  for (std::uint64_t tokens : own->tiers_tokens) tiers.push_back(tokens * own->bytes_per_token);
  const TraceShape shape = ReadShape(g.trace.trace);
  ASSERT_FALSE(shape.tier_sizes.empty());
  // Every size found is one of the trace's K/V tiers (tokens x one layer's K bytes per token), and
  // the quantum is a whole number of tokens' bytes.
  const std::size_t per_token = own->bytes_per_token;
  for (std::size_t size : shape.tier_sizes) {
    EXPECT_TRUE(std::find(tiers.begin(), tiers.end(), size) != tiers.end()) << size;
  }
  EXPECT_EQ(shape.quantum_bytes % per_token, 0u);
  const TuneResult r = MustTune(g.trace.trace);
  // The tiers were a candidate, and beat the default on the tuning part (or were pruned by a better
  // point); the recommendation is whatever needs least.
  auto tiered = std::find_if(r.points.begin(), r.points.end(),
                             [](const TunePoint& p) { return p.allocator.rfind("bucketalloc:tiers:[", 0) == 0; });
  ASSERT_NE(tiered, r.points.end());
  ASSERT_TRUE(tiered->state == "measured" || tiered->state == "pruned") << tiered->state;
  if (tiered->tune.has_value()) {
    EXPECT_LT(tiered->tune->min_capacity_bytes, Default(r).tune->min_capacity_bytes);
  }
  const TunePoint& p = Recommended(r);
  ASSERT_TRUE(p.tune.has_value());
  EXPECT_LT(p.tune->min_capacity_bytes, Default(r).tune->min_capacity_bytes);
  ExpectUsableAndNoWorse(r);
}

TEST(TunerSearchTest, AGrowthTraceGetsNoTiers) {
  const Generated g = Serving(KvLayout::kGrowth);
  const TuneResult r = MustTune(g.trace.trace);
  EXPECT_FALSE(absl::StrContains(Recommended(r).allocator, "tiers")) << Recommended(r).allocator;
  ExpectUsableAndNoWorse(r);
}

TEST(TunerSearchTest, APagedTraceStaysWithinNoiseOfTheDefault) {
  const Generated g = Serving(KvLayout::kPaged);
  const TuneResult r = MustTune(g.trace.trace);
  const TunePoint& p = Recommended(r);
  const TunePoint& d = Default(r);
  ASSERT_TRUE(p.held_out.has_value() && d.held_out.has_value());
  const double live = static_cast<double>(r.held_out_peak_live_bytes);
  EXPECT_LE(std::abs(static_cast<double>(p.held_out->min_capacity_bytes) -
                     static_cast<double>(d.held_out->min_capacity_bytes)) /
                live,
            0.02);  // the layout leaves little to gain: one pool, one tensor per layer
  ExpectUsableAndNoWorse(r);
}

TEST(TunerSearchTest, TheVendoredGpuTraceIsTuned) {
  absl::StatusOr<Trace> t = ReadRecording(Data("traces/hta_kineto_trace_v100_rank1_profile_memory.json.gz"));
  ASSERT_TRUE(t.ok()) << t.status();
  TuneOptions o;
  o.capacity = std::size_t{16} << 30;
  const TuneResult r = MustTune(*t, o);
  EXPECT_TRUE(r.bucketalloc.ooms.has_value());
  ExpectUsableAndNoWorse(r);
}

TEST(TunerSearchTest, AValidationTraceIsTheHeldOutPart) {
  const Generated a = Serving(KvLayout::kTiered, 40);
  TuneOptions o;
  o.validate = Serving(KvLayout::kTiered, 60).trace.trace;
  o.validate_name = "another recording";
  const TuneResult r = MustTune(a.trace.trace, o);
  EXPECT_EQ(r.held_out_name, "another recording");
  EXPECT_EQ(r.tune_peak_live_bytes, PeakLiveBytes(a.trace.trace));
  EXPECT_EQ(r.held_out_peak_live_bytes, PeakLiveBytes(*o.validate));
  ExpectUsableAndNoWorse(r);
}

// The same answer on one thread as on two: every point's state and figures, both choices.
TEST(TunerSearchTest, TheAnswerDoesNotDependOnTheThreads) {
  const Generated g = Serving(KvLayout::kGrowth, 40);
  TuneOptions one;
  one.jobs = 1;
  absl::StatusOr<TuneResult> a = Tune(g.trace.trace, one);
  ASSERT_TRUE(a.ok()) << a.status();
  const TuneResult b = MustTune(g.trace.trace);  // two threads
  ASSERT_EQ(a->points.size(), b.points.size());
  for (std::size_t i = 0; i < b.points.size(); ++i) {
    EXPECT_EQ(a->points[i].allocator, b.points[i].allocator);
    EXPECT_EQ(a->points[i].state, b.points[i].state) << b.points[i].allocator;
    EXPECT_EQ(a->points[i].tune.has_value(), b.points[i].tune.has_value()) << b.points[i].allocator;
    if (a->points[i].tune.has_value() && b.points[i].tune.has_value()) {
      EXPECT_EQ(a->points[i].tune->min_capacity_bytes, b.points[i].tune->min_capacity_bytes);
      EXPECT_EQ(a->points[i].tune->backend_calls, b.points[i].tune->backend_calls);
    }
  }
  EXPECT_EQ(a->bucketalloc.point, b.bucketalloc.point);
  EXPECT_EQ(a->pytorch.point, b.pytorch.point);
}

// Held-out data of another shape (tuned on a tiered trace, checked on the growth trace of the same
// requests): whatever was best on the tuning part is recommended only if the held-out data does not
// veto it, and every candidate ranked above the choice and checked there was worse than the bar.
TEST(TunerSearchTest, TheHeldOutPartVetoesWhatItDoesNotConfirm) {
  const Generated tiered = Serving(KvLayout::kTiered, 150);
  TuneOptions o;
  o.validate = Serving(KvLayout::kGrowth, 150).trace.trace;
  const TuneResult r = MustTune(tiered.trace.trace, o);
  const double tolerance = 0.002 * static_cast<double>(r.held_out_peak_live_bytes);
  std::size_t bar = SIZE_MAX;
  for (const char* b : {"bucketalloc", "bucketalloc:backend:vmm"}) {
    for (const TunePoint& p : r.points) {
      if (p.allocator == b && p.held_out.has_value()) bar = std::min(bar, p.held_out->min_capacity_bytes);
    }
  }
  ASSERT_NE(bar, SIZE_MAX);
  const TunePoint& chosen = Recommended(r);
  ASSERT_TRUE(chosen.held_out.has_value());
  EXPECT_LE(static_cast<double>(chosen.held_out->min_capacity_bytes), static_cast<double>(bar) + tolerance);
  int vetoed = 0;
  for (const TunePoint& p : r.points) {
    if (p.pytorch || !p.tune.has_value() || !p.held_out.has_value() || &p == &chosen) continue;
    const bool above = std::make_pair(p.tune->min_capacity_bytes, p.tune->backend_ms) <
                       std::make_pair(chosen.tune->min_capacity_bytes, chosen.tune->backend_ms);
    if (!above) continue;
    EXPECT_GT(static_cast<double>(p.held_out->min_capacity_bytes), static_cast<double>(bar) + tolerance)
        << p.allocator << " was ranked above " << chosen.allocator << " and held up";
    ++vetoed;
  }
  EXPECT_GT(vetoed, 0) << "the tiers that suit the tiered part should not hold up on the growth part: "
                       << chosen.allocator << ": " << r.bucketalloc.why;
  EXPECT_TRUE(absl::StrContains(r.bucketalloc.why, "were worse there")) << r.bucketalloc.why;
}

// One whole search on a small workload (every sanitizer build runs it): screens, pruning,
// combination, the held-out check, the choices, the JSON and the page.
TEST(TunerTest, ASmallWorkloadEndToEnd) {
  const Generated g = Serving(KvLayout::kGrowth, 12);
  TuneOptions o;
  o.capacity = std::size_t{20} << 30;
  const TuneResult r = MustTune(g.trace.trace, o);
  ASSERT_GE(r.bucketalloc.point, 0);
  ASSERT_GE(r.pytorch.point, 0);
  EXPECT_TRUE(r.bucketalloc.ooms.has_value());
  ExpectUsableAndNoWorse(r);
  const std::string html = r.ToHtml("small.csv");
  EXPECT_TRUE(absl::StrContains(html, "<svg class=\"chart front\"")) << html.substr(0, 300);
  EXPECT_TRUE(absl::StrContains(html, "BUCKETALLOC_CONF="));
}

TEST(TunerTest, TheHeldOutHalfStartsFromTheBlocksLiveAtTheMidpoint) {
  Trace t;
  auto add = [&](TraceAction a, std::uint64_t p, std::uint64_t size) {
    t.events.push_back({1, "0", a, p, size, 0, 0});
  };
  add(TraceAction::kAllocate, 0x1000, 4 << 20);
  add(TraceAction::kAllocate, 0x2000, 8 << 20);
  add(TraceAction::kFree, 0x1000, 4 << 20);
  add(TraceAction::kAllocate, 0x3000, 2 << 20);  // the midpoint: 0x2000 and 0x3000 live before it
  add(TraceAction::kFree, 0x2000, 8 << 20);
  add(TraceAction::kAllocate, 0x4000, 16 << 20);
  add(TraceAction::kFree, 0x3000, 2 << 20);
  add(TraceAction::kFree, 0x4000, 16 << 20);
  const TraceParts parts = SplitTrace(t);
  ASSERT_EQ(parts.tune.events.size(), 4u);
  ASSERT_EQ(parts.held_out.events.size(), 6u);
  EXPECT_EQ(parts.held_out.events[0].pointer, 0x2000u);
  EXPECT_EQ(parts.held_out.events[1].pointer, 0x3000u);
  EXPECT_EQ(parts.held_out.events[2].action, TraceAction::kFree);
  EXPECT_EQ(PeakLiveBytes(parts.held_out), (2u + 16u) << 20);
}

TEST(TunerTest, BadInputIsAClearError) {
  absl::StatusOr<TuneResult> empty = Tune(Trace{}, {});
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(empty.status()));
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "has no allocations")) << empty.status();
  Trace small;
  for (std::uint64_t i = 0; i < 100; ++i)
    small.events.push_back({1, "0", TraceAction::kAllocate, 0x1000 + i * 4096, 4096, 0, 0});
  absl::StatusOr<TuneResult> only_small = Tune(small, {});
  ASSERT_FALSE(only_small.ok());
  EXPECT_TRUE(absl::StrContains(only_small.status().message(), "no allocation above 1 MiB")) << only_small.status();
  TuneOptions o;
  o.budget_s = 1e-9;
  absl::StatusOr<TuneResult> no_time = Tune(Serving(KvLayout::kTiered, 50).trace.trace, o);
  ASSERT_FALSE(no_time.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(no_time.status()));
  EXPECT_TRUE(absl::StrContains(no_time.status().message(), "--budget-s")) << no_time.status();
  // A NaN budget is no budget to keep (issue 42 item 8: it was read as none), nor is a negative one.
  for (double bad : {std::nan(""), -1.0, 2e7}) {
    o.budget_s = bad;
    absl::StatusOr<TuneResult> r = Tune(Serving(KvLayout::kTiered, 50).trace.trace, o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "accepted: 0 (none) to 10000000 seconds")) << r.status();
  }
}

TEST(TunerTest, ASnapshotsHistoryIsReadAsATrace) {
  nlohmann::json s = nlohmann::json::parse(R"({"segments": [], "device_traces": [[
      {"action": "alloc", "addr": 4096, "size": 2097152, "time_us": 1, "stream": 0},
      {"action": "free_requested", "addr": 4096, "size": 2097152, "time_us": 2},
      {"action": "free_completed", "addr": 4096, "size": 2097152, "time_us": 3},
      {"action": "free_completed", "addr": 8192, "size": 512, "time_us": 4}]]})");
  absl::StatusOr<SnapshotContents> c = ReadSnapshot(s, "s.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->history.has_value());
  const std::vector<TraceEvent>& events = c->history->events;
  ASSERT_EQ(events.size(), 2u);  // the free of a block it never allocated is dropped
  EXPECT_EQ(events[0].action, TraceAction::kAllocate);
  EXPECT_EQ(events[1].action, TraceAction::kFree);
  EXPECT_EQ(events[1].time, "3");
  s["device_traces"][0][0].erase("size");
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSnapshot(s, "s.json").status()));
}

}  // namespace
}  // namespace bucketalloc::harness
