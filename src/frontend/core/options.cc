// src/frontend/core/options.cc — the one option table: parsing, validation, the docs table and the
// debug dump all come from the rows of Table() below, each written once. The backends' own keys
// are rows too, taken from the backend registry. PyTorch 2.15's allocator keys are listed once in
// PyTorchKeys(): the rows that honour them, and why each of the others is refused. The environment
// (BUCKETALLOC_CONF, else PyTorch's variables) is read at the end.
#include "bucketalloc/options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "backend/registry.h"
#include "internal/bits.h"

namespace bucketalloc {
namespace {

using internal::IsPowerOfTwo;

// Why a value is not accepted: `why` (may be empty) and, when the value named in the error is not
// the row's whole value (one tier of a list), that value.
struct Problem {
  explicit Problem(std::string why = "", std::optional<std::string> value = std::nullopt)
      : why(std::move(why)), value(std::move(value)) {}
  std::string why;
  std::optional<std::string> value;
};

// One row of the option table.
struct OptionRow {
  std::string name;
  std::string accepted;  // the accepted values: every error of this key names them
  std::string meaning;
  bool device = false;  // see IsDeviceOption
  // Reads `value` into the options; an error's message says why it is not accepted (may be empty).
  std::function<absl::Status(absl::string_view value, Options& o)> parse;
  std::function<std::string(const Options& o)> format;
  // The row's validation on the whole options (ranges, combinations); nullopt when accepted.
  // Empty: every value parse accepts is valid.
  std::function<std::optional<Problem>(const Options& o)> check;
  std::string doc_default;  // the docs' default when it is not format(Options())
  // PyTorch's name of another row (alias_of), writing that row's field: not in the dump, and not
  // given together with that row's key.
  std::string alias_of;
  // When a CONF sets row `follows` and not this one, `follow` sets this row's field from it (PyTorch
  // 2.15: max_non_split_rounding_mb follows large_segment_size_mb).
  std::string follows;
  std::function<void(Options& o)> follow;
};

absl::Status BadValue(absl::string_view key, absl::string_view value, absl::string_view accepted,
                      absl::string_view why = "") {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", key, "': bad value '", value, "'",
                                                 why.empty() ? "" : absl::StrCat(" (", why, ")"),
                                                 "; accepted: ", accepted));
}

absl::Status Why(absl::string_view why = "") { return absl::InvalidArgumentError(why); }

std::string FormatMiB(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  return absl::StrCat(bytes / kMiB);
}

absl::StatusOr<double> ParseDouble(absl::string_view v) {
  double d;
  if (!absl::SimpleAtod(v, &d) || !std::isfinite(d)) return Why();
  return d;
}

absl::StatusOr<std::int64_t> ParseInt(absl::string_view v) {
  std::int64_t i;
  if (!absl::SimpleAtoi(v, &i)) return Why();
  return i;
}

