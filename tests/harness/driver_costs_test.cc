// The driver calls' prices (src/harness/replay/driver_costs.cc) and their attribution to requests,
// the background, the warmup and the steady state (src/harness/replay/driver_meter.cc), alone, over
// the simulated device, and in replays of every policy.
#include "harness/replay/driver_costs.h"
#include "harness/replay/driver_meter.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/testing/sim_backend.h"
#include "harness/replay/policies.h"
#include "harness/replay/replay.h"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(DriverCostsTest, BuiltInProfilesPriceThePublishedFigures) {
  absl::StatusOr<CostModel> a100 = CostProfile("a100-published");
  ASSERT_TRUE(a100.ok()) << a100.status();
  EXPECT_EQ(a100->profile(), "a100-published");
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kCreate, 2 * kMiB), 193.32);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kMap, 2 * kMiB), 1.45);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kSetAccess, 2 * kMiB), 35.99);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kUnmap, 2 * kMiB), 25.63);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kAddressReserve, 8ull << 30), 19.0);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kMalloc, 2 * kMiB), 50.0);
  EXPECT_DOUBLE_EQ(a100->Price(DriverCall::kFree, 2 * kMiB), 10.0);
  EXPECT_EQ(CostModel().profile(), "a100-published") << "the default";
  absl::StatusOr<CostModel> gpu2 = CostProfile("gpu2-published");
  ASSERT_TRUE(gpu2.ok());
  EXPECT_DOUBLE_EQ(gpu2->Price(DriverCall::kCreate, 2 * kMiB), 7.58);
  EXPECT_DOUBLE_EQ(gpu2->Price(DriverCall::kSetAccess, 2 * kMiB), 20.78);
  absl::StatusOr<CostModel> flat = CostProfile("flat");
  ASSERT_TRUE(flat.ok());
  for (DriverCall call : {DriverCall::kCreate, DriverCall::kRelease, DriverCall::kMap, DriverCall::kSetAccess,
                          DriverCall::kUnmap, DriverCall::kAddressReserve, DriverCall::kAddressFree}) {
    EXPECT_DOUBLE_EQ(flat->Price(call, 64 * kMiB), 10.0) << DriverCallName(call);
  }
  EXPECT_DOUBLE_EQ(flat->Price(DriverCall::kSynchronize, 0), 0.0) << "the old model priced no stall";
  absl::StatusOr<CostModel> unknown = CostProfile("h100");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "a100-published, gpu2-published, flat"))
      << unknown.status();
}

// Every call with two points: 2 MiB at 10 us, 22 MiB at 30 us.
std::string TwoPointFile() {
  std::string calls;
  for (const char* call : {"cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess",
                           "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "synchronize"}) {
    absl::StrAppend(&calls, calls.empty() ? "" : ",", "\"", call,
                    "\": [{\"bytes\": 2097152, \"us\": 10, \"p99_us\": 12}, {\"bytes\": 23068672, \"us\": 30}]");
  }
  return absl::StrCat("{\"profile\": \"measured\", \"source\": \"a test\", \"calls\": {", calls, "}}");
}

TEST(DriverCostsTest, AFilesPricesAreInterpolatedBetweenItsSizesAndHeldOutsideThem) {
  absl::StatusOr<CostModel> c = ParseCostModel(TwoPointFile(), "test");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile(), "measured");
  EXPECT_DOUBLE_EQ(c->Price(DriverCall::kCreate, 2 * kMiB), 10.0);
  EXPECT_DOUBLE_EQ(c->Price(DriverCall::kCreate, 12 * kMiB), 20.0) << "halfway";
  EXPECT_DOUBLE_EQ(c->Price(DriverCall::kCreate, 22 * kMiB), 30.0);
  EXPECT_DOUBLE_EQ(c->Price(DriverCall::kCreate, 512), 10.0) << "below the smallest size: its price";
  EXPECT_DOUBLE_EQ(c->Price(DriverCall::kCreate, 1ull << 40), 30.0) << "above the largest: its price, per call";
  // Its JSON reads back the same.
  absl::StatusOr<CostModel> again = ParseCostModel(c->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->Price(DriverCall::kUnmap, 12 * kMiB), 20.0);
  // A file by path; a built-in name wins over nothing else.
  const std::string path = ::testing::TempDir() + "/driver_costs_test.json";
  std::ofstream(path) << TwoPointFile();
  absl::StatusOr<CostModel> loaded = LoadCostModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_DOUBLE_EQ(loaded->Price(DriverCall::kMap, 12 * kMiB), 20.0);
  std::remove(path.c_str());
  absl::StatusOr<CostModel> missing = LoadCostModel(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "or the path of a JSON cost file")) << missing.status();
}

