// compare's JSON and HTML report (src/harness/reports/report.cc): the data is embedded and complete, caller
// text cannot break out of its element, and nothing refers to the network. Rendering in a browser is
// tests/harness/check_html_report.sh's.
#include "harness/reports/report.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/stats.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr char kDataOpen[] = "<script type=\"application/json\" id=\"report-data\">";

Trace SmallTrace() {
  Trace t;
  auto add = [&t](TraceAction action, std::uint64_t pointer, std::size_t size) {
    t.events.push_back({1, "", action, pointer, size, 0, 0});
  };
  add(TraceAction::kAllocate, 0xa, 6 * kMiB);
  add(TraceAction::kAllocate, 0xb, 6 * kMiB);
  add(TraceAction::kFree, 0xa, 6 * kMiB);
  add(TraceAction::kAllocate, 0xc, 30 * kMiB);
  add(TraceAction::kFree, 0xb, 6 * kMiB);
  add(TraceAction::kFree, 0xc, 30 * kMiB);
  return t;
}

CompareReport MakeReport(const std::vector<std::string>& allocators) {
  const Trace trace = SmallTrace();
  CompareReport report;
  report.trace_name = "traces/run.csv";
  report.capacity = 64 * kMiB;
  report.peak_live_bytes = PeakLiveBytes(trace);
  for (const std::string& allocator : allocators) {
    ReplayOptions o;
    o.allocator = allocator;
    o.capacity = report.capacity;
    o.record_timeline = true;
    absl::StatusOr<ReplayResult> r = Replay(trace, o);
    EXPECT_TRUE(r.ok()) << r.status();
    absl::StatusOr<MinCapacityResult> m = MinCapacity(trace, allocator, CostModel{});
    EXPECT_TRUE(m.ok()) << m.status();
    if (r.ok() && m.ok()) report.rows.push_back({*r, *m});
  }
  return report;
}

// The JSON embedded in the report, as the page's script reads it.
nlohmann::json EmbeddedData(const std::string& html) {
  const std::size_t open = html.find(kDataOpen);
  EXPECT_NE(open, std::string::npos);
  if (open == std::string::npos) return nullptr;
  const std::size_t begin = open + sizeof(kDataOpen) - 1;
  const std::size_t end = html.find("</script>", begin);
  EXPECT_NE(end, std::string::npos);
  return nlohmann::json::parse(html.substr(begin, end - begin));
}

std::size_t Count(absl::string_view text, absl::string_view needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != absl::string_view::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ReportTest, JsonHasEachAllocatorsResultsTimelineAndHistogram) {
  const CompareReport report = MakeReport({"bucketalloc", "pytorch-policy", "nocache"});
  ASSERT_EQ(report.rows.size(), 3u);
  const nlohmann::json j = nlohmann::json::parse(CompareToJson(report));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[1]["at_capacity"]["allocator"], "pytorch-policy");
  EXPECT_EQ(j[1]["min_capacity"]["min_capacity_bytes"], report.rows[1].min_capacity.min_capacity_bytes);
  const nlohmann::json& t = j[1]["timeline"];
  EXPECT_EQ(t["events"], 6);
  EXPECT_EQ(t["event"].size(), 6u);
  EXPECT_EQ(t["live_bytes"][3], 36 * kMiB);
  EXPECT_EQ(t["reserved_bytes"][3], 50 * kMiB);
  const nlohmann::json& f = j[1]["peak_fragmentation"];
  EXPECT_EQ(f["event"], 3);
  // The library's one writer of a pool's fragmentation (PoolFragmentationToJson), after the event.
  EXPECT_EQ(f["reserved"], 50 * kMiB);
  nlohmann::json expected = {{"event", 3}, {"live_bytes", f["live_bytes"]}};
  expected.update(
      nlohmann::json::parse(PoolFragmentationToJson(report.rows[1].at_capacity.peak_fragmentation->free_blocks)));
  // And where the reserved bytes were (harness/replay/memory_breakdown.h): pytorch-policy's 14 MiB
  // free lie in segments that hold live blocks.
  expected["breakdown"] = nlohmann::json::parse(
      report.rows[1].at_capacity.peak_fragmentation->breakdown.ToJson(report.rows[1].at_capacity.peak_live_bytes));
  EXPECT_EQ(f, expected);
  EXPECT_EQ(f["breakdown"]["free_shared_with_live_bytes"], 14 * kMiB);
  ASSERT_EQ(f["histogram"].size(), 2u) << "only the non-empty bins: 6 MiB and 8 MiB";
  EXPECT_EQ(f["histogram"][0]["min_bytes"], 4 * kMiB);
  EXPECT_EQ(f["histogram"][0]["max_bytes"], 8 * kMiB - 1);
  EXPECT_EQ(f["histogram"][1]["bytes"], 8 * kMiB);
  EXPECT_TRUE(j[2]["peak_fragmentation"]["histogram"].empty()) << "nocache caches nothing";
  // Without a recorded timeline the keys are absent, not empty.
  CompareReport plain = report;
  plain.rows[0].at_capacity.timeline = Timeline{};
  plain.rows[0].at_capacity.peak_fragmentation.reset();
  const nlohmann::json p = nlohmann::json::parse(CompareToJson(plain));
  EXPECT_FALSE(p[0].contains("timeline"));
  EXPECT_FALSE(p[0].contains("peak_fragmentation"));
}

