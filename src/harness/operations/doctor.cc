// src/harness/operations/doctor.cc — the runbook's classifier (harness/operations/doctor.h).
#include "harness/operations/doctor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketalloc/units.h"
#include "harness/reports/page.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr char kLeverFull[] =
    "the load at start-up is too large for the card: reduce the weights' footprint (quantization, tensor or "
    "pipeline parallelism across more cards) or the buffers reserved up front (KV cache fraction, max batch), or use "
    "a larger card";
constexpr char kLeverCapacity[] =
    "cap the queue or the batch (max_num_seqs, max_num_batched_tokens) and limit sequence lengths (max_model_len): "
    "memory grows with the requests in flight; if the working set is right, a larger card";
constexpr char kLeverLeak[] =
    "find the leak: allocations that are never freed (record_memory_history, then snapshot() or memory_viz: the "
    "blocks alive since the climb began, with their stacks)";
constexpr char kLeverLong[] =
    "limit sequence lengths (max_model_len) or give long requests their own tiers or buckets (tiers_tokens), and cap "
    "the queue so that a long request does not meet a full batch";
constexpr char kLeverFragmentation[] =
    "tiers or buckets for variable-length tensors (tiers_tokens), virtual-memory stitching (backend:vmm), or "
    "max_split_size_mb; a restart only resets it";
constexpr char kLeverCache[] =
    "release the cache at quiet times (empty_cache) or before the cap (garbage_collection_threshold:0.8), so that "
    "memory held but unused does not stand in the way";

// Just past the body's end, so that the range of the run's last part holds the body's last sample
// (a bound of a range, not a threshold).
constexpr double kPastTheEnd = 1e-12;

