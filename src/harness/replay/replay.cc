// src/harness/replay/replay.cc — trace replay, its metrics, and the min-capacity bisection.
#include "harness/replay/replay.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/stats.h"
#include "bucketalloc/timeline.h"
#include "bucketalloc/units.h"
// The harness's one named internal interface (CMakeLists.txt, the harness section): the OOM rules
// every replayed policy is judged by, the allocator's own (WorkingSetExceedsCap).
#include "frontend/observability/oom_diagnosis.h"
#include "harness/replay/policies.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

// A block the replay holds for a trace pointer.
struct Held {
  void* ptr;
  std::uint64_t size;
};

// What one pass over the trace's rounds counted.
struct PassCounts {
  std::uint64_t allocations = 0;
  std::uint64_t ooms = 0;
  std::uint64_t capacity_ooms = 0;
  std::uint64_t fragmentation_ooms = 0;
  std::map<std::uint64_t, std::uint64_t> ooms_by_stream;  // the trace's streams
  std::uint64_t tenant_cap_ooms = 0;
  std::optional<std::uint64_t> first_card_oom_event;  // index over all rounds
  // The last event's OOM, when a tenant's own cap refused it (a bigger card would not serve it).
  std::optional<ReplayAllocator::TenantCapOom> last_oom_at_tenant_cap;
  std::vector<std::uint32_t> latencies;  // ns per allocate or free
  std::vector<std::size_t> per_round_peak_reserved_bytes;
  std::vector<std::size_t> end_of_round_live_bytes;
};

// Replays `repeat` rounds of `trace` on `a`, timing each allocator call. After every event, outside
// the timed calls, `after_event(index, live_bytes, oom)` runs (index over all rounds); it returns
// false to end the pass there. The blocks still held at the end (the trace never freed them, or
// the pass ended early) go back to the allocator, untimed, so that it ends clean. With a `meter`
// (the allocator's device's), each allocate or free is a request of it, and it is stopped before
// those last frees (a service never makes them). With `times` (the trace's, EventTimes), the gap
// after each event but a round's last goes to the policy's Idle, outside every request. A template
// so that the plain replay's no-op observer costs nothing.
template <typename AfterEvent>
absl::Status RunPass(const Trace& trace, const ReplayOptions& options, std::size_t capacity, ReplayAllocator& a,
                     PassCounts& counts, DriverMeter* meter, const std::vector<double>* times,
                     AfterEvent&& after_event) {
  const int repeat = options.repeat;
  // A trace's streams are another process's handles: on a GPU every event uses the default stream.
  const bool default_stream = options.device == ReplayDeviceKind::kCuda;
  absl::flat_hash_map<std::uint64_t, Held> live;  // trace pointer -> the replay's block
  std::size_t live_bytes = 0;
  using Clock = std::chrono::steady_clock;
  auto elapsed_ns = [](Clock::time_point t0) {
    return static_cast<std::uint32_t>(
        std::min<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                               std::numeric_limits<std::uint32_t>::max()));
  };
  std::vector<Held> held_over;  // blocks earlier rounds never freed
  bool called_driver = false;   // by a request of this event
  auto begin_request = [&] {
    if (meter != nullptr) meter->BeginRequest();
  };
  auto end_request = [&] {
    if (meter != nullptr && meter->EndRequest()) called_driver = true;
  };
  std::uint64_t index = 0;
  bool stopped = false;
  absl::Status status;
  for (int round = 0; round < repeat && !stopped && status.ok(); ++round) {
    a.ResetPeak();
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const TraceEvent& e = trace.events[i];
      bool oom = false;
      called_driver = false;
      if (e.action == TraceAction::kAllocate) {
        ++counts.allocations;
        a.SetTraceStream(e.stream);
        begin_request();
        const auto t0 = Clock::now();
        const Stream stream =
            default_stream ? nullptr : reinterpret_cast<Stream>(static_cast<std::uintptr_t>(e.stream));
        absl::StatusOr<void*> p = a.Allocate(e.size, stream);
        counts.latencies.push_back(elapsed_ns(t0));
        end_request();
        if (p.ok()) {
          if (auto old = live.find(e.pointer); old != live.end()) {
            // Logged twice without a free between: the log lost the free (PeakLiveBytes agrees).
            begin_request();
            a.Free(old->second.ptr, old->second.size).IgnoreError();
            end_request();
            live_bytes -= old->second.size;
          }
          live[e.pointer] = Held{*p, e.size};
          live_bytes += e.size;
        } else if (absl::IsResourceExhausted(p.status())) {
          oom = true;
          ++counts.ooms;
          ++counts.ooms_by_stream[e.stream];
          counts.last_oom_at_tenant_cap = a.LastOomAtTenantCap();
          if (counts.last_oom_at_tenant_cap.has_value()) {
            ++counts.tenant_cap_ooms;  // its cause: the tenant's cap, as a process counts it
          } else {
            if (!counts.first_card_oom_event.has_value()) counts.first_card_oom_event = index;
            // The allocator's own definition (frontend/observability/oom_diagnosis.h): requested bytes, not rounded.
            ++(internal::WorkingSetExceedsCap(live_bytes, e.size, capacity) ? counts.capacity_ooms
                                                                            : counts.fragmentation_ooms);
          }
        } else {
          status = absl::Status(p.status().code(), absl::StrCat("line ", e.line, ": ", p.status().message()));
          break;
        }
      } else if (e.action == TraceAction::kFree) {
        // A pointer not held was never allocated in this replay (its allocation failed, or the log
        // lacks it): skipped, though it still counts as an event of the timeline.
        if (auto it = live.find(e.pointer); it != live.end()) {
          begin_request();
          const auto t0 = Clock::now();
          absl::Status s = a.Free(it->second.ptr, it->second.size);
          counts.latencies.push_back(elapsed_ns(t0));
          end_request();
          if (!s.ok()) {
            status = absl::Status(s.code(), absl::StrCat("line ", e.line, ": ", s.message()));
            break;
          }
          live_bytes -= it->second.size;
          live.erase(it);
        }
      }
      // Reserved bytes change only through the driver: read after the events that called it.
      if (called_driver) meter->NoteReserved(a.reserved_bytes());
      if (!after_event(index++, live_bytes, oom)) {
        stopped = true;
        break;
      }
      if (times != nullptr && i + 1 < times->size() && a.Idle((*times)[i + 1] - (*times)[i]) && meter != nullptr) {
        meter->NoteReserved(a.reserved_bytes());
      }
    }
    counts.per_round_peak_reserved_bytes.push_back(a.peak_reserved_bytes());
    counts.end_of_round_live_bytes.push_back(live_bytes);
    // Blocks this round never freed stay held (and counted in live_bytes); the next round's
    // pointers are new blocks.
    for (const auto& [pointer, held] : live) held_over.push_back(held);
    live.clear();
  }
  if (meter != nullptr) meter->Stop();
  for (const Held& held : held_over) a.Free(held.ptr, held.size).IgnoreError();
  return status;
}

