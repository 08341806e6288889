// src/frontend/options.cc — the one option table: parsing, validation, the docs table and the
// debug dump all come from kOptionTable below.
#include "bucketalloc/options.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <span>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "internal/bits.h"

namespace bucketalloc {
namespace {

using internal::IsPowerOfTwo;

struct OptionSpec {
  const char* name;
  const char* accepted;  // what values are accepted, for errors and docs
  const char* meaning;
  absl::Status (*parse)(absl::string_view value, Options& o);
  std::string (*format)(const Options& o);
};

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view accepted,
                      absl::string_view why = "") {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", key, "': bad value '", value,
                                                 "'", why.empty() ? "" : absl::StrCat(" (", why, ")"),
                                                 "; accepted: ", accepted));
}

std::string FormatSize(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  for (auto [unit, name] : {std::pair{kGiB, "GiB"}, std::pair{kMiB, "MiB"}, std::pair{kKiB, "KiB"}}) {
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, name);
  }
  return absl::StrCat(bytes);
}

std::string FormatMiB(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  return absl::StrCat(bytes / kMiB);
}

absl::StatusOr<double> ParseDouble(absl::string_view v) {
  double d;
  if (!absl::SimpleAtod(v, &d) || !std::isfinite(d)) return absl::InvalidArgumentError("not a number");
  return d;
}

absl::StatusOr<std::int64_t> ParseInt(absl::string_view v) {
  std::int64_t i;
  if (!absl::SimpleAtoi(v, &i)) return absl::InvalidArgumentError("not an integer");
  return i;
}

absl::StatusOr<bool> ParseBool(absl::string_view v) {
  const std::string l = absl::AsciiStrToLower(v);
  if (l == "true" || l == "1") return true;
  if (l == "false" || l == "0") return false;
  return absl::InvalidArgumentError("not a boolean");
}

// "[a,b,c]" -> {"a","b","c"}; a bare value is a one-element list.
std::vector<absl::string_view> ListItems(absl::string_view v) {
  if (absl::ConsumePrefix(&v, "[") && !absl::ConsumeSuffix(&v, "]")) return {};
  std::vector<absl::string_view> items;
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    items.push_back(absl::StripAsciiWhitespace(item));
  }
  return items;
}

// A size in MB as PyTorch's *_mb keys take it, or "unlimited" where allowed.
absl::StatusOr<std::size_t> ParseMiB(absl::string_view v) {
  if (absl::AsciiStrToLower(v) == "unlimited") return kUnlimited;
  absl::StatusOr<std::int64_t> mb = ParseInt(v);
  if (!mb.ok() || *mb < 0 || *mb > (std::int64_t{1} << 26)) {
    return absl::InvalidArgumentError("not a whole number of MiB in [0, 2^26]");
  }
  return static_cast<std::size_t>(*mb) * kMiB;
}

