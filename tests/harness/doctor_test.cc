// The doctor (src/harness/operations/doctor.cc) on timelines generated to show each pattern of the runbook:
// each gets the verdict it was made to show, with its evidence, lever and span; a healthy one gets
// only "healthy"; the peaks of a repeat's rounds settle or rise; the JSON and HTML carry it all.
#include "harness/operations/doctor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// 201 samples over 1000 s of a 100 GiB card: f(t) -> {reserved, allocated} in GiB; each OOM
// listed in its sample and counted in the totals from then on.
std::vector<TimelineSample> Generate(const std::function<std::pair<double, double>(double)>& f,
                                     std::vector<OomEvent> ooms = {}, double capacity_gib = 100) {
  std::vector<TimelineSample> out;
  for (int i = 0; i <= 200; ++i) {
    const double t = 5.0 * i;
    const auto [r, a] = f(t);
    TimelineSample s;
    s.time_s = t;
    s.capacity_bytes = static_cast<std::int64_t>(capacity_gib * kGiB);
    s.reserved_bytes = static_cast<std::int64_t>(r * kGiB);
    s.allocated_bytes = s.active_bytes = static_cast<std::int64_t>(a * kGiB);
    s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
    for (const OomEvent& e : ooms) {
      if (e.time_s > t - 5.0 && e.time_s <= t) s.ooms.push_back(e);
      if (e.time_s <= t) ++s.ooms_total[static_cast<int>(e.cause)];
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> Names(const std::vector<Verdict>& v) {
  std::vector<std::string> names;
  for (const Verdict& x : v) names.push_back(std::string(FindingName(x.verdict)));
  return names;
}
bool Has(const std::vector<Verdict>& v, const std::string& name) {
  const std::vector<std::string> n = Names(v);
  return std::find(n.begin(), n.end(), name) != n.end();
}
const Verdict& Get(const std::vector<Verdict>& v, const std::string& name) {
  return *std::find_if(v.begin(), v.end(), [&](const Verdict& x) { return FindingName(x.verdict) == name; });
}
std::string Joined(const std::vector<Verdict>& v) {
  std::string s;
  for (const Verdict& x : v) absl::StrAppend(&s, FindingName(x.verdict), ": ", x.evidence, "\n");
  return s;
}
double Tri(double t, double period) {  // 0..1..0
  const double x = std::fmod(t, period) / period;
  return x < 0.5 ? 2 * x : 2 - 2 * x;
}

TEST(DoctorTest, FullAtStart) {
  const auto v = Diagnose(Generate(
                              [](double) {
                                return std::pair{95.0, 90.0};
                              },
                              {OomEvent{1, 500.0, std::size_t{8} << 30, OomCause::kCapacity}}),
                          0);
  ASSERT_TRUE(Has(v, "full_at_start")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "full_at_start").evidence, "95% of the 100.00 GiB cap")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "full_at_start").evidence, "1 capacity OOMs")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "full_at_start").lever, "parallelism"));
  EXPECT_FALSE(Has(v, "healthy"));
  // Near the cap from the start but never short of memory (a preallocated KV cache): healthy, said.
  const auto calm = Diagnose(Generate([](double) { return std::pair{92.0, 90.0}; }), 0);
  ASSERT_EQ(Names(calm), std::vector<std::string>{"healthy"}) << Joined(calm);
  EXPECT_TRUE(absl::StrContains(calm[0].evidence, "never short of memory")) << Joined(calm);
}

TEST(DoctorTest, OomsTheDeviceRefusedAreMemoryUsedElsewhere) {
  const auto v = Diagnose(Generate(
                              [](double) {
                                return std::pair{50.0, 45.0};
                              },
                              {OomEvent{1, 200.0, 1 << 30, OomCause::kDeviceExhausted}}),
                          0);
  ASSERT_TRUE(Has(v, "full_at_start")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "full_at_start").evidence, "used outside this allocator")) << Joined(v);
  const auto held = Diagnose(Generate(
                                 [](double) {
                                   return std::pair{50.0, 45.0};
                                 },
                                 {OomEvent{1, 200.0, 1 << 30, OomCause::kCacheHeld}}),
                             0);
  ASSERT_TRUE(Has(held, "cache_held")) << Joined(held);
}

