// src/harness/replay/snapshot_import.cc — a memory snapshot's history and segments, from its pickle or
// its JSON (harness/replay/snapshot_import.h). One walk, written once over a view of either form.
#include "harness/replay/snapshot_import.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/units.h"

namespace bucketalloc::harness {
namespace {

// The view of a snapshot's JSON.
struct JsonView {
  using Value = const nlohmann::json*;
  static bool IsDict(Value v) { return v->is_object(); }
  static bool IsList(Value v) { return v->is_array(); }
  static std::size_t Size(Value v) { return v->size(); }
  static Value Item(Value v, std::size_t i) { return &(*v)[i]; }
  static std::optional<Value> Find(Value v, absl::string_view key) {
    const auto it = v->find(key);
    if (it == v->end()) return std::nullopt;
    return &*it;
  }
  static std::optional<absl::string_view> Text(Value v) {
    if (!v->is_string()) return std::nullopt;
    return absl::string_view(v->get_ref<const std::string&>());
  }
  static std::optional<std::uint64_t> Unsigned(Value v) {
    if (v->is_number_unsigned()) return v->get<std::uint64_t>();
    if (v->is_number_integer() && v->get<std::int64_t>() >= 0)
      return static_cast<std::uint64_t>(v->get<std::int64_t>());
    return std::nullopt;
  }
  static std::optional<std::int64_t> Signed(Value v) {
    if (v->is_number_unsigned()) {
      const auto u = v->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
      return static_cast<std::int64_t>(u);
    }
    if (v->is_number_integer()) return v->get<std::int64_t>();
    return std::nullopt;
  }
  static std::optional<double> Number(Value v) {
    if (!v->is_number()) return std::nullopt;
    return v->get<double>();
  }
  // The value as an error message shows it: its JSON, cut to 80 characters.
  static std::string Describe(Value v) {
    std::string text = v->dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
    if (text.size() > 80) text = absl::StrCat(text.substr(0, 80), "...");
    return text;
  }
};

// The view of a parsed pickle.
struct PickleView {
  using Value = PickleValue;
  static bool IsDict(Value v) { return v.is_dict(); }
  static bool IsList(Value v) { return v.is_list(); }
  static std::size_t Size(Value v) { return v.size(); }
  static Value Item(Value v, std::size_t i) { return v.item(i); }
  static std::optional<Value> Find(Value v, absl::string_view key) { return v.Find(key); }
  static std::optional<absl::string_view> Text(Value v) {
    if (!v.is_string()) return std::nullopt;
    return v.text();
  }
  static std::optional<std::uint64_t> Unsigned(Value v) { return v.Unsigned(); }
  static std::optional<std::int64_t> Signed(Value v) { return v.Signed(); }
  static std::optional<double> Number(Value v) { return v.Number(); }
  // The value as an error message shows it: a scalar's value, a container's kind and size.
  static std::string Describe(Value v) {
    switch (v.kind()) {
      case PickleValue::Kind::kNone:
        return "None";
      case PickleValue::Kind::kBool:
        return v.boolean() ? "True" : "False";
      case PickleValue::Kind::kInt:
        return v.Signed().has_value() ? absl::StrCat(*v.Signed()) : absl::StrCat(*v.Unsigned());
      case PickleValue::Kind::kFloat:
        return absl::StrCat(*v.Number());
      case PickleValue::Kind::kString:
        return absl::StrCat("\"", Excerpt(v.text()), "\"");
      case PickleValue::Kind::kList:
        return absl::StrCat("a list of ", v.size());
      case PickleValue::Kind::kDict:
        return absl::StrCat("a dict of ", v.size(), " keys");
    }
    return std::string(v.KindName());
  }
};

// What a walk may visit per byte of its input (a snapshot's entries, fields and blocks): a walk that
// visits more goes through shared containers, which no snapshot holds where this walk goes.
constexpr std::uint64_t kVisitsPerByte = 4;
constexpr std::uint64_t kMaxBytes = kMaxRequestBytes;

template <typename View>
class SnapshotWalk {
 public:
  using Value = typename View::Value;
  SnapshotWalk(absl::string_view source, std::uint64_t budget, const SnapshotReadOptions& o)
      : source_(source), options_(o), budget_(budget) {}

