// The Prometheus exposition (src/frontend/observability/metrics.cc): every family once with HELP and TYPE, the
// conventions' names, every stat of the X-macro lists exported, the histogram's cumulative
// buckets, labels per device and pool, and the metrics an allocator reports (OOMs by cause, no
// device created by asking).
#include "bucketalloc/metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/units.h"

namespace bucketalloc {
namespace {

// name{labels} -> value, and the TYPE of each family.
struct Parsed {
  std::map<std::string, std::string> samples;
  std::map<std::string, std::string> types;
  std::vector<std::string> family_order;
};

Parsed Parse(const std::string& text) {
  Parsed p;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      EXPECT_EQ(parts.size(), 2u) << line;
      EXPECT_FALSE(p.types.contains(parts[0])) << parts[0] << " is declared twice";
      p.types[parts[0]] = parts[1];
      p.family_order.push_back(parts[0]);
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const std::size_t space = line.rfind(' ');
    p.samples[std::string(line.substr(0, space))] = std::string(line.substr(space + 1));
  }
  return p;
}

DeviceMetrics Sample(int device) {
  DeviceMetrics m;
  m.device = device;
  m.stats.allocated_bytes[kAllPools].Increase(100 + device);
  m.stats.allocated_bytes[kLargePool].Increase(100 + device);
  m.stats.reserved_bytes[kAllPools].Increase(4096);
  m.stats.reserved_bytes[kAllPools].Decrease(1024);
  m.stats.allocation[kAllPools].Increase(5);
  m.stats.allocation[kAllPools].Decrease(2);
  m.stats.num_cache_hits = 7;
  m.stats.num_ooms = 3;
  m.stats.num_ooms_fragmentation = 2;
  m.stats.num_ooms_capacity = 1;
  m.stats.capacity_bytes = 1 << 30;
  PoolFragmentation& large = m.fragmentation.pools[kLargePool];
  large.AddFree(512);
  large.AddFree(600);
  large.AddFree(3 << 20);
  large.requested = 90;
  large.allocated = 100;
  m.fragmentation.all().Merge(large);
  m.fragmentation.tiers.push_back(TierUsage{8 << 20, 2, 1});
  m.backend_calls.allocs = 4;
  m.backend_calls.failed_allocs = 1;
  m.backend_calls.maps = 6;
  return m;
}

TEST(MetricsTest, FamiliesAreDeclaredOnceAndEachSampleBelongsToTheFamilyBeforeIt) {
  const std::vector<DeviceMetrics> devices = {Sample(0), Sample(1)};
  const std::string text = MetricsToPrometheus(devices);
  const Parsed p = Parse(text);  // checks "declared once"
  // Samples of a family follow its TYPE line, before the next family's.
  std::string family;
  const std::regex name_re("^[a-zA-Z_:][a-zA-Z0-9_:]*$");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      family = std::string(line.substr(0, line.find(' ')));
      EXPECT_TRUE(std::regex_match(family, name_re)) << family;
      EXPECT_TRUE(absl::StartsWith(family, "bucketalloc_")) << family;
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const std::string name(line.substr(0, line.find('{')));
    EXPECT_TRUE(name == family ||
                (p.types.at(family) == "histogram" &&
                 (name == family + "_bucket" || name == family + "_sum" || name == family + "_count")))
        << name << " under " << family;
  }
  // Counters end in _total, and nothing else does.
  for (const auto& [name, type] : p.types) EXPECT_EQ(type == "counter", absl::EndsWith(name, "_total")) << name;
}

