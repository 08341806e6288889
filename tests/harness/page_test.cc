// The harness's HTML page (src/harness/reports/page.cc): one shape and one stylesheet for every page,
// a policy that forbids every fetch (and scripts, on a page without one), the error hooks before
// anything else runs, and caller text that cannot break out of its element.
#include "harness/reports/page.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bucketalloc::harness {
namespace {

std::size_t Count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

TEST(PageTest, APageWithoutAScriptRunsNone) {
  const std::string html = HtmlPage("a <title> & more", "<p id=\"x\">body</p>");
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>\n<html lang=\"en\">\n"));
  EXPECT_TRUE(absl::StrContains(html, "<title>a &lt;title&gt; &amp; more</title>"));
  EXPECT_TRUE(absl::StrContains(html, "content=\"default-src 'none'; style-src 'unsafe-inline'\""));
  EXPECT_FALSE(absl::StrContains(html, "script-src"));
  EXPECT_FALSE(absl::StrContains(html, "<script"));
  EXPECT_TRUE(absl::StrContains(html, absl::StrCat("<style>\n", PageStylesheet(), "</style>")));
  EXPECT_TRUE(absl::StrContains(html, "<body>\n<p id=\"x\">body</p></body>\n</html>\n"));
}

TEST(PageTest, TheStylesheetIsOneForEveryPage) {
  const absl::string_view css = PageStylesheet();
  EXPECT_TRUE(absl::StrContains(css, "td.best")) << "compare's table";
  EXPECT_TRUE(absl::StrContains(css, "svg.chart")) << "compare's charts";
  EXPECT_TRUE(absl::StrContains(css, "svg.memory")) << "the doctor's curves";
  EXPECT_FALSE(absl::StrContains(css, "url(")) << "nothing fetched";
  EXPECT_FALSE(absl::StrContains(css, "</style")) << "it cannot end its element";
  EXPECT_FALSE(absl::StrContains(ReportScript(), "</script")) << "it cannot end its element";
  EXPECT_TRUE(absl::StrContains(ReportScript(), "dataset.chartsRendered"));
}

TEST(PageTest, AScriptRunsAfterTheErrorHooksAndTheData) {
  const std::string html = HtmlPage("t", "<div id=\"charts\"></div>\n",
                                    {.body_attributes = "data-charts-expected=\"2\"",
                                     .data_json = "{\"name\":\"</script><!-- & \"}",
                                     .script = "document.body.dataset.done = '1';\n"});
  EXPECT_TRUE(absl::StrContains(html, "script-src 'unsafe-inline'; style-src 'unsafe-inline'"));
  EXPECT_TRUE(absl::StrContains(html, "<body data-charts-expected=\"2\">\n<script>\n"));
  const std::size_t hooks = html.find("window.bucketallocRecordError");
  const std::size_t body = html.find("<div id=\"charts\">");
  const std::size_t data = html.find("<script type=\"application/json\" id=\"report-data\">");
  const std::size_t script = html.find("document.body.dataset.done");
  ASSERT_NE(hooks, std::string::npos);
  EXPECT_LT(hooks, body) << "the hooks first, so that a script that fails to parse is reported";
  EXPECT_LT(body, data);
  EXPECT_LT(data, script);
  EXPECT_TRUE(absl::StrContains(html, "{\"name\":\"\\u003c/script\\u003e\\u003c!-- \\u0026 \"}"));
  EXPECT_EQ(Count(html, "</script>"), 3u) << "the hooks, the data and the script";
  EXPECT_EQ(Count(html, "<!--"), 0u);
}

TEST(PageTest, Escaping) {
  EXPECT_EQ(EscapeHtml("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(ScriptSafeJson("[\"<>&\", 1]"), "[\"\\u003c\\u003e\\u0026\", 1]");
}

}  // namespace
}  // namespace bucketalloc::harness