  absl::StatusOr<SnapshotContents> Read(Value root) {
    SnapshotContents c;
    if (!View::IsDict(root)) return Error("the snapshot", "is not a dict", Describe(root), "a dict");
    if (std::optional<Value> traces = View::Find(root, "device_traces")) {
      if (absl::Status s = ReadHistory(*traces, &c); !s.ok()) return s;
    }
    if (std::optional<Value> segments = View::Find(root, "segments")) {
      if (absl::Status s = ReadSegments(*segments, &c); !s.ok()) return s;
    }
    return c;
  }

 private:
  static std::string Describe(Value v) { return View::Describe(v); }

  absl::Status Error(absl::string_view where, absl::string_view what, absl::string_view holds,
                     absl::string_view accepted) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", where, " ", what, holds.empty() ? "" : " (", holds,
                                                   holds.empty() ? "" : ")", "; accepted: ", accepted));
  }
  absl::Status Visit(std::uint64_t n) {
    if (n <= budget_ - visits_) {
      visits_ += n;
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": reading its history and segments visits more than ", budget_, " values (", kVisitsPerByte,
        " per byte): its lists share entries, segments or blocks, which no snapshot of torch's does"));
  }

  // An integer field from 0 to `hi` (`fallback` when absent and not `required`).
  absl::Status Integer(Value dict, absl::string_view where, absl::string_view key, bool required, std::uint64_t hi,
                       std::uint64_t fallback, std::uint64_t* out) const {
    std::optional<Value> v = View::Find(dict, key);
    if (!v.has_value()) {
      if (required) return Error(where, absl::StrCat("has no \"", key, "\""), "", IntegerRange(key, hi));
      *out = fallback;
      return absl::OkStatus();
    }
    std::optional<std::uint64_t> u = View::Unsigned(*v);
    if (!u.has_value() || *u > hi) {
      return Error(where, absl::StrCat("has \"", key, "\" ", Describe(*v)), "", IntegerRange(key, hi));
    }
    *out = *u;
    return absl::OkStatus();
  }
  static std::string IntegerRange(absl::string_view key, std::uint64_t hi) {
    return absl::StrCat("\"", key, "\" an integer from 0 to ", hi,
                        hi == kMaxBytes ? " (kMaxRequestBytes, 64 TiB)" : "");
  }

  absl::Status ReadHistory(Value traces, SnapshotContents* c) {
    c->has_device_traces = true;
    if (!View::IsList(traces)) {
      return Error("\"device_traces\"", "is not a list", Describe(traces),
                   "a list of one list of trace entries per device");
    }
    if (absl::Status s = Visit(View::Size(traces)); !s.ok()) return s;
    int device = options_.device;
    if (device >= 0 && static_cast<std::size_t>(device) >= View::Size(traces)) return absl::OkStatus();
    if (device < 0) {
      for (std::size_t d = 0; d < View::Size(traces) && device < 0; ++d) {
        const Value h = View::Item(traces, d);
        if (View::IsList(h) && View::Size(h) > 0) device = static_cast<int>(d);
      }
      if (device < 0) return absl::OkStatus();
    }
    const Value history = View::Item(traces, static_cast<std::size_t>(device));
    const std::string where_history = absl::StrCat("device_traces[", device, "]");
    if (!View::IsList(history))
      return Error(where_history, "is not a list", Describe(history), "a list of trace entries");
    if (View::Size(history) == 0) return absl::OkStatus();

    Trace trace;
    std::vector<std::optional<double>> times;  // per event, its entry's time_us
    absl::flat_hash_map<std::uint64_t, std::uint64_t> live;
    bool timed = false;
    for (std::size_t i = 0; i < View::Size(history); ++i) {
      const Value e = View::Item(history, i);
      const std::string where = absl::StrCat(where_history, "[", i, "]");
      if (!View::IsDict(e)) return Error(where, "is not a dict", Describe(e), "a dict of one trace entry");
      if (absl::Status s = Visit(1 + View::Size(e)); !s.ok()) return s;
      std::optional<Value> action_value = View::Find(e, "action");
      if (!action_value.has_value()) {
        return Error(where, "has no \"action\"", "", "\"action\" a string (alloc, free_completed, ...)");
      }
      std::optional<absl::string_view> action = View::Text(*action_value);
      if (!action.has_value()) {
        return Error(where, absl::StrCat("has \"action\" ", Describe(*action_value)), "",
                     "\"action\" a string (alloc, free_completed, ...)");
      }
      const bool alloc = *action == "alloc", free = *action == "free_completed";
      if (!alloc && !free) continue;  // segment_*, free_requested, snapshot, oom (no "addr"), ...
      // A free's size is its alloc's (the block's), not read here.
      std::uint64_t addr = 0, size = 0, stream = 0;
      if (absl::Status s = Integer(e, where, "addr", true, std::numeric_limits<std::uint64_t>::max(), 0, &addr);
          !s.ok()) {
        return s;
      }
      if (alloc) {
        if (absl::Status s = Integer(e, where, "size", true, kMaxBytes, 0, &size); !s.ok()) return s;
      }
      if (std::optional<Value> st = View::Find(e, "stream")) {
        // torch writes int64_t(cudaStream_t): a pointer's bits.
        if (std::optional<std::int64_t> v = View::Signed(*st)) {
          stream = static_cast<std::uint64_t>(*v);
        } else if (std::optional<std::uint64_t> u = View::Unsigned(*st)) {
          stream = *u;
        } else {
          return Error(where, absl::StrCat("has \"stream\" ", Describe(*st)), "",
                       "\"stream\" an integer (the stream's handle)");
        }
      }
      std::optional<double> time_us;
      if (std::optional<Value> t = View::Find(e, "time_us")) {
        time_us = View::Number(*t);
        if (!time_us.has_value()) {
          return Error(where, absl::StrCat("has \"time_us\" ", Describe(*t)), "",
                       "\"time_us\" a number of microseconds");
        }
        timed = true;
      }
      const int line = static_cast<int>(std::min<std::size_t>(i + 1, std::numeric_limits<int>::max()));
      if (alloc) {
        if (size == 0) continue;
        if (addr == 0) {
          return Error(where, absl::StrCat("is an alloc of ", size, " bytes at \"addr\" 0"), "",
                       "an alloc at an address");
        }
        live[addr] = size;
        trace.events.push_back({1, "", TraceAction::kAllocate, addr, size, stream, line});
      } else {
        auto it = live.find(addr);
        if (it == live.end()) continue;  // allocated before the ring buffer's oldest entry
        trace.events.push_back({1, "", TraceAction::kFree, addr, it->second, stream, line});
        live.erase(it);
      }
      times.push_back(time_us);
    }
    // The times: time_us (a time out of range, or NaN, reads as 0; one absent takes the time before),
    // or with no time_us at all, the entry's number in microseconds.
    std::int64_t last = 0;
    for (std::size_t k = 0; k < trace.events.size(); ++k) {
      if (!timed) {
        last = trace.events[k].line;
      } else if (times[k].has_value()) {
        const double us = *times[k];
        last = std::isfinite(us) && us > 0 && us < 9e18 ? static_cast<std::int64_t>(us) : 0;
      }
      trace.events[k].time = absl::StrCat(last);
    }
    if (!timed && !trace.events.empty()) {
      c->warnings.push_back(absl::StrCat(
          source_, ": ", where_history,
          " has no \"time_us\" (torch before 2.2 did not record it): its events are timed by their entry number, "
          "1 microsecond apart, so its times are an order, not a duration"));
    }
    c->history = std::move(trace);
    c->history_device = device;
    return absl::OkStatus();
  }

  absl::Status ReadSegments(Value segments, SnapshotContents* c) {
    c->has_segments = true;
    if (!View::IsList(segments)) {
      return Error("\"segments\"", "is not a list", Describe(segments), "a list of segments (dicts)");
    }
    if (options_.segments_device < 0) return absl::OkStatus();
    SnapshotSegmentTotals& t = c->segments;
    for (std::size_t i = 0; i < View::Size(segments); ++i) {
      const Value seg = View::Item(segments, i);
      const std::string where = absl::StrCat("segments[", i, "]");
      if (!View::IsDict(seg)) return Error(where, "is not a dict", Describe(seg), "a dict of one segment");
      if (absl::Status s = Visit(1 + View::Size(seg)); !s.ok()) return s;
      if (std::optional<Value> d = View::Find(seg, "device")) {
        std::optional<std::int64_t> device = View::Signed(*d);
        if (!device.has_value()) {
          return Error(where, absl::StrCat("has \"device\" ", Describe(*d)), "", "\"device\" an integer");
        }
        if (*device != options_.segments_device) continue;
      }
      struct Field {
        const char* key;
        std::int64_t SnapshotSegmentTotals::*sum;
      };
      for (const Field& f : {Field{"total_size", &SnapshotSegmentTotals::reserved_bytes},
                             Field{"allocated_size", &SnapshotSegmentTotals::allocated_bytes},
                             Field{"active_size", &SnapshotSegmentTotals::active_bytes},
                             Field{"requested_size", &SnapshotSegmentTotals::requested_bytes}}) {
        std::uint64_t bytes = 0;
        if (absl::Status s = Integer(seg, where, f.key, false, kMaxBytes, 0, &bytes); !s.ok()) return s;
        // At most 2^46 each: a sum of them passes 2^63 only after 2^17 segments.
        if (t.*f.sum > std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(bytes)) {
          return Error(where, absl::StrCat("brings the segments' \"", f.key, "\" past 2^63 bytes"), "",
                       "the segments of one device, which hold at most its memory");
        }
        t.*f.sum += static_cast<std::int64_t>(bytes);
      }
      ++t.segments;
      std::optional<Value> blocks = View::Find(seg, "blocks");
      if (!blocks.has_value()) continue;
      if (!View::IsList(*blocks)) {
        return Error(where, absl::StrCat("has \"blocks\" ", Describe(*blocks)), "", "\"blocks\" a list of blocks");
      }
      if (absl::Status s = Visit(View::Size(*blocks)); !s.ok()) return s;
      for (std::size_t b = 0; b < View::Size(*blocks); ++b) {
        const Value block = View::Item(*blocks, b);
        const std::string where_block = absl::StrCat(where, "[\"blocks\"][", b, "]");
        if (!View::IsDict(block)) return Error(where_block, "is not a dict", Describe(block), "a dict of one block");
        if (absl::Status s = Visit(1 + View::Size(block)); !s.ok()) return s;
        std::optional<Value> state = View::Find(block, "state");
        std::optional<absl::string_view> state_text =
            state.has_value() ? View::Text(*state) : std::optional<absl::string_view>();
        if (state_text != "inactive") continue;
        std::uint64_t bytes = 0;
        if (absl::Status s = Integer(block, where_block, "size", true, kMaxBytes, 0, &bytes); !s.ok()) return s;
        t.largest_free_block_bytes = std::max(t.largest_free_block_bytes, static_cast<std::int64_t>(bytes));
      }
    }
    return absl::OkStatus();
  }

  std::string source_;
  SnapshotReadOptions options_;
  std::uint64_t budget_;
  std::uint64_t visits_ = 0;
};

}  // namespace

absl::StatusOr<SnapshotContents> ReadSnapshot(const nlohmann::json& snapshot, absl::string_view source,
                                              const SnapshotReadOptions& options) {
  // JSON shares nothing: the walk visits each of its values at most once, no budget needed.
  return SnapshotWalk<JsonView>(source, std::numeric_limits<std::uint64_t>::max(), options).Read(&snapshot);
}

absl::StatusOr<SnapshotContents> ReadSnapshot(const PlainPickle& snapshot, absl::string_view accepted,
                                              const SnapshotReadOptions& options) {
  const PickleValue root = snapshot.root();
  if (!root.is_dict() || !root.Find("device_traces").has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        snapshot.source(), " is a pickle but not a memory snapshot (a dict with \"device_traces\"); ", accepted));
  }
  return SnapshotWalk<PickleView>(snapshot.source(), kVisitsPerByte * snapshot.input_bytes() + 4096, options)
      .Read(root);
}

}  // namespace bucketalloc::harness