TEST(MetricsTest, ValuesAndLabelsComeFromTheStats) {
  const std::vector<DeviceMetrics> devices = {Sample(0), Sample(1)};
  const Parsed p = Parse(MetricsToPrometheus(devices));
  auto at = [&](const std::string& key) {
    auto it = p.samples.find(key);
    EXPECT_TRUE(it != p.samples.end()) << key;
    return it == p.samples.end() ? std::string() : it->second;
  };
  EXPECT_EQ(at("bucketalloc_allocated_bytes{device=\"0\",pool=\"all\"}"), "100");
  EXPECT_EQ(at("bucketalloc_allocated_bytes{device=\"1\",pool=\"large_pool\"}"), "101");
  EXPECT_EQ(at("bucketalloc_reserved_bytes{device=\"0\",pool=\"all\"}"), "3072");
  EXPECT_EQ(at("bucketalloc_peak_reserved_bytes{device=\"0\",pool=\"all\"}"), "4096");
  EXPECT_EQ(at("bucketalloc_live_allocations{device=\"0\",pool=\"all\"}"), "3");
  EXPECT_EQ(at("bucketalloc_allocations_total{device=\"0\"}"), "5");
  EXPECT_EQ(at("bucketalloc_frees_total{device=\"0\"}"), "2");
  EXPECT_EQ(at("bucketalloc_cache_hits_total{device=\"1\"}"), "7");
  EXPECT_EQ(at("bucketalloc_ooms_total{device=\"0\",cause=\"capacity\"}"), "1");
  EXPECT_EQ(at("bucketalloc_ooms_total{device=\"0\",cause=\"fragmentation\"}"), "2");
  EXPECT_EQ(at("bucketalloc_ooms_total{device=\"0\",cause=\"cache_held\"}"), "0");
  EXPECT_EQ(at("bucketalloc_ooms_total{device=\"0\",cause=\"device_exhausted\"}"), "0");
  EXPECT_FALSE(p.types.contains("bucketalloc_ooms_total_total"));
  EXPECT_EQ(at("bucketalloc_capacity_bytes{device=\"1\"}"), "1073741824");
  EXPECT_EQ(at("bucketalloc_largest_free_block_bytes{device=\"0\",pool=\"large_pool\"}"), "3145728");
  EXPECT_EQ(at("bucketalloc_internal_fragmentation_ratio{device=\"0\",pool=\"large_pool\"}"), "0.1");
  double external = 0;
  ASSERT_TRUE(absl::SimpleAtod(at("bucketalloc_external_fragmentation_ratio{device=\"0\",pool=\"all\"}"), &external));
  EXPECT_NEAR(external, 1.0 - 3145728.0 / (3145728.0 + 1112.0), 1e-9);
  EXPECT_EQ(at("bucketalloc_tier_blocks{device=\"0\",tier=\"8388608\",state=\"in_use\"}"), "2");
  EXPECT_EQ(at("bucketalloc_tier_blocks{device=\"0\",tier=\"8388608\",state=\"cached\"}"), "1");
  EXPECT_EQ(at("bucketalloc_backend_calls_total{device=\"0\",call=\"cuMemAlloc\"}"), "5") << "failed calls count";
  EXPECT_EQ(at("bucketalloc_backend_calls_total{device=\"0\",call=\"cuMemMap\"}"), "6");
}

