// src/harness/replay/driver_costs.cc — the driver calls' prices (harness/replay/driver_costs.h).
#include "harness/replay/driver_costs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "harness/replay/trace.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::array<const char*, kDriverCalls> kCallNames = {
    "cudaMalloc",     "cudaFree",   "cuMemCreate",         "cuMemRelease",     "cuMemMap",
    "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "synchronize"};

// The most bytes a priced call may name in a profile: 1 PiB.
constexpr std::size_t kMaxProfileBytes = std::size_t{1} << 50;

// One built-in profile: a price per call at one size (the size the source measured; a size is
// meaningless for a synchronization). Sources: docs/harness.md, "Driver time".
struct BuiltIn {
  const char* name;
  std::array<CostPoint, kDriverCalls> prices;
};

// cudaMalloc ~50 us and cudaFree ~10 us, its implicit synchronization included (reference
// pytorch.md §6: the only published per-call figures found), in every profile. The VMM figures are
// the averages of the public bench_vmm benchmark (magnate3/linux-riscv-dev, nccl/gpu/shm/bench_vmm,
// 2 MiB pages, 4,096 pages, one thread): on an A100 cuMemCreate 193.32 us (p99 381), cuMemMap 1.45,
// cuMemSetAccess 35.99, cuMemUnmap 25.63, cuMemAddressReserve (8 GB) 19; on its second, unnamed GPU
// 7.58, 1.05, 20.78, 11.45 and 9. It times no cuMemRelease nor cuMemAddressFree: they are priced as
// cuMemUnmap and cuMemAddressReserve of the same column, an assumption until a GPU measures them
// (scripts/gpu_check.sh does). A synchronization on an idle device is priced as
// cudaFree, which includes one (a small kernel and a synchronize measured 7.1 us: JuliaGPU/CUDA.jl
// #896); the wait for queued work, which depends on the work, is not priced by any source.
constexpr std::size_t k2M = 2 * kMiB;
constexpr std::size_t k8G = std::size_t{8} << 30;
constexpr BuiltIn kBuiltIns[] = {
    {"a100-published",
     {{{k2M, 50.0},
       {k2M, 10.0},
       {k2M, 193.32},
       {k2M, 25.63},
       {k2M, 1.45},
       {k2M, 35.99},
       {k2M, 25.63},
       {k8G, 19.0},
       {k8G, 19.0},
       {0, 10.0}}}},
    {"gpu2-published",
     {{{k2M, 50.0},
       {k2M, 10.0},
       {k2M, 7.58},
       {k2M, 11.45},
       {k2M, 1.05},
       {k2M, 20.78},
       {k2M, 11.45},
       {k8G, 9.0},
       {k8G, 9.0},
       {0, 10.0}}}},
    {"flat",
     {{{k2M, 50.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {k2M, 10.0},
       {0, 0.0}}}},
};

absl::Status CheckPrice(double us, absl::string_view what) {
  if (us >= 0.0 && us <= kMaxCallMicroseconds) return absl::OkStatus();  // NaN fails too
  return absl::InvalidArgumentError(absl::StrCat(what, " ", us, ": accepted a number of microseconds from 0 to ",
                                                 static_cast<std::int64_t>(kMaxCallMicroseconds), " (one second)"));
}

}  // namespace

absl::string_view DriverCallName(DriverCall call) { return kCallNames[static_cast<std::size_t>(call)]; }

CostModel BuiltInCostModel(int index) {
  const BuiltIn& b = kBuiltIns[index];
  CostModel c;
  c.profile_ = b.name;
  for (std::size_t i = 0; i < kDriverCalls; ++i) c.points_[i] = {b.prices[i]};
  return c;
}

CostModel::CostModel() : profile_(kBuiltIns[0].name) {
  for (std::size_t i = 0; i < kDriverCalls; ++i) points_[i] = {kBuiltIns[0].prices[i]};
}

double CostModel::Price(DriverCall call, std::size_t bytes) const {
  const std::vector<CostPoint>& p = points_[static_cast<std::size_t>(call)];
  if (bytes <= p.front().bytes) return p.front().us;
  if (bytes >= p.back().bytes) return p.back().us;
  const auto hi = std::lower_bound(p.begin(), p.end(), bytes, [](const CostPoint& c, std::size_t b) {
    return c.bytes < b;
  });  // p.front().bytes < bytes < p.back().bytes: hi is past the first and not the end
  const auto lo = hi - 1;
  const double t = static_cast<double>(bytes - lo->bytes) / static_cast<double>(hi->bytes - lo->bytes);
  return lo->us + t * (hi->us - lo->us);
}

absl::Status CostModel::Override(DriverCall call, double us, absl::string_view note) {
  if (absl::Status s = CheckPrice(us, absl::StrCat("cost --", note)); !s.ok()) return s;
  points_[static_cast<std::size_t>(call)] = {CostPoint{0, us}};
  if (!absl::StrContains(profile_, absl::StrCat("+", note))) absl::StrAppend(&profile_, "+", note, "=", us);
  return absl::OkStatus();
}

std::string CostModel::ToJson() const {
  nlohmann::ordered_json j = {{"profile", profile_}, {"calls", nlohmann::ordered_json::object()}};
  for (std::size_t i = 0; i < kDriverCalls; ++i) {
    nlohmann::ordered_json points = nlohmann::ordered_json::array();
    for (const CostPoint& p : points_[i]) points.push_back({{"bytes", p.bytes}, {"us", p.us}});
    j["calls"][kCallNames[i]] = std::move(points);
  }
  return j.dump(2);
}

