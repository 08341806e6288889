// src/harness/workload/requests.cc — request trace readers (Azure CSV, Mooncake JSONL, length CSVs).
#include "harness/workload/requests.h"

#include <cmath>
#include <optional>
#include <random>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "harness/replay/trace.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

absl::Status LineError(absl::string_view source, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", what));
}

// A uniform double in [0, 1) from the generator's top 53 bits: the same on every platform, unlike
// std::uniform_real_distribution, so a seed gives the same requests everywhere.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

constexpr double kMaxArrivalSeconds = 1e9;

// One parsed row before sampling: its time since the epoch or the trace's start (kept as an
// absl::Duration, so Azure's 100 ns digits survive until the origin is subtracted); nullopt for
// lengths-only files.
struct Row {
  std::optional<absl::Duration> time;
  std::int64_t input = 0;
  std::int64_t output = 0;
  int line = 0;
};

absl::Status CheckTokens(absl::string_view source, const Row& row) {
  if (row.input <= 0 || row.input > (1 << 30)) {
    return LineError(source, row.line, absl::StrCat("input tokens ", row.input, ": accepted 1 to 2^30"));
  }
  if (row.output < 0 || row.output > (1 << 30)) {
    return LineError(source, row.line, absl::StrCat("output tokens ", row.output, ": accepted 0 to 2^30"));
  }
  return absl::OkStatus();
}

// CSV with a header; `time_column` < 0 for lengths-only files.
// `lines` starts at file line `first_line`.
absl::StatusOr<std::vector<Row>> ParseCsv(const std::vector<absl::string_view>& lines, int first_line,
                                          absl::string_view source, int time_column, int input_column,
                                          int output_column) {
  std::vector<Row> rows;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + first_line;
    absl::string_view text = absl::StripAsciiWhitespace(lines[i]);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    const int needed = std::max({time_column, input_column, output_column}) + 1;
    if (static_cast<int>(f.size()) < needed) {
      return LineError(source, line, absl::StrCat("has ", f.size(), " fields; the header names at least ", needed));
    }
    Row row;
    row.line = line;
    if (!absl::SimpleAtoi(f[input_column], &row.input) || !absl::SimpleAtoi(f[output_column], &row.output)) {
      return LineError(
          source, line,
          absl::StrCat("token counts \"", f[input_column], "\", \"", f[output_column], "\": accepted whole numbers"));
    }
    if (time_column >= 0) {
      // The 2023 traces write "2023-11-16 18:15:46.6805900"; later ones add a UTC offset
      // ("+00:00") and some tools write RFC 3339 ("T" ... "Z").
      const std::string text(absl::StripAsciiWhitespace(f[time_column]));
      absl::Time t;
      std::string error;
      bool parsed = false;
      for (const char* format :
           {"%Y-%m-%d %H:%M:%E*S", "%Y-%m-%d %H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*S%Ez", "%Y-%m-%dT%H:%M:%E*S"}) {
        // absl::ParseTime also reads "infinite-past" and "infinite-future", whatever the format:
        // not a time a request arrives at (the arrival times became NaN).
        if (absl::ParseTime(format, text, absl::UTCTimeZone(), &t, &error) && t != absl::InfinitePast() &&
            t != absl::InfiniteFuture()) {
          parsed = true;
          break;
        }
      }
      if (!parsed) {
        return LineError(source, line,
                         absl::StrCat("TIMESTAMP \"", f[time_column],
                                      "\": accepted \"YYYY-MM-DD HH:MM:SS[.fraction][+hh:mm]\" or RFC 3339"));
      }
      row.time = t - absl::UnixEpoch();
    }
    if (absl::Status s = CheckTokens(source, row); !s.ok()) return s;
    rows.push_back(row);
  }
  return rows;
}

