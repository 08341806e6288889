// The doctor (src/harness/doctor.cc) on timelines generated to show each pattern of the runbook:
// each gets the verdict it was made to show, with its evidence, lever and span; a healthy one gets
// only "healthy"; the peaks of a repeat's rounds settle or rise; the JSON and HTML carry it all.
#include "harness/doctor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
  for (const Verdict& x : v) names.push_back(x.verdict);
  return names;
}
bool Has(const std::vector<Verdict>& v, const std::string& name) {
  const std::vector<std::string> n = Names(v);
  return std::find(n.begin(), n.end(), name) != n.end();
}
const Verdict& Get(const std::vector<Verdict>& v, const std::string& name) {
  return *std::find_if(v.begin(), v.end(), [&](const Verdict& x) { return x.verdict == name; });
}
std::string Joined(const std::vector<Verdict>& v) {
  std::string s;
  for (const Verdict& x : v) s += x.verdict + ": " + x.evidence + "\n";
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

}  // namespace
}  // namespace bucketalloc::harness