template <typename T>
std::string JoinList(const std::vector<T>& v, std::string (*fmt)(T)) {
  std::vector<std::string> parts;
  for (const T& x : v) parts.push_back(fmt(x));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

// PyTorch's roundup_power2_divisions: "N" for every interval, or "[256:1,512:2,>:8]" where each
// key is the start of a power-of-two interval in MB and ">" covers the intervals after the last.
absl::Status ParseDivisions(absl::string_view v, Options& o) {
  constexpr const char* kAccepted =
      "a power of two or 0 for every interval, or a list like [256:1,512:2,1024:4,>:8] whose keys "
      "are power-of-two MB interval starts (ascending) or '>' and whose values are powers of two or 0";
  auto division = [&](absl::string_view text) -> absl::StatusOr<std::uint32_t> {
    absl::StatusOr<std::int64_t> d = ParseInt(text);
    if (!d.ok() || *d < 0 || *d > 1024 || (*d != 0 && !IsPowerOfTwo(static_cast<std::size_t>(*d)))) {
      return BadValue("roundup_power2_divisions", v, kAccepted);
    }
    return static_cast<std::uint32_t>(*d);
  };
  std::vector<std::uint32_t> divs(16, 0);
  if (!absl::StartsWith(v, "[")) {
    absl::StatusOr<std::uint32_t> d = division(v);
    if (!d.ok()) return d.status();
    std::fill(divs.begin(), divs.end(), *d);
    o.roundup_power2_divisions = divs;
    return absl::OkStatus();
  }
  std::vector<absl::string_view> items = ListItems(v);
  if (items.empty()) return BadValue("roundup_power2_divisions", v, kAccepted);
  int next = 0;  // first interval not yet set
  for (absl::string_view item : items) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    absl::StatusOr<std::uint32_t> d = division(absl::StripAsciiWhitespace(kv.second));
    if (!d.ok()) return d.status();
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    int last;
    if (key == ">") {
      last = 15;
    } else {
      absl::StatusOr<std::int64_t> mb = ParseInt(key);
      if (!mb.ok() || *mb <= 0 || !IsPowerOfTwo(static_cast<std::size_t>(*mb))) {
        return BadValue("roundup_power2_divisions", v, kAccepted, absl::StrCat("bad interval '", key, "'"));
      }
      last = std::min(internal::Log2Floor(static_cast<std::size_t>(*mb)), 15);
      if (last < next) {
        return BadValue("roundup_power2_divisions", v, kAccepted, "interval keys must ascend");
      }
    }
    for (int i = next; i <= last; ++i) divs[i] = *d;
    next = last + 1;
  }
  o.roundup_power2_divisions = divs;
  return absl::OkStatus();
}

