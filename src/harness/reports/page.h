// src/harness/reports/page.h — the harness's HTML pages: one page shape, one stylesheet (layer L5,
// the benchmark harness).
//
// Owns: `HtmlPage`, the self-contained page every HTML output of bucketalloc-bench is (compare's
// report, the doctor's diagnosis, the plan): UTF-8, a Content-Security-Policy that forbids every
// fetch (default-src 'none'; inline style, and inline script only when the page has one), the one
// stylesheet (page.css), and, for a page with a script, the error hooks (error_hooks.js) as the
// first element of <body> — registered before anything else runs, so that even a script that fails
// to parse is reported in <body data-errors> — then the caller's body, its data as JSON in
// <script type="application/json" id="report-data">, and its script last. Also the HTML and
// <script> escaping the pages use. page.css, error_hooks.js and report.js (compare's charts) are
// files of this folder, embedded at build time (CMakeLists.txt, the harness section).
// Thread-safety: pure functions.
//
// Example:
//   std::string html = HtmlPage("bucketalloc plan: " + model, "<section id=\"plan\">...</section>");
//   std::string chart = HtmlPage(title, body, {.body_attributes = "data-charts-expected=\"2\"",
//                                              .data_json = json.dump(), .script = ReportScript()});
#ifndef BUCKETALLOC_HARNESS_REPORTS_PAGE_H_
#define BUCKETALLOC_HARNESS_REPORTS_PAGE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace bucketalloc::harness {

struct PageOptions {
  // Attributes of <body>, as HTML (e.g. data-charts-expected="4"); the caller escapes their values.
  std::string body_attributes;
  // JSON text embedded as <script type="application/json" id="report-data"> (made ScriptSafeJson).
  std::optional<std::string> data_json;
  // Inline JavaScript run after the body and the data; none: the page runs no script at all (and its
  // policy allows none).
  std::optional<absl::string_view> script;
};

// The page titled `title` (text: escaped here) with `body_html` (HTML) as the content of <body>.
std::string HtmlPage(absl::string_view title, absl::string_view body_html, const PageOptions& options = {});

// The stylesheet of every page (page.css), and the script of compare's report (report.js: draws its
// charts from the page's data).
absl::string_view PageStylesheet();
absl::string_view ReportScript();

// `text` for HTML element content and attribute values (& < > " ' escaped).
std::string EscapeHtml(absl::string_view text);

// JSON text for inside <script>: "<", ">" and "&" occur only in JSON strings, where \u escapes mean
// the same characters, so "</script>" or "<!--" in a string cannot end or confuse the element.
std::string ScriptSafeJson(absl::string_view json);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPORTS_PAGE_H_
