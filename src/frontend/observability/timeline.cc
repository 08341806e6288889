// src/frontend/observability/timeline.cc — the timeline's line and its reader (bucketalloc/timeline.h).
#include "bucketalloc/timeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace bucketalloc {
namespace {

using Json = nlohmann::ordered_json;

constexpr OomCause kCauses[kNumOomCauses] = {OomCause::kCapacity, OomCause::kFragmentation, OomCause::kCacheHeld,
                                             OomCause::kDeviceExhausted, OomCause::kTenantCap};

// The figures of a line, in its order: key and member. The memory figures' are their keys
// (BUCKETALLOC_MEMORY_FIGURES).
struct IntField {
  const char* key;
  std::int64_t TimelineSample::*member;
};
constexpr IntField kIntFields[] = {
    {"capacity_bytes", &TimelineSample::capacity_bytes},
#define BUCKETALLOC_SAMPLE_FIGURE_FIELD(type, name, key, meaning) {#key, &TimelineSample::key},
    BUCKETALLOC_MEMORY_FIGURES(BUCKETALLOC_SAMPLE_FIGURE_FIELD)
#undef BUCKETALLOC_SAMPLE_FIGURE_FIELD
        {"allocations_total", &TimelineSample::allocations_total},
    {"frees_total", &TimelineSample::frees_total},
    {"cache_hits_total", &TimelineSample::cache_hits_total},
    {"alloc_retries_total", &TimelineSample::alloc_retries_total},
};
struct RatioField {
  const char* key;
  double TimelineSample::*member;
};
constexpr RatioField kRatioFields[] = {
    {"external_fragmentation", &TimelineSample::external_fragmentation},
    {"internal_fragmentation", &TimelineSample::internal_fragmentation},
};

absl::StatusOr<OomCause> CauseOf(const std::string& key) {
  for (OomCause c : kCauses) {
    if (key == OomCauseKey(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "an OOM cause \"", key, "\"; accepted: capacity, fragmentation, cache_held, device_exhausted, tenant_cap"));
}

// The non-negative integer `j[key]`, or an error naming it.
absl::StatusOr<std::int64_t> Count(const Json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is missing or not an integer >= 0"));
  }
  return j[key].get<std::int64_t>();
}

absl::StatusOr<double> Number(const Json& j, const char* key, double lo, double hi) {
  if (!j.contains(key) || !j[key].is_number() || !std::isfinite(j[key].get<double>()) || j[key].get<double>() < lo ||
      j[key].get<double>() > hi) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is missing or not a number in [", lo, ", ", hi, "]"));
  }
  return j[key].get<double>();
}