// Downsamples (event, live, reserved) to at most `max_points` points, each the maxima (and the
// live trough) of a bucket of consecutive events, in one pass and without storing every event.
class TimelineBuilder {
 public:
  TimelineBuilder(std::uint64_t events, std::size_t max_points) {
    timeline_.events = events;
    timeline_.bucket_events = std::max<std::uint64_t>(1, (events + max_points - 1) / max_points);
    timeline_.points.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(events, max_points)));
  }
  void Add(std::uint64_t index, std::size_t live, std::size_t reserved, bool oom) {
    const std::uint64_t start = index - index % timeline_.bucket_events;
    std::vector<TimelinePoint>& points = timeline_.points;
    if (points.empty() || points.back().event != start) {
      points.push_back({start, live, live, reserved, 0});
    } else {
      TimelinePoint& p = points.back();
      p.live_bytes = std::max(p.live_bytes, live);
      p.live_min_bytes = std::min(p.live_min_bytes, live);
      p.reserved_bytes = std::max(p.reserved_bytes, reserved);
    }
    if (oom) ++points.back().ooms;
  }
  Timeline Take() { return std::move(timeline_); }

 private:
  Timeline timeline_;
};

// The largest hour an RMM time may name (HH of HH:MM:SS.ffffff; a generated trace counts hours from
// its start): over a century, and a time a double still holds to the microsecond.
constexpr std::int64_t kMaxTraceHours = 1000000;
constexpr double kDaySeconds = 24 * 3600.0;

// An RMM time, HH:MM:SS.ffffff (whole hours from 0 to kMaxTraceHours, whole minutes 0 to 59, seconds
// from 0 to below 61: a leap second), in seconds; nullopt for any other text.
std::optional<double> ClockSeconds(absl::Span<const absl::string_view> hms) {
  std::int64_t h = 0, m = 0;
  double sec = 0;
  if (hms.size() != 3 || !absl::SimpleAtoi(hms[0], &h) || !absl::SimpleAtoi(hms[1], &m) ||
      !absl::SimpleAtod(hms[2], &sec) || h < 0 || h > kMaxTraceHours || m < 0 || m > 59 || !(sec >= 0) || sec >= 61) {
    return std::nullopt;
  }
  return static_cast<double>(h) * 3600.0 + static_cast<double>(m) * 60.0 + sec;
}

