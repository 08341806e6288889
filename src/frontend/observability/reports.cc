// src/frontend/observability/reports.cc — the reports of bucketalloc/stats.h: stats, fragmentation, tenant and OOM
// reports as JSON and tables, and a device's memory figures. Every rendering iterates the X-macro
// lists of bucketalloc/stat_types.h and the memory figures' names (BUCKETALLOC_MEMORY_FIGURES), so
// a stat or a figure is declared once.
#include "bucketalloc/stats.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
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
  for (const PrivatePoolStats& pp : stats.reserved_bytes_by_private_pools) {
    for (int p = 0; p < kNumPoolIndices; ++p) {
      const std::string prefix =
          absl::StrCat("reserved_bytes_by_private_pools.", pp.id_first, "_", pp.id_second, ".", kPoolNames[p].key, ".");
      j[prefix + "current"] = pp.reserved_bytes[p].current;
      j[prefix + "peak"] = pp.reserved_bytes[p].peak;
      j[prefix + "allocated"] = pp.reserved_bytes[p].allocated;
      j[prefix + "freed"] = pp.reserved_bytes[p].freed;
    }
  }
  return j.dump();
}

std::string FragmentationToJson(const FragmentationReport& report) { return FragmentationJson(report).dump(); }

std::string PoolFragmentationToJson(const PoolFragmentation& pool) { return HistogramJson(pool).dump(); }

MemoryFigures MemoryFiguresOf(const DeviceStats& stats, const FragmentationReport& fragmentation) {
  MemoryFigures f;
  f.reserved = static_cast<std::size_t>(stats.reserved_bytes[kAllPools].current);
  f.allocated = static_cast<std::size_t>(stats.allocated_bytes[kAllPools].current);
  f.active = static_cast<std::size_t>(stats.active_bytes[kAllPools].current);
  f.cached = static_cast<std::size_t>(stats.cached_bytes[kAllPools].current);
  f.requested = static_cast<std::size_t>(stats.requested_bytes[kAllPools].current);
  f.largest_free = static_cast<std::size_t>(fragmentation.all().largest_free);
  f.live_allocations = stats.allocation[kAllPools].current;
  return f;
}

std::string TenantStatsToJson(const std::vector<TenantStats>& tenants) {
  Json list = Json::array();
  for (const TenantStats& t : tenants) {
    Json j = Json::object();
    j["tenant"] = t.name;
    ForEachTenantField(t, [&](const char* key, auto value, const char*) { j[key] = value; });
    j["ooms"] = t.ooms;
    j["ooms_at_cap"] = t.ooms_at_cap;
    list.push_back(std::move(j));
  }
  return Json{{"tenants", std::move(list)}}.dump();
}

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

namespace {

// Each cause's key (labels, timelines) and name (reports), by OomCause.
struct CauseNames {
  const char* key;
  const char* name;
};
constexpr CauseNames kCauseNames[kNumOomCauses] = {{"capacity", "capacity"},
                                                   {"fragmentation", "fragmentation"},
                                                   {"cache_held", "cache held"},
                                                   {"device_exhausted", "device exhausted"},
                                                   {"tenant_cap", "tenant cap"}};
static_assert(static_cast<int>(OomCause::kTenantCap) == kNumOomCauses - 1);

}  // namespace

const char* OomCauseKey(OomCause cause) { return kCauseNames[static_cast<int>(cause)].key; }
const char* OomCauseName(OomCause cause) { return kCauseNames[static_cast<int>(cause)].name; }

namespace {

// The memory figures an OOM report lists (its JSON under their names, its text under their labels),
// in their order.
constexpr std::size_t MemoryFigures::*kOomFigures[] = {&MemoryFigures::reserved, &MemoryFigures::allocated,
                                                       &MemoryFigures::active, &MemoryFigures::cached,
                                                       &MemoryFigures::largest_free};

// A figure's words in text: its key without the unit, spaced ("largest_free_block_bytes" ->
// "largest free block").
std::string FigureLabel(const MemoryFigureName& name) {
  std::string label(absl::StripSuffix(name.key, "_bytes"));
  std::replace(label.begin(), label.end(), '_', ' ');
  return label;
}

}  // namespace

