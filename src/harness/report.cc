// src/harness/report.cc — compare's JSON and its self-contained HTML report (see the header).
#include "harness/report.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

using Json = nlohmann::ordered_json;

// Columns, not one object per point: a 2000-point timeline stays a few tens of KiB.
Json TimelineJson(const Timeline& t) {
  Json event = Json::array(), live = Json::array(), live_min = Json::array(), reserved = Json::array(),
       ooms = Json::array();
  for (const TimelinePoint& p : t.points) {
    event.push_back(p.event);
    live.push_back(p.live_bytes);
    live_min.push_back(p.live_min_bytes);
    reserved.push_back(p.reserved_bytes);
    ooms.push_back(p.ooms);
  }
  return Json{{"events", t.events},
              {"bucket_events", t.bucket_events},
              {"event", std::move(event)},
              {"live_bytes", std::move(live)},
              {"live_min_bytes", std::move(live_min)},
              {"reserved_bytes", std::move(reserved)},
              {"ooms", std::move(ooms)}};
}

// Only the non-empty bins; bin i holds free blocks with 2^i <= size < 2^(i+1).
Json PeakFragmentationJson(const PeakFragmentation& p) {
  const PoolFragmentation& f = p.free_blocks;
  Json bins = Json::array();
  for (int i = 0; i < kHistogramBins; ++i) {
    const auto bin = static_cast<std::size_t>(i);
    if (f.free_count[bin] == 0) continue;
    bins.push_back(Json{
        {"bin", i}, {"min_bytes", std::uint64_t{1} << i}, {"count", f.free_count[bin]}, {"bytes", f.free_bytes[bin]}});
  }
  return Json{{"event", p.event},
              {"live_bytes", p.live_bytes},
              {"reserved_bytes", f.reserved},
              {"allocated_bytes", f.allocated},
              {"requested_bytes", f.requested},
              {"free_bytes", f.total_free},
              {"largest_free_bytes", f.largest_free},
              {"external_fragmentation", f.external_fragmentation()},
              {"internal_fragmentation", f.internal_fragmentation()},
              {"bins", std::move(bins)}};
}

Json RowsJson(const std::vector<CompareReport>& reports) {
  Json rows = Json::array();
  for (const CompareReport& report : reports) {
    for (const CompareRow& row : report.rows) {
      Json j = {{"trace", report.trace_name},
                {"at_capacity", Json::parse(row.at_capacity.ToJson())},
                {"min_capacity", Json::parse(row.min_capacity.ToJson())}};
      if (row.at_capacity.timeline.events > 0) j["timeline"] = TimelineJson(row.at_capacity.timeline);
      if (row.at_capacity.peak_fragmentation.has_value()) {
        j["peak_fragmentation"] = PeakFragmentationJson(*row.at_capacity.peak_fragmentation);
      }
      rows.push_back(std::move(j));
    }
  }
  return rows;
}