// The trace's event times in seconds from its first event (its Time column: HH:MM:SS.ffffff, or
// whole microseconds as import-kineto writes them), never decreasing; InvalidArgument naming the line
// of a time that is neither. Linear in the events, whatever the times say.
absl::StatusOr<std::vector<double>> EventTimes(const Trace& trace) {
  std::vector<double> times;
  times.reserve(trace.events.size());
  std::optional<std::int64_t> first_micros;
  for (const TraceEvent& e : trace.events) {
    double t = 0.0;
    std::vector<absl::string_view> hms = absl::StrSplit(e.time, ':');
    std::int64_t micros = 0;
    if (std::optional<double> clock = ClockSeconds(hms)) {
      t = *clock;
      // RMM's times have no date: a time far before the previous one (more than 12 h) is on a later
      // day, the first on which it is no longer far before (days counted, not stepped through).
      if (!times.empty() && t + 12 * 3600.0 < times.back()) {
        t += std::ceil((times.back() - 12 * 3600.0 - t) / kDaySeconds) * kDaySeconds;
      }
    } else if (hms.size() == 1 && absl::SimpleAtoi(e.time, &micros) && micros >= 0) {
      // Microseconds since an epoch are too large for a double's microseconds: from the first one.
      if (!first_micros.has_value()) first_micros = micros;
      t = static_cast<double>(micros - *first_micros) * 1e-6;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", e.line, ": time \"", Excerpt(e.time),
                       "\" cannot place the event on a timeline; accepted: HH:MM:SS.ffffff (hours 0 to ",
                       kMaxTraceHours, ", minutes 0 to 59, seconds below 61) or whole microseconds"));
    }
    times.push_back(times.empty() ? t : std::max(t, times.back()));
  }
  const double first = times.empty() ? 0.0 : times.front();
  for (double& t : times) t -= first;
  return times;
}

// The trace's times when policy `a` works between events (ReplayAllocator::WorksWhenIdle), else
// nullopt; a trace whose times cannot place its events is refused naming the policy.
absl::StatusOr<std::optional<std::vector<double>>> IdleTimes(const Trace& trace, const ReplayAllocator& a) {
  if (!a.WorksWhenIdle()) return std::nullopt;
  absl::StatusOr<std::vector<double>> times = EventTimes(trace);
  if (!times.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the allocator works between the trace's events (reserve_ahead_mb), "
                     "which needs their times: ",
                     times.status().message()));
  }
  return std::optional<std::vector<double>>(*std::move(times));
}

// The memory timeline of a replay (ReplayOptions::sample_interval_s): a sample at every multiple of
// the interval from the first event, each holding the state after the last event before (or at)
// its time, and one at the last event (before the replay frees what the trace never freed). bucketalloc's samples are
// its own metrics (as a process's writer takes them); the models' are built from their free blocks
// and the replay's counts. OOMs are the replay's: one a tenant's own cap refused is tenant_cap (with
// the tenant and its cap), as the allocator counts it in a process; of the others, the allocator's
// definition of a capacity OOM (frontend/observability/oom_diagnosis.h), and fragmentation.
class Sampler {
 public:
  Sampler(const Trace& trace, std::vector<double> times, double interval, std::size_t capacity,
          const ReplayAllocator& a)
      : trace_(trace), times_(std::move(times)), interval_(interval), capacity_(capacity), a_(a) {
    round_length_ = (times_.empty() ? 0.0 : times_.back()) + interval_;
  }
  // After event `index` of `total` (over all rounds), with `live` bytes held; `oom` when it failed,
  // `at_tenant_cap` when a tenant's own cap refused it.
  absl::Status After(std::uint64_t index, std::uint64_t total, std::size_t live, bool oom,
                     const std::optional<ReplayAllocator::TenantCapOom>& at_tenant_cap) {
    const std::size_t n = trace_.events.size();
    const TraceEvent& e = trace_.events[index % n];
    const double t = TimeOf(index);
    if (!started_) {
      started_ = true;
      first_ = t;
    }
    if (e.action == TraceAction::kAllocate) {
      if (oom) {
        const OomCause cause = at_tenant_cap.has_value()                                 ? OomCause::kTenantCap
                               : internal::WorkingSetExceedsCap(live, e.size, capacity_) ? OomCause::kCapacity
                                                                                         : OomCause::kFragmentation;
        ++ooms_total_[static_cast<int>(cause)];
        pending_.push_back(OomEvent{++oom_seq_, t, static_cast<std::size_t>(e.size), cause,
                                    at_tenant_cap.has_value() ? at_tenant_cap->tenant : std::string(),
                                    at_tenant_cap.has_value() ? at_tenant_cap->cap : 0});
      } else {
        ++allocations_;
        held_[index / n].insert(e.pointer);
      }
    } else if (e.action == TraceAction::kFree && held_[index / n].erase(e.pointer) > 0) {
      ++frees_;
    }
    // This state holds until the next event: the sample points before it see it.
    const bool last = index + 1 == total;
    const double until = last ? t : TimeOf(index + 1);
    // Sample k is at first + k * interval (no sum of intervals to drift).
    for (double at = first_ + static_cast<double>(k_) * interval_; last ? at <= until : at < until;
         at = first_ + static_cast<double>(++k_) * interval_) {
      if (absl::Status s = Sample(at); !s.ok()) return s;
    }
    if (last && (samples_.empty() || samples_.back().time_s < t)) return Sample(t);
    return absl::OkStatus();
  }
  std::vector<TimelineSample> Take() { return std::move(samples_); }