std::string FormatDivisions(const Options& o) {
  const auto& d = o.roundup_power2_divisions;
  if (std::all_of(d.begin(), d.end(), [&](std::uint32_t x) { return x == d[0]; })) {
    return absl::StrCat(d.empty() ? 0 : d[0]);
  }
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < d.size(); ++i) {
    parts.push_back(i + 1 == d.size() ? absl::StrCat(">:", d[i])
                                      : absl::StrCat(std::size_t{1} << i, ":", d[i]));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

#define SIZE_OPTION(field, key)                                                        \
  [](absl::string_view v, Options& o) -> absl::Status {                                 \
    absl::StatusOr<std::size_t> s = ParseSize(v);                                      \
    if (!s.ok()) return BadValue(key, v, "a size in bytes or with KiB/MiB/GiB, e.g. 16GiB"); \
    o.field = *s;                                                                      \
    return absl::OkStatus();                                                           \
  },                                                                                   \
      [](const Options& o) { return FormatSize(o.field); }

#define MIB_OPTION(field, key, accepted)                         \
  [](absl::string_view v, Options& o) -> absl::Status {          \
    absl::StatusOr<std::size_t> s = ParseMiB(v);                \
    if (!s.ok()) return BadValue(key, v, accepted);             \
    o.field = *s;                                               \
    return absl::OkStatus();                                    \
  },                                                            \
      [](const Options& o) { return FormatMiB(o.field); }

#define DOUBLE_OPTION(field, key, accepted)                      \
  [](absl::string_view v, Options& o) -> absl::Status {          \
    absl::StatusOr<double> d = ParseDouble(v);                  \
    if (!d.ok()) return BadValue(key, v, accepted);             \
    o.field = *d;                                               \
    return absl::OkStatus();                                    \
  },                                                            \
      [](const Options& o) { return absl::StrCat(o.field); }

#define INT_OPTION(field, key, accepted)                         \
  [](absl::string_view v, Options& o) -> absl::Status {          \
    absl::StatusOr<std::int64_t> i = ParseInt(v);               \
    if (!i.ok() || *i < 0) return BadValue(key, v, accepted);   \
    o.field = static_cast<decltype(o.field)>(*i);               \
    return absl::OkStatus();                                    \
  },                                                            \
      [](const Options& o) { return absl::StrCat(o.field); }

#define BOOL_OPTION(field, key)                                          \
  [](absl::string_view v, Options& o) -> absl::Status {                  \
    absl::StatusOr<bool> b = ParseBool(v);                              \
    if (!b.ok()) return BadValue(key, v, "true or false (also 1 or 0)"); \
    o.field = *b;                                                       \
    return absl::OkStatus();                                            \
  },                                                                    \
      [](const Options& o) { return std::string(o.field ? "true" : "false"); }

// The option table. Order is the order of the docs and of the dump.
const OptionSpec kOptionTable[] = {
    {"backend", "sim, cuda or vmm",
     "where memory comes from: the simulated device (CPU), cudaMalloc, or CUDA virtual memory with "
     "stitching (docs/vmm.md)",
     [](absl::string_view v, Options& o) -> absl::Status {
       if (v == "sim") o.backend = BackendKind::kSim;
       else if (v == "cuda") o.backend = BackendKind::kCuda;
       else if (v == "vmm") o.backend = BackendKind::kVmm;
       else return BadValue("backend", v, "sim, cuda or vmm");
       return absl::OkStatus();
     },
     [](const Options& o) { return std::string(BackendName(o.backend)); }},
    {"expandable_segments", "true or false (also True, 1, 0)",
     "stitch large blocks from physical granules (PyTorch's key): on cuda it selects the vmm backend, on "
     "sim the simulated device's virtual memory; implied by backend:vmm",
     BOOL_OPTION(expandable_segments, "expandable_segments")},
    {"capacity", "a size (bytes, KiB, MiB, GiB); 0 = the device's memory",
     "per-device cap on reserved memory", SIZE_OPTION(capacity, "capacity")},
    {"memory_fraction", "a number in (0, 1]",
     "per-device cap as a fraction of the device's memory (the smaller cap wins); "
     "PyTorch's set_per_process_memory_fraction",
     DOUBLE_OPTION(memory_fraction, "memory_fraction", "a number in (0, 1]")},
    {"garbage_collection_threshold", "0 (off) or a number in (0, 1)",
     "when reserved memory exceeds threshold x cap, release cached segments, oldest first, before "
     "growing (PyTorch's key)",
     DOUBLE_OPTION(garbage_collection_threshold, "garbage_collection_threshold",
                   "0 (off) or a number in (0, 1)")},
    {"small_pool_limit", "a size from 512 to 1MiB",
     "requests up to this size go to the small pool (size classes packed in 2 MiB slabs)",
     SIZE_OPTION(small_pool_limit, "small_pool_limit")},
    {"max_split_size_mb", "a whole number of MiB >= 20, or unlimited",
     "free blocks larger than this are never split and serve only requests within "
     "max_non_split_rounding_mb of their size (PyTorch's key)",
     MIB_OPTION(max_split_size, "max_split_size_mb", "a whole number of MiB >= 20, or unlimited")},
    {"max_non_split_rounding_mb", "a whole number of MiB",
     "how much larger than a request an unsplittable block may be, inclusive (PyTorch's key)",
     MIB_OPTION(max_non_split_rounding, "max_non_split_rounding_mb", "a whole number of MiB")},
    {"large_segment_size_mb", "an even whole number of MiB >= 2",
     "segment size for large requests under 10 MiB, which share it by splitting (PyTorch's key)",
     MIB_OPTION(large_segment_size, "large_segment_size_mb", "an even whole number of MiB >= 2")},
    {"roundup_power2_divisions", "N, or [256:1,512:2,1024:4,>:8]",
     "round large requests to 1/N steps of their power-of-two interval; per interval (MB) in the "
     "list form (PyTorch's key)",
     ParseDivisions, FormatDivisions},
    {"tiers", "a list of sizes, e.g. [64MiB,128MiB,256MiB]",
     "large-pool tiers in bytes: a request within tier range rounds up to its tier and is reused "
     "from that tier's own free list",
     [](absl::string_view v, Options& o) -> absl::Status {
       constexpr const char* kAccepted = "a bracketed list of sizes, e.g. [64MiB,128MiB]";
       std::vector<std::size_t> tiers;
       for (absl::string_view item : ListItems(v)) {
         absl::StatusOr<std::size_t> s = ParseSize(item);
         if (!s.ok() || *s == 0) return BadValue("tiers", v, kAccepted, absl::StrCat("bad size '", item, "'"));
         tiers.push_back(*s);
       }
       if (tiers.empty() && v != "[]") return BadValue("tiers", v, kAccepted);
       o.tiers = std::move(tiers);
       return absl::OkStatus();
     },
     [](const Options& o) { return JoinList<std::size_t>(o.tiers, FormatSize); }},
    {"tiers_tokens", "a list of token counts, e.g. [512,1024,2048,4096]",
     "tiers as token counts; each is multiplied by bytes_per_token",
     [](absl::string_view v, Options& o) -> absl::Status {
       constexpr const char* kAccepted = "a bracketed list of positive integers, e.g. [512,1024,2048,4096]";
       std::vector<std::uint64_t> tokens;
       for (absl::string_view item : ListItems(v)) {
         absl::StatusOr<std::int64_t> t = ParseInt(item);
         if (!t.ok() || *t <= 0) return BadValue("tiers_tokens", v, kAccepted, absl::StrCat("bad count '", item, "'"));
         tokens.push_back(static_cast<std::uint64_t>(*t));
       }
       if (tokens.empty() && v != "[]") return BadValue("tiers_tokens", v, kAccepted);
       o.tiers_tokens = std::move(tokens);
       return absl::OkStatus();
     },
     [](const Options& o) {
       return JoinList<std::uint64_t>(o.tiers_tokens, [](std::uint64_t t) { return absl::StrCat(t); });
     }},
    {"bytes_per_token", "a size", "KV-cache bytes per token of the model (see docs/configuration.md)",
     SIZE_OPTION(bytes_per_token, "bytes_per_token")},
    {"tier_min_fill", "a number in (0, 1]",
     "a request rounds up to tier t only when it is at least tier_min_fill x t",
     DOUBLE_OPTION(tier_min_fill, "tier_min_fill", "a number in (0, 1]")},
    {"sim_total_memory", "a size (a multiple of 2MiB)", "memory of each simulated device",
     SIZE_OPTION(sim_total_memory, "sim_total_memory")},
    {"sim_memory", "backed or unbacked",
     "backed: real host memory that tests can write; unbacked: reserved addresses never touched",
     [](absl::string_view v, Options& o) -> absl::Status {
       if (v == "backed") o.sim_unbacked = false;
       else if (v == "unbacked") o.sim_unbacked = true;
       else return BadValue("sim_memory", v, "backed or unbacked");
       return absl::OkStatus();
     },
     [](const Options& o) { return std::string(o.sim_unbacked ? "unbacked" : "backed"); }},
    {"sim_devices", "an integer from 1 to 64", "number of simulated devices",
     INT_OPTION(sim_devices, "sim_devices", "an integer from 1 to 64")},
    {"sim_fail_nth_alloc", "an integer >= 0", "fault injection: fail the Nth backend allocation (0 = never)",
     INT_OPTION(sim_fail_nth_alloc, "sim_fail_nth_alloc", "an integer >= 0")},
    {"sim_fail_fraction", "a number in [0, 1]", "fault injection: fail this fraction of backend allocations",
     DOUBLE_OPTION(sim_fail_fraction, "sim_fail_fraction", "a number in [0, 1]")},
    {"sim_seed", "an integer >= 0", "seed of the fault injection",
     INT_OPTION(sim_seed, "sim_seed", "an integer >= 0")},
    {"probe_stream_capture", "true or false",
     "before a slow path, ask whether the allocating stream captures a CUDA graph (no cudaMalloc then)",
     BOOL_OPTION(probe_stream_capture, "probe_stream_capture")},
    {"debug_check_invariants", "true or false",
     "check every invariant after each slow-path event (always on in a debug build of the library)",
     BOOL_OPTION(debug_check_invariants, "debug_check_invariants")},
};

#undef SIZE_OPTION
#undef MIB_OPTION
#undef DOUBLE_OPTION
#undef INT_OPTION
#undef BOOL_OPTION

std::string AcceptedKeys() {
  std::vector<absl::string_view> names;
  for (const OptionSpec& spec : kOptionTable) names.push_back(spec.name);
  return absl::StrJoin(names, ", ");
}

// Splits "a:1,b:[x,y],c:2" at the commas outside brackets.
absl::StatusOr<std::vector<absl::string_view>> SplitTopLevel(absl::string_view conf) {
  std::vector<absl::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    const char c = i < conf.size() ? conf[i] : ',';
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) {
      absl::string_view part = absl::StripAsciiWhitespace(conf.substr(start, i - start));
      if (!part.empty()) parts.push_back(part);
      start = i + 1;
    }
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc options '", conf,
                                                   "': unbalanced brackets; lists are written [a,b,c]"));
  }
  return parts;
}

}  // namespace