TEST(DoctorTest, ALeakIsLiveMemoryThatNeverFalls) {
  const auto v = Diagnose(Generate([](double t) {
                            if (t >= 1000) return std::pair{2.0, 0.0};        // teardown at the end
                            const double a = 20 + 0.05 * t + 2 * Tri(t, 40);  // jitter, rising troughs
                            return std::pair{a + 2, a};
                          }),
                          0);
  ASSERT_TRUE(Has(v, "leak")) << "a teardown line at the end does not hide it: " << Joined(v);
  EXPECT_FALSE(Has(v, "climbs_capacity")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "leak").lever, "find the leak"));
}

TEST(DoctorTest, ClimbingWithTrafficIsCapacityWhenLiveMemoryFallsBack) {
  double peak = 0;
  const auto v = Diagnose(Generate([&](double t) {
                            const double a = 10 + (5 + 0.06 * t) * Tri(t, 50);  // bursts that grow
                            peak = std::max(peak, a + 1);                       // the cache keeps the peak
                            return std::pair{peak, a};
                          }),
                          0);
  ASSERT_TRUE(Has(v, "climbs_capacity")) << Joined(v);
  EXPECT_FALSE(Has(v, "leak")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "climbs_capacity").lever, "cap the queue"));
}

TEST(DoctorTest, ASpikeOfLiveMemoryIsALongRequest) {
  const auto v = Diagnose(Generate([](double t) {
                            if (t < 600) return std::pair{30.0, 25.0};
                            if (t < 800) return std::pair{60.0, 55.0};  // the long request, then it ends
                            return std::pair{60.0, 25.0};
                          }),
                          0);
  ASSERT_TRUE(Has(v, "spike_long_request")) << Joined(v);
  const Verdict& s = Get(v, "spike_long_request");
  EXPECT_EQ(s.from_s, 595.0);
  EXPECT_EQ(s.to_s, 600.0);
  EXPECT_FALSE(Has(v, "fragmentation")) << Joined(v);
  EXPECT_FALSE(Has(v, "climbs_capacity")) << "one step is a jump, not a climb: " << Joined(v);
}

TEST(DoctorTest, AJumpThatStaysIsASpikeNotALeak) {
  const auto v = Diagnose(Generate([](double t) {
                            return t < 600 ? std::pair{30.0, 25.0} : std::pair{62.0, 57.0};
                          }),
                          0);
  ASSERT_TRUE(Has(v, "spike_long_request")) << Joined(v);
  EXPECT_FALSE(Has(v, "leak")) << "one step is not a rise that never stops: " << Joined(v);
  // Two steps that each make half the rise, the rest flat: not a leak either (few rising steps).
  const auto two =
      Diagnose(Generate([](double t) {
                 return std::pair{20.0 + (t >= 300) * 10 + (t >= 700) * 10, 15.0 + (t >= 300) * 10 + (t >= 700) * 10};
               }),
               0);
  EXPECT_FALSE(Has(two, "leak")) << Joined(two);
}

TEST(DoctorTest, AJumpOfReservedMemoryThatLiveMemoryDoesNotExplainIsFragmentation) {
  const auto v = Diagnose(Generate([](double t) {
                            return t < 600 ? std::pair{30.0, 25.0} : std::pair{60.0, 27.0};
                          }),
                          0);
  ASSERT_TRUE(Has(v, "fragmentation")) << Joined(v);
  EXPECT_FALSE(Has(v, "spike_long_request")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "fragmentation").lever, "tiers"));
}