 private:
  // The memory figures of a model of another allocator (no metrics of its own), from its free
  // blocks `f` (ReplayAllocator::Fragmentation) and the replay's count of live allocations: nothing
  // awaits stream events (active is allocated).
  MemoryFigures ModelFigures(const PoolFragmentation& f) const {
    MemoryFigures m;
    m.reserved = a_.reserved_bytes();
    m.allocated = m.active = static_cast<std::size_t>(f.allocated);
    m.cached = m.reserved - std::min(m.reserved, m.allocated);
    m.requested = static_cast<std::size_t>(f.requested);
    m.largest_free = static_cast<std::size_t>(f.largest_free);
    m.live_allocations = allocations_ - frees_;
    return m;
  }

  double TimeOf(std::uint64_t index) const {
    const std::size_t n = trace_.events.size();
    return static_cast<double>(index / n) * round_length_ + times_[index % n];
  }

  absl::Status Sample(double t) {
    if (samples_.size() >= kMaxTimelineSamples) {
      return absl::InvalidArgumentError(absl::StrCat("the timeline would have more than ", kMaxTimelineSamples,
                                                     " samples; accepted: a longer interval"));
    }
    TimelineSample s;
    if (std::optional<DeviceMetrics> m = a_.Metrics(); m.has_value()) {
      s = TimelineSampleOf(*m, t, std::numeric_limits<std::uint64_t>::max());  // OOMs: the replay's, below
    } else {
      const PoolFragmentation f = a_.Fragmentation();
      s.time_s = t;
      s.capacity_bytes = static_cast<std::int64_t>(capacity_);
      SetMemoryFigures(ModelFigures(f), &s);
      s.external_fragmentation = f.external_fragmentation();
      s.internal_fragmentation = f.internal_fragmentation();
      s.allocations_total = allocations_;
      s.frees_total = frees_;
    }
    s.time_s = t;
    s.ooms_total = ooms_total_;
    s.ooms = std::move(pending_);
    pending_.clear();
    samples_.push_back(std::move(s));
    return absl::OkStatus();
  }

  const Trace& trace_;
  const std::vector<double> times_;
  const double interval_;
  const std::size_t capacity_;
  const ReplayAllocator& a_;
  double round_length_ = 0.0;
  bool started_ = false;
  double first_ = 0.0;
  std::uint64_t k_ = 0;  // the next sample's number
  std::int64_t allocations_ = 0, frees_ = 0;
  std::array<std::int64_t, kNumOomCauses> ooms_total_{};
  std::uint64_t oom_seq_ = 0;
  std::vector<OomEvent> pending_;
  absl::flat_hash_map<std::uint64_t, absl::flat_hash_set<std::uint64_t>> held_;  // by round: pointers held
  std::vector<TimelineSample> samples_;
};