absl::StatusOr<TimelineSample> ParseLine(absl::string_view line) {
  const Json j = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  TimelineSample s;
  absl::StatusOr<double> time = Number(j, "time_s", 0.0, 1e12);
  if (!time.ok()) return time.status();
  s.time_s = *time;
  absl::StatusOr<std::int64_t> device = Count(j, "device");
  if (!device.ok() || *device > 1 << 16) return absl::InvalidArgumentError("\"device\" is missing or not 0 to 65536");
  s.device = static_cast<int>(*device);
  for (const IntField& f : kIntFields) {
    absl::StatusOr<std::int64_t> v = Count(j, f.key);
    if (!v.ok()) return v.status();
    s.*f.member = *v;
  }
  for (const RatioField& f : kRatioFields) {
    absl::StatusOr<double> v = Number(j, f.key, 0.0, 1.0);
    if (!v.ok()) return v.status();
    s.*f.member = *v;
  }
  if (!j.contains("ooms_total") || !j["ooms_total"].is_object()) {
    return absl::InvalidArgumentError("\"ooms_total\" is missing or not an object of counts by cause");
  }
  for (OomCause c : kCauses) {
    // tenant_cap came later: a timeline written before it has none (0).
    if (c == OomCause::kTenantCap && !j["ooms_total"].contains(OomCauseKey(c))) continue;
    absl::StatusOr<std::int64_t> v = Count(j["ooms_total"], OomCauseKey(c));
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("ooms_total: ", v.status().message()));
    s.ooms_total[static_cast<int>(c)] = *v;
  }
  if (!j.contains("ooms") || !j["ooms"].is_array())
    return absl::InvalidArgumentError("\"ooms\" is missing or not a list");
  for (const Json& e : j["ooms"]) {
    OomEvent o;
    absl::StatusOr<std::int64_t> seq = Count(e, "seq");
    absl::StatusOr<double> t = Number(e, "time_s", 0.0, 1e12);
    absl::StatusOr<std::int64_t> size = Count(e, "size");
    if (!seq.ok() || !t.ok() || !size.ok() || !e.contains("cause") || !e["cause"].is_string()) {
      return absl::InvalidArgumentError("an entry of \"ooms\" lacks an integer seq and size, a time_s or a cause");
    }
    absl::StatusOr<OomCause> cause = CauseOf(e["cause"].get<std::string>());
    if (!cause.ok()) return cause.status();
    o.seq = static_cast<std::uint64_t>(*seq);
    o.time_s = *t;
    o.size = static_cast<std::size_t>(*size);
    o.cause = *cause;
    if (e.contains("tenant")) {
      absl::StatusOr<std::int64_t> cap = Count(e, "tenant_cap_bytes");
      if (!e["tenant"].is_string() || e["tenant"].get<std::string>().empty() || !cap.ok()) {
        return absl::InvalidArgumentError(
            "an entry of \"ooms\" has a \"tenant\" that is not a name, or no integer \"tenant_cap_bytes\"");
      }
      o.tenant = e["tenant"].get<std::string>();
      o.tenant_cap = static_cast<std::size_t>(*cap);
    }
    s.ooms.push_back(std::move(o));
  }
  return s;
}

}  // namespace

void SetMemoryFigures(const MemoryFigures& figures, TimelineSample* sample) {
#define BUCKETALLOC_SET_SAMPLE_FIGURE(type, name, key, meaning) sample->key = static_cast<std::int64_t>(figures.name);
  BUCKETALLOC_MEMORY_FIGURES(BUCKETALLOC_SET_SAMPLE_FIGURE)
#undef BUCKETALLOC_SET_SAMPLE_FIGURE
}

TimelineSample TimelineSampleOf(const DeviceMetrics& m, double time_s, std::uint64_t after_seq) {
  TimelineSample s;
  const DeviceStats& st = m.stats;
  const PoolFragmentation& all = m.fragmentation.all();
  s.time_s = time_s;
  s.device = m.device;
  s.capacity_bytes = st.capacity_bytes;
  SetMemoryFigures(MemoryFiguresOf(st, m.fragmentation), &s);
  s.external_fragmentation = all.external_fragmentation();
  s.internal_fragmentation = all.internal_fragmentation();
  s.allocations_total = st.allocation[kAllPools].allocated;
  s.frees_total = st.allocation[kAllPools].freed;
  s.cache_hits_total = st.num_cache_hits;
  s.alloc_retries_total = st.num_alloc_retries;
  s.ooms_total = OomCounts(st);
  for (const OomEvent& e : m.recent_ooms) {
    if (e.seq > after_seq) s.ooms.push_back(e);
  }
  return s;
}

std::string TimelineToJsonLine(const TimelineSample& s) {
  Json j = {{"time_s", s.time_s}, {"device", s.device}};
  for (const IntField& f : kIntFields) j[f.key] = s.*f.member;
  for (const RatioField& f : kRatioFields) j[f.key] = s.*f.member;
  Json by_cause = Json::object();
  for (OomCause c : kCauses) by_cause[OomCauseKey(c)] = s.ooms_total[static_cast<int>(c)];
  j["ooms_total"] = by_cause;
  Json ooms = Json::array();
  for (const OomEvent& e : s.ooms) {
    Json o = {{"seq", e.seq}, {"time_s", e.time_s}, {"size", e.size}, {"cause", OomCauseKey(e.cause)}};
    if (!e.tenant.empty()) {
      o["tenant"] = e.tenant;
      o["tenant_cap_bytes"] = e.tenant_cap;
    }
    ooms.push_back(std::move(o));
  }
  j["ooms"] = ooms;
  return j.dump();
}