TEST(DoctorTest, FragmentationOomsAreFragmentationAndCapacityOomsJoinTheirVerdict) {
  const auto v = Diagnose(Generate(
                              [](double) {
                                return std::pair{50.0, 45.0};
                              },
                              {OomEvent{1, 300.0, 1 << 30, OomCause::kFragmentation},
                               OomEvent{2, 310.0, 1 << 30, OomCause::kFragmentation}}),
                          0);
  ASSERT_TRUE(Has(v, "fragmentation")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "fragmentation").evidence, "2 fragmentation OOMs between 300.0 s and 310.0 s"))
      << Joined(v);
  const auto c = Diagnose(Generate(
                              [](double) {
                                return std::pair{50.0, 45.0};
                              },
                              {OomEvent{1, 300.0, std::size_t{60} << 30, OomCause::kCapacity}}),
                          0);
  ASSERT_TRUE(Has(c, "climbs_capacity")) << Joined(c);
  EXPECT_TRUE(absl::StrContains(Get(c, "climbs_capacity").evidence, "1 capacity OOMs")) << Joined(c);
}

TEST(DoctorTest, CacheHeldButUnusedWhileMemoryIsShort) {
  const auto v = Diagnose(Generate([](double t) { return std::pair{92.0, 30.0 + 3 * Tri(t, 30)}; }), 0);
  ASSERT_TRUE(Has(v, "cache_held")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Get(v, "cache_held").lever, "empty_cache"));
  // A training-like run that keeps its cache far from the cap: keeping it saves allocations.
  const auto training = Diagnose(Generate([](double t) { return std::pair{40.0, 20.0 + 6 * Tri(t, 30)}; }), 0);
  ASSERT_EQ(Names(training), std::vector<std::string>{"healthy"}) << Joined(training);
  EXPECT_TRUE(absl::StrContains(training[0].evidence, "memory was never short")) << Joined(training);
}

TEST(DoctorTest, WithoutACapThePeakIsTheScaleAndNothingIsFullAtStart) {
  const auto v = Diagnose(Generate([](double) { return std::pair{50.0, 45.0}; }, {}, 0), 0);
  EXPECT_EQ(Names(v), std::vector<std::string>{"healthy"}) << Joined(v);
  EXPECT_TRUE(absl::StrContains(v[0].evidence, "no cap in the timeline")) << Joined(v);
  const auto idle = Diagnose(Generate([](double) { return std::pair{0.0, 0.0}; }, {}, 0), 0);
  EXPECT_TRUE(absl::StrContains(idle[0].evidence, "used no memory")) << Joined(idle);
}

TEST(DoctorTest, AHealthyTimelineIsOnlyHealthy) {
  const auto v = Diagnose(Generate([](double t) { return std::pair{40.0, 30.0 + 8 * Tri(t, 60)}; }), 0);
  EXPECT_EQ(Names(v), std::vector<std::string>{"healthy"}) << Joined(v);
  EXPECT_TRUE(absl::StrContains(v[0].evidence, "peak reserved 40.00 GiB")) << v[0].evidence;
  // Another device's samples are not this one's.
  EXPECT_TRUE(absl::StrContains(Diagnose(Generate([](double) {
                                           return std::pair{95.0, 90.0};
                                         }),
                                         3)[0]
                                    .evidence,
                                "device 3 has no samples"));
}

TEST(DoctorTest, RoundsThatSettleAreFragmentationsSteadyStateAndWhatCarriesOverALeak) {
  const std::vector<std::size_t> none = {0, 0, 0, 0, 0};
  const std::vector<std::size_t> settle = {100, 120, 130, 130, 130};
  const auto s = DiagnoseRounds(settle, none, 0);
  ASSERT_EQ(Names(s), std::vector<std::string>{"healthy"});
  EXPECT_TRUE(absl::StrContains(s[0].evidence, "steady state"));
  const std::vector<std::size_t> rise = {100, 120, 140, 160, 180};
  EXPECT_EQ(Names(DiagnoseRounds(rise, none, 0)), std::vector<std::string>{"fragmentation"});
  // Weights never freed carry over: the peaks rise by them, which is what carries over, not fragmentation.
  const std::vector<std::size_t> weights_peaks = {132, 232, 332};
  const std::vector<std::size_t> weights_left = {100, 200, 300};
  const auto w = DiagnoseRounds(weights_peaks, weights_left, 0);
  ASSERT_EQ(Names(w), std::vector<std::string>{"leak"}) << Joined(w);
  EXPECT_TRUE(absl::StrContains(w[0].lever, "repeat only its steady part")) << Joined(w);
  EXPECT_TRUE(DiagnoseRounds(std::vector<std::size_t>{10}, std::vector<std::size_t>{0}, 0).empty());
  const std::vector<std::size_t> flat = {100, 100, 101};
  EXPECT_TRUE(DiagnoseRounds(flat, std::vector<std::size_t>{0, 0, 0}, 0).empty()) << "within 1%: nothing to say";
}

