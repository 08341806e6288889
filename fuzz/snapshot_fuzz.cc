// fuzz/snapshot_fuzz.cc — the reader of PyTorch's memory snapshot pickles
// (src/harness/replay/snapshot_pickle.cc) and the snapshot history importer: any input is plain data
// or an InvalidArgument (never an exception, a crash, a leak or code run), and a history it imports
// is a trace that replay reads back.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "harness/replay/importers.h"
#include "harness/replay/snapshot_pickle.h"
#include "harness/replay/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using bucketalloc::fuzz::Broken;
  namespace h = bucketalloc::harness;
  absl::StatusOr<nlohmann::json> j = h::ParsePlainPickle(bucketalloc::fuzz::Text(data, size), "fuzz.pickle");
  if (!j.ok()) {
    if (!absl::IsInvalidArgument(j.status())) Broken("a bad pickle is InvalidArgument", j.status().ToString());
    return 0;
  }
  // Plain data: it prints (bytes that are not UTF-8 replaced) and reads back as the same value.
  const std::string text = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded()) {
    Broken("the plain data of a pickle prints as JSON", text);
  }
  if (!j->is_object()) return 0;
  absl::StatusOr<std::optional<h::Trace>> t = h::ImportSnapshotHistory(*j);
  if (!t.ok()) {
    if (!absl::IsInvalidArgument(t.status())) Broken("a bad history is InvalidArgument", t.status().ToString());
    return 0;
  }
  if (!t->has_value()) return 0;
  const std::string csv = h::FormatTrace(**t);
  absl::StatusOr<h::Trace> again = h::ParseTrace(csv, "snapshot");
  if (!again.ok()) Broken("an imported history replays", csv + "\n" + again.status().ToString());
  if (again->events.size() != (*t)->events.size()) Broken("an imported history keeps its events", csv);
  return 0;
}