absl::StatusOr<std::size_t> ParseSize(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  std::size_t split = 0;
  while (split < t.size() && (std::isdigit(static_cast<unsigned char>(t[split])) || t[split] == '.')) ++split;
  const absl::string_view number = t.substr(0, split);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(split)));
  double multiplier;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") multiplier = static_cast<double>(kKiB);
  else if (unit == "m" || unit == "mb" || unit == "mib") multiplier = static_cast<double>(kMiB);
  else if (unit == "g" || unit == "gb" || unit == "gib") multiplier = static_cast<double>(kGiB);
  else if (unit == "t" || unit == "tb" || unit == "tib") multiplier = static_cast<double>(kGiB) * 1024;
  else return absl::InvalidArgumentError(absl::StrCat("size '", text, "': unknown unit '", unit, "'"));
  double value;
  if (number.empty() || !absl::SimpleAtod(number, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is not a non-negative number"));
  }
  const double bytes = std::ceil(value * multiplier);
  if (bytes >= 18446744073709551615.0) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is too large"));
  }
  return static_cast<std::size_t>(bytes);
}

std::string FormatBytes(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  const double b = static_cast<double>(bytes);
  if (bytes >= kGiB) return absl::StrFormat("%.2f GiB", b / static_cast<double>(kGiB));
  if (bytes >= kMiB) return absl::StrFormat("%.2f MiB", b / static_cast<double>(kMiB));
  if (bytes >= kKiB) return absl::StrFormat("%.2f KiB", b / static_cast<double>(kKiB));
  return absl::StrCat(bytes, " B");
}