// Every decision reads its threshold from DoctorThresholds: moving one moves the verdict.
TEST(DoctorTest, TheThresholdsDecide) {
  const auto jump = Generate([](double t) { return t < 600 ? std::pair{30.0, 25.0} : std::pair{60.0, 50.0}; });
  ASSERT_TRUE(Has(Diagnose(jump, 0), "spike_long_request"));
  const auto strict = Diagnose(jump, 0, DoctorThresholds{.spike_live = 0.9});
  EXPECT_TRUE(Has(strict, "fragmentation")) << "live memory rose by 83% of the jump: " << Joined(strict);
  EXPECT_TRUE(Has(Diagnose(jump, 0, DoctorThresholds{.jump = 0.35}), "healthy")) << "a jump of 30% of the cap";
  EXPECT_TRUE(Has(Diagnose(jump, 0, DoctorThresholds{.curve_samples = 1000}), "healthy")) << "too few samples";

  double peak = 0;
  const auto climb = Generate([&](double t) {
    const double a = 10 + (5 + 0.06 * t) * Tri(t, 50);
    peak = std::max(peak, a + 1);
    return std::pair{peak, a};
  });
  ASSERT_TRUE(Has(Diagnose(climb, 0), "climbs_capacity"));
  EXPECT_FALSE(Has(Diagnose(climb, 0, DoctorThresholds{.climb_steps = 10}), "climbs_capacity"));

  const std::vector<std::size_t> rise = {100, 120, 140, 160, 180}, none = {0, 0, 0, 0, 0};
  EXPECT_TRUE(DiagnoseRounds(rise, none, 0, DoctorThresholds{.settle_rounds = 6}).empty());
  const std::vector<std::size_t> flat = {100, 100, 101};
  EXPECT_EQ(Names(DiagnoseRounds(flat, std::vector<std::size_t>{0, 0, 0}, 0, DoctorThresholds{.round_rise = 0.001})),
            std::vector<std::string>{"fragmentation"});
}

TEST(DoctorTest, JsonAndHtmlCarryTheVerdicts) {
  const auto samples = Generate([](double t) { return t < 600 ? std::pair{30.0, 25.0} : std::pair{60.0, 27.0}; });
  const auto v = Diagnose(samples, 0);
  const nlohmann::json j = nlohmann::json::parse(VerdictsToJson(v));
  ASSERT_TRUE(j.contains("verdicts"));
  for (const auto& x : j["verdicts"]) {
    for (const char* key : {"verdict", "evidence", "lever", "from_s", "to_s", "device"}) EXPECT_TRUE(x.contains(key));
  }
  const std::string html = DoctorHtml(v, samples, "t <&>");
  EXPECT_TRUE(absl::StrContains(html, "<section id=\"doctor\">"));
  EXPECT_LT(html.find("id=\"doctor\""), html.find("<svg")) << "the verdicts come first";
  EXPECT_TRUE(absl::StrContains(html, "data-marked=\"fragmentation\"")) << "the curve is marked";
  EXPECT_TRUE(absl::StrContains(html, "t &lt;&amp;&gt;"));
  EXPECT_FALSE(absl::StrContains(html, "<script")) << "no script: nothing to run";
}