// Replays again on a fresh allocator up to event `event` and snapshots its free blocks there
// (PeakFragmentation's comment says why a second replay); `expected_reserved`, when given, is what
// the first replay had reserved then (a replay that differs is an internal error).
absl::StatusOr<PeakFragmentation> CaptureFragmentationAt(const Trace& trace, const ReplayOptions& options,
                                                         std::size_t capacity, std::uint64_t event,
                                                         std::optional<std::size_t> expected_reserved) {
  DriverMeter meter(options.cost);  // the first replay's prices: a policy's idle work follows them
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> made =
      MakeReplayAllocator(options.allocator, options.capacity, options.device, &meter);
  if (!made.ok()) return made.status();
  ReplayAllocator& a = **made;
  absl::StatusOr<std::optional<std::vector<double>>> times = IdleTimes(trace, a);
  if (!times.ok()) return times.status();
  PeakFragmentation f;
  std::size_t reserved = 0;
  bool reached = false;
  PassCounts counts;
  auto snapshot_at_event = [&](std::uint64_t index, std::size_t live, bool) {
    if (index < event) return true;
    reached = true;
    reserved = a.reserved_bytes();
    f.event = index;
    f.live_bytes = live;
    f.free_blocks = a.Fragmentation();
    f.breakdown = a.Breakdown();
    return false;
  };
  absl::Status s = RunPass(trace, options, capacity, a, counts, /*meter=*/nullptr,
                           times->has_value() ? &**times : nullptr, snapshot_at_event);
  if (!s.ok()) return s;
  if (!reached || (expected_reserved.has_value() && reserved != *expected_reserved)) {
    return absl::InternalError(absl::StrCat(
        "allocator ", options.allocator, " replayed differently the second time: reserved bytes after event ", event,
        " were ", expected_reserved.value_or(0), ", then ", reached ? reserved : 0, reached ? "" : " (never reached)"));
  }
  return f;
}

}  // namespace

absl::string_view BreakdownMomentName(BreakdownMoment moment) {
  return moment == BreakdownMoment::kDecidingEvent ? "deciding_event" : "peak_reserved";
}

std::size_t PeakLiveBytes(const Trace& trace, int rounds) {
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live;
  std::size_t now = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.action == TraceAction::kAllocate) {
      if (auto [it, inserted] = live.emplace(e.pointer, e.size); inserted) {
        now += e.size;
      } else {  // a pointer allocated twice without a free: the log lost a free; count the new size
        now += e.size - it->second;
        it->second = e.size;
      }
      peak = std::max(peak, now);
    } else if (e.action == TraceAction::kFree) {
      if (auto it = live.find(e.pointer); it != live.end()) {
        now -= it->second;
        live.erase(it);
      }
    }
  }
  // What a round never frees stays held through the later rounds (the replay keeps it).
  return peak + static_cast<std::size_t>(std::max(rounds, 1) - 1) * now;
}