// JSON inside <script>: "<", ">" and "&" occur only in strings, where \u escapes mean the same
// characters, so "</script>" or "<!--" in an allocator name cannot end or confuse the element.
// Invalid UTF-8 (a name from the command line) becomes U+FFFD instead of throwing.
std::string ScriptSafeJson(const Json& j) {
  const std::string dumped = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(dumped.size());
  for (char c : dumped) {
    switch (c) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string ResultsTable(const std::vector<CompareReport>& reports) {
  // The smallest min capacity is the answer the table exists for: it is marked.
  std::size_t best = 0;
  bool any_true_need = false;
  for (const CompareReport& report : reports) {
    for (const CompareRow& row : report.rows) {
      if (best == 0 || row.min_capacity.min_capacity_bytes < best) best = row.min_capacity.min_capacity_bytes;
      any_true_need = any_true_need || row.min_capacity.true_need_bytes.has_value();
    }
  }
  const bool several = reports.size() > 1;
  std::string t = absl::StrCat(
      "<div class=\"table-wrap\"><table id=\"results\">\n<thead><tr>", several ? "<th>trace</th>" : "",
      "<th>allocator</th><th>peak reserved</th><th>min capacity</th><th>min / live</th>",
      any_true_need ? "<th>min / true need</th>" : "",
      "<th>OOMs</th><th>capacity OOMs</th><th>fragmentation OOMs</th><th>p50 ns</th><th>p99 ns</th>"
      "<th>backend calls</th><th>simulated backend ms</th><th>granules stitched</th><th>verdict</th></tr></thead>\n"
      "<tbody>\n");
  for (const CompareReport& report : reports) {
    for (const CompareRow& row : report.rows) {
      const ReplayResult& r = row.at_capacity;
      const MinCapacityResult& m = row.min_capacity;
      absl::StrAppend(&t, "<tr>",
                      several ? absl::StrCat("<td><code>", EscapeHtml(report.trace_name), "</code></td>") : "", "<td>",
                      EscapeHtml(r.allocator), "</td><td>", FormatBytes(r.peak_reserved_bytes), "</td>",
                      m.min_capacity_bytes == best ? "<td class=\"best\">" : "<td>", FormatBytes(m.min_capacity_bytes),
                      "</td><td>", absl::StrFormat("%.3f", m.min_capacity_over_live), "</td>");
      if (any_true_need) {
        absl::StrAppend(&t, "<td>",
                        m.true_need_bytes.has_value() ? absl::StrFormat("%.3f", m.min_capacity_over_true_need()) : "",
                        "</td>");
      }
      absl::StrAppend(&t, "<td>", r.ooms, "</td><td>", r.capacity_ooms, "</td><td>", r.fragmentation_ooms, "</td><td>",
                      absl::StrFormat("%.0f", r.p50_ns), "</td><td>", absl::StrFormat("%.0f", r.p99_ns), "</td><td>",
                      r.backend_calls, "</td><td>", absl::StrFormat("%.1f", r.simulated_backend_ms), "</td><td>",
                      r.granules_stitched, "</td><td>", EscapeHtml(r.verdict), "</td></tr>\n");
    }
  }
  absl::StrAppend(&t, "</tbody></table></div>\n");
  return t;
}

constexpr absl::string_view kStyle = R"CSS(
:root { color-scheme: light; --live: #1f6fb4; --reserved: #e8730c; --capacity: #c8202a; --bar: #2a9d4a; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
       max-width: 1120px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 4px; border-top: 1px solid #ddd; padding-top: 16px; }
code { font: 13px ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
.meta, .note, figcaption, .caption { color: #555; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 12px 0; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e2e2e2; text-align: right; white-space: nowrap; }
th { font-weight: 600; border-bottom: 2px solid #bbb; white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: 700; color: #137a35; }
figure { margin: 12px 0 20px; }
figcaption { font-weight: 600; color: #333; margin-bottom: 4px; }
svg.chart { display: block; width: 100%; max-width: 960px; height: auto; background: #fff; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #444; }
svg.chart .grid { stroke: #ececec; }
svg.chart .axis { stroke: #888; }
svg.chart .live { fill: none; stroke: var(--live); stroke-width: 1.5; }
svg.chart .live-band { fill: var(--live); fill-opacity: 0.15; stroke: none; }
svg.chart .reserved { fill: none; stroke: var(--reserved); stroke-width: 1.5; }
svg.chart .capacity { stroke: var(--capacity); stroke-width: 1.2; stroke-dasharray: 6 4; }
svg.chart .peak-marker { stroke: #777; stroke-dasharray: 2 3; }
svg.chart .oom { stroke: var(--capacity); stroke-width: 2; }
svg.chart .bar { fill: var(--bar); }
svg.chart .bar:hover { fill-opacity: 0.75; }
svg.chart text.empty { font-size: 14px; fill: #777; }
.swatch { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin: 0 4px 0 12px; }
.swatch.live { background: var(--live); }
.swatch.reserved { background: var(--reserved); }
.swatch.capacity { background: var(--capacity); }
)CSS";

// Registered first, in its own element, so that even a script that fails to parse is reported.
constexpr absl::string_view kErrorHooks = R"JS(
(function () {
  'use strict';
  function recordError(message) {
    const body = document.body;
    body.dataset.errors = (body.dataset.errors ? body.dataset.errors + ' | ' : '') + message;
  }
  window.bucketallocRecordError = recordError;
  window.addEventListener('error', function (e) { recordError(String(e.message || e.type)); });
  window.addEventListener('unhandledrejection', function (e) {
    recordError('unhandled rejection: ' + String(e.reason));
  });
  document.addEventListener('securitypolicyviolation', function (e) {
    recordError('blocked by the report\'s content security policy: ' + e.blockedURI);
  });
})();
)JS";

// Draws the charts as inline SVG from the embedded data.
constexpr absl::string_view kScript = R"JS(
(function () {
  'use strict';
  const SVG_NS = 'http://www.w3.org/2000/svg';  // a namespace name, not a resource: nothing is fetched
  const W = 960, M = { left: 84, right: 24, top: 16, bottom: 48 };
  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  const data = JSON.parse(document.getElementById('report-data').textContent);

  // As bucketalloc::FormatBytes prints them.
  function formatBytes(bytes) {
    let v = bytes, i = 0;
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; ++i; }
    return i === 0 ? v + ' B' : v.toFixed(2) + ' ' + UNITS[i];
  }
  // Axis labels: powers of two read better without decimals.
  function shortBytes(bytes) {
    let v = bytes, i = 0;
    while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; ++i; }
    return (Number.isInteger(v) ? String(v) : v.toFixed(1)) + ' ' + UNITS[i];
  }
  function formatCount(n) { return Number(n).toLocaleString('en-US'); }
  function svg(name, attrs, parent, text) {
    const e = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(name, attrs, parent, text) {
    const e = document.createElement(name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  // Byte axes step by powers of two (512 MiB, 1 GiB, ...), at most 8 steps.
  function byteTicks(max) {
    let step = 1;
    while (max / step > 8) step *= 2;
    const ticks = [];
    for (let v = 0; v <= max; v += step) ticks.push(v);
    return ticks;
  }
  // Event axes step by 1, 2 or 5 times a power of ten, about 6 steps.
  function countTicks(max) {
    const raw = Math.max(1, max / 6);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(function (m) { return m * p; }).find(function (s) { return s >= raw; });
    const ticks = [];
    for (let v = 0; v <= max; v += step) ticks.push(v);
    return ticks;
  }
  function chart(figure, label, height) {
    return svg('svg', { class: 'chart', viewBox: '0 0 ' + W + ' ' + height, role: 'img', 'aria-label': label }, figure);
  }
  function yAxis(root, ticks, y, height) {
    for (const v of ticks) {
      svg('line', { class: 'grid', x1: M.left, x2: W - M.right, y1: y(v), y2: y(v) }, root);
      svg('text', { x: M.left - 6, y: y(v) + 4, 'text-anchor': 'end' }, root, shortBytes(v));
    }
    svg('line', { class: 'axis', x1: M.left, x2: M.left, y1: M.top, y2: height - M.bottom }, root);
    svg('line', { class: 'axis', x1: M.left, x2: W - M.right, y1: height - M.bottom, y2: height - M.bottom }, root);
  }
  function emptyMessage(root, height, text) {
    svg('text', { class: 'empty', x: W / 2, y: height / 2, 'text-anchor': 'middle' }, root, text);
  }

  // Live (line: the bucket maxima; band: down to the bucket minima) and reserved bytes per event
  // bucket, the capacity, the buckets with OOMs, and where the histogram was taken.
  function drawTimeline(row, figure) {
    const H = 300;
    const root = chart(figure, 'live and reserved bytes over the replay of ' + row.at_capacity.allocator, H);
    const t = row.timeline;
    const capacity = row.at_capacity.capacity_bytes;
    if (!t || t.event.length === 0) {
      const y = function (b) { return H - M.bottom - b / capacity * (H - M.top - M.bottom); };
      yAxis(root, byteTicks(capacity), y, H);
      emptyMessage(root, H, 'no timeline recorded');
      return root;
    }
    const n = t.event.length;
    let yMax = capacity;
    for (let i = 0; i < n; ++i) yMax = Math.max(yMax, t.live_bytes[i], t.reserved_bytes[i]);
    yMax = Math.max(1, yMax * 1.05);
    const xMax = Math.max(1, t.events);
    const x = function (ev) { return M.left + ev / xMax * (W - M.left - M.right); };
    const y = function (b) { return H - M.bottom - b / yMax * (H - M.top - M.bottom); };
    yAxis(root, byteTicks(yMax), y, H);
    for (const v of countTicks(xMax)) {
      svg('text', { x: x(v), y: H - M.bottom + 16, 'text-anchor': 'middle' }, root, formatCount(v));
    }
    svg('text', { x: (M.left + W - M.right) / 2, y: H - 10, 'text-anchor': 'middle' }, root, 'trace event');
    // Each point covers [event, event + bucket_events): a step outline shows exactly that.
    // Vertices left to right (or right to left, to close the band).
    function steps(values, leftToRight) {
      const parts = [];
      for (let k = 0; k < n; ++k) {
        const i = leftToRight ? k : n - 1 - k;
        const x0 = x(t.event[i]).toFixed(1), x1 = x(Math.min(t.events, t.event[i] + t.bucket_events)).toFixed(1);
        const yi = y(values[i]).toFixed(1);
        if (leftToRight) parts.push(x0 + ',' + yi, x1 + ',' + yi);
        else parts.push(x1 + ',' + yi, x0 + ',' + yi);
      }
      return parts;
    }
    const live = steps(t.live_bytes, true);
    svg('path', { class: 'live-band', d: 'M' + live.concat(steps(t.live_min_bytes, false)).join('L') + 'Z' }, root);
    svg('path', { class: 'live', d: 'M' + live.join('L') }, root);
    svg('path', { class: 'reserved', d: 'M' + steps(t.reserved_bytes, true).join('L') }, root);
    const cap = svg('line', { class: 'capacity', x1: M.left, x2: W - M.right, y1: y(capacity), y2: y(capacity) }, root);
    svg('title', {}, cap, 'capacity ' + formatBytes(capacity));
    svg('text', { x: W - M.right - 4, y: y(capacity) - 5, 'text-anchor': 'end' }, root,
        'capacity ' + formatBytes(capacity));
    for (let i = 0; i < n; ++i) {
      if (t.ooms[i] === 0) continue;
      const tick = svg('line', { class: 'oom', x1: x(t.event[i]), x2: x(t.event[i]),
                                 y1: H - M.bottom, y2: H - M.bottom - 8 }, root);
      svg('title', {}, tick, t.ooms[i] + ' OOM(s) in events ' + t.event[i] + '-' + (t.event[i] + t.bucket_events - 1));
    }
    const pf = row.peak_fragmentation;
    if (pf) {
      const mark = svg('line', { class: 'peak-marker', x1: x(pf.event), x2: x(pf.event),
                                 y1: M.top, y2: H - M.bottom }, root);
      svg('title', {}, mark, 'event ' + pf.event +
          ': reserved bytes first reach their peak; the histogram below is taken here');
    }
    return root;
  }

  // Free blocks by power-of-two size at the peak of reserved bytes: bytes per bin, count on top.
  function drawHistogram(row, figure) {
    const H = 280;
    const root = chart(figure, 'free blocks at the peak of reserved bytes of ' + row.at_capacity.allocator, H);
    const pf = row.peak_fragmentation;
    const bins = pf ? pf.bins : [];
    if (bins.length === 0) {
      yAxis(root, [0], function () { return H - M.bottom; }, H);
      emptyMessage(root, H, pf ? 'no cached free blocks at the peak' : 'nothing was reserved');
      return root;
    }
    const lo = bins[0].bin, hi = bins[bins.length - 1].bin;
    const byBin = new Map(bins.map(function (b) { return [b.bin, b]; }));
    let yMax = 1;
    for (const b of bins) yMax = Math.max(yMax, b.bytes);
    yMax *= 1.12;
    const slot = (W - M.left - M.right) / (hi - lo + 1);
    const y = function (b) { return H - M.bottom - b / yMax * (H - M.top - M.bottom); };
    yAxis(root, byteTicks(yMax), y, H);
    for (let bin = lo; bin <= hi; ++bin) {
      const b = byBin.get(bin) || { bin: bin, min_bytes: Math.pow(2, bin), count: 0, bytes: 0 };
      const x0 = M.left + (bin - lo) * slot;
      const cx = x0 + slot / 2;
      if (b.count > 0) {
        const bar = svg('rect', { class: 'bar', x: x0 + slot * 0.1, width: slot * 0.8, y: y(b.bytes),
                                  height: Math.max(1, y(0) - y(b.bytes)) }, root);
        svg('title', {}, bar, formatCount(b.count) + ' free block(s) of ' + formatBytes(b.min_bytes) + ' to ' +
            formatBytes(b.min_bytes * 2) + ': ' + formatBytes(b.bytes));
        svg('text', { x: cx, y: y(b.bytes) - 4, 'text-anchor': 'middle' }, root, formatCount(b.count));
      }
      svg('text', { x: cx, y: H - M.bottom + 14, 'text-anchor': 'end',
                    transform: 'rotate(-35 ' + cx.toFixed(1) + ' ' + (H - M.bottom + 14) + ')' },
          root, '\u2265' + shortBytes(b.min_bytes));
    }
    return root;
  }

  function timelineCaption(row) {
    const t = row.timeline, r = row.at_capacity;
    if (!t) return '';
    return 'Peak reserved ' + formatBytes(r.peak_reserved_bytes) + ', peak live ' + formatBytes(r.peak_live_bytes) +
           ', ' + formatCount(r.ooms) + ' OOM(s) (red ticks). ' + formatCount(t.events) + ' events; each step covers ' +
           formatCount(t.bucket_events) + ' event(s) and shows their maxima, the shaded band the live minimum.';
  }
  function histogramCaption(row) {
    const pf = row.peak_fragmentation;
    if (!pf) return '';
    const blocks = pf.bins.reduce(function (s, b) { return s + b.count; }, 0);
    return 'After event ' + formatCount(pf.event) + ', when reserved bytes first reached their peak: reserved ' +
           formatBytes(pf.reserved_bytes) + ', allocated ' + formatBytes(pf.allocated_bytes) + ' (requested ' +
           formatBytes(pf.requested_bytes) + ', the trace held ' + formatBytes(pf.live_bytes) + '); free and cached ' +
           formatBytes(pf.free_bytes) + ' in ' + formatCount(blocks) + ' block(s), the largest ' +
           formatBytes(pf.largest_free_bytes) + ' (external fragmentation ' +
           (100 * pf.external_fragmentation).toFixed(1) + '%).';
  }

  const container = document.getElementById('charts');
  let rendered = 0;
  data.rows.forEach(function (row, index) {
    const name = (data.several_traces ? row.trace + ' \u00b7 ' : '') + row.at_capacity.allocator;
    const section = html('section', { class: 'allocator', id: 'allocator-' + index }, container);
    html('h2', {}, section, name);
    const kinds = [['timeline', 'Live vs reserved bytes over the replay', drawTimeline, timelineCaption],
                   ['histogram', 'Free blocks by size at the peak of reserved bytes', drawHistogram, histogramCaption]];
    for (const [kind, title, draw, caption] of kinds) {
      const figure = html('figure', { 'data-chart': kind }, section);
      html('figcaption', {}, figure, title);
      try {
        const root = draw(row, figure);
        html('p', { class: 'caption' }, figure, caption(row));
        root.setAttribute('data-rendered', 'true');
        ++rendered;
      } catch (e) {
        window.bucketallocRecordError(kind + ' chart of ' + name + ': ' + e);
        console.error(e);
      }
    }
  });
  document.body.dataset.chartsRendered = String(rendered);
})();
)JS";

}  // namespace

std::string EscapeHtml(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string CompareToJson(const std::vector<CompareReport>& reports) {
  return RowsJson(reports).dump(2, ' ', false, Json::error_handler_t::replace);
}

std::string CompareReportHtml(const std::vector<CompareReport>& reports) {
  const Json data = {{"several_traces", reports.size() > 1}, {"rows", RowsJson(reports)}};
  std::size_t charts = 0;
  std::string names, meta;
  bool on_gpu = false;
  for (const CompareReport& report : reports) {
    charts += 2 * report.rows.size();
    for (const CompareRow& row : report.rows) on_gpu = on_gpu || row.at_capacity.device == "cuda";
    absl::StrAppend(&names, names.empty() ? "" : ", ", report.trace_name);
    absl::StrAppend(&meta, "<p class=\"meta\">trace <code>", EscapeHtml(report.trace_name),
                    "</code> &middot; capacity ", FormatBytes(report.capacity), " &middot; peak live ",
                    FormatBytes(report.peak_live_bytes), " &middot; ", report.rows.size(), " allocator(s)</p>\n");
  }
  std::string h;
  absl::StrAppend(&h,
                  "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  // Nothing may be fetched: a report that tried would show a policy error, not
                  // quietly depend on the network.
                  "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                  "script-src 'unsafe-inline'; style-src 'unsafe-inline'\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                  "<title>bucketalloc-bench compare: ",
                  EscapeHtml(names), "</title>\n<style>", kStyle, "</style>\n</head>\n<body data-charts-expected=\"",
                  charts, "\">\n<script>", kErrorHooks, "</script>\n");
  absl::StrAppend(&h, "<h1>bucketalloc-bench compare</h1>\n", meta);
  absl::StrAppend(&h, ResultsTable(reports));
  absl::StrAppend(
      &h, "<p class=\"note\">Each allocator replays the trace on ",
      on_gpu ? "GPU 0 (cudaMalloc), capped at" : "a simulated device of exactly",
      " the capacity; min capacity is always found on the simulated device. "
      "<b>min capacity</b>: the smallest card (2 MiB resolution) found to serve the trace with no OOM (bisection, then "
      "a grid below it); "
      "<b>min / live</b>: that over the trace's peak of live bytes, the bound no allocator beats; "
      "<b>min / true need</b> (generated serving traces): that over the workload's true peak need, weights + "
      "the exact KV of the tokens held + activations, so it also counts what the KV layout's rounding costs. A "
      "<b>capacity OOM</b> is one where live + request exceeds the capacity; every other OOM is "
      "fragmentation. Latencies are wall time per allocate or free on the machine that ran the replay; "
      "backend calls are priced by the cost model.</p>\n"
      "<p class=\"note\"><span class=\"swatch live\"></span>live bytes (the trace) "
      "<span class=\"swatch reserved\"></span>reserved bytes (the allocator) "
      "<span class=\"swatch capacity\"></span>capacity</p>\n"
      "<div id=\"charts\"></div>\n<noscript>The charts need JavaScript; the table does not.</noscript>\n");
  absl::StrAppend(&h, "<script type=\"application/json\" id=\"report-data\">", ScriptSafeJson(data), "</script>\n");
  absl::StrAppend(&h, "<script>", kScript, "</script>\n</body>\n</html>\n");
  return h;
}

}  // namespace bucketalloc::harness