// Issue 27 item 8: figures no bucketalloc sample shows (1 TiB reserved under a 1 MiB cap was
// "healthy, 104857600% of the cap"; live memory above reserved) are an inconsistent input, and
// nothing else is said of that device; a cap lowered below what was reserved is not.
TEST(DoctorTest, SamplesThatContradictThemselvesAreInconsistentNotHealthy) {
  // Reserved memory above the cap is said (over_cap), never healthy; it is not a contradiction: a
  // cap lowered below what was reserved (set_memory_fraction) leaves the cache above it, and a
  // timeline that starts after that shows it from its first line.
  auto over_cap = Generate([](double) { return std::pair{1024.0, 1.0}; }, {}, 1.0 / 1024);  // 1 TiB, 1 MiB cap
  const auto v = Diagnose(over_cap, 0);
  ASSERT_TRUE(Has(v, "over_cap")) << Joined(v);
  EXPECT_FALSE(Has(v, "healthy")) << Joined(v);
  EXPECT_FALSE(Has(v, "inconsistent")) << Joined(v);
  EXPECT_TRUE(absl::StrContains(Joined(v),
                                "201 of device 0's 201 samples reserve more than the cap, from 0.0 s "
                                "(reserved 1024.00 GiB is 104857600% of the 1.00 MiB cap)"))
      << Joined(v);
  for (const Verdict& x : v) {
    if (x.verdict == Finding::kOverCap) {
      EXPECT_TRUE(absl::StrContains(x.lever, "empty_cache")) << x.lever;
    }
  }

  auto live_over_reserved = Generate([](double t) { return std::pair{40.0, 30.0 + 8 * Tri(t, 60)}; });
  live_over_reserved[100].allocated_bytes = live_over_reserved[100].reserved_bytes + 1;
  const auto w = Diagnose(live_over_reserved, 0);
  ASSERT_EQ(Names(w), std::vector<std::string>{"inconsistent"}) << Joined(w);
  EXPECT_TRUE(absl::StrContains(w[0].evidence, "1 of device 0's 201 samples")) << Joined(w);
  EXPECT_TRUE(absl::StrContains(w[0].evidence, "at 500.0 s: allocated (live)")) << Joined(w);
  EXPECT_EQ(w[0].from_s, 500.0);
  for (auto field : {&TimelineSample::active_bytes, &TimelineSample::cached_bytes, &TimelineSample::requested_bytes,
                     &TimelineSample::largest_free_block_bytes}) {
    auto bad = Generate([](double) { return std::pair{40.0, 30.0}; });
    bad[7].*field = bad[7].reserved_bytes + 1;
    EXPECT_EQ(Names(Diagnose(bad, 0)), std::vector<std::string>{"inconsistent"});
  }

  // set_per_process_memory_fraction lowered the cap below what was reserved: consistent, and said.
  auto lowered = Generate([](double) { return std::pair{60.0, 30.0}; });
  for (std::size_t i = 100; i < lowered.size(); ++i) lowered[i].capacity_bytes = static_cast<std::int64_t>(50 * kGiB);
  EXPECT_FALSE(Has(Diagnose(lowered, 0), "inconsistent")) << Joined(Diagnose(lowered, 0));
  EXPECT_TRUE(Has(Diagnose(lowered, 0), "over_cap")) << Joined(Diagnose(lowered, 0));
  // The HTML marks no span for a contradiction.
  EXPECT_FALSE(absl::StrContains(DoctorHtml(w, live_over_reserved, "x"), "data-marked="));
}