std::string Bytes(double b) { return FormatBytes(static_cast<std::size_t>(std::max(0.0, b))); }
std::string Pct(double part, double whole) { return absl::StrFormat("%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0); }
std::string At(double t) { return absl::StrFormat("%.1f s", t); }

// One device's series.
struct Series {
  std::vector<double> t;
  std::vector<double> reserved, allocated, cached;
  double cap = 0.0;    // the cap; 0 when the timeline does not know it
  double scale = 0.0;  // what the thresholds are fractions of: the cap, else the peak of reserved
  double t0 = 0.0, duration = 0.0;
  std::vector<OomEvent> ooms;                            // as listed (a process lists at most 64 per line)
  std::array<std::int64_t, kNumOomCauses> oom_counts{};  // over the timeline, from ooms_total
  std::int64_t retries = 0;                              // alloc_retries_total over the timeline
  // Samples that contradict themselves (Contradiction), and the first one's.
  std::size_t contradictions = 0;
  std::string first_contradiction;
  double first_contradiction_at = 0.0;
  // Samples with reserved memory above the cap (OverCap), the first one's, and the largest excess.
  std::size_t over_cap = 0;
  std::string first_over_cap;
  double first_over_cap_at = 0.0, last_over_cap_at = 0.0;
  std::size_t size() const { return t.size(); }
  double Position(double at) const { return duration > 0 ? (at - t0) / duration : 0.0; }
};

// What no bucketalloc sample shows, or "": a figure of memory held within reserved memory that is
// above it (live, active, cached, requested, the largest free block).
std::string Contradiction(const TimelineSample& x) {
  const std::pair<const char*, std::int64_t> within[] = {{"allocated (live)", x.allocated_bytes},
                                                         {"active", x.active_bytes},
                                                         {"cached", x.cached_bytes},
                                                         {"requested", x.requested_bytes},
                                                         {"the largest free block", x.largest_free_block_bytes}};
  for (const auto& [name, bytes] : within) {
    if (bytes > x.reserved_bytes) {
      return absl::StrCat(name, " ", Bytes(static_cast<double>(bytes)), " is more than reserved ",
                          Bytes(static_cast<double>(x.reserved_bytes)), ", which holds it");
    }
  }
  return "";
}

// Reserved memory above the cap, or "": a state a process reaches only when its cap is lowered
// below what it holds (set_per_process_memory_fraction, bucketalloc_set_memory_fraction: the cache
// above the cap stays until released), which a timeline that starts after the change shows from
// its first line; or figures that are not a bucketalloc timeline's. Either way it is said.
std::string OverCap(const TimelineSample& x) {
  if (x.capacity_bytes <= 0 || x.reserved_bytes <= x.capacity_bytes) return "";
  return absl::StrCat("reserved ", Bytes(static_cast<double>(x.reserved_bytes)), " is ",
                      Pct(static_cast<double>(x.reserved_bytes), static_cast<double>(x.capacity_bytes)), " of the ",
                      Bytes(static_cast<double>(x.capacity_bytes)), " cap");
}

// The series of the samples at `indices` (one device's, in time order).
Series SeriesOf(absl::Span<const TimelineSample> samples, absl::Span<const std::size_t> indices) {
  Series s;
  s.t.reserve(indices.size());
  s.reserved.reserve(indices.size());
  s.allocated.reserve(indices.size());
  s.cached.reserve(indices.size());
  const TimelineSample* first = nullptr;
  const TimelineSample* last = nullptr;
  for (std::size_t i : indices) {
    const TimelineSample& x = samples[i];
    if (first == nullptr) first = &x;
    last = &x;
    s.t.push_back(x.time_s);
    s.reserved.push_back(static_cast<double>(x.reserved_bytes));
    s.allocated.push_back(static_cast<double>(x.allocated_bytes));
    s.cached.push_back(static_cast<double>(std::max<std::int64_t>(0, x.reserved_bytes - x.allocated_bytes)));
    s.cap = std::max(s.cap, static_cast<double>(x.capacity_bytes));
    s.ooms.insert(s.ooms.end(), x.ooms.begin(), x.ooms.end());
    if (std::string c = Contradiction(x); !c.empty()) {
      if (s.contradictions++ == 0) {
        s.first_contradiction = std::move(c);
        s.first_contradiction_at = x.time_s;
      }
    }
    if (std::string c = OverCap(x); !c.empty()) {
      if (s.over_cap++ == 0) {
        s.first_over_cap = std::move(c);
        s.first_over_cap_at = x.time_s;
      }
      s.last_over_cap_at = x.time_s;
    }
  }
  if (s.size() > 0) {
    s.t0 = s.t.front();
    s.duration = s.t.back() - s.t.front();
    s.scale = s.cap > 0 ? s.cap : *std::max_element(s.reserved.begin(), s.reserved.end());
    // The counts over the timeline: the totals' growth, and the first line's own OOMs.
    for (int c = 0; c < kNumOomCauses; ++c) {
      std::int64_t in_first = 0;
      for (const OomEvent& e : first->ooms) in_first += static_cast<int>(e.cause) == c;
      s.oom_counts[c] = std::max<std::int64_t>(0, last->ooms_total[c] - first->ooms_total[c] + in_first);
    }
    s.retries = std::max<std::int64_t>(0, last->alloc_retries_total - first->alloc_retries_total);
  }
  return s;
}

// The indices of each device's samples, the devices in the order they first appear: one pass.
std::vector<std::pair<int, std::vector<std::size_t>>> SamplesByDevice(absl::Span<const TimelineSample> samples) {
  std::vector<std::pair<int, std::vector<std::size_t>>> out;
  absl::flat_hash_map<int, std::size_t> slot;  // device -> its place in `out`
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto [it, added] = slot.try_emplace(samples[i].device, out.size());
    if (added) out.emplace_back(samples[i].device, std::vector<std::size_t>{});
    out[it->second].second.push_back(i);
  }
  return out;
}

// The index range [lo, hi) of samples with position in [a, b).
std::pair<std::size_t, std::size_t> Range(const Series& s, double a, double b) {
  std::size_t lo = 0, hi = 0;
  while (lo < s.size() && s.Position(s.t[lo]) < a) ++lo;
  hi = lo;
  while (hi < s.size() && (s.Position(s.t[hi]) < b || (b >= 1.0 && hi + 1 == s.size()))) ++hi;
  return {lo, hi};
}

double Max(const std::vector<double>& v, std::size_t lo, std::size_t hi) {
  double m = 0;
  for (std::size_t i = lo; i < hi; ++i) m = std::max(m, v[i]);
  return m;
}
double Min(const std::vector<double>& v, std::size_t lo, std::size_t hi) {
  double m = lo < hi ? v[lo] : 0.0;
  for (std::size_t i = lo; i < hi; ++i) m = std::min(m, v[i]);
  return m;
}

void Add(std::vector<Verdict>* out, int device, Finding verdict, std::string evidence, std::string lever, double from,
         double to) {
  for (Verdict& v : *out) {
    if (v.verdict == verdict) {  // one verdict of a kind: the evidence joins it
      absl::StrAppend(&v.evidence, "; ", evidence);
      v.from_s = std::min(v.from_s, from);
      v.to_s = std::max(v.to_s, to);
      return;
    }
  }
  out->push_back(Verdict{verdict, std::move(evidence), std::move(lever), from, to, device});
}

// What every check of one device's series reads (a series that used memory: scale > 0).
struct Context {
  Context(const Series& series, int device_index, const DoctorThresholds& thresholds)
      : s(series), th(thresholds), device(device_index), cap(series.scale) {
    n = s.size();
    peak_reserved = Max(s.reserved, 0, n);
    peak_live = Max(s.allocated, 0, n);
    of_cap = s.cap > 0 ? " of the cap" : " of the peak of reserved memory (no cap in the timeline)";
    // The device's OOMs: a tenant refused at its own cap does not make the device short.
    for (int c = 0; c < kNumOomCauses; ++c) ooms += c == static_cast<int>(OomCause::kTenantCap) ? 0 : s.oom_counts[c];
    pressure = ooms > 0 || s.retries > 0;
    body = n;
    while (body > 1 && s.Position(s.t[body - 1]) > th.body_end) --body;
  }
  const Series& s;
  const DoctorThresholds& th;
  int device;
  double cap;          // what the thresholds are fractions of (the cap, else the peak of reserved)
  std::string of_cap;  // what `cap` is, for the evidence
  std::size_t n = 0;
  double peak_reserved = 0, peak_live = 0;
  std::int64_t ooms = 0;
  bool pressure = false;  // the allocator ran short at least once (an OOM or a retry)
  std::size_t body = 0;   // the samples of the run's body: its teardown (after th.body_end) left out
};

// The body of the run in th.windows windows of equal time: the index range [lo, hi) of window `w`.
std::pair<std::size_t, std::size_t> Window(const Context& c, int w) {
  const double body_end = c.s.Position(c.s.t[c.body - 1]);
  auto r = Range(c.s, body_end * w / c.th.windows, body_end * (w + 1) / c.th.windows);
  r.second = std::min(r.second, c.body);
  if (w == c.th.windows - 1) r.second = c.body;
  return r;
}

// Samples that contradict themselves cannot be read as a curve: this verdict and no other.
Verdict Inconsistent(const Series& s, int device) {
  return Verdict{Finding::kInconsistent,
                 absl::StrCat(s.contradictions, " of device ", device, "'s ", s.size(),
                              " samples contradict themselves, which no bucketalloc timeline does; the first, at ",
                              At(s.first_contradiction_at), ": ", s.first_contradiction),
                 "check the input: it is not a bucketalloc timeline (BUCKETALLOC_TIMELINE, replay --timeline), or it "
                 "was corrupted or edited; no other verdict is given, since its figures cannot be trusted",
                 s.first_contradiction_at,
                 s.first_contradiction_at,
                 device};
}

// Reserved memory above the cap (a cap lowered below what was reserved), said beside the others.
void FindOverCap(const Series& s, int device, std::vector<Verdict>* out) {
  if (s.over_cap == 0) return;
  Add(out, device, Finding::kOverCap,
      absl::StrCat(s.over_cap, " of device ", device, "'s ", s.size(), " samples reserve more than the cap, from ",
                   At(s.first_over_cap_at), " (", s.first_over_cap,
                   "): a cap lowered below what was reserved, whose cache above it stays until released; no "
                   "growth is possible meanwhile"),
      "release the cache above the cap (empty_cache) after lowering it, or raise the cap back; if the cap was "
      "never lowered, check the input: a bucketalloc process never reserves above its cap otherwise",
      s.first_over_cap_at, s.last_over_cap_at);
}

// Full at start: near the cap in the first part of the run, and short of memory at some point.
// Near the cap but never short is said in `calm` (what a healthy verdict also says).
void FindFullAtStart(const Context& c, std::vector<Verdict>* out, std::string* calm) {
  const Series& s = c.s;
  if (s.cap <= 0) return;
  for (std::size_t i = 0; i < c.n; ++i) {
    if (s.Position(s.t[i]) > c.th.start_fraction) break;
    if (std::max(s.reserved[i], s.allocated[i]) < c.th.full * c.cap) continue;
    const std::string evidence = absl::StrCat("reserved ", Bytes(s.reserved[i]), " (", Pct(s.reserved[i], c.cap),
                                              " of the ", Bytes(c.cap), " cap; live ", Bytes(s.allocated[i]), ") at ",
                                              At(s.t[i]), ", ", Pct(s.t[i] - s.t0, s.duration), " into the timeline");
    if (c.pressure) {
      Add(out, c.device, Finding::kFullAtStart,
          absl::StrCat(evidence, "; later ", c.ooms, " OOMs and ", s.retries, " retries of a released cache"),
          kLeverFull, s.t0, s.t[i]);
    } else {
      *calm = absl::StrCat("; near the cap from start-up (", evidence,
                           ") but never short of memory: fine if intended (a preallocated KV cache)");
    }
    return;
  }
}

// Leak: the troughs of live memory rise window after window (the first window, start-up, and the
// teardown left out), in most steps and falling in few, by more than noise, and no one step makes
// most of the rise (one jump that stays is a spike, not a leak). Returns whether it is one.
bool FindLeak(const Context& c, std::vector<Verdict>* out) {
  const Series& s = c.s;
  const DoctorThresholds& th = c.th;
  std::vector<double> troughs, trough_at;
  for (int w = 1; w < th.windows; ++w) {
    auto [lo, hi] = Window(c, w);
    if (lo >= hi) continue;
    troughs.push_back(Min(s.allocated, lo, hi));
    trough_at.push_back(s.t[lo]);
  }
  const double noise = th.leak_noise * c.cap;
  int up = 0, down = 0;
  double largest_step = 0;
  for (std::size_t i = 1; i < troughs.size(); ++i) {
    const double d = troughs[i] - troughs[i - 1];
    up += d > noise;
    down += d < -noise;
    largest_step = std::max(largest_step, d);
  }
  const int steps = static_cast<int>(troughs.size()) - 1;
  const double total_rise = troughs.empty() ? 0.0 : troughs.back() - troughs.front();
  const bool leak = troughs.size() >= static_cast<std::size_t>(th.leak_troughs) && up >= th.leak_rising * steps &&
                    down <= th.leak_falling * steps && total_rise >= th.climb * c.cap &&
                    largest_step <= th.leak_largest_step * total_rise;
  if (leak) {
    Add(out, c.device, Finding::kLeak,
        absl::StrCat("live memory's troughs rose from ", Bytes(troughs.front()), " (", At(trough_at.front()), ") to ",
                     Bytes(troughs.back()), " (", At(trough_at.back()),
                     ") and it never fell back below them; its peak ", Bytes(c.peak_live)),
        kLeverLeak, trough_at.front(), s.t[c.body - 1]);
  }
  return leak;
}

// Climbs without coming back down: reserved's peaks rise from the first part of the run to the
// last, in steps over several windows (one step is a jump, FindJump), and it stays near its peak at
// the end, while live memory falls back within the last part.
void FindClimb(const Context& c, std::vector<Verdict>* out) {
  const Series& s = c.s;
  const DoctorThresholds& th = c.th;
  const std::size_t body = c.body;
  const double body_end = s.Position(s.t[body - 1]);
  auto [f_lo, f_hi] = Range(s, 0.0, body_end / th.climb_parts);
  auto [l_lo, l_hi] = Range(s, body_end * (th.climb_parts - 1) / th.climb_parts, body_end + kPastTheEnd);
  l_hi = std::min(l_hi, body);
  const double first_peak = Max(s.reserved, f_lo, f_hi), last_peak = Max(s.reserved, l_lo, l_hi);
  const double body_peak = Max(s.reserved, 0, body);
  int steps = 0;
  double running = 0;
  for (int w = 0; w < th.windows; ++w) {
    auto [lo, hi] = Window(c, w);
    if (lo >= hi) continue;
    const double peak = Max(s.reserved, lo, hi);
    if (w > 0 && peak >= running + th.climb_step * c.cap) ++steps;
    running = std::max(running, peak);
  }
  const bool falls_back =
      l_lo < l_hi && Max(s.allocated, l_lo, l_hi) - Min(s.allocated, l_lo, l_hi) >= th.climb * c.cap;
  if (f_lo < f_hi && l_lo < l_hi && steps >= th.climb_steps && last_peak - first_peak >= th.climb * c.cap &&
      s.reserved[body - 1] >= th.settle * body_peak && falls_back) {
    Add(out, c.device, Finding::kClimbsCapacity,
        absl::StrCat("reserved climbed from a peak of ", Bytes(first_peak), " in the first third to ", Bytes(last_peak),
                     " in the last, in ", steps, " steps, and did not come back down (", Bytes(s.reserved[body - 1]),
                     " at the end, ", Pct(s.reserved[body - 1], c.cap), c.of_cap, "); live memory fell back to ",
                     Bytes(Min(s.allocated, l_lo, l_hi)), " in the last third"),
        kLeverCapacity, s.t[f_lo], s.t[body - 1]);
  }
}

// A sudden jump after a long plateau: for each start i, the largest rise of reserved within the
// jump span after it (a sliding maximum), and the band of reserved over the plateau before it
// (sliding maximum and minimum); linear in the samples. Live memory that explains the jump makes
// it a long request (a spike), else fragmentation.
void FindJump(const Context& c, std::vector<Verdict>* out) {
  const Series& s = c.s;
  const DoctorThresholds& th = c.th;
  const std::size_t n = c.n;
  const double span = th.jump_span * s.duration, plateau = th.plateau * s.duration;
  double best = 0;
  std::size_t best_i = 0, best_j = 0;
  std::deque<std::size_t> ahead, hi_q, lo_q;  // indices: max ahead; max and min behind
  std::size_t next = 0, behind = 0;
  for (std::size_t i = 0; i < n; ++i) {
    while (next < n && s.t[next] - s.t[i] <= span) {
      while (!ahead.empty() && s.reserved[ahead.back()] < s.reserved[next]) ahead.pop_back();  // the first of equals
      ahead.push_back(next++);
    }
    while (!ahead.empty() && ahead.front() < i) ahead.pop_front();
    while (!hi_q.empty() && s.reserved[hi_q.back()] <= s.reserved[i]) hi_q.pop_back();
    while (!lo_q.empty() && s.reserved[lo_q.back()] >= s.reserved[i]) lo_q.pop_back();
    hi_q.push_back(i);
    lo_q.push_back(i);
    while (s.t[i] - s.t[behind] > plateau) ++behind;
    while (hi_q.front() < behind) hi_q.pop_front();
    while (lo_q.front() < behind) lo_q.pop_front();
    if (s.t[i] - s.t0 < plateau) continue;
    const std::size_t top = ahead.front();
    const double rise = s.reserved[top] - s.reserved[i];
    if (rise < th.jump * c.cap || rise < best) continue;  // among equal rises the latest start: where it jumps
    if (s.reserved[hi_q.front()] - s.reserved[lo_q.front()] > th.plateau_band * c.cap) continue;
    best = rise;
    best_i = i;
    best_j = top;
  }
  if (best <= 0) return;
  const double live_rise = Max(s.allocated, best_i, best_j + 1) - s.allocated[best_i];
  const std::string evidence =
      absl::StrCat("after ", At(s.t[best_i] - s.t0), " within ", Bytes(th.plateau_band * c.cap),
                   ", reserved jumped by ", Bytes(best), " (", Pct(best, c.cap), c.of_cap, ") between ",
                   At(s.t[best_i]), " and ", At(s.t[best_j]), "; live memory rose by ", Bytes(live_rise));
  if (live_rise >= th.spike_live * best) {
    Add(out, c.device, Finding::kSpikeLongRequest, absl::StrCat(evidence, ": the requests in flight grew"), kLeverLong,
        s.t[best_i], s.t[best_j]);
  } else {
    Add(out, c.device, Finding::kFragmentation,
        absl::StrCat(evidence, ": new memory for requests that the free cache (", Bytes(s.cached[best_i]),
                     ") could not serve"),
        kLeverFragmentation, s.t[best_i], s.t[best_j]);
  }
}

// The OOMs of `cause`: how many (from the totals: a process lists at most 64 per line), and when
// (from the lists; the whole run when none is listed).
struct OomSpan {
  std::int64_t count = 0;
  double from = 0, to = 0;
  std::string when;  // " between A and B", or " over the run"
};
OomSpan OomsOf(const Series& s, OomCause cause) {
  OomSpan o;
  o.count = s.oom_counts[static_cast<int>(cause)];
  o.from = s.t0;
  o.to = s.t.back();
  bool any = false;
  for (const OomEvent& e : s.ooms) {
    if (e.cause != cause) continue;
    if (!any) o.from = e.time_s;
    o.to = e.time_s;
    any = true;
  }
  o.when = any ? absl::StrCat(" between ", At(o.from), " and ", At(o.to)) : std::string(" over the run");
  return o;
}

// The tenants the listed OOMs at a tenant's cap name, each with its cap: "tenant 'a' (cap 3.00 GiB)'s".
std::string TenantsAtCap(const Series& s) {
  std::map<std::string, std::size_t> caps;
  for (const OomEvent& e : s.ooms) {
    if (e.cause == OomCause::kTenantCap && !e.tenant.empty()) caps[e.tenant] = e.tenant_cap;
  }
  std::string named;
  for (const auto& [tenant, tenant_cap] : caps) {
    absl::StrAppend(&named, named.empty() ? "" : ", ", "'", tenant, "' (cap ", Bytes(static_cast<double>(tenant_cap)),
                    ")");
  }
  return named.empty() ? std::string("a tenant's") : absl::StrCat("tenant ", named, "'s");
}

// The OOMs by cause: each cause's verdict, or (capacity) the evidence of the first verdict that is
// not fragmentation or cache held.
void FindOoms(const Context& c, std::vector<Verdict>* out) {
  const Series& s = c.s;
  if (const OomSpan o = OomsOf(s, OomCause::kFragmentation); o.count > 0) {
    Add(out, c.device, Finding::kFragmentation,
        absl::StrCat(o.count, " fragmentation OOMs", o.when, ": enough memory was free, in pieces no request fitted"),
        kLeverFragmentation, o.from, o.to);
  }
  if (const OomSpan o = OomsOf(s, OomCause::kCacheHeld); o.count > 0) {
    Add(out, c.device, Finding::kCacheHeld,
        absl::StrCat(o.count, " OOMs", o.when,
                     " while memory was held for stream events not yet complete (record_stream)"),
        kLeverCache, o.from, o.to);
  }
  if (const OomSpan o = OomsOf(s, OomCause::kDeviceExhausted); o.count > 0) {
    Add(out, c.device, Finding::kFullAtStart,
        absl::StrCat(o.count, " OOMs", o.when,
                     " that the device refused under the cap: its memory is used outside this allocator (another "
                     "process, the CUDA context, communication buffers); lower the cap to what is really free"),
        kLeverFull, o.from, o.to);
  }
  if (const OomSpan o = OomsOf(s, OomCause::kTenantCap); o.count > 0) {
    const std::string whose = TenantsAtCap(s);
    Add(out, c.device, Finding::kTenantCap,
        absl::StrCat(o.count, " OOMs", o.when, " were refused by ", whose,
                     " own cap, not by the device's: the card had room for them"),
        absl::StrCat(
            "raise ", whose,
            " cap if its working set is right (tenants:[NAME:SIZE] in BUCKETALLOC_CONF, or "
            "bucketalloc_set_tenant_cap / bucketalloc_torch.set_tenant_cap at run time), or bind fewer or "
            "shorter requests to it; tiers or stitching do not help here, the device's memory was not the limit"),
        o.from, o.to);
  }
  if (const OomSpan o = OomsOf(s, OomCause::kCapacity); o.count > 0) {
    const std::string evidence =
        absl::StrCat(o.count, " capacity OOMs", o.when, ": live memory plus the request exceeded the cap");
    for (Verdict& v : *out) {
      if (v.verdict == Finding::kFragmentation || v.verdict == Finding::kCacheHeld) continue;
      absl::StrAppend(&v.evidence, "; ", evidence);
      return;
    }
    Add(out, c.device, Finding::kClimbsCapacity, evidence, kLeverCapacity, o.from, o.to);
  }
}

// Cache held but unused, for long, while memory was short (near the cap, or an OOM or retry).
// Held while memory was never short is said in `calm`.
void FindCacheHeld(const Context& c, std::vector<Verdict>* out, std::string* calm) {
  const Series& s = c.s;
  const DoctorThresholds& th = c.th;
  auto held = [&](std::size_t i) {
    return s.cached[i] >= th.cache_share * s.reserved[i] && s.cached[i] >= th.cache_cap * c.cap;
  };
  double held_time = 0, held_bytes = 0, held_from = -1, held_to = 0, held_reserved = 0;
  for (std::size_t i = 0; i + 1 < c.body; ++i) {
    if (!held(i)) continue;
    held_time += s.t[i + 1] - s.t[i];
    held_bytes = std::max(held_bytes, s.cached[i]);
    held_reserved = std::max(held_reserved, s.reserved[i]);
    if (held_from < 0) held_from = s.t[i];
    held_to = s.t[i + 1];
  }
  const bool held_long = s.duration > 0 ? held_time >= th.cache_time * s.duration : held(c.n - 1);
  if (s.duration == 0) {
    held_bytes = s.cached.back();
    held_reserved = s.reserved.back();
    held_from = held_to = s.t0;
  }
  if (!held_long) return;
  const std::string evidence =
      s.duration > 0
          ? absl::StrCat("for ", Pct(held_time, s.duration), " of the run (", At(held_from), " to ", At(held_to),
                         ") the cache held but unused (reserved - allocated) was at least ", Pct(th.cache_share, 1.0),
                         " of reserved, up to ", Bytes(held_bytes), " (", Pct(held_bytes, c.cap), c.of_cap, ")")
          : absl::StrCat("cache held but unused ", Bytes(held_bytes), " of ", Bytes(held_reserved), " reserved (",
                         Pct(held_bytes, c.cap), c.of_cap, ")");
  const bool short_of_memory = c.pressure || (s.cap > 0 && held_reserved >= th.full * c.cap);
  if (short_of_memory) {
    Add(out, c.device, Finding::kCacheHeld,
        absl::StrCat(evidence, ", with reserved memory up to ", Pct(held_reserved, c.cap), c.of_cap, ", ", c.ooms,
                     " OOMs and ", s.retries, " retries"),
        kLeverCache, held_from, held_to);
  } else {
    absl::StrAppend(calm, "; ", evidence, ", but memory was never short: keeping it saves allocations");
  }
}

Verdict Healthy(const Context& c, const std::string& calm) {
  const Series& s = c.s;
  return Verdict{
      Finding::kHealthy,
      absl::StrCat("peak reserved ", Bytes(c.peak_reserved), " (", Pct(c.peak_reserved, c.cap), c.of_cap,
                   s.cap > 0 ? absl::StrCat(" of ", Bytes(c.cap)) : "", "), peak live ", Bytes(c.peak_live), ", ",
                   c.ooms, " OOMs, ", s.retries, " retries; no climb, leak or spike over ", At(s.duration), calm),
      "nothing to do",
      s.t0,
      s.t.back(),
      c.device};
}

// The verdicts of one device's series (not empty).
std::vector<Verdict> DiagnoseSeries(const Series& s, int device, const DoctorThresholds& th) {
  if (s.contradictions > 0) return {Inconsistent(s, device)};
  std::vector<Verdict> out;
  FindOverCap(s, device, &out);
  if (s.scale <= 0) {
    out.push_back(Verdict{Finding::kHealthy, absl::StrCat("device ", device, " used no memory over ", At(s.duration)),
                          "nothing to do", s.t0, s.t.back(), device});
    return out;
  }
  const Context c(s, device, th);
  std::string calm;  // what a healthy verdict should also say
  FindFullAtStart(c, &out, &calm);
  if (c.body >= static_cast<std::size_t>(th.curve_samples) && s.duration > 0) {
    if (!FindLeak(c, &out)) FindClimb(c, &out);
    FindJump(c, &out);
  }
  FindOoms(c, &out);
  FindCacheHeld(c, &out, &calm);
  if (out.empty()) out.push_back(Healthy(c, calm));
  return out;
}

}  // namespace

