// src/frontend/observability/metrics.cc — the Prometheus text exposition of the stats (bucketalloc/metrics.h).
// The gauges and counters come from the X-macro lists of bucketalloc/stat_types.h, so a stat added
// there is exported without a change here; what is not one of those lists (the fragmentation
// report, the backend's calls, the OOM causes as one labelled family) is written out below.
#include "bucketalloc/metrics.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "bucketalloc/stats.h"

namespace bucketalloc {
namespace {

// One metric family: its name, type and help, and its sample lines (for every device).
struct Family {
  std::string name;
  const char* type;
  std::string help;
  std::vector<std::string> samples;
};

class Families {
 public:
  // The family `name` (created in order of first use).
  Family& Get(absl::string_view name, const char* type, absl::string_view help) {
    for (Family& f : families_) {
      if (f.name == name) return f;
    }
    families_.push_back(Family{std::string(name), type, std::string(help), {}});
    return families_.back();
  }
  void Add(absl::string_view name, const char* type, absl::string_view help, absl::string_view labels,
           absl::string_view value) {
    Get(name, type, help).samples.push_back(absl::StrCat(name, "{", labels, "} ", value));
  }
  std::string Render() const {
    std::string out;
    for (const Family& f : families_) {
      absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name, " ", f.type, "\n");
      for (const std::string& s : f.samples) absl::StrAppend(&out, s, "\n");
    }
    return out;
  }

