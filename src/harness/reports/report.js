// src/harness/reports/report.js — compare's charts (report.h): per allocator, live vs reserved bytes
// over the replay and the histogram of its free blocks at its peak, drawn as inline SVG from the
// page's data (the JSON element report-data); the body's data-charts-rendered counts what it drew.
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
    // The non-empty bins of the histogram, each with its index (bin i: sizes in [2^i, 2^(i+1))).
    const bins = pf ? pf.histogram.map(function (b) {
      return { bin: Math.round(Math.log2(b.min_bytes)), min_bytes: b.min_bytes, count: b.count, bytes: b.bytes };
    }) : [];
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
    const blocks = pf.histogram.reduce(function (s, b) { return s + b.count; }, 0);
    return 'After event ' + formatCount(pf.event) + ', when reserved bytes first reached their peak: reserved ' +
           formatBytes(pf.reserved) + ', allocated ' + formatBytes(pf.allocated) + ' (requested ' +
           formatBytes(pf.requested) + ', the trace held ' + formatBytes(pf.live_bytes) + '); free and cached ' +
           formatBytes(pf.total_free) + ' in ' + formatCount(blocks) + ' block(s), the largest ' +
           formatBytes(pf.largest_free) + ' (external fragmentation ' +
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
