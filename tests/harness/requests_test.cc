// Request trace readers (src/harness/workload/requests.cc): the three formats, sampling, limit, time scale,
// Poisson arrivals for length-only files, and errors with line numbers.
#include "harness/workload/requests.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bucketalloc::harness {
namespace {

constexpr char kAzure[] =
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:46.6805900,100,0";  // no final newline, as in the real file

TEST(RequestsTest, AzureTimesAreRelativeToTheFirstRequest) {
  absl::StatusOr<RequestSet> s = ParseRequests(kAzure, {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->format, RequestFormat::kAzure);
  ASSERT_EQ(s->requests.size(), 3u);
  EXPECT_DOUBLE_EQ(s->requests[0].arrival_s, 0.0);
  EXPECT_NEAR(s->requests[1].arrival_s, 4.314579, 1e-6);
  EXPECT_NEAR(s->requests[2].arrival_s, 60.0, 1e-6);
  EXPECT_EQ(s->requests[1].input_tokens, 396);
  EXPECT_EQ(s->requests[1].output_tokens, 109);
  EXPECT_EQ(s->requests[2].output_tokens, 1);  // 0 generated tokens: at least one step produces one

  absl::StatusOr<RequestSet> scaled = ParseRequests(kAzure, {.limit = 2, .time_scale = 0.5});
  ASSERT_TRUE(scaled.ok());
  ASSERT_EQ(scaled->requests.size(), 2u);
  EXPECT_EQ(scaled->rows, 3);
  EXPECT_NEAR(scaled->requests[1].arrival_s, 4.314579 / 2, 1e-6);
}

TEST(RequestsTest, MooncakeTimestampsAreMilliseconds) {
  absl::StatusOr<RequestSet> s = ParseRequests(
      "{\"timestamp\": 1000, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 3500, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": []}\n",
      {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->format, RequestFormat::kMooncake);
  ASSERT_EQ(s->requests.size(), 2u);
  EXPECT_DOUBLE_EQ(s->requests[1].arrival_s, 2.5);
  EXPECT_EQ(s->requests[0].input_tokens, 6758);
}

TEST(RequestsTest, LengthOnlyFilesGetSeededPoissonArrivals) {
  std::string csv = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n";
  for (int i = 0; i < 4000; ++i) csv += "74,918,992,0.08\n";
  absl::StatusOr<RequestSet> a = ParseRequests(csv, {.qps = 10.0, .seed = 7});
  absl::StatusOr<RequestSet> b = ParseRequests(csv, {.qps = 10.0, .seed = 7});
  absl::StatusOr<RequestSet> c = ParseRequests(csv, {.qps = 10.0, .seed = 8});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status();
  EXPECT_EQ(a->format, RequestFormat::kLengthsOnly);
  ASSERT_EQ(a->requests.size(), 4000u);
  EXPECT_EQ(a->requests.back().arrival_s, b->requests.back().arrival_s);
  EXPECT_NE(a->requests.back().arrival_s, c->requests.back().arrival_s);
  // 3999 gaps of mean 0.1 s: the total is within 5 standard deviations (sqrt(3999) x 0.1 = 6.3 s).
  EXPECT_NEAR(a->requests.back().arrival_s, 399.9, 32.0);
  for (std::size_t i = 1; i < a->requests.size(); ++i)
    ASSERT_GE(a->requests[i].arrival_s, a->requests[i - 1].arrival_s);

  absl::StatusOr<RequestSet> half = ParseRequests(csv, {.sample_fraction = 0.5, .qps = 10.0, .seed = 7});
  ASSERT_TRUE(half.ok());
  const double kept = static_cast<double>(half->requests.size());
  EXPECT_NEAR(kept, 2000.0, 160.0);  // 5 standard deviations
  // --qps is the rate of the kept requests, whatever the fraction.
  EXPECT_NEAR(half->requests.back().arrival_s, (kept - 1) / 10.0, 5 * std::sqrt(kept) / 10.0);
}

TEST(RequestsTest, AzureTimesKeepTheirDigitsOffsetsAndOrigin) {
  absl::StatusOr<RequestSet> s = ParseRequests(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:50.0000001,10,2\n"
      "2023-11-16 18:15:40.1234567,10,2\n"  // earlier than the first row: the origin
      "2024-05-10 00:00:00.009930+00:00,10,2\n"
      "2024-05-10T00:00:01Z,10,2\n",
      {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->requests[0].arrival_s, 9.8765434, 1e-9);
  EXPECT_DOUBLE_EQ(s->requests[1].arrival_s, 0.0);
  EXPECT_GT(s->requests[2].arrival_s, 1.5e7);
  EXPECT_NEAR(s->requests[3].arrival_s - s->requests[2].arrival_s, 0.99007, 1e-6);
}

TEST(RequestsTest, LineNumbersCountLeadingBlankLines) {
  absl::StatusOr<RequestSet> s =
      ParseRequests("\n\nTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\nbad,1,2\n", {}, "f");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "f:5: TIMESTAMP \"bad\"")) << s.status();
  s = ParseRequests("\n{\"timestamp\": 1, \"input_length\": 12.9, \"output_length\": 2}\n", {}, "m");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "m:2: \"input_length\" missing or not a whole number"))
      << s.status();
}