absl::StatusOr<bool> ParseBool(absl::string_view v) {
  const std::string l = absl::AsciiStrToLower(v);
  if (l == "true" || l == "1") return true;
  if (l == "false" || l == "0") return false;
  return Why();
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

// A size in MB as PyTorch's *_mb keys take it, or "unlimited".
absl::StatusOr<std::size_t> ParseMiB(absl::string_view v) {
  if (absl::AsciiStrToLower(v) == "unlimited") return kUnlimited;
  absl::StatusOr<std::int64_t> mb = ParseInt(v);
  if (!mb.ok() || *mb < 0 || *mb > (std::int64_t{1} << 26)) return Why();
  return static_cast<std::size_t>(*mb) * kMiB;
}

template <typename T>
std::string JoinList(const std::vector<T>& v, std::string (*fmt)(T)) {
  std::vector<std::string> parts;
  for (const T& x : v) parts.push_back(fmt(x));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

// The largest division roundup_power2_divisions takes (PyTorch takes any power of two; one above
// an interval's size in 512-byte units rounds like it).
constexpr std::int64_t kMaxDivisions = std::int64_t{1} << 31;

// PyTorch's roundup_power2_divisions, read as torch 2.15 reads it: "N" for every interval, or a
// list "[256:1,512:2,>:8]" whose keys are interval starts in MB (powers of two: the interval
// log2(key), the last one covering everything above) or '>'. A key sets its own interval, the
// first key also every interval below it, and '>' every interval after the last key read before
// it; intervals no key reaches keep 0 (so "[1:2,64:4]" leaves 2 MB to 32 MB unrounded, as torch
// does). Keys need not ascend; a later key overrides an earlier one.
absl::Status ParseDivisions(absl::string_view v, Options& o) {
  auto division = [&](absl::string_view text) -> absl::StatusOr<std::uint32_t> {
    absl::StatusOr<std::int64_t> d = ParseInt(text);
    if (!d.ok() || *d < 0 || *d > kMaxDivisions || (*d != 0 && !IsPowerOfTwo(static_cast<std::size_t>(*d)))) {
      return Why(absl::StrCat("bad division '", text, "'"));
    }
    return static_cast<std::uint32_t>(*d);
  };
  std::vector<std::uint32_t> divs(16, 0);
  if (!absl::StartsWith(v, "[")) {
    absl::StatusOr<std::uint32_t> d = division(v);
    if (!d.ok()) return Why();
    std::fill(divs.begin(), divs.end(), *d);
    o.roundup_power2_divisions = divs;
    return absl::OkStatus();
  }
  std::vector<absl::string_view> items = ListItems(v);
  if (items.empty() && v != "[]") return Why();
  bool first = true;
  int last = 0;  // the interval of the last key read
  for (absl::string_view item : items) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    absl::StatusOr<std::uint32_t> d = division(absl::StripAsciiWhitespace(kv.second));
    if (!d.ok()) return d.status();
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    if (key == ">") {
      std::fill(divs.begin() + last + 1, divs.end(), *d);
      continue;
    }
    absl::StatusOr<std::int64_t> mb = ParseInt(key);
    if (!mb.ok() || *mb <= 0 || !IsPowerOfTwo(static_cast<std::size_t>(*mb))) {
      return Why(absl::StrCat("bad interval '", key, "'"));
    }
    const int index = std::min(internal::Log2Floor(static_cast<std::size_t>(*mb)), 15);
    if (first) std::fill(divs.begin(), divs.begin() + index, *d);
    first = false;
    divs[index] = *d;
    last = index;
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
    parts.push_back(i + 1 == d.size() ? absl::StrCat(">:", d[i]) : absl::StrCat(std::size_t{1} << i, ":", d[i]));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

// A size a row reads (its own message replaces ParseSize's).
absl::StatusOr<std::size_t> ParseSizeValue(absl::string_view v) {
  absl::StatusOr<std::size_t> s = ParseSize(v);
  if (!s.ok()) return Why();
  return *s;
}
// Exact (absl::StrCat keeps 6 digits: 0.9999999 printed as 1, which the option then refused).
std::string DoubleText(double d) { return NumberText(d); }
std::string BoolText(bool b) { return b ? "true" : "false"; }

// A field kind: how a typed field is read (an error is the row's message) and written.
template <typename T, absl::StatusOr<T> (*Parse)(absl::string_view), std::string (*Format)(T)>
struct FieldKind {
  template <T Options::*Field>
  static absl::Status Read(absl::string_view v, Options& o) {
    absl::StatusOr<T> x = Parse(v);
    if (!x.ok()) return x.status();
    o.*Field = *x;
    return absl::OkStatus();
  }
  template <T Options::*Field>
  static std::string Write(const Options& o) {
    return Format(o.*Field);
  }
};
using SizeKind = FieldKind<std::size_t, ParseSizeValue, SizeText>;  // bytes: "16GiB", "1000"
using MiBKind = FieldKind<std::size_t, ParseMiB, FormatMiB>;        // PyTorch's *_mb keys
using DoubleKind = FieldKind<double, ParseDouble, DoubleText>;
using BoolKind = FieldKind<bool, ParseBool, BoolText>;
template <std::size_t Options::*F>
constexpr auto SizeField = &SizeKind::Read<F>;
template <std::size_t Options::*F>
constexpr auto FormatSizeField = &SizeKind::Write<F>;
template <std::size_t Options::*F>
constexpr auto MiBField = &MiBKind::Read<F>;
template <std::size_t Options::*F>
constexpr auto FormatMiBField = &MiBKind::Write<F>;
template <double Options::*F>
constexpr auto DoubleField = &DoubleKind::Read<F>;
template <double Options::*F>
constexpr auto FormatDoubleField = &DoubleKind::Write<F>;
template <bool Options::*F>
constexpr auto BoolField = &BoolKind::Read<F>;
template <bool Options::*F>
constexpr auto FormatBoolField = &BoolKind::Write<F>;

// A check that accepts the field when `ok(value)` holds.
template <typename T, T Options::*Field>
std::function<std::optional<Problem>(const Options&)> Require(bool (*ok)(T), const char* why = "") {
  return [ok, why](const Options& o) -> std::optional<Problem> {
    if (ok(o.*Field)) return std::nullopt;
    return Problem(why);
  };
}

using ParseFn = std::function<absl::Status(absl::string_view, Options&)>;
using FormatFn = std::function<std::string(const Options&)>;
using CheckFn = std::function<std::optional<Problem>(const Options&)>;

// A front-end row (see OptionRow).
OptionRow Row(std::string name, std::string accepted, std::string meaning, bool device, ParseFn parse, FormatFn format,
              CheckFn check = nullptr, std::string doc_default = "") {
  return OptionRow{std::move(name),  std::move(accepted), std::move(meaning), device,
                   std::move(parse), std::move(format),   std::move(check),   std::move(doc_default),
                   /*alias_of=*/"",  /*follows=*/"",      /*follow=*/nullptr};
}

// The row of a key a backend owns: the value lives in backend_settings, canonical.
OptionRow BackendRow(const internal::BackendOptionSpec& spec) {
  OptionRow row;
  row.name = spec.name;
  row.accepted = spec.accepted;
  row.meaning = spec.meaning;
  row.device = true;
  row.parse = [&spec](absl::string_view v, Options& o) -> absl::Status {
    absl::StatusOr<std::string> canonical = spec.parse(v);
    if (!canonical.ok()) return Why();
    o.backend_settings[spec.name] = *canonical;
    return absl::OkStatus();
  };  // the range is checked with the other rows, once everything is parsed
  row.format = [&spec](const Options& o) {
    auto it = o.backend_settings.find(spec.name);
    return it == o.backend_settings.end() ? std::string(spec.default_value) : it->second;
  };
  row.check = [&spec](const Options& o) -> std::optional<Problem> {
    auto it = o.backend_settings.find(spec.name);
    if (it == o.backend_settings.end()) return std::nullopt;
    absl::StatusOr<std::string> canonical = spec.parse(it->second);
    if (canonical.ok() && (spec.valid == nullptr || spec.valid(*canonical))) return std::nullopt;
    return Problem();
  };
  return row;
}

// Why backend:cudaMallocAsync is refused (the backend row's error and PyTorch's key table).
constexpr const char* kCudaMallocAsyncWhy =
    "PyTorch's cudaMallocAsync backend hands every allocation to CUDA's stream-ordered pool instead of a caching "
    "allocator, and bucketalloc is the caching allocator: use native (cuda), or remove the key";

// The option table. Order is the order of the docs, the dump and validation.
std::vector<OptionRow> MakeTable() {
  std::vector<OptionRow> t;
  t.push_back(Row(
      "backend", absl::StrCat(internal::BackendNamesText(), " (PyTorch's native: cuda)"),
      "where memory comes from: the simulated device (CPU), cudaMalloc, or CUDA virtual memory with "
      "stitching (docs/vmm.md); PyTorch's cudaMallocAsync is refused (docs/configuration.md, \"PyTorch's "
      "variables\")",
      true,
      [](absl::string_view v, Options& o) -> absl::Status {
        if (v == "native") v = "cuda";  // PyTorch's caching allocator: bucketalloc's default backend
        if (v == "cudaMallocAsync") return Why(kCudaMallocAsyncWhy);
        if (internal::FindBackend(v) == nullptr) return Why();
        o.backend = std::string(v);
        return absl::OkStatus();
      },
      [](const Options& o) { return o.backend; },
      [](const Options& o) -> std::optional<Problem> {
        if (internal::FindBackend(o.backend) != nullptr) return std::nullopt;
        return Problem();
      }));
  t.push_back(Row("expandable_segments", "true or false (also True, 1, 0)",
                  "stitch large blocks from physical granules (PyTorch's key): on cuda it selects the vmm backend, on "
                  "sim the simulated device's virtual memory; implied by backend:vmm",
                  false, BoolField<&Options::expandable_segments>, FormatBoolField<&Options::expandable_segments>));
  t.push_back(Row("grow_piece_mb", "an even whole number of MiB from 2 to 1024",
                  "with stitching, the physical pieces a grow creates while it is not at the cap (granules at the "
                  "cap): larger pieces, fewer driver calls on the request's path and more memory at the cap (free "
                  "bytes beside a live block in a piece cannot move); 2 (the default) creates granules always "
                  "(docs/vmm.md, \"What a piece is\")",
                  false, MiBField<&Options::grow_piece>, FormatMiBField<&Options::grow_piece>,
                  Require<std::size_t, &Options::grow_piece>(
                      [](std::size_t p) { return p >= 2 * kMiB && p <= 1024 * kMiB && p % (2 * kMiB) == 0; })));
  t.push_back(Row("capacity", "0 (the device's memory) or a size of at least 2MiB (bytes, KiB, MiB, GiB)",
                  "per-device cap on reserved memory", true, SizeField<&Options::capacity>,
                  FormatSizeField<&Options::capacity>,
                  Require<std::size_t, &Options::capacity>([](std::size_t c) { return c == 0 || c >= 2 * kMiB; })));
  t.push_back(Row("memory_fraction", "a number in (0, 1]",
                  "per-device cap as a fraction of the device's memory (the smaller cap wins); "
                  "PyTorch's set_per_process_memory_fraction",
                  true, DoubleField<&Options::memory_fraction>, FormatDoubleField<&Options::memory_fraction>,
                  [](const Options& o) -> std::optional<Problem> {
                    if (o.memory_fraction > 0.0 && o.memory_fraction <= 1.0) return std::nullopt;
                    return Problem(o.memory_fraction == 0.0 ? "a cap of 0 would refuse every allocation" : "");
                  }));
  t.push_back(Row("per_process_memory_fraction", "a number in (0, 1]; not with memory_fraction",
                  "PyTorch's name of memory_fraction: the cap of every device as a fraction of its memory", true,
                  DoubleField<&Options::memory_fraction>, FormatDoubleField<&Options::memory_fraction>));
  t.back().alias_of = "memory_fraction";
  t.push_back(Row("throw_on_cudamalloc_oom", "True or False (also true, false, 1, 0)",
                  "PyTorch's key: growth past the cap is always refused before the device is asked (each "
                  "refusal counted in num_oom_rejections); with True such a refusal fails the request at once, "
                  "without releasing the cache and retrying (an OOM with bucketalloc's report, counted in num_ooms "
                  "too); with False the cache is released and the request retried once first",
                  false, BoolField<&Options::throw_on_cudamalloc_oom>,
                  FormatBoolField<&Options::throw_on_cudamalloc_oom>));
  t.push_back(Row("garbage_collection_threshold", "0 (off) or a number in (0, 1)",
                  "when reserved memory exceeds threshold x cap, release cached segments, oldest first, before "
                  "growing (PyTorch's key)",
                  false, DoubleField<&Options::garbage_collection_threshold>,
                  FormatDoubleField<&Options::garbage_collection_threshold>,
                  Require<double, &Options::garbage_collection_threshold>(
                      [](double g) { return g == 0.0 || (g > 0.0 && g < 1.0); })));
  t.push_back(
      Row("small_pool_limit", "a size from 512 to 1MiB",
          "requests up to this size go to the small pool (2 MiB slabs up to slab_limit, the rest packed in 2 MiB "
          "segments)",
          false, SizeField<&Options::small_pool_limit>, FormatSizeField<&Options::small_pool_limit>,
          Require<std::size_t, &Options::small_pool_limit>(
              [](std::size_t s) { return s >= 512 && s <= kMiB; },
              "small blocks are packed in 2 MiB slabs, two or more per slab")));
  t.push_back(
      Row("slab_limit", "0 or a size from 512 to 1MiB",
          "small requests up to this size go to slabs of one size class each; those above it (up to "
          "small_pool_limit) are packed as PyTorch packs its small pool: 2 MiB segments, best fit, split "
          "down to 512 B (0: no slabs)",
          false, SizeField<&Options::slab_limit>, FormatSizeField<&Options::slab_limit>,
          Require<std::size_t, &Options::slab_limit>([](std::size_t s) { return s == 0 || (s >= 512 && s <= kMiB); },
                                                     "slabs serve sizes from 512 B to 1 MiB")));
  t.push_back(Row("max_split_size_mb", "a whole number of MiB >= large_segment_size_mb (20 by default), or unlimited",
                  "free blocks larger than this are never split and serve only requests within "
                  "max_non_split_rounding_mb of their size (PyTorch's key)",
                  false, MiBField<&Options::max_split_size>, FormatMiBField<&Options::max_split_size>,
                  [](const Options& o) -> std::optional<Problem> {
                    if (o.max_split_size >= o.large_segment_size) return std::nullopt;
                    return Problem("segments shared by requests under 10 MiB must stay splittable");
                  }));
  t.push_back(
      Row("max_non_split_rounding_mb", "a whole number of MiB",
          "how much larger than a request an unsplittable block may be, inclusive (PyTorch's key; a CONF "
          "that sets large_segment_size_mb and not this key sets it to large_segment_size_mb, as PyTorch "
          "2.15 does)",
          false, MiBField<&Options::max_non_split_rounding>, FormatMiBField<&Options::max_non_split_rounding>,
          Require<std::size_t, &Options::max_non_split_rounding>([](std::size_t s) { return s != kUnlimited; })));
  t.back().follows = "large_segment_size_mb";
  t.back().follow = [](Options& o) { o.max_non_split_rounding = o.large_segment_size; };
  t.push_back(Row("large_segment_size_mb", "an even whole number of MiB >= 2",
                  "segment size for large requests under 10 MiB, which share it by splitting (PyTorch's key)", false,
                  MiBField<&Options::large_segment_size>, FormatMiBField<&Options::large_segment_size>,
                  [](const Options& o) -> std::optional<Problem> {
                    const std::size_t s = o.large_segment_size;
                    if (s < 2 * kMiB || s % (2 * kMiB) != 0 || s == kUnlimited) return Problem();
                    return std::nullopt;
                  }));
  t.push_back(Row("roundup_power2_divisions",
                  "N, or [256:1,512:2,1024:4,>:8]: N and the divisions 0 or powers of two up to 2^31, the keys "
                  "interval starts in MB (powers of two) or '>'",
                  "round large requests to 1/N steps of their power-of-two interval; in the list form a key sets "
                  "its interval, the first key also those below it, '>' those after the last key (PyTorch's key, "
                  "read as torch reads it)",
                  false, ParseDivisions, FormatDivisions, [](const Options& o) -> std::optional<Problem> {
                    if (o.roundup_power2_divisions.size() == 16) return std::nullopt;
                    return Problem("16 intervals");
                  }));
  t.push_back(Row(
      "tiers",
      "a list of sizes, e.g. [64MiB,128MiB,256MiB], each larger than small_pool_limit and at "
      "most 16TiB; not with tiers_tokens",
      "large-pool tiers in bytes: a request within tier range rounds up to its tier and is reused "
      "from that tier's own free list",
      false,
      [](absl::string_view v, Options& o) -> absl::Status {
        std::vector<std::size_t> tiers;
        for (absl::string_view item : ListItems(v)) {
          absl::StatusOr<std::size_t> s = ParseSize(item);
          if (!s.ok() || *s == 0) return Why(absl::StrCat("bad size '", item, "'"));
          tiers.push_back(*s);
        }
        if (tiers.empty() && v != "[]") return Why();
        o.tiers = std::move(tiers);
        return absl::OkStatus();
      },
      [](const Options& o) { return JoinList<std::size_t>(o.tiers, SizeText); },
      [](const Options& o) -> std::optional<Problem> {
        if (!o.tiers.empty() && !o.tiers_tokens.empty()) return Problem("either tiers or tiers_tokens, not both");
        if (o.tiers.empty() && o.bytes_per_token == 0) return std::nullopt;  // bytes_per_token's row says so
        for (std::size_t t : o.ResolvedTiers(1)) {
          if (t <= o.small_pool_limit || t > (std::size_t{1} << 44)) {
            return Problem(o.tiers.empty() ? "tiers_tokens x bytes_per_token" : "", SizeText(t));
          }
        }
        return std::nullopt;
      }));
  t.push_back(Row(
      "tiers_tokens", "a list of positive token counts, e.g. [512,1024,2048,4096]",
      "tiers as token counts; each is multiplied by bytes_per_token", false,
      [](absl::string_view v, Options& o) -> absl::Status {
        std::vector<std::uint64_t> tokens;
        for (absl::string_view item : ListItems(v)) {
          absl::StatusOr<std::int64_t> n = ParseInt(item);
          if (!n.ok() || *n <= 0) return Why(absl::StrCat("bad count '", item, "'"));
          tokens.push_back(static_cast<std::uint64_t>(*n));
        }
        if (tokens.empty() && v != "[]") return Why();
        o.tiers_tokens = std::move(tokens);
        return absl::OkStatus();
      },
      [](const Options& o) {
        return JoinList<std::uint64_t>(o.tiers_tokens, [](std::uint64_t n) { return absl::StrCat(n); });
      }));
  t.push_back(Row("bytes_per_token", "a size; positive when tiers_tokens is set",
                  "KV-cache bytes per token of the model (see docs/configuration.md)", false,
                  SizeField<&Options::bytes_per_token>, FormatSizeField<&Options::bytes_per_token>,
                  [](const Options& o) -> std::optional<Problem> {
                    if (o.tiers_tokens.empty() || o.bytes_per_token > 0) return std::nullopt;
                    return Problem("tiers_tokens needs bytes_per_token");
                  }));
  t.push_back(Row("tier_min_fill", "a number in (0, 1]",
                  "a request rounds up to tier t only when it is at least tier_min_fill x t", false,
                  DoubleField<&Options::tier_min_fill>, FormatDoubleField<&Options::tier_min_fill>,
                  Require<double, &Options::tier_min_fill>([](double f) { return f > 0.0 && f <= 1.0; })));
  t.push_back(Row(
      "tenants",
      "a list of NAME:SIZE, e.g. [short:20GiB,long:40GiB]: names of 1 to 32 letters, digits, '_', '-' or '.', "
      "unique and not 'default', sizes of at least 2MiB; at most 64 tenants",
      "tenants, each with its own pools, cap on reserved memory and stats; streams and threads are bound to "
      "them (bucketalloc_bind_stream, bucketalloc_set_thread_tenant); the rest goes to the default tenant",
      false,
      [](absl::string_view v, Options& o) -> absl::Status {
        std::vector<TenantSpec> tenants;
        for (absl::string_view item : ListItems(v)) {
          const std::size_t colon = item.rfind(':');
          if (colon == absl::string_view::npos) return Why(absl::StrCat("'", item, "' is not NAME:SIZE"));
          absl::StatusOr<std::size_t> cap = ParseSize(item.substr(colon + 1));
          if (!cap.ok()) return Why(absl::StrCat("bad size in '", item, "'"));
          tenants.push_back({std::string(item.substr(0, colon)), *cap});
        }
        if (tenants.empty() && v != "[]") return Why();
        o.tenants = std::move(tenants);
        return absl::OkStatus();
      },
      [](const Options& o) {
        std::vector<std::string> parts;
        for (const TenantSpec& t : o.tenants) parts.push_back(absl::StrCat(t.name, ":", SizeText(t.cap)));
        return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
      },
      [](const Options& o) -> std::optional<Problem> {
        if (o.tenants.size() > static_cast<std::size_t>(kMaxTenants)) return Problem("more than 64 tenants");
        for (std::size_t i = 0; i < o.tenants.size(); ++i) {
          const TenantSpec& t = o.tenants[i];
          const bool name_ok =
              !t.name.empty() && t.name.size() <= 32 && t.name != "default" &&
              std::all_of(t.name.begin(), t.name.end(), [](char c) {
                return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
              });
          if (!name_ok) return Problem("a bad tenant name", absl::StrCat("'", t.name, "'"));
          for (std::size_t j = 0; j < i; ++j) {
            if (o.tenants[j].name == t.name) return Problem("a tenant named twice", t.name);
          }
          if (!TenantCapInRange(t.cap)) {
            return Problem(absl::StrCat("tenant ", t.name, "'s cap"), SizeText(t.cap));
          }
        }
        return std::nullopt;
      }));
  for (const internal::BackendEntry* backend : internal::Backends()) {
    for (const internal::BackendOptionSpec& spec : backend->options) t.push_back(BackendRow(spec));
  }
  t.push_back(Row("probe_stream_capture", "true or false (also 1 or 0)",
                  "before a slow path, ask whether the allocating stream captures a CUDA graph (no cudaMalloc then)",
                  false, BoolField<&Options::probe_stream_capture>, FormatBoolField<&Options::probe_stream_capture>));
  t.push_back(Row("debug_check_invariants", "true or false (also 1 or 0)",
                  "check every invariant after each slow-path event (always on in a debug build of the library)", false,
                  BoolField<&Options::debug_check_invariants>, FormatBoolField<&Options::debug_check_invariants>,
                  nullptr, "false (always true in a debug build)"));
  return t;
}

const std::vector<OptionRow>& Table() {
  static const std::vector<OptionRow>* const table = new std::vector<OptionRow>(MakeTable());
  return *table;
}

const OptionRow* FindRow(absl::string_view key) {
  for (const OptionRow& row : Table()) {
    if (key == row.name) return &row;
  }
  return nullptr;
}

std::string AcceptedKeys() {
  std::vector<absl::string_view> names;
  for (const OptionRow& row : Table()) names.push_back(row.name);
  return absl::StrJoin(names, ", ");
}

// What bucketalloc does with one of PyTorch 2.15's allocator keys.
enum class PyTorchKeyUse {
  kOption,      // a row of the option table (the same name): parsed and validated there
  kFalseOnly,   // not an option: False (PyTorch's default) is what bucketalloc does; True is refused
  kRefused,     // refused by name with the reason
  kHostMemory,  // torch's pinned host-memory allocator's: skipped in a PyTorch variable (torch reads it
                // there), refused in bucketalloc's own CONF
};

// One of PyTorch 2.15's allocator keys: what bucketalloc does with it (`status`, for the docs) and
// `why`: for an option, where bucketalloc's values or meaning differ from PyTorch's; for the
// others, the reason of the refusal (of True, for kFalseOnly).
struct PyTorchKey {
  const char* name;
  PyTorchKeyUse use;
  const char* status;
  const char* why;
};

constexpr const char* kHostMemoryWhy =
    "a setting of torch's pinned (page-locked host) memory allocator; bucketalloc manages device memory only: set "
    "it in PYTORCH_ALLOC_CONF, where torch reads it (bucketalloc skips it there)";
constexpr const char* kReserveWhy =
    "bucketalloc sizes its virtual-memory address space itself: each stream's segment is a range of the cap's size, "
    "carved with the others from a few reservations of 1 1/4 x the cap (docs/vmm.md, \"Address space\"), so there "
    "is no reserve to size: remove the key";
constexpr const char* kReleaseLockWhy =
    "bucketalloc holds its device lock while the backend allocates (PyTorch's False); releasing it around the call "
    "is not implemented";

// PyTorch 2.15's keys, in torch's order: the common ones (c10/core/AllocatorConfig.cpp), then the
// CUDA ones (c10/cuda/CUDAAllocatorConfig.cpp; torch also takes the ROCm spellings there).
const std::vector<PyTorchKey>& PyTorchKeys() {
  using enum PyTorchKeyUse;
  static const std::vector<PyTorchKey>* const keys = new std::vector<PyTorchKey>{
      {"large_segment_size_mb", kOption, "honoured",
       "PyTorch takes a whole number above 10; bucketalloc an even one of at least 2 (segments are whole 2 MiB "
       "granules): an odd size is refused, 2 to 10 are bucketalloc's own"},
      {"max_split_size_mb", kOption, "honoured; admits more cached blocks",
       "the same limit (at least large_segment_size_mb); unlimited is bucketalloc's own spelling of the default. "
       "bucketalloc admits more cached blocks (src/pool/large_pool.h): a block of exactly this size serves smaller "
       "requests, split, and a larger one serves any request within max_non_split_rounding_mb of its size, where "
       "PyTorch serves only requests of at least this size"},
      {"max_non_split_rounding_mb", kOption, "honoured; inclusive",
       "the same default (20, or large_segment_size_mb when a CONF sets that and not this); PyTorch takes at least "
       "large_segment_size_mb, bucketalloc also smaller values (0: exact fits only). Inclusive here: a block exactly "
       "this much larger serves, in PyTorch it does not"},
      {"garbage_collection_threshold", kOption, "honoured; also without a fraction",
       "the same range, (0, 1); 0 (off, the default) is bucketalloc's own spelling. PyTorch collects only when a "
       "memory fraction is set; bucketalloc collects against its cap, the device's memory when none is"},
      {"roundup_power2_divisions", kOption, "honoured",
       "the same syntax and reading (a list key sets its own interval, the first key also those below it, '>' "
       "those after the last key); bucketalloc also takes N = 0 (off) and refuses divisions above 2^31"},
      {"expandable_segments", kOption, "honoured by stitching",
       "True turns on virtual-memory stitching (docs/vmm.md), bucketalloc's answer to the fragmentation PyTorch's "
       "growing segments address; PyTorch takes only True and False, bucketalloc also true, false, 1 and 0"},
      {"pinned_use_background_threads", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_max_round_threshold_mb", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_max_cached_size_mb", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"backend", kOption, "native honoured, cudaMallocAsync refused",
       "native is bucketalloc's default backend (cuda; vmm with expandable_segments:True). cudaMallocAsync: "
       "refused, since PyTorch's cudaMallocAsync backend hands every allocation to CUDA's stream-ordered pool "
       "instead of a caching allocator, and bucketalloc is the caching allocator"},
      {"release_lock_on_cudamalloc", kFalseOnly, "False only", kReleaseLockWhy},
      {"release_lock_on_hipmalloc", kFalseOnly, "False only", kReleaseLockWhy},
      {"pinned_use_cuda_host_register", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_use_hip_host_register", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_num_register_threads", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_reserve_segment_size_mb", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"pinned_free_catch_all", kHostMemory, "left to torch (host memory)", kHostMemoryWhy},
      {"graph_capture_record_stream_reuse", kFalseOnly, "False only",
       "a block used on other streams and freed during a capture waits, without events, until the capture ends "
       "(PyTorch's False; docs/architecture.md, \"CUDA graph capture\"); reuse decided by the graph's topology is "
       "not implemented"},
      {"per_process_memory_fraction", kOption, "honoured",
       "the cap memory_fraction sets (give one of the two); PyTorch's 0 is refused, since it would refuse every "
       "allocation"},
      {"throw_on_cudamalloc_oom", kOption, "honoured",
       "True: growth the cap refuses fails at once, without releasing the cache and retrying; bucketalloc counts "
       "every refusal in num_oom_rejections (PyTorch only with True) and the failure in num_ooms too, with its OOM "
       "report; the native allocator calls PyTorch's OOM-rejection observers"},
      {"expandable_segments_reserve", kRefused, "refused", kReserveWhy},
      {"expandable_segments_reserve_by_class", kRefused, "refused", kReserveWhy},
  };
  return *keys;
}

// PyTorch's key `key`, or nullptr. A pinned_* key PyTorch 2.15 does not have is taken as a host
// setting too (torch's naming rule: "pinned_" belongs to the host allocator).
const PyTorchKey* FindPyTorchKey(absl::string_view key) {
  for (const PyTorchKey& k : PyTorchKeys()) {
    if (key == k.name) return &k;
  }
  static const PyTorchKey kOtherPinned{"pinned_*", PyTorchKeyUse::kHostMemory, "", kHostMemoryWhy};
  return absl::StartsWith(key, "pinned_") ? &kOtherPinned : nullptr;
}

// Which CONF is read: bucketalloc's own (BUCKETALLOC_CONF, bucketalloc_configure, ParseOptions),
// or one of PyTorch's variables.
enum class ConfKind { kBucketalloc, kPyTorch };

// Takes setting `s` of PyTorch's key `k` that is not an option: OK for a False-only key at False
// and for a host setting in a PyTorch variable (named in `skipped`); else the refusal.
absl::Status TakePyTorchKey(const PyTorchKey& k, const OptionSetting& s, ConfKind kind,
                            std::vector<std::string>* skipped) {
  switch (k.use) {
    case PyTorchKeyUse::kHostMemory:
      if (kind == ConfKind::kPyTorch) {
        if (skipped != nullptr) skipped->push_back(s.key);
        return absl::OkStatus();
      }
      break;
    case PyTorchKeyUse::kFalseOnly: {
      absl::StatusOr<bool> on = ParseBool(s.value);
      if (on.ok() && !*on) return absl::OkStatus();
      return BadValue(s.key, s.value, "False (PyTorch's default; also false or 0)", on.ok() ? k.why : "");
    }
    case PyTorchKeyUse::kRefused:
      break;
    case PyTorchKeyUse::kOption:  // a row: ParseOptions found it first
      return absl::InternalError(absl::StrCat("bucketalloc option '", s.key, "' has no row"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bucketalloc option '", s.key, "' (value '", s.value, "') is refused: ", k.why));
}

// The row name and value an error names: for a row given under its alias (row name -> the alias's
// setting), the alias and the value given.
using Spellings = absl::flat_hash_map<std::string, OptionSetting>;

absl::Status Validate(const Options& o, const Spellings& spelled) {
  for (const auto& [key, value] : o.backend_settings) {
    if (internal::FindBackendOption(key) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucketalloc option '", key, "' (value '", value,
                       "') in backend_settings is unknown; accepted keys: ", AcceptedKeys()));
    }
  }
  for (const OptionRow& row : Table()) {
    if (!row.check) continue;
    if (std::optional<Problem> p = row.check(o); p.has_value()) {
      auto alias = spelled.find(row.name);
      const bool given_as_alias = alias != spelled.end();
      const std::string value = p->value.has_value() ? *p->value : given_as_alias ? alias->second.value : row.format(o);
      return BadValue(given_as_alias ? alias->second.key : row.name, value, row.accepted, p->why);
    }
  }
  return absl::OkStatus();
}

// ParseOptions for a CONF of `kind`; in a PyTorch variable the host settings skipped are named in
// `skipped`.
absl::StatusOr<Options> Parse(absl::string_view conf, const Options& base, ConfKind kind,
                              std::vector<std::string>* skipped) {
  Options o = base;
  absl::StatusOr<std::vector<OptionSetting>> settings = SplitOptions(conf);
  if (!settings.ok()) return settings.status();
  Spellings spelled;
  absl::flat_hash_map<std::string, OptionSetting> given;  // row name (an alias's target) -> its setting
  for (const OptionSetting& s : *settings) {
    const OptionRow* row = FindRow(s.key);
    if (row == nullptr) {
      if (const PyTorchKey* k = FindPyTorchKey(s.key); k != nullptr) {
        if (absl::Status taken = TakePyTorchKey(*k, s, kind, skipped); !taken.ok()) return taken;
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", s.key, "' (value '", s.value,
                                                     "') is unknown; accepted keys: ", AcceptedKeys()));
    }
    const std::string& target = row->alias_of.empty() ? row->name : row->alias_of;
    if (auto it = given.find(target); it != given.end() && it->second.key != s.key) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", s.key, "' (value '", s.value,
                                                     "') sets what '", it->second.key, "' (value '", it->second.value,
                                                     "') sets: give one of them"));
    }
    given[target] = s;
    if (absl::Status why = row->parse(s.value, o); !why.ok()) {
      return BadValue(row->name, s.value, row->accepted, why.message());
    }
    if (row->alias_of.empty()) {
      spelled.erase(row->name);
    } else {
      spelled[row->alias_of] = s;
    }
  }
  for (const OptionRow& row : Table()) {
    if (!row.follows.empty() && given.contains(row.follows) && !given.contains(row.name)) row.follow(o);
  }
  if (absl::Status s = Validate(o, spelled); !s.ok()) return s;
  return o;
}

// The line OptionsFromEnv prints for `source` (empty: nothing to say).
std::string EnvNotice(const OptionsSource& source, const std::vector<std::string>& skipped) {
  std::vector<std::string> parts;
  if (!source.ignored.empty()) {
    parts.push_back(absl::StrCat(absl::StrJoin(source.ignored, " and "), " ignored (",
                                 source.FromPyTorch() ? "torch 2.15 reads PYTORCH_CUDA_ALLOC_CONF first too"
                                                      : "BUCKETALLOC_CONF wins over PyTorch's variables",
                                 ")"));
  }
  if (!skipped.empty()) {
    parts.push_back(absl::StrCat(absl::StrJoin(skipped, ", "),
                                 " skipped: torch's pinned host-memory allocator reads them, bucketalloc manages "
                                 "device memory only"));
  }
  if (parts.empty()) return "";
  return absl::StrCat("bucketalloc: options from ", source.variable, "; ", absl::StrJoin(parts, "; "));
}

// Prints `line` on stderr unless this process printed it already.
void PrintOnce(const std::string& line) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* const printed = new absl::flat_hash_set<std::string>();
  absl::MutexLock lock(&mu);
  if (printed->insert(line).second) std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> SplitOptionList(absl::string_view text) {
  std::vector<std::string> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) {
      absl::string_view part = absl::StripAsciiWhitespace(text.substr(start, i - start));
      if (!part.empty()) parts.emplace_back(part);
      start = i + 1;
    }
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketalloc options '", text, "': unbalanced brackets; lists are written [a,b,c]"));
  }
  return parts;
}