// Issue 27 item 9: the doctor diagnosed each device over every sample (200k lines over 65,537
// devices took minutes). DiagnoseAll groups the samples once: 60,000 samples over 30,000 devices
// (1.8e9 sample visits the old way) take milliseconds.
TEST(DoctorTest, ManyDevicesAreDiagnosedInOnePass) {
  constexpr int kDevices = 30000;
  std::vector<TimelineSample> samples;
  for (int round = 0; round < 2; ++round) {
    for (int d = 0; d < kDevices; ++d) {
      TimelineSample s;
      s.time_s = round;
      s.device = d;
      s.capacity_bytes = std::int64_t{1} << 30;
      s.reserved_bytes = s.allocated_bytes = s.active_bytes = std::int64_t{100} << 20;
      s.ooms_total[static_cast<int>(OomCause::kFragmentation)] = d == 7 && round == 1;
      samples.push_back(s);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Verdict> all = DiagnoseAll(samples);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "linear in the samples: milliseconds, not seconds";
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kDevices)) << "one verdict per device";
  for (int d : {0, 7, 29999}) {
    const std::vector<Verdict> one = Diagnose(samples, d);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(all[d].device, d);
    EXPECT_EQ(all[d].verdict, one[0].verdict);
    EXPECT_EQ(all[d].evidence, one[0].evidence);
  }
  EXPECT_EQ(all[7].verdict, Finding::kFragmentation);
  EXPECT_EQ(all[8].verdict, Finding::kHealthy);
  EXPECT_TRUE(DiagnoseAll({}).empty());
}

// ReadDoctorInput on files: a file with nothing readable is an error naming it and what is
// expected (issue 27 items 8 and 14), never "healthy, 0 samples".
class DoctorInputTest : public testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) / absl::StrCat("doctor_input_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

std::string Line(int device, double t, std::int64_t reserved = 10 << 20) {
  TimelineSample s;
  s.time_s = t;
  s.device = device;
  s.capacity_bytes = std::int64_t{64} << 20;
  s.reserved_bytes = s.allocated_bytes = s.active_bytes = s.requested_bytes = reserved;
  return TimelineToJsonLine(s);
}

TEST_F(DoctorInputTest, NothingReadableIsAnErrorNamingTheFileAndWhatIsExpected) {
  const std::string cut = Line(0, 0).substr(0, 80);
  for (const auto& [name, text, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"cut.jsonl", cut, "its only line is cut off or not a sample"},
           {"garbage.json", "{garbage", "its only line is cut off or not a sample"},
           {"stats.json", R"({"allocated_bytes.all.current": 0, "num_ooms": 0})", "not a timeline sample"},
           {"empty.jsonl", "", "is empty"},
           {"blank.jsonl", " \n\n", "is empty"}}) {
    const std::string path = Write(name, text);
    absl::StatusOr<DoctorInput> in = ReadDoctorInput(path, DoctorOptions{});
    ASSERT_FALSE(in.ok()) << name << ": " << (in.ok() ? absl::StrCat(in->samples.size(), " samples") : "");
    EXPECT_TRUE(absl::StrContains(in.status().message(), path)) << in.status();
    EXPECT_TRUE(absl::StrContains(in.status().message(), why)) << in.status();
    EXPECT_TRUE(absl::StrContains(in.status().message(), "expected a file: a timeline (JSON lines")) << in.status();
  }
}

TEST_F(DoctorInputTest, ADirectoryIsNamedAndAByteOrderMarkIsSkipped) {
  absl::StatusOr<DoctorInput> dir = ReadDoctorInput(dir_.string(), DoctorOptions{});
  ASSERT_FALSE(dir.ok());
  EXPECT_TRUE(
      absl::StrContains(dir.status().message(), absl::StrCat(dir_.string(), " is a directory; expected a file")))
      << dir.status();
  const std::string timeline = Line(0, 0) + "\n" + Line(0, 1) + "\n";
  absl::StatusOr<DoctorInput> bom = ReadDoctorInput(Write("bom.jsonl", "\xEF\xBB\xBF" + timeline), DoctorOptions{});
  ASSERT_TRUE(bom.ok()) << bom.status();
  EXPECT_EQ(bom->kind, "timeline");
  EXPECT_EQ(bom->samples.size(), 2u);
  DoctorOptions o;
  o.capacity = 64 << 20;
  o.allocator = "nocache";
  absl::StatusOr<DoctorInput> csv = ReadDoctorInput(
      Write("bom.csv",
            "\xEF\xBB\xBFThread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0xa,1048576,0x0\n"
            "1,00:00:00.000002,free,0xa,1048576,0x0\n"),
      o);
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(csv->kind, "trace");
}