TEST(DriverCostsTest, ABadFileIsRefusedNamingTheField) {
  const std::string good = TwoPointFile();
  struct Case {
    std::string json;
    const char* names;
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const Case cases[] = {
      {"[1, 2]", "not a JSON object"},
      {"{", "not JSON ([json.exception.parse_error.101] parse error at line 1, column 2"},
      {replaced("\"profile\": \"measured\"", "\"profile\": 3"), "\"profile\""},
      {replaced("\"source\"", "\"origin\""), "unknown key \"origin\""},
      {replaced("\"cudaFree\"", "\"cudaFreeAsync\""), "unknown call \"cudaFreeAsync\""},
      {replaced("\"synchronize\": [{\"bytes\": 2097152, \"us\": 10, \"p99_us\": 12}, {\"bytes\": 23068672, \"us\": "
                "30}]",
                "\"extra\": []"),
       "unknown call \"extra\""},
      {replaced("\"cuMemMap\": [{\"bytes\": 2097152, \"us\": 10", "\"cuMemMap\": [{\"bytes\": 2097152, \"us\": -1"),
       "calls.cuMemMap[0].us -1"},
      {replaced("\"cuMemMap\": [{\"bytes\": 2097152", "\"cuMemMap\": [{\"bytes\": 33554432"),
       "calls.cuMemMap[1].bytes 23068672 is not above"},
      {replaced("\"cuMemUnmap\": [{\"bytes\": 2097152", "\"cuMemUnmap\": [{\"bytes\": -5"),
       "calls.cuMemUnmap[0].bytes is missing or not an integer"},
      {replaced("\"cuMemCreate\": [{\"bytes\": 2097152, \"us\": 10,",
                "\"cuMemCreate\": [{\"bytes\": 2097152, \"ms\": 10,"),
       "calls.cuMemCreate[0] has unknown key \"ms\""},
      {replaced("\"cudaMalloc\": [", "\"cudaMalloc\": 5, \"cudaMallocAsync\": ["), "unknown call \"cudaMallocAsync\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CostModel> m = ParseCostModel(c.json, "costs.json");
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
    EXPECT_TRUE(absl::StrContains(m.status().message(), c.names)) << m.status() << " should name " << c.names;
    EXPECT_TRUE(absl::StartsWith(m.status().message(), "costs.json: ")) << m.status();
  }
  // A call left out.
  std::string without = good;
  const std::size_t at = without.find(",\"cuMemRelease\"");
  without.erase(at, without.find(",\"cuMemMap\"") - at);
  absl::StatusOr<CostModel> m = ParseCostModel(without, "costs.json");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "calls.cuMemRelease is missing")) << m.status();
}

TEST(DriverCostsTest, AnOverrideSetsEverySizeAndIsNamedInTheProfile) {
  CostModel c;
  ASSERT_TRUE(c.Override(DriverCall::kCreate, 5.0, "vmm-call-us").ok());
  EXPECT_DOUBLE_EQ(c.Price(DriverCall::kCreate, 2 * kMiB), 5.0);
  EXPECT_DOUBLE_EQ(c.Price(DriverCall::kCreate, 1ull << 30), 5.0);
  ASSERT_TRUE(c.Override(DriverCall::kMap, 5.0, "vmm-call-us").ok());
  EXPECT_EQ(c.profile(), "a100-published+vmm-call-us=5") << "named once";
  for (double bad : {-1.0, 2e6, std::numeric_limits<double>::quiet_NaN()}) {
    absl::Status s = c.Override(DriverCall::kFree, bad, "free-us");
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "free-us")) << s;
  }
  EXPECT_DOUBLE_EQ(c.Price(DriverCall::kFree, 2 * kMiB), 10.0) << "a refused price changes nothing";
}

