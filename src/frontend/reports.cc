// src/frontend/reports.cc — the reports of bucketalloc/stats.h: stats, fragmentation and OOM reports
// as JSON and tables. Every rendering iterates the X-macro lists of bucketalloc/stat_types.h, so a
// stat is declared once.
#include "bucketalloc/stats.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace bucketalloc {
namespace {

using Json = nlohmann::ordered_json;

Json HistogramJson(const PoolFragmentation& p) {
  Json bins = Json::array();
  for (int i = 0; i < kHistogramBins; ++i) {
    if (p.free_count[i] == 0) continue;
    bins.push_back({{"min_bytes", std::int64_t{1} << i},
                    {"max_bytes", (std::int64_t{1} << (i + 1)) - 1},
                    {"count", p.free_count[i]},
                    {"bytes", p.free_bytes[i]}});
  }
  return Json{{"reserved", p.reserved},
              {"allocated", p.allocated},
              {"requested", p.requested},
              {"total_free", p.total_free},
              {"largest_free", p.largest_free},
              {"external_fragmentation", p.external_fragmentation()},
              {"internal_fragmentation", p.internal_fragmentation()},
              {"histogram", bins}};
}

Json FragmentationJson(const FragmentationReport& r) {
  Json tiers = Json::array();
  for (const TierUsage& t : r.tiers) {
    tiers.push_back({{"tier_bytes", t.tier_bytes}, {"in_use", t.in_use}, {"cached", t.cached}});
  }
  Json j = Json::object();
  for (int p = 0; p < kNumPoolIndices; ++p) j[kPoolNames[p].key] = HistogramJson(r.pools[p]);
  j["tiers"] = tiers;
  return j;
}

void AppendPoolTable(std::string* out, const char* name, const PoolFragmentation& p) {
  absl::StrAppendFormat(out, "%s: reserved %s, allocated %s, requested %s, free %s, largest free %s\n", name,
                        FormatBytes(p.reserved), FormatBytes(p.allocated), FormatBytes(p.requested),
                        FormatBytes(p.total_free), FormatBytes(p.largest_free));
  absl::StrAppendFormat(out, "  external fragmentation %.1f%%, internal fragmentation %.1f%%\n",
                        100.0 * p.external_fragmentation(), 100.0 * p.internal_fragmentation());
  bool any = false;
  for (int i = 0; i < kHistogramBins; ++i) {
    if (p.free_count[i] == 0) continue;
    if (!any) absl::StrAppend(out, "  free blocks  size bin                    count        bytes\n");
    any = true;
    absl::StrAppendFormat(out, "               [%10s, %10s) %10d %12s\n", FormatBytes(std::size_t{1} << i),
                          FormatBytes(std::size_t{1} << (i + 1)), p.free_count[i],
                          FormatBytes(static_cast<std::size_t>(p.free_bytes[i])));
  }
  if (!any) absl::StrAppend(out, "  no free blocks\n");
}

}  // namespace