TEST_F(DoctorInputTest, ADamagedLineIsSkippedWithAWarning) {
  const std::string path = Write("damaged.jsonl", Line(0, 0) + "\n{\"time_s\": 1, \"dev\n" + Line(0, 2) + "\n");
  absl::StatusOr<DoctorInput> in = ReadDoctorInput(path, DoctorOptions{});
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->samples.size(), 2u);
  ASSERT_EQ(in->warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(in->warnings[0], absl::StrCat(path, ":2: not a timeline sample"))) << in->warnings[0];
}

TEST_F(DoctorInputTest, DevicesNoProcessHasAndSnapshotsLargerThanTheCardAreRefused) {
  absl::StatusOr<DoctorInput> high =
      ReadDoctorInput(Write("high.jsonl", Line(0, 0) + "\n" + Line(kMaxDoctorDevice + 1, 0) + "\n"), DoctorOptions{});
  ASSERT_FALSE(high.ok());
  EXPECT_TRUE(absl::StrContains(high.status().message(),
                                "sample 2 (time_s 0) is of device 65536; accepted: devices 0 "
                                "to 65535"))
      << high.status();
  EXPECT_TRUE(ReadDoctorInput(Write("top.jsonl", Line(kMaxDoctorDevice, 0) + "\n"), DoctorOptions{}).ok());
  const std::string snapshot = R"({"segments": [{"device": 0, "total_size": 104857600, "allocated_size": 10485760,
      "active_size": 10485760, "requested_size": 10485760, "blocks": []}]})";
  DoctorOptions o;
  o.capacity = 64 << 20;
  absl::StatusOr<DoctorInput> big = ReadDoctorInput(Write("snap.json", snapshot), o);
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(absl::StrContains(big.status().message(), "hold 100.00 MiB, more than --capacity 64.00 MiB"))
      << big.status();
}

// Segment sizes near 2^63 overflowed the doctor's sums (issue 42 item 4: UBSan aborted; a release
// build said "allocated (live) 0 B is more than reserved 0 B"): refused naming the field and range.
TEST_F(DoctorInputTest, AbsurdSegmentSizesAreRefusedNamingTheField) {
  const std::string snapshot = R"({"segments": [
      {"device": 0, "total_size": 9223372036854775000, "allocated_size": 0, "active_size": 0, "blocks": []},
      {"device": 0, "total_size": 9223372036854775000, "allocated_size": 0, "active_size": 0, "blocks": []}]})";
  DoctorOptions o;
  o.capacity = std::size_t{80} << 30;
  const std::string path = Write("absurd.json", snapshot);
  absl::StatusOr<DoctorInput> in = ReadDoctorInput(path, o);
  ASSERT_FALSE(in.ok());
  EXPECT_TRUE(absl::StrContains(in.status().message(),
                                absl::StrCat(path,
                                             ": segments[0] has \"total_size\" 9223372036854775000; accepted: "
                                             "\"total_size\" an integer from 0 to 70368744177664")))
      << in.status();
}

// A snapshot of torch 2.1 (_dump_snapshot's first release) has no time_us (issue 42 item 1): its
// history is replayed in entry order, with a warning that says so.
TEST_F(DoctorInputTest, AHistoryWithoutTimesIsReplayedInEntryOrderWithAWarning) {
  const std::string snapshot = R"({"segments": [], "device_traces": [[
      {"action": "segment_alloc", "addr": 4096, "size": 20971520, "stream": 0},
      {"action": "alloc", "addr": 4096, "size": 1048576, "stream": 0, "frames": []},
      {"action": "oom", "device_free": 0, "size": 1073741824, "stream": 0},
      {"action": "free_completed", "addr": 4096, "size": 1048576, "stream": 0}]]})";
  DoctorOptions o;
  o.capacity = 64 << 20;
  absl::StatusOr<DoctorInput> in = ReadDoctorInput(Write("torch21.json", snapshot), o);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->kind, "snapshot");
  EXPECT_FALSE(in->samples.empty());
  ASSERT_EQ(in->warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(in->warnings[0], "has no \"time_us\"")) << in->warnings[0];
}

}  // namespace
}  // namespace bucketalloc::harness