absl::StatusOr<double> TraceDuration(const Trace& trace) {
  absl::StatusOr<std::vector<double>> times = EventTimes(trace);
  if (!times.ok()) return times.status();
  return times->empty() ? 0.0 : times->back();
}

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.repeat < 1) {
    return absl::InvalidArgumentError(absl::StrCat("repeat ", options.repeat, " is invalid; accepted: 1 or more"));
  }
  if (!(options.sample_interval_s >= 0.0 && options.sample_interval_s < std::numeric_limits<double>::infinity())) {
    return absl::InvalidArgumentError(absl::StrCat("sample interval ", options.sample_interval_s,
                                                   " s; accepted: 0 (no timeline) or a number of seconds above 0"));
  }
  if (options.record_timeline && options.timeline_points == 0) {
    return absl::InvalidArgumentError("timeline_points 0 is invalid; accepted: 1 or more");
  }
  if (absl::Status s = CheckTrace(trace); !s.ok()) return s;
  DriverMeter meter(options.cost);  // outlives the allocator: its teardown still calls the driver
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> made =
      MakeReplayAllocator(options.allocator, options.capacity, options.device, &meter);
  if (!made.ok()) return made.status();
  ReplayAllocator& a = **made;
  absl::StatusOr<std::optional<std::vector<double>>> idle_times = IdleTimes(trace, a);
  if (!idle_times.ok()) return idle_times.status();
  const std::vector<double>* idle = idle_times->has_value() ? &**idle_times : nullptr;
  ReplayResult r;
  r.allocator = options.allocator;
  r.device = std::string(ReplayDeviceName(options.device));
  r.capacity = ReplayCapacity(options.capacity);
  r.peak_live_bytes = PeakLiveBytes(trace, options.repeat);
  const std::uint64_t events =
      static_cast<std::uint64_t>(trace.events.size()) * static_cast<std::uint64_t>(options.repeat);
  PassCounts counts;
  counts.latencies.reserve(static_cast<std::size_t>(events));
  std::size_t peak_reserved = 0;  // as read after each event, with the first event that reached it
  std::uint64_t peak_event = 0;
  std::optional<Sampler> sampler;
  absl::Status sampled;
  if (options.sample_interval_s > 0.0) {
    absl::StatusOr<std::vector<double>> times = EventTimes(trace);
    if (!times.ok()) return times.status();
    // A sample per interval over every round (Sampler): refused before the replay when too many,
    // so that a trace's time span never becomes the replay's loop count.
    const double span = ((times->empty() ? 0.0 : times->back()) + options.sample_interval_s) * options.repeat;
    if (!(span / options.sample_interval_s <= static_cast<double>(kMaxTimelineSamples))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a timeline sampled every ", options.sample_interval_s, " s over the trace's ", span,
          " s (all rounds) would have more than ", kMaxTimelineSamples, " samples; accepted: an interval of at least ",
          span / static_cast<double>(kMaxTimelineSamples), " s"));
    }
    sampler.emplace(trace, std::move(*times), options.sample_interval_s, r.capacity, a);
  }
  // Samples after each event when asked; false stops the replay (too many samples).
  auto sample = [&](std::uint64_t index, std::size_t live, bool oom) {
    if (sampler.has_value() && sampled.ok()) {
      sampled = sampler->After(index, events, live, oom, counts.last_oom_at_tenant_cap);
    }
    return sampled.ok();
  };
  if (!options.record_timeline) {
    auto until_oom = [&](std::uint64_t index, std::size_t live, bool oom) {
      return sample(index, live, oom) &&
             !(oom && options.stop_at_first_oom && !counts.last_oom_at_tenant_cap.has_value());
    };
    absl::Status s = RunPass(trace, options, r.capacity, a, counts, &meter, idle, until_oom);
    if (!s.ok()) return s;
  } else {
    TimelineBuilder timeline(events, options.timeline_points);
    auto record = [&](std::uint64_t index, std::size_t live, bool oom) {
      const std::size_t reserved = a.reserved_bytes();
      timeline.Add(index, live, reserved, oom);
      if (reserved > peak_reserved) {
        peak_reserved = reserved;
        peak_event = index;
      }
      return sample(index, live, oom);
    };
    absl::Status s = RunPass(trace, options, r.capacity, a, counts, &meter, idle, record);
    if (!s.ok()) return s;
    r.timeline = timeline.Take();
  }
  if (!sampled.ok()) return sampled;
  if (sampler.has_value()) r.samples = sampler->Take();
  r.allocations = counts.allocations;
  r.ooms = counts.ooms;
  r.capacity_ooms = counts.capacity_ooms;
  r.fragmentation_ooms = counts.fragmentation_ooms;
  r.ooms_by_stream = std::move(counts.ooms_by_stream);
  r.tenant_cap_ooms = counts.tenant_cap_ooms;
  r.first_card_oom_event = counts.first_card_oom_event;
  if (std::optional<DeviceMetrics> m = a.Metrics(); m.has_value()) r.tenants = std::move(m->tenants);
  r.per_round_peak_reserved_bytes = std::move(counts.per_round_peak_reserved_bytes);
  r.per_round_end_live_bytes = counts.end_of_round_live_bytes;
  r.peak_reserved_bytes =
      *std::max_element(r.per_round_peak_reserved_bytes.begin(), r.per_round_peak_reserved_bytes.end());
  r.reserved_over_live = r.peak_live_bytes == 0
                             ? 0.0
                             : static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_live_bytes);
  r.p50_ns = Percentile(absl::MakeSpan(counts.latencies), 0.50);
  r.p99_ns = Percentile(absl::MakeSpan(counts.latencies), 0.99);
  const BackendCounters c = a.backend_counters();
  std::int64_t all_calls = 0;
  for (const BackendCall& call : BackendCalls(c)) all_calls += call.count;
  r.backend_calls = static_cast<std::uint64_t>(all_calls);
  r.backend_counters = c;
  r.driver_time = meter.Summary();
  r.simulated_backend_ms = r.driver_time.total_ms;
  r.granules_stitched = a.granules_stitched();
  if (options.repeat == 1) {
    r.verdict = "single round";
  } else {
    // Fragmentation settles in the first rounds; a peak that still grows in the second half, or
    // bytes still held at the end of each round that grow round over round, is a leak.
    // With two rounds, the second is the settled one: it must not exceed the first.
    const std::size_t settled =
        r.per_round_peak_reserved_bytes[options.repeat == 2 ? 0 : static_cast<std::size_t>(options.repeat) / 2];
    const bool peak_grows = r.per_round_peak_reserved_bytes.back() > settled;
    const bool held_grows = counts.end_of_round_live_bytes.back() > counts.end_of_round_live_bytes.front();
    r.verdict = peak_grows || held_grows ? "rising" : "stable";
  }
  if (options.record_timeline && peak_reserved > 0) {
    made->reset();  // its cache goes back first: on a GPU the two replays would not fit together
    absl::StatusOr<PeakFragmentation> f = CaptureFragmentationAt(trace, options, r.capacity, peak_event, peak_reserved);
    if (!f.ok()) return f.status();
    r.peak_fragmentation = std::move(*f);
  }
  return r;
}

