// src/harness/reports/page.cc — the harness's HTML page and its escaping (see the header).
#include "harness/reports/page.h"

#include <string_view>

#include "absl/strings/str_cat.h"
// Generated at configure time from page.css, error_hooks.js and report.js of this folder
// (CMakeLists.txt, the harness section): each defines one constexpr std::string_view.
#include "embedded/error_hooks.js.h"
#include "embedded/page.css.h"
#include "embedded/report.js.h"

namespace bucketalloc::harness {
namespace {

absl::string_view View(std::string_view text) { return absl::string_view(text.data(), text.size()); }

}  // namespace

absl::string_view PageStylesheet() { return View(embedded::kPageCss); }
absl::string_view ReportScript() { return View(embedded::kReportJs); }

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

std::string ScriptSafeJson(absl::string_view json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
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

std::string HtmlPage(absl::string_view title, absl::string_view body_html, const PageOptions& options) {
  const bool scripted = options.script.has_value();
  std::string h;
  absl::StrAppend(&h,
                  "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  // Nothing may be fetched: a page that tried would show a policy error, not
                  // quietly depend on the network.
                  "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; ",
                  scripted ? "script-src 'unsafe-inline'; " : "",
                  "style-src 'unsafe-inline'\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                  "<title>",
                  EscapeHtml(title), "</title>\n<style>\n", PageStylesheet(), "</style>\n</head>\n<body",
                  options.body_attributes.empty() ? "" : " ", options.body_attributes, ">\n");
  // First, in its own element, so that even a script that fails to parse is reported.
  if (scripted) absl::StrAppend(&h, "<script>\n", View(embedded::kErrorHooksJs), "</script>\n");
  absl::StrAppend(&h, body_html);
  if (options.data_json.has_value()) {
    absl::StrAppend(&h, "<script type=\"application/json\" id=\"report-data\">", ScriptSafeJson(*options.data_json),
                    "</script>\n");
  }
  if (scripted) absl::StrAppend(&h, "<script>\n", *options.script, "</script>\n");
  absl::StrAppend(&h, "</body>\n</html>\n");
  return h;
}

}  // namespace bucketalloc::harness