 private:
  std::vector<Family> families_;
};

std::string Int(std::int64_t v) { return absl::StrCat(v); }
std::string Ratio(double v) { return absl::StrFormat("%.9g", v); }

// A HELP text escaped as the format requires (backslash and newline).
std::string Help(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The gauge name of a per-pool stat: byte stats keep theirs; counts are named for what they count.
std::string PoolGaugeName(absl::string_view stat) {
  if (absl::EndsWith(stat, "_bytes")) return absl::StrCat("bucketalloc_", stat);
  if (stat == "allocation") return "bucketalloc_live_allocations";
  if (stat == "active") return "bucketalloc_active_blocks";
  if (stat == "segment") return "bucketalloc_segments";
  return absl::StrCat("bucketalloc_", stat, "_blocks");  // inactive_split
}

void AddDevice(const DeviceMetrics& m, Families* out) {
  const std::string dev = absl::StrCat("device=\"", m.device, "\"");
  const DeviceStats& s = m.stats;
  auto pool_labels = [&](int p) { return absl::StrCat(dev, ",pool=\"", kPoolNames[p].key, "\""); };

  // Gauges of every pool: current values, and the peaks of the byte ones.
#define BUCKETALLOC_POOL_GAUGE(name, doc)                                                                  \
  for (int p = 0; p < kNumPoolIndices; ++p) {                                                              \
    out->Add(PoolGaugeName(#name), "gauge", Help(doc), pool_labels(p), Int(s.name[p].current));            \
  }                                                                                                        \
  if (absl::EndsWith(#name, "_bytes")) {                                                                   \
    for (int p = 0; p < kNumPoolIndices; ++p) {                                                            \
      out->Add(absl::StrCat("bucketalloc_peak_", #name), "gauge",                                          \
               absl::StrCat("the peak of bucketalloc_", #name, " since the start or the last peak reset"), \
               pool_labels(p), Int(s.name[p].peak));                                                       \
    }                                                                                                      \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_POOL_GAUGE)
#undef BUCKETALLOC_POOL_GAUGE

  // The fragmentation report of every pool.
  for (int p = 0; p < kNumPoolIndices; ++p) {
    const PoolFragmentation& f = m.fragmentation.pools[p];
    out->Add("bucketalloc_largest_free_block_bytes", "gauge", "the largest free cached block", pool_labels(p),
             Int(f.largest_free));
    out->Add("bucketalloc_external_fragmentation_ratio", "gauge",
             "1 - largest free block / free cached bytes (0 when nothing is free): free memory in pieces too small "
             "for a large request",
             pool_labels(p), Ratio(f.external_fragmentation()));
    out->Add("bucketalloc_internal_fragmentation_ratio", "gauge",
             "1 - requested / allocated bytes of live allocations (0 when none): memory lost to rounding",
             pool_labels(p), Ratio(f.internal_fragmentation()));
  }
  // Free blocks by size: the distribution now, as a histogram (cumulative buckets, le in bytes:
  // bin i of the report holds sizes in [2^i, 2^(i+1)), so its bucket's bound is 2^(i+1) - 1).
  const char* const kHist = "bucketalloc_free_block_size_bytes";
  const char* const kHistHelp =
      "the sizes of the free cached blocks now (a distribution that rises and falls with the cache, not a count of "
      "observations)";
  for (int p = 0; p < kNumPoolIndices; ++p) {
    const PoolFragmentation& f = m.fragmentation.pools[p];
    Family& h = out->Get(kHist, "histogram", kHistHelp);
    std::int64_t cumulative = 0, count = 0;
    for (int i = 0; i < kHistogramBins; ++i) count += f.free_count[i];
    for (int i = 9; i < kHistogramBins; ++i) {  // 2^9 = 512 B, the smallest block
      for (int j = i == 9 ? 0 : i; j <= i; ++j) cumulative += f.free_count[j];
      h.samples.push_back(absl::StrCat(kHist, "_bucket{", pool_labels(p), ",le=\"", (std::int64_t{1} << (i + 1)) - 1,
                                       "\"} ", cumulative));
    }
    h.samples.push_back(absl::StrCat(kHist, "_bucket{", pool_labels(p), ",le=\"+Inf\"} ", count));
    h.samples.push_back(absl::StrCat(kHist, "_sum{", pool_labels(p), "} ", f.total_free));
    h.samples.push_back(absl::StrCat(kHist, "_count{", pool_labels(p), "} ", count));
  }

  // Device-wide gauges.
  out->Add("bucketalloc_capacity_bytes", "gauge", "the cap on reserved bytes", dev, Int(s.capacity_bytes));
#define BUCKETALLOC_DEVICE_GAUGE(name, doc) \
  out->Add(absl::StrCat("bucketalloc_", #name), "gauge", Help(doc), dev, Int(s.name.current));
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_DEVICE_GAUGE)
#undef BUCKETALLOC_DEVICE_GAUGE
  for (const TierUsage& t : m.fragmentation.tiers) {
    const std::string tier = absl::StrCat(dev, ",tier=\"", t.tier_bytes, "\"");
    const char* const help =
        "blocks of each tier (its size in bytes): in use (held or awaiting stream events) or cached";
    out->Add("bucketalloc_tier_blocks", "gauge", help, absl::StrCat(tier, ",state=\"in_use\""), Int(t.in_use));
    out->Add("bucketalloc_tier_blocks", "gauge", help, absl::StrCat(tier, ",state=\"cached\""), Int(t.cached));
  }
  for (const PrivatePoolStats& pp : s.reserved_bytes_by_private_pools) {
    for (int p = 0; p < kNumPoolIndices; ++p) {
      out->Add("bucketalloc_private_pool_reserved_bytes", "gauge",
               "bytes reserved by each private pool (CUDA graphs, MemPool), by its id",
               absl::StrCat(pool_labels(p), ",private_pool=\"", pp.id_first, "_", pp.id_second, "\""),
               Int(pp.reserved_bytes[p].current));
    }
  }

  // Tenants: each one's figures (a label of its name), as its JSON lists them.
  for (const TenantStats& t : m.tenants) {
    const std::string tenant = absl::StrCat(dev, ",tenant=\"", t.name, "\"");
    ForEachTenantField(t, [&](const char* key, auto value, const char* meaning) {
      out->Add(absl::StrCat("bucketalloc_tenant_", key), "gauge", meaning, tenant,
               Int(static_cast<std::int64_t>(value)));
    });
    out->Add("bucketalloc_tenant_ooms_total", "counter", "out-of-memory failures of each tenant's requests", tenant,
             Int(t.ooms));
    out->Add("bucketalloc_tenant_ooms_at_cap_total", "counter",
             "of each tenant's out-of-memory failures, those its own cap refused (not the device's)", tenant,
             Int(t.ooms_at_cap));
  }

  // Counters: allocations and frees ever made, every event counter, the OOMs by cause.
  out->Add("bucketalloc_allocations_total", "counter", "allocations served", dev,
           Int(s.allocation[kAllPools].allocated));
  out->Add("bucketalloc_frees_total", "counter", "allocations freed", dev, Int(s.allocation[kAllPools].freed));
  const std::array<std::int64_t, kNumOomCauses> counts = OomCounts(s);
  for (int c = 0; c < kNumOomCauses; ++c) {
    const char* cause = OomCauseKey(static_cast<OomCause>(c));
    const std::int64_t n = counts[c];
    out->Add("bucketalloc_ooms_total", "counter",
             "out-of-memory failures by cause: capacity (live memory plus the request exceed the cap), fragmentation "
             "(enough is free but no piece fits), cache_held (memory held for unsynchronized stream events), "
             "device_exhausted (the device refused under the cap), tenant_cap (a tenant's own cap refused it)",
             absl::StrCat(dev, ",cause=\"", cause, "\""), Int(n));
  }
#define BUCKETALLOC_COUNTER(name, doc)                                                                            \
  if (!absl::StartsWith(#name, "num_ooms")) {                                                                     \
    out->Add(absl::StrCat("bucketalloc_", absl::StripPrefix(#name, "num_"), "_total"), "counter", Help(doc), dev, \
             Int(s.name));                                                                                        \
  }
  BUCKETALLOC_COUNTERS(BUCKETALLOC_COUNTER)
#undef BUCKETALLOC_COUNTER

  // The backend's calls, by driver call.
  const char* const calls_help = "calls to the device's memory API, by call (failed allocations and creates included)";
  for (const BackendCall& call : BackendCalls(m.backend_calls)) {
    out->Add("bucketalloc_backend_calls_total", "counter", calls_help, absl::StrCat(dev, ",call=\"", call.call, "\""),
             Int(call.count));
  }
  out->Add("bucketalloc_backend_calls_total", "counter", calls_help, absl::StrCat(dev, ",call=\"cuEventRecord\""),
           Int(m.backend_calls.events_recorded));
}

}  // namespace

std::string MetricsToPrometheus(absl::Span<const DeviceMetrics> devices) {
  Families families;
  for (const DeviceMetrics& m : devices) AddDevice(m, &families);
  return families.Render();
}

}  // namespace bucketalloc