std::vector<Verdict> DiagnoseInput(const DoctorInput& input, const DoctorThresholds& t) {
  // The samples grouped by device once (a timeline may have thousands).
  std::vector<Verdict> verdicts = DiagnoseAll(input.samples, t);
  for (const Verdict& v :
       DiagnoseRounds(input.per_round_peak_reserved, input.per_round_end_live, input.rounds_device, t)) {
    auto healthy = std::find_if(verdicts.begin(), verdicts.end(), [&](const Verdict& x) {
      return x.device == v.device && x.verdict == Finding::kHealthy;
    });
    if (healthy != verdicts.end() && v.verdict == Finding::kLeak) verdicts.erase(healthy);
    verdicts.push_back(v);
  }
  return verdicts;
}

int InconsistentDevices(absl::Span<const Verdict> verdicts) {
  return static_cast<int>(std::count_if(verdicts.begin(), verdicts.end(),
                                        [](const Verdict& v) { return v.verdict == Finding::kInconsistent; }));
}

absl::string_view FindingName(Finding finding) {
  switch (finding) {
    case Finding::kFullAtStart:
      return "full_at_start";
    case Finding::kClimbsCapacity:
      return "climbs_capacity";
    case Finding::kLeak:
      return "leak";
    case Finding::kSpikeLongRequest:
      return "spike_long_request";
    case Finding::kFragmentation:
      return "fragmentation";
    case Finding::kCacheHeld:
      return "cache_held";
    case Finding::kTenantCap:
      return "tenant_cap";
    case Finding::kOverCap:
      return "over_cap";
    case Finding::kHealthy:
      return "healthy";
    case Finding::kInconsistent:
      return "inconsistent";
  }
  return "unknown";
}