TEST(RequestsTest, ErrorsNameTheLineAndWhatIsAccepted) {
  absl::StatusOr<RequestSet> s = ParseRequests(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\nyesterday,1,2\n", {}, "r.csv");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "r.csv:3: TIMESTAMP \"yesterday\"")) << s.status();
  s = ParseRequests("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,many,44\n", {}, "r.csv");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "r.csv:2: token counts")) << s.status();
  s = ParseRequests("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,44\n", {}, "r.csv");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "input tokens 0: accepted 1")) << s.status();
  s = ParseRequests("{\"timestamp\": 1, \"input_length\": 3}\n", {}, "m.jsonl");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "m.jsonl:1: \"output_length\" missing")) << s.status();
  s = ParseRequests("a,b,c\n1,2,3\n", {}, "x.csv");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "unknown request format")) << s.status();
  EXPECT_FALSE(ParseRequests(kAzure, {.sample_fraction = 0.0}).ok());
  EXPECT_FALSE(ParseRequests(kAzure, {.time_scale = -1.0}).ok());
  // absl::ParseTime reads "infinite-past" in any format; a request cannot arrive then (found by
  // workload_fuzz: the arrival times became NaN).
  for (const char* when : {"infinite-past", "infinite-future"}) {
    const std::string csv = absl::StrCat("TIMESTAMP,ContextTokens,GeneratedTokens\n", when,
                                         ",879,55\n2023-11-16 18:15:51.3910170,950,206\n");
    absl::Status s = ParseRequests(csv, {}).status();
    EXPECT_TRUE(absl::StrContains(s.message(), ":2: TIMESTAMP")) << s;
  }
  const std::string far =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:51,9,5\n99999-01-01 00:00:00,9,5\n";
  EXPECT_TRUE(absl::StrContains(ParseRequests(far, {}).status().message(), ":3: arrives"))
      << ParseRequests(far, {}).status();
  // A scale that sends arrival times to infinity, or is no number: refused, naming what is accepted.
  for (double scale : {1e308, std::numeric_limits<double>::infinity(), std::nan("")}) {
    absl::Status s = ParseRequests(kAzure, {.time_scale = scale}).status();
    EXPECT_TRUE(absl::StrContains(s.message(), "accepted a number > 0 and at most 1e6")) << s;
  }
  EXPECT_FALSE(ParseRequests("", {}).ok());
  EXPECT_FALSE(ReadRequestsFile("/nonexistent.csv", {}).ok());
}

TEST(RequestsTest, TheVendoredAzureTraceReadsWhole) {
  absl::StatusOr<RequestSet> s = ReadRequestsFile(
      absl::StrCat(BUCKETALLOC_SOURCE_DIR, "/data/requests/azure_llm_inference_trace_2023_conv.csv"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->rows, 19366);                               // data/SOURCES.md
  EXPECT_NEAR(s->requests.back().arrival_s, 3501.0, 2.0);  // 18:15:46 to 19:14:08
}

}  // namespace
}  // namespace bucketalloc::harness
