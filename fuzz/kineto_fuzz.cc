// fuzz/kineto_fuzz.cc — the Kineto importers (src/harness/replay/importers.cc), JSON and CSV: any input
// is a trace or an InvalidArgument (never an exception or a crash), and what they import is a
// trace that replay reads back (its CSV parses and passes CheckTrace).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "harness/replay/importers.h"
#include "harness/replay/trace.h"

namespace {

void Check(const absl::StatusOr<bucketalloc::harness::Trace>& t, const char* form) {
  using bucketalloc::fuzz::Broken;
  if (!t.ok()) {
    if (!absl::IsInvalidArgument(t.status())) Broken("a bad Kineto log is InvalidArgument", t.status().ToString());
    return;
  }
  const std::string csv = bucketalloc::harness::FormatTrace(*t);
  absl::StatusOr<bucketalloc::harness::Trace> again = bucketalloc::harness::ParseTrace(csv, form);
  if (!again.ok()) Broken("an imported trace replays", csv + "\n" + again.status().ToString());
  if (again->events.size() != t->events.size()) Broken("an imported trace keeps its events", csv);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const absl::string_view text = bucketalloc::fuzz::Text(data, size);
  Check(bucketalloc::harness::ImportKinetoJson(text, -1, "fuzz.json"), "json");
  Check(bucketalloc::harness::ImportKinetoCsv(text, -1, "fuzz.csv"), "csv");
  return 0;
}