absl::StatusOr<std::vector<OptionSetting>> SplitOptions(absl::string_view conf) {
  absl::StatusOr<std::vector<std::string>> parts = SplitOptionList(conf);
  if (!parts.ok()) return parts.status();
  std::vector<OptionSetting> settings;
  for (const std::string& part : *parts) {
    const std::size_t colon = part.find(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc option '", part, "' has no value; write key:value"));
    }
    settings.push_back({std::string(absl::StripAsciiWhitespace(absl::string_view(part).substr(0, colon))),
                        std::string(absl::StripAsciiWhitespace(absl::string_view(part).substr(colon + 1)))});
  }
  return settings;
}

bool IsDeviceOption(absl::string_view key) {
  const OptionRow* row = FindRow(key);
  return row != nullptr && row->device;
}

std::vector<std::size_t> Options::ResolvedTiers(std::size_t granularity) const {
  std::vector<std::size_t> out;
  if (!tiers.empty()) {
    out = tiers;
  } else {
    // Saturated at 2^62 (over any accepted tier, and safe to round): a product that wraps would
    // read as a small tier.
    constexpr std::size_t kSaturated = std::size_t{1} << 62;
    for (std::uint64_t t : tiers_tokens) {
      out.push_back(bytes_per_token != 0 && t > kSaturated / bytes_per_token
                        ? kSaturated
                        : static_cast<std::size_t>(t) * bytes_per_token);
    }
  }
  for (std::size_t& t : out) t = internal::RoundUp(t, granularity);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool Options::Stitching() const {
  const internal::BackendEntry* entry = internal::FindBackend(backend);
  return expandable_segments || (entry != nullptr && entry->always_stitches);
}

std::string Options::DeviceBackend() const {
  const internal::BackendEntry* entry = internal::FindBackend(backend);
  if (entry != nullptr && Stitching() && entry->stitching_backend != nullptr) return entry->stitching_backend;
  return backend;
}

absl::Status ValidateOptions(const Options& o) { return Validate(o, Spellings()); }

absl::StatusOr<Options> ParseOptions(absl::string_view conf, const Options& base) {
  return Parse(conf, base, ConfKind::kBucketalloc, nullptr);
}

namespace {

constexpr EnvVariable kEnvVariables[] = {
    {kConfVariable, "the library, when the allocator is made (OptionsFromEnv)",
     "options as `key:value,...` (the option table)", "bucketalloc's options; set, PyTorch's variables are ignored"},
    {kPyTorchConfVariables[0], "the library, when BUCKETALLOC_CONF is not set",
     "PyTorch 2.15's CONF (its keys, and bucketalloc's)", "PyTorch's options, read as PyTorch reads them"},
    {kPyTorchConfVariables[1], "the library, when neither of the above is set",
     "PyTorch 2.15's CONF (its keys, and bucketalloc's)", "PyTorch's options, read as PyTorch reads them"},
    {"BUCKETALLOC_METRICS_ADDR", "the C ABI and the LD_PRELOAD shim, at the allocator's first allocation",
     "`HOST:PORT` (port 0: any free port)", "serves Prometheus metrics there (docs/operations.md)"},
    {"BUCKETALLOC_TIMELINE", "the C ABI and the LD_PRELOAD shim, at the allocator's first allocation",
     "`PATH[,interval_ms]` (default 1000 ms)", "writes the timeline there (docs/operations.md)"},
    {"BUCKETALLOC_VERBOSE", "the LD_PRELOAD shim", "`1`", "prints every refused or failed CUDA call on stderr"},
    {"BUCKETALLOC_STATS_ON_EXIT", "the LD_PRELOAD shim, at exit", "`stderr`, or a file path (`.json`: JSON)",
     "prints each used device's stats at exit (docs/preload.md)"},
};

}  // namespace

absl::Span<const EnvVariable> EnvVariables() { return kEnvVariables; }

const char* ReadEnv(const char* name) {
  for (const EnvVariable& v : kEnvVariables) {
    if (std::strcmp(v.name, name) == 0) return std::getenv(name);
  }
  return nullptr;
}

std::string EnvVariablesMarkdownTable() {
  std::string out = "| variable | read by | accepted values | what it does |\n|---|---|---|---|\n";
  for (const EnvVariable& v : EnvVariables()) {
    absl::StrAppend(&out, "| `", v.name, "` | ", v.read_by, " | ", v.accepted, " | ", v.meaning, " |\n");
  }
  return out;
}

std::string DumpEnv() {
  std::string out;
  for (const EnvVariable& v : EnvVariables()) {
    if (const char* value = std::getenv(v.name)) absl::StrAppend(&out, v.name, "=", value, "\n");
  }
  return out;
}

OptionsSource OptionsSourceFromEnv() {
  OptionsSource source;
  auto read = [&](const char* name) {
    const char* value = ReadEnv(name);
    if (value == nullptr) return;
    if (source.variable.empty()) {
      source.variable = name;
      source.text = value;
    } else {
      source.ignored.push_back(name);
    }
  };
  read(kConfVariable);
  for (const char* name : kPyTorchConfVariables) read(name);
  return source;
}

absl::StatusOr<Options> OptionsFromEnv() {
  const OptionsSource source = OptionsSourceFromEnv();
  std::vector<std::string> skipped;
  absl::StatusOr<Options> o =
      Parse(source.text, Options(), source.FromPyTorch() ? ConfKind::kPyTorch : ConfKind::kBucketalloc, &skipped);
  if (const std::string notice = EnvNotice(source, skipped); !notice.empty()) PrintOnce(notice);
  if (!o.ok() && source.FromPyTorch()) {
    return absl::Status(o.status().code(),
                        absl::StrCat(o.status().message(), " (in ", source.variable,
                                     ", which bucketalloc reads when BUCKETALLOC_CONF is not set; set BUCKETALLOC_CONF "
                                     "to configure bucketalloc apart from torch)"));
  }
  return o;
}

std::string FormatOptions(const Options& o) {
  std::vector<std::string> parts;
  for (const OptionRow& row : Table()) {
    if (row.alias_of.empty()) parts.push_back(absl::StrCat(row.name, ":", row.format(o)));
  }
  return absl::StrJoin(parts, ",");
}

std::string OptionsMarkdownTable() {
  const Options defaults;
  std::string out = "| key | accepted values | default | meaning |\n|---|---|---|---|\n";
  for (const OptionRow& row : Table()) {
    const std::string def = row.doc_default.empty() ? row.format(defaults) : row.doc_default;
    absl::StrAppend(&out, "| `", row.name, "` | ", row.accepted, " | `", def, "` | ", row.meaning, " |\n");
  }
  return out;
}

std::string PyTorchKeysMarkdownTable() {
  std::string out = "| PyTorch's key | in bucketalloc | why, or how it differs |\n|---|---|---|\n";
  for (const PyTorchKey& k : PyTorchKeys()) {
    absl::StrAppend(&out, "| `", k.name, "` | ", k.status, " | ", k.why, " |\n");
  }
  return out;
}

}  // namespace bucketalloc
