// src/harness/importers.cc — Kineto memory events to traces.
#include "harness/importers.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
                                                   lines[0], "\""));
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
                                                     lines[n], "\""));
    }
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
    std::int64_t ts, order, type, id, addr, bytes;
    int index;
  };
  std::vector<Event> events;
  int index = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    ++index;
    if (!e.is_object() || e.value("name", "") != "[memory]" || !e.contains("args")) continue;
    const nlohmann::json& a = e["args"];
    auto get = [&](const char* key) -> std::int64_t {
      return a.contains(key) && a[key].is_number_integer() ? a[key].get<std::int64_t>() : 0;
    };
    if (!a.contains("Addr") || !a.contains("Bytes")) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": traceEvents[", index - 1, "] is a [memory] event without Addr and Bytes"));
    }
    events.push_back({e.value("ts", std::int64_t{0}), get("Ev Idx"), get("Device Type"), get("Device Id"), get("Addr"),
                      get("Bytes"), index});
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& x, const Event& y) { return std::tie(x.ts, x.order) < std::tie(y.ts, y.order); });
  Builder b(device);
  for (const Event& e : events) {
    b.Add(e.ts, static_cast<int>(e.type), static_cast<int>(e.id), static_cast<std::uint64_t>(e.addr), e.bytes, e.index);
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

}  // namespace bucketalloc::harness