std::vector<Verdict> Diagnose(absl::Span<const TimelineSample> samples, int device, const DoctorThresholds& th) {
  std::vector<std::size_t> indices;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].device == device) indices.push_back(i);
  }
  if (indices.empty()) {
    return {Verdict{Finding::kHealthy, absl::StrCat("device ", device, " has no samples in the timeline"),
                    "nothing to do", 0, 0, device}};
  }
  return DiagnoseSeries(SeriesOf(samples, indices), device, th);
}

std::vector<Verdict> DiagnoseAll(absl::Span<const TimelineSample> samples, const DoctorThresholds& th) {
  std::vector<Verdict> out;
  for (const auto& [device, indices] : SamplesByDevice(samples)) {
    std::vector<Verdict> v = DiagnoseSeries(SeriesOf(samples, indices), device, th);
    out.insert(out.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  }
  return out;
}

std::vector<Verdict> DiagnoseRounds(absl::Span<const std::size_t> peaks, absl::Span<const std::size_t> end_live,
                                    int device, const DoctorThresholds& th) {
  std::vector<Verdict> out;
  const std::size_t k = peaks.size();
  if (k < 2 || end_live.size() != k) return out;
  std::string list;
  for (std::size_t p : peaks) absl::StrAppend(&list, list.empty() ? "" : ", ", FormatBytes(p));
  // What the trace never frees carries over into the next round (and its peak): a trace that loads
  // its weights at its start loads them again each round.
  if (end_live.back() > end_live.front()) {
    out.push_back(
        Verdict{Finding::kLeak,
                absl::StrCat("the trace keeps ", FormatBytes(end_live.front()),
                             " at the end of each round that it never frees, so ", k, " rounds of it hold ",
                             FormatBytes(end_live.back()), " at the end (peaks of reserved memory: ", list, ")"),
                "if the trace loads its weights or caches once per run, repeat only its steady part (a "
                "trace without its start-up); otherwise find the leak (record_memory_history, snapshot)",
                0, 0, device});
  }
  if (k < static_cast<std::size_t>(th.settle_rounds)) return out;
  // The peaks less what earlier rounds left: fragmentation settling, or not.
  std::vector<double> own(k);
  double top = 0;
  for (std::size_t r = 0; r < k; ++r) {
    own[r] = static_cast<double>(peaks[r]) - (r == 0 ? 0.0 : static_cast<double>(end_live[r - 1]));
    top = std::max(top, own[r]);
  }
  const double tolerance = th.round_rise * top;
  const double settled = own[k / 2];
  if (own.back() > settled + tolerance) {
    out.push_back(Verdict{Finding::kFragmentation,
                          absl::StrCat("the peak of reserved memory, less what earlier rounds left, still rose in the "
                                       "second half of ",
                                       k, " rounds (", Bytes(settled), " to ", Bytes(own.back()),
                                       "): fragmentation that has not settled"),
                          kLeverFragmentation, 0, 0, device});
  } else if (settled > own.front() + tolerance) {
    out.push_back(Verdict{Finding::kHealthy,
                          absl::StrCat("the peak of reserved memory (less what earlier rounds left) rose from ",
                                       Bytes(own.front()), " to ", Bytes(settled),
                                       " over the first rounds and then settled: fragmentation reaching its steady "
                                       "state, not a leak"),
                          "nothing to do; the settled peak is what the card needs", 0, 0, device});
  }
  return out;
}

std::string VerdictsToJson(absl::Span<const Verdict> verdicts) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const Verdict& v : verdicts) {
    list.push_back({{"verdict", FindingName(v.verdict)},
                    {"evidence", v.evidence},
                    {"lever", v.lever},
                    {"from_s", v.from_s},
                    {"to_s", v.to_s},
                    {"device", v.device}});
  }
  return nlohmann::ordered_json{{"verdicts", list}}.dump(2);
}

