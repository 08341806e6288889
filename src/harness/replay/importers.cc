// src/harness/replay/importers.cc — Kineto memory events to traces.
#include "harness/replay/importers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bucketalloc/allocator.h"
#include "harness/replay/snapshot_import.h"
#include "harness/replay/snapshot_pickle.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr int kCudaDeviceType = 1;  // Kineto's DeviceType::CUDA

// Builds the trace from (timestamp, device type, device id, address, signed bytes) events.
class Builder {
 public:
  explicit Builder(int device) : device_(device) {}
  void Add(std::int64_t ts, int type, int id, std::uint64_t addr, std::int64_t bytes, int line) {
    if (type != kCudaDeviceType || bytes == 0) return;
    if (device_ < 0) device_ = id;
    if (id != device_) return;
    TraceEvent e;
    e.thread = 1;
    e.time = absl::StrCat(ts);
    e.pointer = addr;
    e.line = line;
    if (bytes > 0) {
      e.action = TraceAction::kAllocate;
      e.size = static_cast<std::uint64_t>(bytes);
      live_[addr] = e.size;
    } else {
      auto it = live_.find(addr);
      if (it == live_.end()) return;  // allocated before the log began
      e.action = TraceAction::kFree;
      e.size = it->second;
      live_.erase(it);
    }
    trace_.events.push_back(std::move(e));
  }
  absl::StatusOr<Trace> Finish(absl::string_view source) {
    if (trace_.events.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": no CUDA memory events",
                                                     device_ >= 0 ? absl::StrCat(" for device ", device_) : "",
                                                     " (Device Type 1)"));
    }
    return std::move(trace_);
  }

 private:
  int device_;
  Trace trace_;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live_;
};

// A JSON value as it may appear in an error message: ASCII, invalid UTF-8 replaced (dump would
// throw on it), cut to 80 characters.
std::string JsonExcerpt(const nlohmann::json& v) {
  std::string text = v.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 80), "...");
  return text;
}

// What a replay needs of a memory event: an address when it has bytes, and a size an allocator can
// be asked for.
absl::Status CheckMemoryEvent(absl::string_view where, std::uint64_t addr, std::int64_t bytes) {
  if (addr == 0 && bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a memory event of ", bytes, " bytes at address 0; only an empty event has no address"));
  }
  if (bytes > static_cast<std::int64_t>(kMaxRequestBytes) || bytes < -static_cast<std::int64_t>(kMaxRequestBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a memory event of ", bytes, " bytes; accepted: at most ",
                                                   kMaxRequestBytes, " (kMaxRequestBytes) either way"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Trace> ImportKinetoCsv(absl::string_view text, int device, absl::string_view source) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": empty"));
  std::vector<absl::string_view> header = absl::StrSplit(absl::StripAsciiWhitespace(lines[0]), ',');
  auto column = [&](absl::string_view name) -> int {
    for (std::size_t i = 0; i < header.size(); ++i) {
      if (header[i] == name) return static_cast<int>(i);
    }
    return -1;
  };
  const int ts = column("ts_us"), type = column("device_type"), id = column("device_id"), addr = column("addr"),
            bytes = column("bytes");
  if (ts < 0 || type < 0 || id < 0 || addr < 0 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ":1: the header needs the columns ts_us, device_type, "
                                                   "device_id, addr and bytes; found \"",
                                                   Excerpt(lines[0]), "\""));
  }
  Builder b(device);
  for (std::size_t n = 1; n < lines.size(); ++n) {
    std::vector<absl::string_view> f = absl::StrSplit(absl::StripAsciiWhitespace(lines[n]), ',');
    std::int64_t t = 0, size = 0;
    int dt = 0, di = 0;
    std::uint64_t a = 0;
    if (f.size() != header.size() || !absl::SimpleAtoi(f[ts], &t) || !absl::SimpleAtoi(f[type], &dt) ||
        !absl::SimpleAtoi(f[id], &di) || !absl::SimpleAtoi(f[addr], &a) || !absl::SimpleAtoi(f[bytes], &size)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", n + 1, ": expected ", header.size(),
                                                     " comma-separated fields with integer ts_us, device_type, "
                                                     "device_id, addr and bytes; found \"",
                                                     Excerpt(lines[n]), "\""));
    }
    if (absl::Status s = CheckMemoryEvent(absl::StrCat(source, ":", n + 1), a, size); !s.ok()) return s;
    b.Add(t, dt, di, a, size, static_cast<int>(n + 1));
  }
  return b.Finish(source);
}

