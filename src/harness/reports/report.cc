// src/harness/reports/report.cc — compare's JSON and its self-contained HTML report (see the header).
#include "harness/reports/report.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "harness/reports/page.h"
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

// The event and the bytes the trace held then, followed by the free blocks as the library writes
// one pool's fragmentation (PoolFragmentationToJson: its byte totals and the non-empty bins of its
// "histogram"), and where the reserved bytes were ("breakdown", each part also over `peak_live`).
Json PeakFragmentationJson(const PeakFragmentation& p, std::size_t peak_live) {
  Json j = {{"event", p.event}, {"live_bytes", p.live_bytes}};
  Json free_blocks = Json::parse(PoolFragmentationToJson(p.free_blocks));
  for (auto& [key, value] : free_blocks.items()) j[key] = std::move(value);
  j["breakdown"] = Json::parse(p.breakdown.ToJson(peak_live));
  return j;
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
        j["peak_fragmentation"] =
            PeakFragmentationJson(*row.at_capacity.peak_fragmentation, row.at_capacity.peak_live_bytes);
      }
      rows.push_back(std::move(j));
    }
  }
  return rows;
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
      "<th>backend calls</th><th>simulated backend ms</th><th>driver ms on requests' path</th>"
      "<th>p99 &micro;s of a request calling the driver</th><th>synchronizations</th><th>granules stitched</th>"
      "<th>verdict</th></tr></thead>\n"
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
                      absl::StrFormat("%.1f", r.driver_time.request_path_ms), "</td><td>",
                      absl::StrFormat("%.0f", r.driver_time.p99_request_us), "</td><td>",
                      r.driver_time.synchronizations, "</td><td>", r.granules_stitched, "</td><td>",
                      EscapeHtml(r.verdict), "</td></tr>\n");
    }
  }
  absl::StrAppend(&t, "</tbody></table></div>\n");
  return t;
}

}  // namespace

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
      "driver calls are priced by the cost profile <code>",
      EscapeHtml(reports.empty() || reports.front().rows.empty()
                     ? std::string("a100-published")
                     : reports.front().rows.front().at_capacity.driver_time.profile),
      "</code> (docs/harness.md, &ldquo;Driver time&rdquo;): a request's are those it waited for; a "
      "synchronization is a cudaFree or a wait for queued work before memory is unmapped.</p>\n"
      "<p class=\"note\"><span class=\"swatch live\"></span>live bytes (the trace) "
      "<span class=\"swatch reserved\"></span>reserved bytes (the allocator) "
      "<span class=\"swatch capacity\"></span>capacity</p>\n"
      "<div id=\"charts\"></div>\n<noscript>The charts need JavaScript; the table does not.</noscript>\n");
  // Invalid UTF-8 (a name from the command line) becomes U+FFFD instead of throwing.
  return HtmlPage(absl::StrCat("bucketalloc-bench compare: ", names), h,
                  {.body_attributes = absl::StrCat("data-charts-expected=\"", charts, "\""),
                   .data_json = data.dump(-1, ' ', false, Json::error_handler_t::replace),
                   .script = ReportScript()});
}

}  // namespace bucketalloc::harness