std::string StatsToJson(const DeviceStats& stats) {
  Json j = Json::object();
#define BUCKETALLOC_STAT_JSON(name, doc)                                         \
  for (int p = 0; p < kNumPoolIndices; ++p) {                                    \
    const std::string prefix = absl::StrCat(#name, ".", kPoolNames[p].key, "."); \
    j[prefix + "current"] = stats.name[p].current;                               \
    j[prefix + "peak"] = stats.name[p].peak;                                     \
    j[prefix + "allocated"] = stats.name[p].allocated;                           \
    j[prefix + "freed"] = stats.name[p].freed;                                   \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_STAT_JSON)
#undef BUCKETALLOC_STAT_JSON
#define BUCKETALLOC_COUNTER_JSON(name, doc) j[#name] = stats.name;
  BUCKETALLOC_COUNTERS(BUCKETALLOC_COUNTER_JSON)
#undef BUCKETALLOC_COUNTER_JSON
#define BUCKETALLOC_DEVICE_STAT_JSON(name, doc) \
  j[#name ".current"] = stats.name.current;     \
  j[#name ".peak"] = stats.name.peak;           \
  j[#name ".allocated"] = stats.name.allocated; \
  j[#name ".freed"] = stats.name.freed;
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_DEVICE_STAT_JSON)
#undef BUCKETALLOC_DEVICE_STAT_JSON
  j["max_split_size"] = stats.max_split_size;
  j["capacity_bytes"] = stats.capacity_bytes;
  return j.dump();
}

std::string FragmentationToJson(const FragmentationReport& report) { return FragmentationJson(report).dump(); }

std::string FragmentationToTable(const FragmentationReport& report) {
  std::string out;
  for (int p = 0; p < kNumPoolIndices; ++p) AppendPoolTable(&out, kPoolNames[p].label, report.pools[p]);
  if (!report.tiers.empty()) {
    absl::StrAppend(&out, "tiers:        tier size     in use     cached\n");
    for (const TierUsage& t : report.tiers) {
      absl::StrAppendFormat(&out, "           %12s %10d %10d\n", FormatBytes(static_cast<std::size_t>(t.tier_bytes)),
                            t.in_use, t.cached);
    }
  }
  return out;
}

const char* OomCauseName(OomCause cause) {
  switch (cause) {
    case OomCause::kCapacity:
      return "capacity";
    case OomCause::kFragmentation:
      return "fragmentation";
    case OomCause::kCacheHeld:
      return "cache held";
    case OomCause::kDeviceExhausted:
      return "device exhausted";
  }
  return "unknown";
}

std::string OomReport::ToString() const {
  std::string out = absl::StrCat("bucketalloc: out of memory on device ", device, ": ", diagnosis, "\n");
  absl::StrAppendFormat(&out,
                        "  requested %s (rounded %s); cap %s; reserved %s; allocated %s; active %s; "
                        "cached %s; largest free block %s; device free %s\n",
                        FormatBytes(requested), FormatBytes(rounded), FormatBytes(capacity), FormatBytes(reserved),
                        FormatBytes(allocated), FormatBytes(active), FormatBytes(cached), FormatBytes(largest_free),
                        FormatBytes(device_free));
  absl::StrAppend(&out, FragmentationToTable(fragmentation));
  return out;
}

namespace {

// PyTorch's format_size (c10/core/Allocator.h): bytes up to 1 KiB, then KiB, MiB, GiB with two
// decimals, each up to and including its upper bound.
std::string TorchFormatSize(std::size_t size) {
  const double d = static_cast<double>(size);
  if (size <= 1024) return absl::StrCat(size, " bytes");
  if (size <= 1048576) return absl::StrFormat("%.2f KiB", d / 1024.0);
  if (size <= 1073741824) return absl::StrFormat("%.2f MiB", d / 1048576.0);
  return absl::StrFormat("%.2f GiB", d / 1073741824.0);
}

}  // namespace

std::string OomReport::TorchHeader() const {
  std::string out =
      absl::StrCat("CUDA out of memory. Tried to allocate ", TorchFormatSize(segment != 0 ? segment : rounded),
                   ". GPU ", device, " has a total capacity of ", TorchFormatSize(device_total), " of which ",
                   TorchFormatSize(device_free), " is free. ");
  if (capacity < device_total) absl::StrAppend(&out, TorchFormatSize(capacity), " allowed; ");
  absl::StrAppend(&out, "Of the allocated memory ", TorchFormatSize(allocated), " is allocated by PyTorch, and ",
                  TorchFormatSize(reserved > allocated ? reserved - allocated : 0),
                  " is reserved by PyTorch but unallocated.");
  return out;
}

std::string OomReport::ToJson() const {
  Json j{{"device", device},
         {"requested", requested},
         {"rounded", rounded},
         {"capacity", capacity},
         {"reserved", reserved},
         {"allocated", allocated},
         {"active", active},
         {"cached", cached},
         {"largest_free", largest_free},
         {"device_free", device_free},
         {"cause", OomCauseName(cause)},
         {"diagnosis", diagnosis},
         {"fragmentation", FragmentationJson(fragmentation)}};
  return j.dump();
}

std::string StatsSummary(const DeviceStats& s, int device) {
  std::string out;
  const std::string rule(88, '=');
  absl::StrAppend(&out, rule, "\n");
  absl::StrAppendFormat(&out, "|%-86s|\n",
                        absl::StrCat(" bucketalloc memory summary, device ", device, "  (cap ",
                                     FormatBytes(static_cast<std::size_t>(s.capacity_bytes)), ")"));
  absl::StrAppend(&out, rule, "\n");
  absl::StrAppendFormat(&out, "| %-26s | %12s | %12s | %12s | %12s |\n", "Metric", "Cur Usage", "Peak Usage",
                        "Tot Alloc", "Tot Freed");
  absl::StrAppend(&out, std::string(88, '-'), "\n");
  auto row = [&](const std::string& label, const Stat& st, bool bytes) {
    auto fmt = [bytes](std::int64_t v) {
      return bytes ? FormatBytes(static_cast<std::size_t>(std::max<std::int64_t>(v, 0))) : absl::StrCat(v);
    };
    absl::StrAppendFormat(&out, "| %-26s | %12s | %12s | %12s | %12s |\n", label, fmt(st.current), fmt(st.peak),
                          fmt(st.allocated), fmt(st.freed));
  };
  // PyTorch's order: the total, then the pools from the last (large) to the first (small).
#define BUCKETALLOC_SUMMARY_ROW(name, doc)                                 \
  {                                                                        \
    const bool bytes = absl::EndsWith(#name, "_bytes");                    \
    row(#name, s.name[kAllPools], bytes);                                  \
    for (int p = kNumPoolIndices - 1; p > kAllPools; --p) {                \
      row(absl::StrCat("  from ", kPoolNames[p].label), s.name[p], bytes); \
    }                                                                      \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_SUMMARY_ROW)
#undef BUCKETALLOC_SUMMARY_ROW
#define BUCKETALLOC_SUMMARY_DEVICE_ROW(name, doc) row(#name, s.name, false);
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_SUMMARY_DEVICE_ROW)
#undef BUCKETALLOC_SUMMARY_DEVICE_ROW
  absl::StrAppend(&out, std::string(88, '-'), "\n");
#define BUCKETALLOC_SUMMARY_COUNTER(name, doc) absl::StrAppendFormat(&out, "| %-26s | %57d |\n", #name, s.name);
  BUCKETALLOC_COUNTERS(BUCKETALLOC_SUMMARY_COUNTER)
#undef BUCKETALLOC_SUMMARY_COUNTER
  absl::StrAppend(&out, rule, "\n");
  return out;
}

}  // namespace bucketalloc