absl::StatusOr<Trace> ImportKinetoJson(absl::string_view text, int device, absl::string_view source) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a Kineto trace (expected a JSON object with a \"traceEvents\" array)"));
  }
  // traceEvents are not in time order (Kineto groups them): sort the memory events by timestamp,
  // then by their event index.
  struct Event {
    std::int64_t ts, order, type, id;
    std::uint64_t addr;
    std::int64_t bytes;
    int index;
  };
  std::vector<Event> events;
  int index = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    ++index;
    if (!e.is_object()) continue;
    const std::string where = absl::StrCat(source, ": traceEvents[", index - 1, "]");
    auto bad = [&](absl::string_view field, absl::string_view accepted, const nlohmann::json& v) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, " is ", JsonExcerpt(v), "; accepted: ", accepted));
    };
    const auto name = e.find("name");
    if (name == e.end()) continue;
    if (!name->is_string()) return bad("\"name\"", "a string", *name);
    if (name->get_ref<const std::string&>() != "[memory]") continue;
    const auto args = e.find("args");
    if (args == e.end() || !args->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is a [memory] event without an \"args\" object"));
    }
    // An integer field of args; `required` fields must be present.
    auto integer = [&](const nlohmann::json& obj, const char* key, bool required, std::int64_t lo, std::int64_t hi,
                       std::int64_t* out) -> absl::Status {
      const auto it = obj.find(key);
      if (it == obj.end()) {
        return required ? absl::InvalidArgumentError(absl::StrCat(where, " is a [memory] event without \"", key, "\""))
                        : absl::OkStatus();
      }
      const std::string accepted = absl::StrCat("an integer from ", lo, " to ", hi);
      if (!it->is_number_integer()) return bad(absl::StrCat("\"", key, "\""), accepted, *it);
      if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
        return bad(absl::StrCat("\"", key, "\""), accepted, *it);
      }
      const std::int64_t v = it->get<std::int64_t>();
      if (!it->is_number_unsigned() && (v < lo || v > hi)) return bad(absl::StrCat("\"", key, "\""), accepted, *it);
      *out = v;
      return absl::OkStatus();
    };
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    constexpr std::int64_t kMaxBytes = static_cast<std::int64_t>(kMaxRequestBytes);
    constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
    Event ev{0, 0, 0, 0, 0, 0, index};
    std::int64_t addr = 0;
    // Kineto writes "ts" as integer microseconds; Chrome's trace format also allows a fraction.
    if (const auto ts = e.find("ts"); ts != e.end()) {
      if (ts->is_number_integer() && !ts->is_number_unsigned()) {
        ev.ts = ts->get<std::int64_t>();
      } else if (ts->is_number() && std::isfinite(ts->get<double>()) && std::fabs(ts->get<double>()) < 9.2e18) {
        ev.ts = static_cast<std::int64_t>(std::floor(ts->get<double>()));
      } else {
        return bad("\"ts\"", "a number of microseconds", *ts);
      }
    }
    for (absl::Status s :
         {integer(*args, "Ev Idx", false, std::numeric_limits<std::int64_t>::min(), kMax, &ev.order),
          integer(*args, "Device Type", false, 0, kIntMax, &ev.type),
          // Kineto writes Device Id -1 for the CPU's memory events (Device Type 0), which are skipped.
          integer(*args, "Device Id", false, -1, kIntMax, &ev.id), integer(*args, "Addr", true, 0, kMax, &addr),
          integer(*args, "Bytes", true, -kMaxBytes, kMaxBytes, &ev.bytes)}) {
      if (!s.ok()) return s;
    }
    if (absl::Status s = CheckMemoryEvent(where, static_cast<std::uint64_t>(addr), ev.bytes); !s.ok()) return s;
    ev.addr = static_cast<std::uint64_t>(addr);
    events.push_back(ev);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& x, const Event& y) { return std::tie(x.ts, x.order) < std::tie(y.ts, y.order); });
  Builder b(device);
  for (const Event& e : events) {
    b.Add(e.ts, static_cast<int>(e.type), static_cast<int>(e.id), e.addr, e.bytes, e.index);
  }
  return b.Finish(source);
}

absl::StatusOr<Trace> ImportKinetoFile(const std::string& path, int device) {
  absl::StatusOr<std::string> read = ReadTextFile(path, "the Kineto trace");
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  const absl::string_view start = absl::StripLeadingAsciiWhitespace(text);
  if (absl::StartsWith(start, "{")) return ImportKinetoJson(text, device, path);
  return ImportKinetoCsv(text, device, path);
}

absl::StatusOr<Trace> ReadRecording(const std::string& path, int device, std::vector<std::string>* warnings) {
  constexpr absl::string_view kAccepted =
      "accepted: a trace (RMM CSV), a profiler trace (Kineto JSON, JSON.gz or its memory-event CSV) or a memory "
      "snapshot with its history (torch.cuda.memory._dump_snapshot's pickle, or JSON)";
  absl::StatusOr<std::string> read = ReadTextFile(path, "the recording");
  if (!read.ok()) return read.status();
  std::string& text = *read;
  const absl::string_view start = absl::StripLeadingAsciiWhitespace(text);
  if (start.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is empty; ", kAccepted));
  // A snapshot's history, from its pickle or its JSON.
  auto history = [&](absl::StatusOr<SnapshotContents> c) -> absl::StatusOr<Trace> {
    if (!c.ok()) return c.status();
    if (!c->history.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is a snapshot without history",
                       device >= 0 ? absl::StrCat(" for device ", device, " (--device)") : std::string(),
                       " (record it with torch.cuda.memory._record_memory_history first); ", kAccepted));
    }
    if (warnings != nullptr) warnings->insert(warnings->end(), c->warnings.begin(), c->warnings.end());
    return std::move(*c->history);
  };
  SnapshotReadOptions options;
  options.device = device;
  if (LooksLikePickle(text)) {
    absl::StatusOr<PlainPickle> p = PlainPickle::Parse(std::move(text), path);
    if (!p.ok()) return p.status();
    return history(ReadSnapshot(*p, kAccepted, options));
  }
  if (start[0] == '{') {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("segments")) return history(ReadSnapshot(j, path, options));
    return ImportKinetoJson(text, device, path);
  }
  if (absl::StartsWith(start, "Thread,")) return ParseTrace(text, path);
  absl::StatusOr<Trace> kineto = ImportKinetoCsv(text, device, path);
  if (kineto.ok()) return kineto;
  absl::StatusOr<Trace> rmm = ParseTrace(text, path);
  if (rmm.ok()) return rmm;
  return absl::InvalidArgumentError(absl::StrCat(
      path, " is none of the recordings read here (as RMM CSV: ", rmm.status().message(), "); ", kAccepted));
}

}  // namespace bucketalloc::harness