std::string ReplayResult::ToJson() const {
  nlohmann::ordered_json j = {{"allocator", allocator},
                              {"device", device},
                              {"capacity_bytes", capacity},
                              {"allocations", allocations},
                              {"peak_live_bytes", peak_live_bytes},
                              {"peak_reserved_bytes", peak_reserved_bytes},
                              {"reserved_over_live", reserved_over_live},
                              {"ooms", ooms},
                              {"capacity_ooms", capacity_ooms},
                              {"fragmentation_ooms", fragmentation_ooms},
                              {"tenant_cap_ooms", tenant_cap_ooms},
                              {"p50_ns", p50_ns},
                              {"p99_ns", p99_ns},
                              {"backend_calls", backend_calls},
                              {"backend_call_counts", nlohmann::ordered_json::object()},
                              {"granules_stitched", granules_stitched},
                              {"simulated_backend_ms", simulated_backend_ms},
                              {"driver_time", driver_time.ToJson()},
                              {"per_round_peak_reserved_bytes", per_round_peak_reserved_bytes},
                              {"verdict", verdict}};
  for (const BackendCall& call : BackendCalls(backend_counters)) j["backend_call_counts"][call.key] = call.count;
  if (ooms_by_stream.size() > 1 || (ooms_by_stream.size() == 1 && ooms_by_stream.begin()->first != 0)) {
    j["ooms_by_stream"] = nlohmann::ordered_json::object();
    for (const auto& [stream, n] : ooms_by_stream) j["ooms_by_stream"][absl::StrCat(stream)] = n;
  }
  if (!tenants.empty()) j["tenants"] = nlohmann::ordered_json::parse(TenantStatsToJson(tenants))["tenants"];
  return j.dump(2);
}

absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              void (*progress)(const std::string& line)) {
  MinCapacitySearch search;
  if (progress != nullptr) search.progress = progress;
  return MinCapacity(trace, allocator, cost, search);
}

absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              const MinCapacitySearch& search) {
  // The trace and the cost model are checked by each probe's Replay (the first probe reports).
  const std::size_t live = PeakLiveBytes(trace);
  auto probe = [&](std::size_t capacity) -> absl::StatusOr<ReplayResult> {
    if (search.expired && search.expired()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "min-capacity ", allocator, ": the time allowed ran out before a probe of ", FormatBytes(capacity)));
    }
    ReplayOptions o;
    o.allocator = std::string(allocator);
    o.capacity = capacity;
    o.cost = cost;
    o.stop_at_first_oom = true;  // a probe only asks whether the capacity serves the whole trace
    absl::StatusOr<ReplayResult> r = Replay(trace, o);
    if (r.ok() && search.progress) {
      search.progress(absl::StrCat("min-capacity ", allocator, ": ", FormatBytes(capacity), " -> ",
                                   r->card_ooms() == 0 ? "serves the trace" : "fails (stopped at the first OOM)"));
    }
    return r;
  };
  // Below the peak of live bytes nothing can work: start just under it (or at the known failure)
  // and double from it (or from the expected pass) until it works.
  const std::size_t floor_live = std::max(kReplayGranularity, RoundUp(live, kReplayGranularity)) - kReplayGranularity;
  std::size_t lo = std::max(floor_live, ReplayCapacity(search.failing));
  std::size_t hi = std::max(2 * kReplayGranularity, RoundUp(live, kReplayGranularity));
  if (search.passing > 0) hi = std::max(hi, RoundUp(search.passing, kReplayGranularity));
  if (hi <= lo) hi = lo + kReplayGranularity;
  absl::StatusOr<ReplayResult> at_hi = probe(hi);
  while (at_hi.ok() && at_hi->card_ooms() > 0) {
    if (hi >= kMaxRequestBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocator ", allocator, " does not serve the trace even with ", FormatBytes(hi)));
    }
    lo = hi;
    hi *= 2;
    at_hi = probe(hi);
  }
  if (!at_hi.ok()) return at_hi.status();
  // Tenants' caps refused some of the trace: what the rest needs may be less than the trace's peak
  // of live bytes, so the search goes down to the smallest card.
  const bool capped = at_hi->tenant_cap_ooms > 0;
  if (capped) lo = kReplayGranularity;
  auto bisect = [&](std::size_t failing, std::size_t passing,
                    ReplayResult at_passing) -> absl::StatusOr<std::pair<std::size_t, ReplayResult>> {
    while (passing - failing > kReplayGranularity) {
      const std::size_t mid = (failing + passing) / 2 / kReplayGranularity * kReplayGranularity;
      absl::StatusOr<ReplayResult> r = probe(mid);
      if (!r.ok()) return r.status();
      if (r->card_ooms() == 0) {
        passing = mid;
        at_passing = std::move(*r);
      } else {
        failing = mid;
      }
    }
    return std::make_pair(passing, std::move(at_passing));
  };
  absl::StatusOr<std::pair<std::size_t, ReplayResult>> found = bisect(lo, hi, std::move(*at_hi));
  if (!found.ok()) return found.status();
  // Serving a trace is not always monotone in capacity: a cache that never had to release can pin a
  // segment that a tighter run gave back. So probe kGridProbes evenly spaced capacities between the
  // first one that could work (the peak of live bytes, rounded up, which failed) and the answer,
  // and bisect again below the smallest that serves the trace.
  constexpr int kGridProbes = 5;
  const std::size_t floor =
      capped ? 2 * kReplayGranularity : std::max(2 * kReplayGranularity, RoundUp(live, kReplayGranularity));
  if (found->first > floor + kReplayGranularity) {
    std::size_t failing = floor;
    for (int k = 1; k <= kGridProbes; ++k) {
      const std::size_t c = (floor + (found->first - floor) * static_cast<std::size_t>(k) / (kGridProbes + 1)) /
                            kReplayGranularity * kReplayGranularity;
      if (c <= failing || c >= found->first) continue;
      absl::StatusOr<ReplayResult> r = probe(c);
      if (!r.ok()) return r.status();
      if (r->card_ooms() > 0) {
        failing = c;
        continue;
      }
      absl::StatusOr<std::pair<std::size_t, ReplayResult>> lower = bisect(failing, c, std::move(*r));
      if (!lower.ok()) return lower.status();
      found = std::move(lower);
      break;
    }
  }
  hi = found->first;
  at_hi = std::move(found->second);
  MinCapacityResult m;
  m.min_capacity_bytes = hi;
  m.min_capacity_over_live = live == 0 ? 0.0 : static_cast<double>(hi) / static_cast<double>(live);
  m.at_min = std::move(*at_hi);
  return m;
}