absl::Status ParseTimelineSpec(absl::string_view spec, std::string* path, int* interval_ms) {
  *interval_ms = kDefaultTimelineIntervalMs;
  absl::string_view p = spec;
  if (const std::size_t comma = spec.rfind(','); comma != absl::string_view::npos) {
    p = spec.substr(0, comma);
    const absl::string_view ms = spec.substr(comma + 1);
    if (!absl::SimpleAtoi(ms, interval_ms) || *interval_ms < 1 || *interval_ms > kMaxTimelineIntervalMs) {
      // Not a number at all: most likely the end of a path that has a comma in it.
      int number = 0;
      const std::string comma_note =
          absl::SimpleAtoi(ms, &number)
              ? ""
              : absl::StrCat(
                    "; the part after the last comma is always the interval, so a PATH that contains a comma "
                    "needs \",interval_ms\" after it (e.g. \"",
                    spec, ",", kDefaultTimelineIntervalMs, "\")");
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc: timeline \"", spec, "\": interval \"", ms,
                                                     "\" is invalid; accepted: PATH[,interval_ms] with interval_ms an "
                                                     "integer from 1 to ",
                                                     kMaxTimelineIntervalMs, " (default ", kDefaultTimelineIntervalMs,
                                                     ")", comma_note));
    }
  }
  if (p.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketalloc: timeline \"", spec, "\" names no file; accepted: PATH[,interval_ms]"));
  }
  *path = std::string(p);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TimelineSample>> ReadTimeline(absl::string_view text, absl::string_view source,
                                                         std::vector<std::string>* warnings) {
  std::vector<TimelineSample> samples;
  std::map<int, double> last_time;  // per device
  std::size_t skipped = 0;
  std::string first_error;  // the first line that is not a sample, and why
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::size_t number = i + 1;
    const absl::string_view line = lines[i];
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    absl::StatusOr<TimelineSample> s = ParseLine(line);
    // A last line without its newline that does not parse was cut off (the process was killed
    // while writing it): the lines before it are the timeline.
    if (!s.ok() && i + 1 == lines.size()) break;
    if (!s.ok()) {
      // A damaged line (cut by a full disk and ended by the writer's next line, or garbled): skipped.
      const std::string why = absl::StrCat(source, ":", number, ": not a timeline sample: ", s.status().message());
      if (first_error.empty()) first_error = why;
      if (warnings != nullptr && skipped < kMaxTimelineWarnings) warnings->push_back(absl::StrCat(why, "; skipped"));
      ++skipped;
      continue;
    }
    // A wall clock stepped back (NTP) keeps the device's time where it was.
    auto [it, first] = last_time.emplace(s->device, s->time_s);
    if (!first) s->time_s = std::max(s->time_s, it->second);
    it->second = s->time_s;
    samples.push_back(std::move(*s));
  }
  if (samples.empty() && skipped > 0) {
    return absl::InvalidArgumentError(absl::StrCat(first_error, " (docs/operations.md has the format); none of the ",
                                                   skipped, " lines of ", source, " is a sample"));
  }
  if (warnings != nullptr && skipped > kMaxTimelineWarnings) {
    warnings->push_back(absl::StrCat(source, ": ", skipped - kMaxTimelineWarnings,
                                     " more lines that are not timeline samples skipped (", skipped, " in all, of ",
                                     skipped + samples.size(), ")"));
  }
  return samples;
}

}  // namespace bucketalloc