std::string OomReport::ToString() const {
  std::string out = absl::StrCat(
      "bucketalloc: out of memory on device ", device,
      tenant.empty() ? std::string() : absl::StrCat(" for tenant '", tenant, "' (cap ", FormatBytes(tenant_cap), ")"),
      ": ", diagnosis, "\n");
  absl::StrAppend(&out, "  requested ", FormatBytes(requested), " (rounded ", FormatBytes(rounded), "); cap ",
                  FormatBytes(capacity), "; ");
  for (std::size_t MemoryFigures::*m : kOomFigures) {
    absl::StrAppend(&out, FigureLabel(MemoryFigureNameOf(m)), " ", FormatBytes(figures().*m), "; ");
  }
  absl::StrAppend(&out, "device free ", FormatBytes(device_free), "\n");
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
  Json j{{"device", device}, {"requested", requested}, {"rounded", rounded}, {"capacity", capacity}};
  for (std::size_t MemoryFigures::*m : kOomFigures) j[MemoryFigureNameOf(m).name] = figures().*m;
  j["device_free"] = device_free;
  j["cause"] = OomCauseName(cause);
  j["diagnosis"] = diagnosis;
  j["fragmentation"] = FragmentationJson(fragmentation);
  if (!tenant.empty()) {
    j["tenant"] = tenant;
    j["tenant_cap"] = tenant_cap;
    j["at_tenant_cap"] = at_tenant_cap;
  }
  return j.dump();
}

namespace {

// PyTorch's memory_summary() formatters (torch/cuda/memory.py): a value scaled down by 1024 (sizes)
// or 1000 (counts) as often as its row's first value (`pref`, the "all" row's) is at least 768 KiB
// or 750 thousand, with integer division.
std::string TorchSize(std::int64_t size, double pref) {
  static constexpr const char* kPrefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  for (; i + 1 < 6 && !(pref < 768 * 1024); ++i) {
    size /= 1024;
    pref /= 1024;
  }
  return absl::StrFormat("%6d %s", size, kPrefixes[i]);
}
std::string TorchCount(std::int64_t count, double pref) {
  static constexpr const char* kPrefixes[] = {" ", "K", "M"};
  int i = 0;
  for (; i + 1 < 3 && !(pref < 750 * 1000); ++i) {
    count /= 1000;
    pref /= 1000;
  }
  return absl::StrFormat("%7d %s ", count, kPrefixes[i]);
}

}  // namespace