absl::Status MeasurePeakAtMin(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                              MinCapacityResult* m) {
  ReplayOptions o;
  o.allocator = std::string(allocator);
  o.cost = cost;
  // The event that decides the min capacity: the first that fails one step below it.
  if (m->min_capacity_bytes > kReplayGranularity) {
    o.capacity = m->min_capacity_bytes - kReplayGranularity;
    o.stop_at_first_oom = true;
    absl::StatusOr<ReplayResult> below = Replay(trace, o);
    if (!below.ok()) return below.status();
    if (below->first_card_oom_event.has_value()) {
      o.capacity = m->min_capacity_bytes;
      o.stop_at_first_oom = false;
      absl::StatusOr<PeakFragmentation> f = CaptureFragmentationAt(
          trace, o, ReplayCapacity(o.capacity), *below->first_card_oom_event, /*expected_reserved=*/std::nullopt);
      if (!f.ok()) return f.status();
      f->moment = BreakdownMoment::kDecidingEvent;
      m->peak_at_min = std::move(*f);
      return absl::OkStatus();
    }
  }
  // No step below fails (the smallest card, or tenants' caps refuse the rest): where reserved peaks.
  o.capacity = m->min_capacity_bytes;
  o.stop_at_first_oom = false;
  o.record_timeline = true;
  o.timeline_points = 1;
  absl::StatusOr<ReplayResult> r = Replay(trace, o);
  if (!r.ok()) return r.status();
  m->peak_at_min = std::move(r->peak_fragmentation);
  if (m->peak_at_min.has_value()) m->peak_at_min->moment = BreakdownMoment::kPeakReserved;
  return absl::OkStatus();
}

double MinCapacityResult::min_capacity_over_true_need() const {
  if (!true_need_bytes.has_value() || *true_need_bytes == 0) return 0.0;
  return static_cast<double>(min_capacity_bytes) / static_cast<double>(*true_need_bytes);
}

std::string MinCapacityResult::ToJson() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(at_min.ToJson());
  j["min_capacity_bytes"] = min_capacity_bytes;
  j["min_capacity_over_live"] = min_capacity_over_live;
  if (true_need_bytes.has_value()) {
    j["true_need_bytes"] = *true_need_bytes;
    j["min_capacity_over_true_need"] = min_capacity_over_true_need();
  }
  if (peak_at_min.has_value()) {
    j["peak_at_min"] = {
        {"event", peak_at_min->event},
        {"moment", BreakdownMomentName(peak_at_min->moment)},
        {"live_bytes", peak_at_min->live_bytes},
        {"breakdown", nlohmann::ordered_json::parse(peak_at_min->breakdown.ToJson(at_min.peak_live_bytes))}};
  }
  return j.dump(2);
}

}  // namespace bucketalloc::harness