absl::StatusOr<std::vector<Row>> ParseMooncake(const std::vector<absl::string_view>& lines, int first_line,
                                               absl::string_view source) {
  std::vector<Row> rows;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + first_line;
    absl::string_view text = absl::StripAsciiWhitespace(lines[i]);
    if (text.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return LineError(source, line,
                       "not a JSON object; a request file that starts with '{' is read as Mooncake JSON lines, one "
                       "object per line with timestamp (ms), input_length and output_length");
    for (const char* key : {"timestamp", "input_length", "output_length"}) {
      const bool whole = std::string_view(key) != "timestamp";
      if (!j.contains(key) || !(whole ? j[key].is_number_integer() : j[key].is_number())) {
        return LineError(source, line,
                         absl::StrCat("\"", key, "\" missing or not ", whole ? "a whole number" : "a number",
                                      "; each line needs timestamp (ms), input_length and output_length (tokens)"));
      }
    }
    Row row;
    row.line = line;
    const double ms = j["timestamp"].get<double>();
    if (!std::isfinite(ms) || std::abs(ms) > 1e15) {
      return LineError(source, line, absl::StrCat("timestamp ", j["timestamp"].dump(), ": accepted milliseconds"));
    }
    row.time = absl::Milliseconds(ms);
    row.input = j["input_length"].get<std::int64_t>();
    row.output = j["output_length"].get<std::int64_t>();
    if (absl::Status s = CheckTokens(source, row); !s.ok()) return s;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

absl::string_view RequestFormatName(RequestFormat format) {
  switch (format) {
    case RequestFormat::kAzure:
      return "azure";
    case RequestFormat::kMooncake:
      return "mooncake";
    case RequestFormat::kLengthsOnly:
      return "lengths";
  }
  return "?";
}

absl::StatusOr<RequestSet> ParseRequests(absl::string_view text, const RequestOptions& options,
                                         absl::string_view source) {
  if (!(options.sample_fraction > 0.0 && options.sample_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("sample fraction ", options.sample_fraction, ": accepted (0, 1]"));
  }
  if (!(options.time_scale > 0.0 && options.time_scale <= 1e6)) {  // NaN fails too
    return absl::InvalidArgumentError(
        absl::StrCat("time scale ", options.time_scale, ": accepted a number > 0 and at most 1e6"));
  }
  if (!(options.qps > 0.0) || !std::isfinite(options.qps)) {
    return absl::InvalidArgumentError(absl::StrCat("qps ", options.qps, ": accepted a number > 0"));
  }
  if (options.limit < 0) return absl::InvalidArgumentError(absl::StrCat("limit ", options.limit, ": accepted >= 0"));

  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  std::size_t first = 0;
  while (first < lines.size() && absl::StripAsciiWhitespace(lines[first]).empty()) ++first;
  if (first == lines.size()) return absl::InvalidArgumentError(absl::StrCat(source, ": empty"));
  lines.erase(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(first));
  const int first_line = static_cast<int>(first) + 1;  // of lines[0] in the file

  RequestSet set;
  absl::StatusOr<std::vector<Row>> rows;
  const absl::string_view head = absl::StripAsciiWhitespace(lines[0]);
  if (absl::StartsWith(head, "{")) {
    set.format = RequestFormat::kMooncake;
    rows = ParseMooncake(lines, first_line, source);
  } else {
    std::vector<std::string> header;
    for (absl::string_view h : absl::StrSplit(head, ',')) header.push_back(std::string(absl::StripAsciiWhitespace(h)));
    auto column = [&](absl::string_view name) {
      for (std::size_t i = 0; i < header.size(); ++i) {
        if (header[i] == name) return static_cast<int>(i);
      }
      return -1;
    };
    if (column("ContextTokens") >= 0 && column("GeneratedTokens") >= 0 && column("TIMESTAMP") >= 0) {
      set.format = RequestFormat::kAzure;
      rows =
          ParseCsv(lines, first_line, source, column("TIMESTAMP"), column("ContextTokens"), column("GeneratedTokens"));
    } else if (column("num_prefill_tokens") >= 0 && column("num_decode_tokens") >= 0) {
      set.format = RequestFormat::kLengthsOnly;
      rows = ParseCsv(lines, first_line, source, -1, column("num_prefill_tokens"), column("num_decode_tokens"));
    } else {
      return LineError(source, first_line,
                       absl::StrCat("unknown request format (header \"", head,
                                    "\"); accepted: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), Mooncake "
                                    "JSON lines (timestamp, input_length, output_length), or a length CSV "
                                    "(num_prefill_tokens,num_decode_tokens,...)"));
    }
  }
  if (!rows.ok()) return rows.status();
  set.rows = static_cast<std::int64_t>(rows->size());

  // Two streams from the seed: one samples, one draws the Poisson gaps of the kept requests only,
  // so the arrival rate is --qps whatever the sample fraction.
  std::mt19937_64 keep_rng(options.seed);
  std::mt19937_64 gap_rng(options.seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<const Row*> kept;
  for (const Row& row : *rows) {
    if (Uniform(keep_rng) >= options.sample_fraction) continue;
    if (options.limit > 0 && static_cast<std::int64_t>(kept.size()) >= options.limit) break;
    kept.push_back(&row);
  }
  // Times are relative to the earliest kept request (a file need not be sorted).
  std::optional<absl::Duration> origin;
  for (const Row* row : kept) {
    if (row->time && (!origin || *row->time < *origin)) origin = row->time;
  }
  double poisson_clock = 0.0;
  for (const Row* row : kept) {
    Request r;
    if (row->time) {
      r.arrival_s = absl::ToDoubleSeconds(*row->time - *origin) * options.time_scale;
      if (!(r.arrival_s <= kMaxArrivalSeconds)) {  // years apart: the duration saturated, or near it
        return LineError(source, row->line,
                         absl::StrCat("arrives ", r.arrival_s, " s after the earliest request; accepted: within ",
                                      kMaxArrivalSeconds, " s (about 30 years)"));
      }
    } else {
      if (!set.requests.empty()) poisson_clock += -std::log1p(-Uniform(gap_rng)) / options.qps;
      r.arrival_s = poisson_clock * options.time_scale;
    }
    r.input_tokens = static_cast<int>(row->input);
    r.output_tokens = static_cast<int>(std::max<std::int64_t>(row->output, 1));
    set.requests.push_back(r);
  }
  if (set.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no requests left after sampling (", set.rows,
                                                   " in the file, sample fraction ", options.sample_fraction, ")"));
  }
  return set;
}

absl::StatusOr<RequestSet> ReadRequestsFile(const std::string& path, const RequestOptions& options) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "the request trace");
  if (!text.ok()) return text.status();
  return ParseRequests(*text, options, path);
}

}  // namespace bucketalloc::harness