std::string TorchMemorySummary(const DeviceStats& s, int device, bool abbreviated) {
  std::vector<std::string> lines;
  lines.push_back(std::string(75, '='));
  lines.push_back(absl::StrFormat(" %16s PyTorch CUDA memory summary, device ID %-17d ", "", device));
  lines.push_back(std::string(75, '-'));
  lines.push_back(absl::StrFormat("  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  ", "", s.num_ooms, "",
                                  s.num_alloc_retries));
  lines.push_back(std::string(75, '='));
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  using Formatter = std::string (*)(std::int64_t, double);
  // Each column is scaled by its "all" row's value.
  auto row = [&](absl::string_view name, const Stat& st, const Stat& pref, Formatter f) {
    lines.push_back(absl::StrFormat(
        " %-21s | %s | %s | %s | %s ", name, f(st.current, static_cast<double>(pref.current)),
        f(st.peak, static_cast<double>(pref.peak)), f(st.allocated, static_cast<double>(pref.allocated)),
        f(st.freed, static_cast<double>(pref.freed))));
  };
  struct Metric {
    StatArray DeviceStats::*stat;
    const char* name;
    Formatter format;
  };
  for (const Metric& m : {Metric{&DeviceStats::allocated_bytes, "Allocated memory", TorchSize},
                          Metric{&DeviceStats::active_bytes, "Active memory", TorchSize},
                          Metric{&DeviceStats::requested_bytes, "Requested memory", TorchSize},
                          Metric{&DeviceStats::reserved_bytes, "GPU reserved memory", TorchSize},
                          Metric{&DeviceStats::inactive_split_bytes, "Non-releasable memory", TorchSize},
                          Metric{&DeviceStats::allocation, "Allocations", TorchCount},
                          Metric{&DeviceStats::active, "Active allocs", TorchCount},
                          Metric{&DeviceStats::segment, "GPU reserved segments", TorchCount},
                          Metric{&DeviceStats::inactive_split, "Non-releasable allocs", TorchCount}}) {
    lines.push_back(std::string(75, '-'));
    const StatArray& a = s.*m.stat;
    row(m.name, a[kAllPools], a[kAllPools], m.format);
    if (!abbreviated) {
      row("      from large pool", a[kLargePool], a[kAllPools], m.format);
      row("      from small pool", a[kSmallPool], a[kAllPools], m.format);
    }
  }
  for (const auto& [stat, name] : {std::pair{&DeviceStats::oversize_allocations, "Oversize allocations"},
                                   std::pair{&DeviceStats::oversize_segments, "Oversize GPU segments"}}) {
    lines.push_back(std::string(75, '-'));
    row(name, s.*stat, s.*stat, TorchCount);
  }
  lines.push_back(std::string(75, '='));
  return absl::StrCat("|", absl::StrJoin(lines, "|\n|"), "|\n");
}

std::string StatsSummary(const DeviceStats& s, int device) {
  // PyTorch's table, then bucketalloc's rows: the cache, the cap and every counter.
  std::string out = TorchMemorySummary(s, device, /*abbreviated=*/false);
  const std::string rule(88, '=');
  absl::StrAppend(&out, rule, "\n");
  absl::StrAppendFormat(&out, "|%-86s|\n",
                        absl::StrCat(" bucketalloc memory summary, device ", device, "  (cap ",
                                     FormatBytes(static_cast<std::size_t>(s.capacity_bytes)), ")"));
  absl::StrAppend(&out, rule, "\n");
  absl::StrAppendFormat(&out, "| %-26s | %12s | %12s | %12s | %12s |\n", "Metric", "Cur Usage", "Peak Usage",
                        "Tot Alloc", "Tot Freed");
  absl::StrAppend(&out, std::string(88, '-'), "\n");
  auto row = [&](const std::string& label, const Stat& st) {
    auto fmt = [](std::int64_t v) { return FormatBytes(static_cast<std::size_t>(std::max<std::int64_t>(v, 0))); };
    absl::StrAppendFormat(&out, "| %-26s | %12s | %12s | %12s | %12s |\n", label, fmt(st.current), fmt(st.peak),
                          fmt(st.allocated), fmt(st.freed));
  };
  // PyTorch's order: the total, then the pools from the last (large) to the first (small).
  row("cached_bytes", s.cached_bytes[kAllPools]);
  for (int p = kNumPoolIndices - 1; p > kAllPools; --p) {
    row(absl::StrCat("  from ", kPoolNames[p].label), s.cached_bytes[p]);
  }
  absl::StrAppend(&out, std::string(88, '-'), "\n");
#define BUCKETALLOC_SUMMARY_COUNTER(name, doc) absl::StrAppendFormat(&out, "| %-26s | %57d |\n", #name, s.name);
  BUCKETALLOC_COUNTERS(BUCKETALLOC_SUMMARY_COUNTER)
#undef BUCKETALLOC_SUMMARY_COUNTER
  absl::StrAppend(&out, rule, "\n");
  return out;
}

}  // namespace bucketalloc
