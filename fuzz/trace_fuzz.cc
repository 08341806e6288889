// fuzz/trace_fuzz.cc — the RMM trace reader (src/harness/replay/trace.cc): any text is a trace or an
// InvalidArgument naming a line; a trace it reads passes CheckTrace, and its CSV reads back to the
// same events.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "harness/replay/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using bucketalloc::fuzz::Broken;
  using bucketalloc::harness::Trace;
  absl::StatusOr<Trace> t = bucketalloc::harness::ParseTrace(bucketalloc::fuzz::Text(data, size), "fuzz");
  if (!t.ok()) {
    if (!absl::IsInvalidArgument(t.status())) Broken("a bad trace is InvalidArgument", t.status().ToString());
    return 0;
  }
  if (absl::Status s = bucketalloc::harness::CheckTrace(*t); !s.ok())
    Broken("a read trace is replayable", s.ToString());
  const std::string csv = bucketalloc::harness::FormatTrace(*t);
  absl::StatusOr<Trace> again = bucketalloc::harness::ParseTrace(csv, "again");
  if (!again.ok()) Broken("a written trace reads back", csv + "\n" + again.status().ToString());
  if (again->events.size() != t->events.size()) Broken("a written trace keeps its events", csv);
  for (std::size_t i = 0; i < t->events.size(); ++i) {
    const auto &a = t->events[i], &b = again->events[i];
    if (a.action != b.action || a.pointer != b.pointer || a.size != b.size || a.stream != b.stream ||
        a.thread != b.thread) {
      Broken("a written trace keeps each event", csv);
    }
  }
  return 0;
}