TEST(DriverMeterTest, ACallInsideARequestIsOnItsPathAndOneOutsideIsBackground) {
  DriverMeter meter(*CostProfile("flat"));
  meter.Charge(DriverCall::kAddressReserve, 1ull << 30);  // construction: background
  meter.BeginRequest();
  meter.Charge(DriverCall::kMalloc, 2 * kMiB);
  EXPECT_TRUE(meter.EndRequest());
  meter.NoteReserved(2 * kMiB);
  meter.BeginRequest();
  EXPECT_FALSE(meter.EndRequest()) << "a hit calls nothing";
  // Another thread's call during a request is not the request's.
  meter.BeginRequest();
  std::thread([&] { meter.Charge(DriverCall::kCreate, 2 * kMiB); }).join();
  meter.Charge(DriverCall::kMalloc, 2 * kMiB);
  EXPECT_TRUE(meter.EndRequest());
  meter.NoteReserved(4 * kMiB);  // the peak: the warmup ends here
  meter.BeginRequest();
  meter.Charge(DriverCall::kFree, 2 * kMiB, /*synchronizes=*/true);
  EXPECT_TRUE(meter.EndRequest());
  meter.NoteReserved(2 * kMiB);
  meter.Stop();
  meter.Charge(DriverCall::kFree, 2 * kMiB, true);  // teardown: not counted
  const DriverTime t = meter.Summary();
  EXPECT_EQ(t.profile, "flat");
  EXPECT_DOUBLE_EQ(t.request_path_ms, (50 + 50 + 10) / 1000.0);
  EXPECT_DOUBLE_EQ(t.background_ms, (10 + 10) / 1000.0);
  EXPECT_DOUBLE_EQ(t.total_ms, t.request_path_ms + t.background_ms);
  EXPECT_DOUBLE_EQ(t.warmup_ms, (10 + 50 + 10 + 50) / 1000.0);
  EXPECT_NEAR(t.steady_ms, 10 / 1000.0, 1e-12);
  EXPECT_EQ(t.requests_calling_driver, 3u);
  EXPECT_DOUBLE_EQ(t.p99_request_us, 50.0);
  EXPECT_DOUBLE_EQ(t.max_request_us, 50.0);
  EXPECT_EQ(t.synchronizations, 1u);
  EXPECT_EQ(t.steady_synchronizations, 1u);
  const nlohmann::ordered_json j = t.ToJson();
  for (const char* key : {"profile", "total_ms", "request_path_ms", "background_ms", "warmup_ms", "steady_ms",
                          "p99_request_us", "synchronizations"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(DriverMeterTest, TheP99IsTheNearestRankOverRequestsThatCalledTheDriver) {
  DriverMeter meter(*CostProfile("flat"));
  for (int i = 0; i < 200; ++i) {
    meter.BeginRequest();
    meter.Charge(i < 197 ? DriverCall::kFree : DriverCall::kMalloc, 2 * kMiB);  // 197 x 10 us, 3 x 50 us
    meter.EndRequest();
  }
  EXPECT_DOUBLE_EQ(meter.Summary().p99_request_us, 50.0) << "rank 198 of 200 is a 50 us request";
  DriverMeter two(*CostProfile("flat"));
  for (int i = 0; i < 100; ++i) {
    two.BeginRequest();
    two.Charge(i == 0 ? DriverCall::kMalloc : DriverCall::kFree, 2 * kMiB);
    two.EndRequest();
  }
  EXPECT_DOUBLE_EQ(two.Summary().p99_request_us, 10.0) << "one slow request in 100 is above the 99th";
  EXPECT_DOUBLE_EQ(two.Summary().max_request_us, 50.0);
}

TEST(DriverMeterTest, TheMeteredBackendPricesEachCallBySizeAndPassesItThrough) {
  SimBackendOptions o;
  o.total_memory = 256 * kMiB;
  o.memory = SimMemoryMode::kUnbacked;
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  // Every call 10 us at 2 MiB and 30 us at 22 MiB: a price tells the size it was charged for.
  absl::StatusOr<CostModel> costs = ParseCostModel(TwoPointFile(), "test");
  ASSERT_TRUE(costs.ok()) << costs.status();
  DriverMeter meter(*costs);
  std::unique_ptr<Backend> b = MeterBackend(std::move(*sim), &meter);
  meter.BeginRequest();
  absl::StatusOr<std::uintptr_t> va = b->ReserveAddressRange(64 * kMiB, 0);  // 30 (above 22 MiB)
  ASSERT_TRUE(va.ok()) << va.status();
  std::vector<PhysicalPiece> pieces;
  for (std::size_t mib : {2, 4, 6}) {  // 10, 12, 14
    absl::StatusOr<PhysicalHandle> h = b->CreatePhysical(mib * kMiB);
    ASSERT_TRUE(h.ok()) << h.status();
    pieces.push_back({*h, mib * kMiB});
  }
  std::size_t mapped = 0;
  ASSERT_TRUE(b->MapRun(*va, pieces, &mapped).ok());  // maps 10 + 12 + 14, one grant over 12 MiB: 20
  EXPECT_EQ(mapped, 3u);
  ASSERT_TRUE(b->SynchronizeDevice().ok());    // 10 (size 0: the smallest's price)
  ASSERT_TRUE(b->Unmap(*va, 12 * kMiB).ok());  // 20
  for (const PhysicalPiece& p : pieces) ASSERT_TRUE(b->ReleasePhysical(p.handle).ok());  // 10 + 12 + 14
  absl::StatusOr<void*> p = b->Allocate(12 * kMiB);                                      // 20
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(b->Free(*p, 12 * kMiB).ok());  // 20
  ASSERT_TRUE(meter.EndRequest());
  const BackendCounters c = b->counters();
  EXPECT_EQ(c.physical_creates, 3);
  EXPECT_EQ(c.maps, 3);
  EXPECT_EQ(c.access_grants, 1) << "one grant for the run";
  const DriverTime t = meter.Summary();
  const double expected_us = 30 + 36 + 36 + 20 + 10 + 20 + 36 + 20 + 20;
  EXPECT_NEAR(t.request_path_ms, expected_us / 1000.0, 1e-9);
  EXPECT_EQ(t.synchronizations, 2u) << "the device synchronization and the cudaFree";
}

TEST(DriverMeterTest, ARequestWhoseCallsCostNothingStillCalledTheDriver) {
  CostModel c = *CostProfile("flat");
  ASSERT_TRUE(c.Override(DriverCall::kMalloc, 0.0, "malloc-us").ok());
  DriverMeter meter(c);
  meter.BeginRequest();
  meter.Charge(DriverCall::kMalloc, 2 * kMiB);
  EXPECT_TRUE(meter.EndRequest()) << "a call priced at 0 is still a call";
  EXPECT_EQ(meter.Summary().requests_calling_driver, 1u);
}

ReplayResult ReplayOf(const Trace& t, const std::string& allocator, std::size_t capacity, const CostModel& costs) {
  ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.cost = costs;
  absl::StatusOr<ReplayResult> r = Replay(t, o);
  EXPECT_TRUE(r.ok()) << allocator << ": " << r.status();
  return r.ok() ? *r : ReplayResult{};
}

Trace Events(std::initializer_list<std::tuple<TraceAction, std::uint64_t, std::size_t>> events) {
  Trace t;
  for (const auto& [action, pointer, size] : events) t.events.push_back({1, "", action, pointer, size, 0, 0});
  return t;
}

TEST(DriverMeterTest, AReplayAttributesEveryPoliciesCallsToItsRequests) {
  constexpr TraceAction kAlloc = TraceAction::kAllocate;
  constexpr TraceAction kFree = TraceAction::kFree;
  const Trace t = Events({{kAlloc, 0xa, 10 * kMiB},
                          {kAlloc, 0xb, 20 * kMiB},
                          {kFree, 0xa, 10 * kMiB},
                          {kAlloc, 0xc, 5 * kMiB},
                          {kFree, 0xb, 20 * kMiB},
                          {kFree, 0xc, 5 * kMiB}});
  const CostModel a100 = *CostProfile("a100-published");
  // nocache: a cudaMalloc per allocation and a cudaFree (a synchronization) per free, all waited for.
  ReplayResult r = ReplayOf(t, "nocache", 64 * kMiB, a100);
  EXPECT_DOUBLE_EQ(r.driver_time.request_path_ms, (3 * 50.0 + 3 * 10.0) / 1000.0);
  EXPECT_DOUBLE_EQ(r.driver_time.background_ms, 0.0);
  EXPECT_DOUBLE_EQ(r.simulated_backend_ms, r.driver_time.total_ms);
  EXPECT_EQ(r.driver_time.synchronizations, 3u);
  EXPECT_EQ(r.driver_time.requests_calling_driver, 6u);
  EXPECT_EQ(r.driver_time.profile, "a100-published");
  // The warmup ends after the second allocation (30 MiB reserved, the peak): two cudaMallocs.
  EXPECT_DOUBLE_EQ(r.driver_time.warmup_ms, 100.0 / 1000.0);
  EXPECT_EQ(r.driver_time.steady_synchronizations, 3u);
  // Stitching pays a create per granule of new memory, on the request's path.
  ReplayResult vmm = ReplayOf(t, "bucketalloc:backend:vmm", 64 * kMiB, a100);
  EXPECT_GT(vmm.backend_counters.physical_creates, 0);
  EXPECT_GE(vmm.driver_time.request_path_ms,
            static_cast<double>(vmm.backend_counters.physical_creates) * 193.32 / 1000.0 - 1e-9);
  EXPECT_DOUBLE_EQ(vmm.driver_time.background_ms, 0.0) << "no thread of its own: every call is a request's";
  EXPECT_EQ(nlohmann::json::parse(vmm.ToJson())["driver_time"]["profile"], "a100-published");
  // Every policy has the figures, in its JSON too.
  for (const char* allocator : {"bucketalloc", "pytorch-policy", "pytorch-expandable"}) {
    ReplayResult p = ReplayOf(t, allocator, 64 * kMiB, a100);
    EXPECT_GT(p.driver_time.total_ms, 0.0) << allocator;
    const nlohmann::json j = nlohmann::json::parse(p.ToJson());
    for (const char* key : {"profile", "total_ms", "request_path_ms", "background_ms", "warmup_ms", "steady_ms",
                            "p99_request_us", "synchronizations"}) {
      EXPECT_TRUE(j["driver_time"].contains(key)) << allocator << " " << key;
    }
  }
}

TEST(DriverMeterTest, LargerGrowPiecesTakeCreatesOffTheRequestsPath) {
  constexpr TraceAction kAlloc = TraceAction::kAllocate;
  constexpr TraceAction kFree = TraceAction::kFree;
  // 120 MiB and 40 MiB live on a 1 GiB card, far from its cap: 80 granules, or 8 pieces of 20 MiB.
  const Trace t =
      Events({{kAlloc, 0x1, 120 * kMiB}, {kAlloc, 0x2, 40 * kMiB}, {kFree, 0x1, 120 * kMiB}, {kFree, 0x2, 40 * kMiB}});
  const CostModel a100 = *CostProfile("a100-published");
  ReplayResult granules = ReplayOf(t, "bucketalloc:backend:vmm", 1024 * kMiB, a100);
  ReplayResult pieces = ReplayOf(t, "bucketalloc:backend:vmm,grow_piece_mb:20", 1024 * kMiB, a100);
  EXPECT_EQ(granules.backend_counters.physical_creates, 80);
  EXPECT_EQ(pieces.backend_counters.physical_creates, 8);
  EXPECT_LT(pieces.driver_time.request_path_ms, granules.driver_time.request_path_ms - 70 * 0.19)
      << "72 creates fewer, at 193 us each";
  EXPECT_EQ(pieces.peak_reserved_bytes, granules.peak_reserved_bytes) << "away from the cap: the same memory";
}

// reserve_ahead_mb: the time between events (the trace's Time column, whole microseconds here)
// pays for creates of spares outside every request, and a grow maps them instead of creating.
TEST(DriverMeterTest, AReserveAheadCreatesInTheGapsAndTakesCreatesOffTheRequestsPath) {
  constexpr TraceAction kAlloc = TraceAction::kAllocate;
  constexpr TraceAction kFree = TraceAction::kFree;
  // 40 MiB at t = 0, then 1 ms later (5 creates at 193 us) 8 MiB, then 100 ms later 32 MiB.
  Trace t;
  const std::pair<const char*, std::tuple<TraceAction, std::uint64_t, std::size_t>> timed[] = {
      {"0", {kAlloc, 0x1, 40 * kMiB}},     {"1000", {kAlloc, 0x2, 8 * kMiB}},  {"101000", {kAlloc, 0x3, 32 * kMiB}},
      {"101001", {kFree, 0x1, 40 * kMiB}}, {"101002", {kFree, 0x2, 8 * kMiB}}, {"101003", {kFree, 0x3, 32 * kMiB}}};
  for (const auto& [time, event] : timed) {
    const auto& [action, pointer, size] = event;
    t.events.push_back({1, time, action, pointer, size, 0, 0});
  }
  const CostModel a100 = *CostProfile("a100-published");
  ReplayResult plain = ReplayOf(t, "bucketalloc:backend:vmm", 1024 * kMiB, a100);
  ReplayResult ahead = ReplayOf(t, "bucketalloc:backend:vmm,reserve_ahead_mb:32", 1024 * kMiB, a100);
  EXPECT_EQ(plain.backend_counters.physical_creates, 40);
  EXPECT_DOUBLE_EQ(plain.driver_time.background_ms, 0.0);
  // After the first event, 1 ms pays for 5 granules (10 MiB): the 8 MiB request maps 4 of them and
  // creates none; after it, 100 ms pay for the 15 the 32 MiB target lacks; the 32 MiB request maps
  // 16 spares; the 1 us gaps after it pay for nothing. The same 40 creates, 20 of them in the gaps.
  EXPECT_EQ(ahead.backend_counters.physical_creates, 40);
  const double create_ms = a100.Price(DriverCall::kCreate, 2 * kMiB) / 1000.0;
  EXPECT_NEAR(ahead.driver_time.request_path_ms, plain.driver_time.request_path_ms - 20 * create_ms, 1e-9)
      << "the 20 creates of the two later requests left their path";
  EXPECT_NEAR(ahead.driver_time.background_ms, 20 * create_ms, 1e-9);
  EXPECT_EQ(ahead.ooms, 0u);
  // Without times the gaps are unknown: refused naming why; without virtual memory, refused too.
  ReplayOptions o;
  o.allocator = "bucketalloc:backend:vmm,reserve_ahead_mb:32";
  o.capacity = 1024 * kMiB;
  absl::StatusOr<ReplayResult> untimed = Replay(Events({{kAlloc, 0x1, 4 * kMiB}}), o);
  ASSERT_FALSE(untimed.ok());
  EXPECT_TRUE(absl::StrContains(untimed.status().message(), "reserve_ahead_mb")) << untimed.status();
  EXPECT_TRUE(absl::StrContains(untimed.status().message(), "accepted: HH:MM:SS.ffffff")) << untimed.status();
  o.allocator = "bucketalloc:reserve_ahead_mb:32";
  absl::StatusOr<ReplayResult> plain_segments = Replay(t, o);
  ASSERT_FALSE(plain_segments.ok());
  EXPECT_TRUE(absl::StrContains(plain_segments.status().message(), "accepted with backend:vmm"))
      << plain_segments.status();
  o.allocator = "bucketalloc:backend:vmm,reserve_ahead_mb:0";
  absl::StatusOr<ReplayResult> zero = Replay(t, o);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(absl::StrContains(zero.status().message(), "accepted: a whole number of MiB from 1")) << zero.status();
}

TEST(DriverMeterTest, ExpandableSegmentsSynchronizeBeforeGivingPagesBack) {
  constexpr TraceAction kAlloc = TraceAction::kAllocate;
  constexpr TraceAction kFree = TraceAction::kFree;
  // 40 MiB (two 20 MiB pages) and 20 MiB live on a 64 MiB card, the first freed, then 42 MiB: three
  // pages more do not fit, so the free block's two whole pages go back (PyTorch's unmapHandles
  // synchronizes the stream first) before the allocation is tried again.
  const Trace t =
      Events({{kAlloc, 0x1, 40 * kMiB}, {kAlloc, 0x2, 20 * kMiB}, {kFree, 0x1, 40 * kMiB}, {kAlloc, 0x3, 42 * kMiB}});
  ReplayResult r = ReplayOf(t, "pytorch-expandable", 64 * kMiB, *CostProfile("a100-published"));
  EXPECT_EQ(r.backend_counters.unmaps, 2);
  EXPECT_EQ(r.driver_time.synchronizations, 1u) << "an unmap of memory a stream may still use waits for it";
}

}  // namespace
}  // namespace bucketalloc::harness