TEST(ReportTest, HtmlEmbedsTheDataTheTableAndTheChartCount) {
  const CompareReport report = MakeReport({"bucketalloc", "pytorch-policy", "nocache"});
  const std::string html = CompareReportHtml(report);
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::StrContains(html, "<title>bucketalloc-bench compare: traces/run.csv</title>"));
  EXPECT_TRUE(absl::StrContains(html, "data-charts-expected=\"6\"")) << "a timeline and a histogram per allocator";
  const nlohmann::json data = EmbeddedData(html);
  EXPECT_EQ(data["several_traces"], false);
  ASSERT_EQ(data["rows"].size(), 3u);
  EXPECT_EQ(data["rows"][0]["trace"], "traces/run.csv");
  EXPECT_EQ(data["rows"][0]["at_capacity"]["capacity_bytes"], 64 * kMiB);
  EXPECT_TRUE(absl::StrContains(html, "capacity 64.00 MiB &middot; peak live 36.00 MiB"));
  EXPECT_EQ(data["rows"], nlohmann::json::parse(CompareToJson(report))) << "the page shows what --json writes";
  // The table: the terminal table's columns, a row per allocator.
  for (const char* column :
       {"peak reserved", "min capacity", "min / live", "capacity OOMs", "fragmentation OOMs", "p50 ns", "p99 ns",
        "backend calls", "simulated backend ms", "driver ms on requests' path", "synchronizations", "verdict"}) {
    EXPECT_TRUE(absl::StrContains(html, absl::StrCat("<th>", column, "</th>"))) << column;
  }
  EXPECT_TRUE(absl::StrContains(html, "<tr><td>pytorch-policy</td><td>50.00 MiB</td>"));
}

TEST(ReportTest, CallerTextCannotCloseItsElement) {
  CompareReport report = MakeReport({"bucketalloc"});
  ASSERT_EQ(report.rows.size(), 1u);
  const std::string evil = "</script><script>alert(1)</script><!-- & \"quoted\"";
  report.rows[0].at_capacity.allocator = evil;
  report.trace_name = "<b>trace</b>.csv";
  const std::string html = CompareReportHtml(report);
  EXPECT_FALSE(absl::StrContains(html, "alert(1)</script>"));
  EXPECT_FALSE(absl::StrContains(html, "<script>alert"));
  EXPECT_FALSE(absl::StrContains(html, "<b>trace"));
  EXPECT_EQ(Count(html, "</script>"), 3u) << "the error hooks, the data and the charts";
  EXPECT_EQ(Count(html, "<!--"), 0u);
  EXPECT_TRUE(absl::StrContains(html,
                                "<td>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;!-- &amp; "
                                "&quot;quoted&quot;</td>"));
  EXPECT_TRUE(absl::StrContains(html, "&lt;b&gt;trace&lt;/b&gt;.csv"));
  // Escaped, the names still read back exactly.
  const nlohmann::json data = EmbeddedData(html);
  EXPECT_EQ(data["rows"][0]["at_capacity"]["allocator"], evil);
  EXPECT_EQ(data["rows"][0]["trace"], "<b>trace</b>.csv");
  // Invalid UTF-8 from a command line is replaced, not thrown.
  report.trace_name = "bad\xff.csv";
  EXPECT_TRUE(absl::StrContains(CompareReportHtml(report), "bad"));
}

TEST(ReportTest, SeveralTracesShareOneTableWithTheTrueNeed) {
  CompareReport tiered = MakeReport({"bucketalloc", "pytorch-policy"});
  tiered.trace_name = "tiered.csv";
  CompareReport paged = MakeReport({"bucketalloc"});
  paged.trace_name = "paged.csv";
  for (CompareRow& row : tiered.rows) row.min_capacity.true_need_bytes = 40 * kMiB;
  const std::string html = CompareReportHtml(std::vector<CompareReport>{tiered, paged});
  EXPECT_TRUE(absl::StrContains(html, "data-charts-expected=\"6\""));
  EXPECT_TRUE(absl::StrContains(html, "<th>trace</th>"));
  EXPECT_TRUE(absl::StrContains(html, "<th>min / true need</th>"));
  EXPECT_TRUE(absl::StrContains(html, "<td><code>paged.csv</code></td>"));
  const double over = static_cast<double>(tiered.rows[0].min_capacity.min_capacity_bytes) / (40.0 * kMiB);
  EXPECT_TRUE(absl::StrContains(html, absl::StrFormat("<td>%.3f</td>", over)));
  const nlohmann::json data = EmbeddedData(html);
  EXPECT_EQ(data["several_traces"], true);
  ASSERT_EQ(data["rows"].size(), 3u);
  EXPECT_EQ(data["rows"][2]["trace"], "paged.csv");
  EXPECT_DOUBLE_EQ(data["rows"][0]["min_capacity"]["min_capacity_over_true_need"].get<double>(), over);
  EXPECT_FALSE(data["rows"][2]["min_capacity"].contains("true_need_bytes")) << "paged.csv has no meta file";
}

TEST(ReportTest, NothingRefersToTheNetwork) {
  const std::string html = CompareReportHtml(MakeReport({"bucketalloc", "nocache"}));
  std::string rest = html;
  // The SVG namespace name is a URI that nothing fetches; nothing else may look like a URL.
  for (std::size_t at; (at = rest.find("http://www.w3.org/2000/svg")) != std::string::npos;) rest.erase(at, 26);
  for (const char* needle : {"http://", "https://", "//cdn", "src=", "<link", "@import", "url(", "<img", "<iframe"}) {
    EXPECT_FALSE(absl::StrContains(rest, needle)) << needle;
  }
  EXPECT_TRUE(absl::StrContains(html, "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';"))
      << "the browser itself refuses any fetch";
  EXPECT_TRUE(absl::StrContains(html, "<style>"));
  EXPECT_TRUE(absl::StrContains(html, "dataset.chartsRendered"));
}

}  // namespace
}  // namespace bucketalloc::harness