std::vector<std::size_t> Options::ResolvedTiers(std::size_t granularity) const {
  std::vector<std::size_t> out;
  if (!tiers.empty()) {
    out = tiers;
  } else {
    for (std::uint64_t t : tiers_tokens) out.push_back(static_cast<std::size_t>(t) * bytes_per_token);
  }
  for (std::size_t& t : out) t = internal::RoundUp(t, granularity);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::Status ValidateOptions(const Options& o) {
  auto bad = [](absl::string_view key, const std::string& value, absl::string_view accepted,
                absl::string_view why = "") { return BadValue(key, value, accepted, why); };
  if (!(o.memory_fraction > 0.0 && o.memory_fraction <= 1.0)) {
    return bad("memory_fraction", absl::StrCat(o.memory_fraction), "a number in (0, 1]");
  }
  if (!(o.garbage_collection_threshold == 0.0 ||
        (o.garbage_collection_threshold > 0.0 && o.garbage_collection_threshold < 1.0))) {
    return bad("garbage_collection_threshold", absl::StrCat(o.garbage_collection_threshold),
               "0 (off) or a number in (0, 1)");
  }
  if (o.small_pool_limit < 512 || o.small_pool_limit > kMiB) {
    return bad("small_pool_limit", FormatSize(o.small_pool_limit), "a size from 512 to 1MiB",
               "small blocks are packed in 2 MiB slabs, two or more per slab");
  }
  if (o.max_split_size < 20 * kMiB) {
    return bad("max_split_size_mb", FormatMiB(o.max_split_size), "a whole number of MiB >= 20, or unlimited",
               "blocks of large segments (20 MiB) must stay splittable");
  }
  if (o.large_segment_size > o.max_split_size) {
    return bad("large_segment_size_mb", FormatMiB(o.large_segment_size),
               "at most max_split_size_mb", "segments shared by requests under 10 MiB must stay splittable");
  }
  if (o.max_non_split_rounding == kUnlimited) {
    return bad("max_non_split_rounding_mb", "unlimited", "a whole number of MiB");
  }
  if (o.large_segment_size < 2 * kMiB || o.large_segment_size % (2 * kMiB) != 0 ||
      o.large_segment_size == kUnlimited) {
    return bad("large_segment_size_mb", FormatMiB(o.large_segment_size), "an even whole number of MiB >= 2");
  }
  if (o.roundup_power2_divisions.size() != 16) {
    return bad("roundup_power2_divisions", FormatDivisions(o), "16 intervals");
  }
  if (!o.tiers.empty() && !o.tiers_tokens.empty()) {
    return bad("tiers", FormatSize(o.tiers.size()), "either tiers or tiers_tokens, not both");
  }
  if (!o.tiers_tokens.empty() && o.bytes_per_token == 0) {
    return bad("bytes_per_token", "0", "a positive size", "tiers_tokens needs bytes_per_token");
  }
  for (std::size_t t : o.ResolvedTiers(1)) {
    if (t <= o.small_pool_limit || t > (std::size_t{1} << 44)) {
      return bad("tiers", FormatSize(t), "tiers larger than small_pool_limit and at most 16TiB");
    }
  }
  if (!(o.tier_min_fill > 0.0 && o.tier_min_fill <= 1.0)) {
    return bad("tier_min_fill", absl::StrCat(o.tier_min_fill), "a number in (0, 1]");
  }
  if (o.sim_total_memory == 0 || o.sim_total_memory % (2 * kMiB) != 0 ||
      o.sim_total_memory > (std::size_t{1} << 42)) {
    return bad("sim_total_memory", FormatSize(o.sim_total_memory), "a positive multiple of 2MiB up to 4TiB");
  }
  if (o.sim_devices < 1 || o.sim_devices > 64) {
    return bad("sim_devices", absl::StrCat(o.sim_devices), "an integer from 1 to 64");
  }
  if (!(o.sim_fail_fraction >= 0.0 && o.sim_fail_fraction <= 1.0)) {
    return bad("sim_fail_fraction", absl::StrCat(o.sim_fail_fraction), "a number in [0, 1]");
  }
  return absl::OkStatus();
}

absl::string_view BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kSim:
      return "sim";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kVmm:
      return "vmm";
  }
  return "unknown";
}

