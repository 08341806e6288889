// src/harness/doctor.cc — the runbook's classifier (harness/doctor.h).
#include "harness/doctor.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketalloc/units.h"
#include "harness/report.h"
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

// A window whose peak of reserved memory passes every earlier one by this much of the cap is a
// step of a climb.
constexpr double kClimbStep = 0.02;

std::string Bytes(double b) { return FormatBytes(static_cast<std::size_t>(std::max(0.0, b))); }
std::string Pct(double part, double whole) { return absl::StrFormat("%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0); }
std::string At(double t) { return absl::StrFormat("%.1f s", t); }

// One device's series.
struct Series {
  std::vector<double> t;
  std::vector<double> reserved, allocated, cached;
  double cap = 0.0;
  double t0 = 0.0, duration = 0.0;
  std::vector<OomEvent> ooms;
  std::size_t size() const { return t.size(); }
  double Position(double at) const { return duration > 0 ? (at - t0) / duration : 0.0; }
};

Series SeriesOf(absl::Span<const TimelineSample> samples, int device) {
  Series s;
  for (const TimelineSample& x : samples) {
    if (x.device != device) continue;
    s.t.push_back(x.time_s);
    s.reserved.push_back(static_cast<double>(x.reserved_bytes));
    s.allocated.push_back(static_cast<double>(x.allocated_bytes));
    s.cached.push_back(static_cast<double>(std::max<std::int64_t>(0, x.reserved_bytes - x.allocated_bytes)));
    s.cap = std::max(s.cap, static_cast<double>(x.capacity_bytes));
    s.ooms.insert(s.ooms.end(), x.ooms.begin(), x.ooms.end());
  }
  if (s.size() > 0) {
    s.t0 = s.t.front();
    s.duration = s.t.back() - s.t.front();
    if (s.cap <= 0) s.cap = *std::max_element(s.reserved.begin(), s.reserved.end());
  }
  return s;
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

void Add(std::vector<Verdict>* out, int device, const char* verdict, std::string evidence, const char* lever,
         double from, double to) {
  for (Verdict& v : *out) {
    if (v.verdict == verdict) {  // one verdict of a kind: the evidence joins it
      absl::StrAppend(&v.evidence, "; ", evidence);
      v.from_s = std::min(v.from_s, from);
      v.to_s = std::max(v.to_s, to);
      return;
    }
  }
  out->push_back(Verdict{verdict, std::move(evidence), lever, from, to, device});
}

}  // namespace

std::vector<Verdict> Diagnose(absl::Span<const TimelineSample> samples, int device, const DoctorThresholds& th) {
  std::vector<Verdict> out;
  const Series s = SeriesOf(samples, device);
  if (s.size() == 0) {
    out.push_back(Verdict{"healthy", absl::StrCat("device ", device, " has no samples in the timeline"),
                          "nothing to do", 0, 0, device});
    return out;
  }
  const double cap = s.cap;
  const double peak_r = Max(s.reserved, 0, s.size());
  const double peak_a = Max(s.allocated, 0, s.size());
  const std::size_t n = s.size();

  // Full at start: near the cap in the first part of the run.
  for (std::size_t i = 0; i < n; ++i) {
    if (s.Position(s.t[i]) > th.start_fraction) break;
    if (std::max(s.reserved[i], s.allocated[i]) >= th.full * cap) {
      Add(&out, device, "full_at_start",
          absl::StrCat("reserved ", Bytes(s.reserved[i]), " (", Pct(s.reserved[i], cap), " of the ", Bytes(cap),
                       " cap; live ", Bytes(s.allocated[i]), ") at ", At(s.t[i]), ", ",
                       Pct(s.t[i] - s.t0, s.duration), " into the timeline"),
          kLeverFull, s.t0, s.t[i]);
      break;
    }
  }

  if (n >= 3 && s.duration > 0) {
    // Leak: the troughs of live memory rise window after window and it never falls back.
    constexpr int kWindows = 10;
    std::vector<double> troughs;
    std::vector<double> trough_at;
    for (int w = 1; w < kWindows; ++w) {  // the first window is start-up
      auto [lo, hi] = Range(s, static_cast<double>(w) / kWindows, static_cast<double>(w + 1) / kWindows);
      if (lo >= hi) continue;
      troughs.push_back(Min(s.allocated, lo, hi));
      trough_at.push_back(s.t[lo]);
    }
    int rising = 0;
    for (std::size_t i = 1; i < troughs.size(); ++i) rising += troughs[i] >= troughs[i - 1];
    const bool leak = troughs.size() >= 4 && rising >= static_cast<int>(0.8 * static_cast<double>(troughs.size() - 1)) &&
                      troughs.back() - troughs.front() >= th.climb * cap &&
                      s.allocated.back() >= th.settle * peak_a;
    if (leak) {
      Add(&out, device, "leak",
          absl::StrCat("live memory's troughs rose from ", Bytes(troughs.front()), " (", At(trough_at.front()), ") to ",
                       Bytes(troughs.back()), " (", At(trough_at.back()), ") and it never fell back: ",
                       Bytes(s.allocated.back()), " at the end, its peak ", Bytes(peak_a)),
          kLeverLeak, trough_at.front(), s.t.back());
    }
    // Climbs without coming back down: reserved's peaks rise from the first third to the last, in
    // steps over at least three windows (one step is a jump, below), and it stays near its peak at
    // the end, while live memory falls back.
    auto [f_lo, f_hi] = Range(s, 0.0, 1.0 / 3);
    auto [l_lo, l_hi] = Range(s, 2.0 / 3, 1.0);
    const double first_peak = Max(s.reserved, f_lo, f_hi), last_peak = Max(s.reserved, l_lo, l_hi);
    int steps = 0;
    double running = 0;
    for (int w = 0; w < kWindows; ++w) {
      auto [lo, hi] = Range(s, static_cast<double>(w) / kWindows, static_cast<double>(w + 1) / kWindows);
      if (lo >= hi) continue;
      const double peak = Max(s.reserved, lo, hi);
      if (w > 0 && peak >= running + kClimbStep * cap) ++steps;
      running = std::max(running, peak);
    }
    if (!leak && f_lo < f_hi && l_lo < l_hi && steps >= 3 && last_peak - first_peak >= th.climb * cap &&
        s.reserved.back() >= th.settle * peak_r) {
      Add(&out, device, "climbs_capacity",
          absl::StrCat("reserved climbed from a peak of ", Bytes(first_peak), " in the first third to ",
                       Bytes(last_peak), " in the last and did not come back down (", Bytes(s.reserved.back()),
                       " at the end, ", Pct(s.reserved.back(), cap), " of the cap); live memory fell back to ",
                       Bytes(Min(s.allocated, l_lo, l_hi)), " meanwhile"),
          kLeverCapacity, s.t[f_lo], s.t.back());
    }

    // A sudden jump after a long plateau.
    const double span = th.jump_span * s.duration, plateau = th.plateau * s.duration;
    double best = 0;
    std::size_t best_i = 0, best_j = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (s.t[i] - s.t0 < plateau) continue;
      std::size_t j = i;
      double rise = 0;
      std::size_t top = i;
      while (j + 1 < n && s.t[j + 1] - s.t[i] <= span) {
        ++j;
        if (s.reserved[j] - s.reserved[i] > rise) {
          rise = s.reserved[j] - s.reserved[i];
          top = j;
        }
      }
      if (rise < th.jump * cap || rise < best) continue;  // among equal rises the latest start: where it jumps
      std::size_t p = i;
      while (p > 0 && s.t[i] - s.t[p - 1] <= plateau) --p;
      if (Max(s.reserved, p, i + 1) - Min(s.reserved, p, i + 1) > th.plateau_band * cap) continue;
      best = rise;
      best_i = i;
      best_j = top;
    }
    if (best > 0) {
      const double live_rise = Max(s.allocated, best_i, best_j + 1) - s.allocated[best_i];
      const std::string evidence = absl::StrCat(
          "after ", At(s.t[best_i] - s.t0), " within ", Bytes(th.plateau_band * cap), ", reserved jumped by ",
          Bytes(best), " (", Pct(best, cap), " of the cap) between ", At(s.t[best_i]), " and ", At(s.t[best_j]),
          "; live memory rose by ", Bytes(live_rise));
      if (live_rise >= 0.7 * best) {
        Add(&out, device, "spike_long_request", absl::StrCat(evidence, ": the requests in flight grew"), kLeverLong,
            s.t[best_i], s.t[best_j]);
      } else {
        Add(&out, device, "fragmentation",
            absl::StrCat(evidence, ": new memory for requests that the free cache (",
                         Bytes(s.cached[best_i]), ") could not serve"),
            kLeverFragmentation, s.t[best_i], s.t[best_j]);
      }
    }
  }

  // OOMs: fragmentation OOMs are their own evidence; capacity OOMs join the verdict of their time,
  // or say that the working set exceeded the cap.
  std::vector<OomEvent> frag, capacity;
  for (const OomEvent& e : s.ooms) {
    if (e.cause == OomCause::kFragmentation) frag.push_back(e);
    if (e.cause == OomCause::kCapacity) capacity.push_back(e);
  }
  if (!frag.empty()) {
    Add(&out, device, "fragmentation",
        absl::StrCat(frag.size(), " fragmentation OOMs between ", At(frag.front().time_s), " and ",
                     At(frag.back().time_s), " (the first asked ", Bytes(static_cast<double>(frag.front().size)),
                     "): enough memory was free, in pieces no request fitted"),
        kLeverFragmentation, frag.front().time_s, frag.back().time_s);
  }
  if (!capacity.empty()) {
    const std::string evidence = absl::StrCat(capacity.size(), " capacity OOMs between ", At(capacity.front().time_s),
                                              " and ", At(capacity.back().time_s), " (the first asked ",
                                              Bytes(static_cast<double>(capacity.front().size)),
                                              "): live memory plus the request exceeded the cap");
    bool joined = false;
    for (Verdict& v : out) {
      if (v.verdict == "fragmentation" || v.verdict == "cache_held") continue;
      absl::StrAppend(&v.evidence, "; ", evidence);
      joined = true;
      break;
    }
    if (!joined) Add(&out, device, "climbs_capacity", evidence, kLeverCapacity, capacity.front().time_s,
                     capacity.back().time_s);
  }

  // Cache held but unused, for long.
  double held_time = 0, held_bytes = 0, held_from = -1, held_to = 0;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    if (s.cached[i] >= th.cache_share * s.reserved[i] && s.cached[i] >= th.cache_cap * cap) {
      held_time += s.t[i + 1] - s.t[i];
      held_bytes = std::max(held_bytes, s.cached[i]);
      if (held_from < 0) held_from = s.t[i];
      held_to = s.t[i + 1];
    }
  }
  if (s.duration > 0 && held_time >= th.cache_time * s.duration) {
    Add(&out, device, "cache_held",
        absl::StrCat("for ", Pct(held_time, s.duration), " of the run (", At(held_from), " to ", At(held_to),
                     ") the cache held but unused (reserved - allocated) was at least ", Pct(th.cache_share, 1.0),
                     " of reserved, up to ", Bytes(held_bytes), " (", Pct(held_bytes, cap), " of the cap)"),
        kLeverCache, held_from, held_to);
  } else if (s.duration == 0 && s.cached.back() >= th.cache_share * s.reserved.back() &&
             s.cached.back() >= th.cache_cap * cap) {
    Add(&out, device, "cache_held",
        absl::StrCat("cache held but unused ", Bytes(s.cached.back()), " of ", Bytes(s.reserved.back()), " reserved"),
        kLeverCache, s.t0, s.t0);
  }

  if (out.empty()) {
    out.push_back(Verdict{"healthy",
                          absl::StrCat("peak reserved ", Bytes(peak_r), " (", Pct(peak_r, cap), " of the ", Bytes(cap),
                                       " cap), peak live ", Bytes(peak_a), ", no OOM, no climb, spike or held cache "
                                       "over ",
                                       At(s.duration)),
                          "nothing to do", s.t0, s.t.back(), device});
  }
  return out;
}

