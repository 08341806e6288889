// src/harness/reports/report.h — compare's results as JSON and as one self-contained HTML report (layer L5,
// the benchmark harness).
//
// Owns: `CompareReport` (what `bucketalloc-bench compare` measured: per allocator its replay at the
// capacity and its min-capacity) and its two renderings:
//   - CompareToJson: the --json array, one {"at_capacity", "min_capacity"} object per allocator
//     (ReplayResult::ToJson and MinCapacityResult::ToJson), plus "timeline" and
//     "peak_fragmentation" where the replay recorded them;
//   - CompareReportHtml: one HTML file that needs no network (a page of harness/reports/page.h):
//     the stylesheet, the script report.js that draws inline SVG, the data embedded as JSON, and a
//     Content-Security-Policy that forbids every fetch, so a report that tried to load something
//     would fail loudly instead of silently. It
//     holds the results table (the terminal table's columns), and per allocator a chart of live
//     vs reserved bytes over the replay (with the capacity line) and the histogram of its free
//     blocks at its peak of reserved bytes. The script sets `data-charts-rendered` on <body> to the
//     number of charts drawn (`data-charts-expected` is 2 per allocator) and appends any script
//     error to `data-errors`, which tests/harness/check_html_report.sh checks in headless Chromium.
// Thread-safety: none (values).
//
// Example:
//   CompareReport report{.trace_name = "run.csv", .capacity = 24 * kGiB, .peak_live_bytes = live};
//   report.rows.push_back({*Replay(trace, options_with_timeline), *MinCapacity(trace, "bucketalloc", cost)});
//   std::string html = CompareReportHtml(report);
#ifndef BUCKETALLOC_HARNESS_REPORTS_REPORT_H_
#define BUCKETALLOC_HARNESS_REPORTS_REPORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "harness/replay/replay.h"

namespace bucketalloc::harness {

// One allocator of a comparison.
struct CompareRow {
  ReplayResult at_capacity;  // with its timeline and peak_fragmentation for the charts
  MinCapacityResult min_capacity;
};

struct CompareReport {
  std::string trace_name;  // shown as given (a path)
  std::size_t capacity = 0;
  std::size_t peak_live_bytes = 0;
  std::vector<CompareRow> rows;
};

// Returns the JSON array written by `compare --json`: one object per (trace, allocator), with the
// trace's name under "trace".
std::string CompareToJson(const std::vector<CompareReport>& reports);
inline std::string CompareToJson(const CompareReport& report) { return CompareToJson(std::vector{report}); }

// Returns the self-contained HTML report (see the file comment) of one or several traces (e.g. the
// same requests in each KV layout: the table then answers which layout and allocator serve them on
// the smallest card). Text from the caller (trace names, allocator specs) is escaped for HTML, and
// the embedded JSON cannot close its <script>.
std::string CompareReportHtml(const std::vector<CompareReport>& reports);
inline std::string CompareReportHtml(const CompareReport& report) { return CompareReportHtml(std::vector{report}); }

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPORTS_REPORT_H_
