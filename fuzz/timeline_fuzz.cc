// fuzz/timeline_fuzz.cc — the timeline reader and writer (src/frontend/observability/timeline.cc) on any bytes:
//   - any text is samples (with at most kMaxTimelineWarnings + 1 warnings, each naming the source
//     and a line) or an InvalidArgument naming the source, never both;
//   - every sample read has its figures in the ranges the reader accepts, and each device's times
//     never go back;
//   - what is read writes back and reads again to the same lines (TimelineToJsonLine, ReadTimeline):
//     the whole file at once gives as many samples as the first read, each written identically,
//     with no warning.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/timeline.h"
#include "fuzz_util.h"

namespace {

using bucketalloc::TimelineSample;
using bucketalloc::fuzz::Broken;

void CheckRanges(const std::vector<TimelineSample>& samples) {
  std::map<int, double> last_time;
  for (const TimelineSample& s : samples) {
    if (s.reserved_bytes < 0 || s.allocated_bytes < 0 || s.device < 0 || s.device > 65536 ||
        s.external_fragmentation < 0 || s.external_fragmentation > 1 || s.internal_fragmentation < 0 ||
        s.internal_fragmentation > 1) {
      Broken("a sample the reader accepts has figures in their ranges");
    }
    auto [it, first] = last_time.emplace(s.device, s.time_s);
    if (!first) {
      if (s.time_s < it->second) Broken("a device's times never go back");
      it->second = s.time_s;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const absl::string_view text = bucketalloc::fuzz::Text(data, size);
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<TimelineSample>> read = bucketalloc::ReadTimeline(text, "in.jsonl", &warnings);
  if (!read.ok()) {
    if (!absl::IsInvalidArgument(read.status())) Broken("a text that is no timeline is InvalidArgument");
    if (!absl::StrContains(read.status().message(), "in.jsonl")) Broken("the error names the source");
    return 0;
  }
  if (warnings.size() > bucketalloc::kMaxTimelineWarnings + 1) Broken("the warnings are bounded");
  for (const std::string& w : warnings) {
    if (!absl::StartsWith(w, "in.jsonl:")) Broken("a warning names the source and the line", w);
  }
  CheckRanges(*read);
  // Written back, read again: the same samples, written the same.
  std::vector<std::string> lines;
  std::string file;
  for (const TimelineSample& s : *read) {
    lines.push_back(bucketalloc::TimelineToJsonLine(s));
    absl::StrAppend(&file, lines.back(), "\n");
  }
  std::vector<std::string> again_warnings;
  absl::StatusOr<std::vector<TimelineSample>> again = bucketalloc::ReadTimeline(file, "out.jsonl", &again_warnings);
  if (!again.ok()) Broken("what the writer writes reads", again.status().ToString());
  if (!again_warnings.empty()) Broken("what the writer writes reads without a warning", again_warnings[0]);
  if (again->size() != read->size()) Broken("written and read again: as many samples");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string line = bucketalloc::TimelineToJsonLine((*again)[i]);
    if (line != lines[i]) Broken("written and read again: the same sample", absl::StrCat(lines[i], "\n", line));
  }
  return 0;
}