absl::StatusOr<Options> ParseOptions(absl::string_view conf, const Options& base) {
  Options o = base;
  absl::StatusOr<std::vector<absl::string_view>> parts = SplitTopLevel(conf);
  if (!parts.ok()) return parts.status();
  for (absl::string_view part : *parts) {
    const std::size_t colon = part.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", part,
                                                     "' has no value; write key:value"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(part.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(part.substr(colon + 1));
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : kOptionTable) {
      if (key == s.name) spec = &s;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", key,
                                                     "' (value '", value, "') is unknown; accepted keys: ",
                                                     AcceptedKeys()));
    }
    if (absl::Status s = spec->parse(value, o); !s.ok()) return s;
  }
  if (absl::Status s = ValidateOptions(o); !s.ok()) return s;
  return o;
}

absl::StatusOr<Options> OptionsFromEnv() {
  const char* conf = std::getenv("BUCKETALLOC_CONF");
  return ParseOptions(conf == nullptr ? "" : conf);
}

std::string FormatOptions(const Options& o) {
  std::vector<std::string> parts;
  for (const OptionSpec& spec : kOptionTable) parts.push_back(absl::StrCat(spec.name, ":", spec.format(o)));
  return absl::StrJoin(parts, ",");
}

std::string OptionsMarkdownTable() {
  const Options defaults;
  std::string out = "| key | accepted values | default | meaning |\n|---|---|---|---|\n";
  for (const OptionSpec& spec : kOptionTable) {
    std::string def = spec.format(defaults);
    if (absl::string_view(spec.name) == "debug_check_invariants") def = "false (always true in a debug build)";
    absl::StrAppend(&out, "| `", spec.name, "` | ", spec.accepted, " | `", def, "` | ", spec.meaning, " |\n");
  }
  return out;
}

}  // namespace bucketalloc