std::string VerdictsToText(absl::Span<const Verdict> verdicts) {
  std::string out;
  for (const Verdict& v : verdicts) {
    absl::StrAppend(&out, "device ", v.device, ": ", FindingName(v.verdict), "\n  evidence: ", v.evidence,
                    "\n  first lever: ", v.lever, "\n");
  }
  return out;
}

std::string DoctorHtml(absl::Span<const Verdict> verdicts, absl::Span<const TimelineSample> samples,
                       const std::string& title) {
  std::string html =
      absl::StrCat("<h1>", EscapeHtml(title), "</h1><section id=\"doctor\"><h2>Diagnosis</h2><ul class=\"verdicts\">");
  for (const Verdict& v : verdicts) {
    absl::StrAppend(&html, "<li data-verdict=\"", EscapeHtml(FindingName(v.verdict)),
                    "\"><span class=\"verdict-name\">device ", v.device, ": ", EscapeHtml(FindingName(v.verdict)),
                    "</span><br>evidence: ", EscapeHtml(v.evidence), "<br>first lever: ", EscapeHtml(v.lever), "</li>");
  }
  absl::StrAppend(&html, "</ul></section>");
  // Each device's verdicts, found once (a timeline may have many devices).
  absl::flat_hash_map<int, std::vector<const Verdict*>> by_device;
  for (const Verdict& v : verdicts) by_device[v.device].push_back(&v);
  constexpr double kW = 900, kH = 300, kPad = 40;  // the plot's size and margin, in pixels
  constexpr double kTop = 1.05;                    // the plot's top: 5% above the cap or the peak
  for (const auto& [d, indices] : SamplesByDevice(samples)) {
    const Series s = SeriesOf(samples, indices);
    const double top = std::max(s.cap, Max(s.reserved, 0, s.size())) * kTop;
    auto x = [&](double t) { return kPad + (s.duration > 0 ? (t - s.t0) / s.duration : 0.0) * (kW - 2 * kPad); };
    auto y = [&](double b) { return kH - kPad - (top > 0 ? b / top : 0.0) * (kH - 2 * kPad); };
    absl::StrAppend(&html, "<h2>Device ", d, "</h2><svg class=\"memory\" width=\"", kW, "\" height=\"", kH,
                    "\" viewBox=\"0 0 ", kW, " ", kH, "\" role=\"img\" aria-label=\"memory over time\">");
    for (const Verdict* marked : by_device[d]) {
      const Verdict& v = *marked;
      if (v.verdict == Finding::kHealthy || v.verdict == Finding::kInconsistent) continue;
      const double x0 = x(v.from_s), x1 = std::max(x(v.to_s), x0 + 2);
      absl::StrAppendFormat(&html,
                            "<rect data-marked=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"#f5a623\" fill-opacity=\"0.25\"><title>%s</title></rect>",
                            EscapeHtml(FindingName(v.verdict)), x0, kPad, x1 - x0, kH - 2 * kPad,
                            EscapeHtml(FindingName(v.verdict)));
    }
    auto line = [&](const std::vector<double>& v, const char* color, const char* name) {
      std::string pts;
      for (std::size_t i = 0; i < v.size(); ++i) absl::StrAppendFormat(&pts, "%.1f,%.1f ", x(s.t[i]), y(v[i]));
      absl::StrAppend(&html, "<polyline fill=\"none\" stroke=\"", color, "\" stroke-width=\"1.5\" points=\"", pts,
                      "\"><title>", name, "</title></polyline>");
    };
    line(s.reserved, "#1f77b4", "reserved");
    line(s.allocated, "#2ca02c", "allocated (live)");
    absl::StrAppendFormat(&html,
                          "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
                          "stroke-dasharray=\"4\"><title>cap</title></line>",
                          kPad, kW - kPad, y(s.cap), y(s.cap));
    absl::StrAppendFormat(&html,
                          "<text x=\"%.1f\" y=\"20\">reserved (blue), live (green), cap %s (red); "
                          "%s to %s; marked: the verdicts' spans</text></svg>",
                          kPad, EscapeHtml(FormatBytes(static_cast<std::size_t>(s.cap))), At(s.t0),
                          At(s.t0 + s.duration));
  }
  return HtmlPage(title, html);
}

}  // namespace bucketalloc::harness