TEST(MetricsTest, EveryStatOfTheListsIsExported) {
  const std::vector<DeviceMetrics> devices = {Sample(0)};
  const Parsed p = Parse(MetricsToPrometheus(devices));
  std::set<std::string> want;
#define BUCKETALLOC_WANT_COUNTER(name, doc)                                                \
  if (!absl::StartsWith(#name, "num_ooms")) {                                              \
    want.insert(absl::StrCat("bucketalloc_", absl::StripPrefix(#name, "num_"), "_total")); \
  }
  BUCKETALLOC_COUNTERS(BUCKETALLOC_WANT_COUNTER)
#undef BUCKETALLOC_WANT_COUNTER
#define BUCKETALLOC_WANT_DEVICE(name, doc) want.insert(absl::StrCat("bucketalloc_", #name));
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_WANT_DEVICE)
#undef BUCKETALLOC_WANT_DEVICE
  for (const char* name : {"bucketalloc_requested_bytes", "bucketalloc_allocated_bytes", "bucketalloc_active_bytes",
                           "bucketalloc_reserved_bytes", "bucketalloc_cached_bytes", "bucketalloc_inactive_split_bytes",
                           "bucketalloc_live_allocations", "bucketalloc_active_blocks", "bucketalloc_segments",
                           "bucketalloc_inactive_split_blocks", "bucketalloc_ooms_total",
                           "bucketalloc_free_block_size_bytes", "bucketalloc_backend_calls_total"}) {
    want.insert(name);
  }
  for (const std::string& name : want) EXPECT_TRUE(p.types.contains(name)) << name;
}

TEST(MetricsTest, TheHistogramIsCumulativeOverBinsWithExactBounds) {
  const std::vector<DeviceMetrics> devices = {Sample(0)};
  const Parsed p = Parse(MetricsToPrometheus(devices));
  EXPECT_EQ(p.types.at("bucketalloc_free_block_size_bytes"), "histogram");
  const std::string b = "bucketalloc_free_block_size_bytes_bucket{device=\"0\",pool=\"large_pool\",le=\"";
  // 512 and 600 B lie in [512, 1024); 3 MiB in [2 MiB, 4 MiB).
  EXPECT_EQ(p.samples.at(b + "1023\"}"), "2");
  EXPECT_EQ(p.samples.at(b + "2097151\"}"), "2");
  EXPECT_EQ(p.samples.at(b + "4194303\"}"), "3");
  EXPECT_EQ(p.samples.at(b + "+Inf\"}"), "3");
  EXPECT_EQ(p.samples.at("bucketalloc_free_block_size_bytes_count{device=\"0\",pool=\"large_pool\"}"), "3");
  EXPECT_EQ(p.samples.at("bucketalloc_free_block_size_bytes_sum{device=\"0\",pool=\"large_pool\"}"),
            absl::StrCat(512 + 600 + (3 << 20)));
  // Buckets never decrease.
  std::int64_t last = -1;
  for (int i = 9; i < kHistogramBins; ++i) {
    std::int64_t v = 0;
    ASSERT_TRUE(absl::SimpleAtoi(p.samples.at(absl::StrCat(b, (std::int64_t{1} << (i + 1)) - 1, "\"}")), &v));
    EXPECT_GE(v, last);
    last = v;
  }
}

TEST(MetricsTest, AnAllocatorReportsItsCreatedDevicesAndItsOomsByCause) {
  absl::StatusOr<Options> o = ParseOptions("backend:sim,capacity:64MiB,sim_total_memory:128MiB,sim_devices:2");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(*o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->Metrics().empty()) << "no device is created by asking";
  EXPECT_EQ(MetricsToPrometheus((*a)->Metrics()), "");
  absl::StatusOr<void*> p = (*a)->Allocate(4 * kMiB, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*a)->Allocate(1 * kGiB, 1).ok());
  const std::vector<DeviceMetrics> m = (*a)->Metrics();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].device, 1);
  EXPECT_EQ(m[0].stats.num_ooms_capacity, 1);
  EXPECT_EQ(m[0].stats.num_ooms, 1);
  EXPECT_EQ(m[0].stats.allocated_bytes[kAllPools].current, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(m[0].fragmentation.all().allocated, static_cast<std::int64_t>(4 * kMiB));
  EXPECT_GE(m[0].backend_calls.allocs, 1);
  EXPECT_TRUE((*a)->CheckInvariants(1).ok());
  ASSERT_TRUE((*a)->Free(*p, 1).ok());
}

// PyTorch's reset_accumulated_memory_stats zeroes the stats' counters and totals; the metrics'
// counters are Prometheus counters, which never go back.
TEST(MetricsTest, CountersNeverGoBackWhenTheAccumulatedStatsAreReset) {
  absl::StatusOr<Options> o = ParseOptions("backend:sim,capacity:64MiB,sim_total_memory:128MiB");
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(*o);
  ASSERT_TRUE(a.ok()) << a.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<void*> p = (*a)->Allocate(4 * kMiB, 0);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*a)->Free(*p, 0).ok());
  }
  EXPECT_FALSE((*a)->Allocate(1 * kGiB, 0).ok());
  const DeviceStats before = (*a)->Metrics()[0].stats;
  ASSERT_TRUE((*a)->ResetAccumulatedStats(0).ok());
  absl::StatusOr<DeviceStats> reset = (*a)->GetStats(0);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->allocation[kAllPools].allocated, 0);
  EXPECT_EQ(reset->num_ooms, 0);
  absl::StatusOr<void*> p = (*a)->Allocate(4 * kMiB, 0);
  ASSERT_TRUE(p.ok());
  const DeviceStats after = (*a)->Metrics()[0].stats;
  EXPECT_EQ(after.allocation[kAllPools].allocated, before.allocation[kAllPools].allocated + 1);
  EXPECT_EQ(after.num_ooms, before.num_ooms);
#define BUCKETALLOC_EXPECT_MONOTONIC(name, doc) EXPECT_GE(after.name, before.name) << #name;
  BUCKETALLOC_COUNTERS(BUCKETALLOC_EXPECT_MONOTONIC)
#undef BUCKETALLOC_EXPECT_MONOTONIC
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc + 1);  // the OOM's retry released the cache
  EXPECT_EQ(after.allocated_bytes[kAllPools].current, static_cast<std::int64_t>(4 * kMiB));
  ASSERT_TRUE((*a)->Free(*p, 0).ok());
  EXPECT_TRUE((*a)->CheckInvariants(0).ok());
}

}  // namespace
}  // namespace bucketalloc