std::vector<std::string> CostProfileNames() {
  std::vector<std::string> names;
  for (const BuiltIn& b : kBuiltIns) names.emplace_back(b.name);
  return names;
}

absl::StatusOr<CostModel> CostProfile(absl::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kBuiltIns)); ++i) {
    if (name == kBuiltIns[i].name) return BuiltInCostModel(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cost profile \"", name, "\" is not built in; accepted: ", absl::StrJoin(CostProfileNames(), ", "),
                   ", or the path of a JSON cost file (docs/harness.md)"));
}

absl::StatusOr<CostModel> ParseCostModel(absl::string_view json, absl::string_view origin) {
  auto bad = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(origin, ": ", why)); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::parse_error& e) {
    return bad(absl::StrCat("not JSON (", e.what(), "); accepted: {\"profile\": ..., \"calls\": {...}}"));
  }
  if (!j.is_object()) return bad("not a JSON object; accepted: {\"profile\": ..., \"calls\": {...}}");
  for (const auto& [key, value] : j.items()) {
    if (key != "profile" && key != "source" && key != "calls") {
      return bad(absl::StrCat("unknown key \"", key, "\"; accepted: profile, source, calls"));
    }
  }
  CostModel c;
  if (!j.contains("profile") || !j["profile"].is_string() || j["profile"].get<std::string>().empty()) {
    return bad("\"profile\" is missing or not a non-empty string");
  }
  c.profile_ = j["profile"].get<std::string>();
  if (j.contains("source") && !j["source"].is_string()) return bad("\"source\" is not a string");
  if (!j.contains("calls") || !j["calls"].is_object()) {
    return bad(absl::StrCat("\"calls\" is missing or not an object; accepted: an object with a price list for each of ",
                            absl::StrJoin(kCallNames, ", ")));
  }
  const nlohmann::json& calls = j["calls"];
  for (const auto& item : calls.items()) {
    const std::string& key = item.key();  // not a structured binding: clang before 16 cannot capture one
    if (std::find_if(kCallNames.begin(), kCallNames.end(), [&](const char* n) { return key == n; }) ==
        kCallNames.end()) {
      return bad(absl::StrCat("unknown call \"", key, "\"; accepted: ", absl::StrJoin(kCallNames, ", ")));
    }
  }
  for (std::size_t i = 0; i < kDriverCalls; ++i) {
    const std::string field = absl::StrCat("calls.", kCallNames[i]);
    if (!calls.contains(kCallNames[i])) return bad(absl::StrCat(field, " is missing; every call needs a price"));
    const nlohmann::json& points = calls[kCallNames[i]];
    if (!points.is_array() || points.empty() || points.size() > 64) {
      return bad(absl::StrCat(field, " is not an array of 1 to 64 {\"bytes\", \"us\"} points"));
    }
    std::vector<CostPoint>& out = c.points_[i];
    out.clear();
    for (std::size_t k = 0; k < points.size(); ++k) {
      const nlohmann::json& p = points[k];
      const std::string at = absl::StrCat(field, "[", k, "]");
      if (!p.is_object()) return bad(absl::StrCat(at, " is not an object"));
      for (const auto& [key, value] : p.items()) {
        if (key != "bytes" && key != "us" && key != "p99_us") {
          return bad(absl::StrCat(at, " has unknown key \"", key, "\"; accepted: bytes, us, p99_us"));
        }
      }
      if (!p.contains("bytes") || !p["bytes"].is_number_unsigned() ||
          p["bytes"].get<std::uint64_t>() > kMaxProfileBytes) {
        return bad(absl::StrCat(at, ".bytes is missing or not an integer from 0 to ", kMaxProfileBytes));
      }
      if (!p.contains("us") || !p["us"].is_number()) return bad(absl::StrCat(at, ".us is missing or not a number"));
      if (absl::Status s = CheckPrice(p["us"].get<double>(), absl::StrCat(origin, ": ", at, ".us")); !s.ok()) return s;
      if (p.contains("p99_us") && !p["p99_us"].is_number()) return bad(absl::StrCat(at, ".p99_us is not a number"));
      const CostPoint point{static_cast<std::size_t>(p["bytes"].get<std::uint64_t>()), p["us"].get<double>()};
      if (!out.empty() && point.bytes <= out.back().bytes) {
        return bad(absl::StrCat(at, ".bytes ", point.bytes, " is not above the point before it (", out.back().bytes,
                                "); accepted: sizes in increasing order"));
      }
      out.push_back(point);
    }
  }
  return c;
}

absl::StatusOr<CostModel> LoadCostModel(absl::string_view spec) {
  for (const BuiltIn& b : kBuiltIns) {
    if (spec == b.name) return CostProfile(spec);
  }
  // A name with no path separator and no extension is a profile's; anything else a file's.
  std::error_code error;
  const bool looks_like_path = absl::StrContains(spec, '/') || absl::StrContains(spec, '.');
  if (spec.empty() || (!looks_like_path && !std::filesystem::exists(std::string(spec), error))) {
    return CostProfile(spec);
  }
  absl::StatusOr<std::string> text = ReadTextFile(std::string(spec), "the JSON cost file");
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(text.status().message(), "; accepted: a built-in profile (",
                                     absl::StrJoin(CostProfileNames(), ", "), ") or the path of a JSON cost file"));
  }
  return ParseCostModel(*text, absl::StrCat("cost file ", spec));
}

}  // namespace bucketalloc::harness