std::vector<Verdict> DiagnoseRounds(absl::Span<const std::size_t> peaks, int device) {
  std::vector<Verdict> out;
  if (peaks.size() < 2) return out;
  const std::size_t k = peaks.size();
  const std::size_t settled = peaks[k == 2 ? 0 : k / 2];
  std::string list;
  for (std::size_t p : peaks) absl::StrAppend(&list, list.empty() ? "" : ", ", FormatBytes(p));
  if (peaks.back() > settled) {
    out.push_back(Verdict{"leak",
                          absl::StrCat("the peak of reserved memory still rose in the second half of ", k,
                                       " rounds of the same trace (", list, ")"),
                          kLeverLeak, 0, 0, device});
  } else if (settled > peaks.front()) {
    out.push_back(Verdict{"healthy",
                          absl::StrCat("the peak of reserved memory rose over the first rounds and then settled (", list,
                                       "): fragmentation reaching its steady state, not a leak"),
                          "nothing to do; the settled peak is what the card needs", 0, 0, device});
  }
  return out;
}

std::string VerdictsToJson(absl::Span<const Verdict> verdicts) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const Verdict& v : verdicts) {
    list.push_back({{"verdict", v.verdict},
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
    absl::StrAppend(&out, "device ", v.device, ": ", v.verdict, "\n  evidence: ", v.evidence, "\n  first lever: ",
                    v.lever, "\n");
  }
  return out;
}

std::string DoctorHtml(absl::Span<const Verdict> verdicts, absl::Span<const TimelineSample> samples,
                       const std::string& title) {
  std::string html = absl::StrCat(
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" "
      "content=\"default-src 'none'; style-src 'unsafe-inline'\"><title>",
      EscapeHtml(title),
      "</title><style>body{font-family:sans-serif;margin:2em}li{margin:.6em 0}.v{font-weight:bold}"
      "svg{border:1px solid #ccc}</style></head><body><h1>",
      EscapeHtml(title), "</h1><section id=\"doctor\"><h2>Diagnosis</h2><ul>");
  for (const Verdict& v : verdicts) {
    absl::StrAppend(&html, "<li data-verdict=\"", EscapeHtml(v.verdict), "\"><span class=\"v\">device ", v.device, ": ",
                    EscapeHtml(v.verdict), "</span><br>evidence: ", EscapeHtml(v.evidence),
                    "<br>first lever: ", EscapeHtml(v.lever), "</li>");
  }
  absl::StrAppend(&html, "</ul></section>");
  std::vector<int> devices;
  for (const TimelineSample& s : samples) {
    if (std::find(devices.begin(), devices.end(), s.device) == devices.end()) devices.push_back(s.device);
  }
  constexpr double kW = 900, kH = 300, kPad = 40;
  for (int d : devices) {
    const Series s = SeriesOf(samples, d);
    const double top = std::max(s.cap, Max(s.reserved, 0, s.size())) * 1.05;
    auto x = [&](double t) { return kPad + (s.duration > 0 ? (t - s.t0) / s.duration : 0.0) * (kW - 2 * kPad); };
    auto y = [&](double b) { return kH - kPad - (top > 0 ? b / top : 0.0) * (kH - 2 * kPad); };
    absl::StrAppend(&html, "<h2>Device ", d, "</h2><svg width=\"", kW, "\" height=\"", kH,
                    "\" role=\"img\" aria-label=\"memory over time\">");
    for (const Verdict& v : verdicts) {
      if (v.device != d || v.verdict == "healthy") continue;
      const double x0 = x(v.from_s), x1 = std::max(x(v.to_s), x0 + 2);
      absl::StrAppendFormat(&html,
                            "<rect data-marked=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"#f5a623\" fill-opacity=\"0.25\"><title>%s</title></rect>",
                            EscapeHtml(v.verdict), x0, kPad, x1 - x0, kH - 2 * kPad, EscapeHtml(v.verdict));
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
                          "<text x=\"%.1f\" y=\"20\" font-size=\"12\">reserved (blue), live (green), cap %s (red); "
                          "%s to %s; marked: the verdicts' spans</text></svg>",
                          kPad, EscapeHtml(FormatBytes(static_cast<std::size_t>(s.cap))), At(s.t0),
                          At(s.t0 + s.duration));
  }
  absl::StrAppend(&html, "</body></html>\n");
  return html;
}

}  // namespace bucketalloc::harness
