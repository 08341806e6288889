// fuzz/snapshot_fuzz.cc — the reader of PyTorch's memory snapshot pickles
// (src/harness/replay/snapshot_pickle.cc) and the snapshot reader (snapshot_import.cc): any input is
// plain data or an InvalidArgument (never an exception, a crash, a leak or code run); the tree holds
// at most a few bytes per byte of input however its values are shared (memo bombs of strings or of
// containers); its JSON stays within the expansion budget; a snapshot it reads has a history that
// replay reads back and segment totals no larger than kMaxRequestBytes per segment.
#include <cstddef>
#include <cstdint>
#include <string>

#include "bucketalloc/units.h"
#include "fuzz_util.h"
#include "harness/replay/snapshot_import.h"
#include "harness/replay/snapshot_pickle.h"
#include "harness/replay/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using bucketalloc::fuzz::Broken;
  namespace h = bucketalloc::harness;
  absl::StatusOr<h::PlainPickle> p =
      h::PlainPickle::Parse(std::string(bucketalloc::fuzz::Text(data, size)), "fuzz.pickle");
  if (!p.ok()) {
    if (!absl::IsInvalidArgument(p.status())) Broken("a bad pickle is InvalidArgument", p.status().ToString());
    return 0;
  }
  // Every opcode makes at most one node (16 bytes); an item is a 4-byte reference in a region at most
  // twice its container's size, and the regions left behind hold as much again: the tree is linear
  // in the input (vectors' spare capacity included).
  if (p->tree_bytes() > 64 * size + 4096) Broken("the tree is linear in the input", std::to_string(p->tree_bytes()));
  absl::StatusOr<nlohmann::json> j = h::PickleToJson(p->root(), *p);
  if (j.ok()) {
    // Plain data: it prints (bytes that are not UTF-8 replaced) and reads back as the same value.
    const std::string text = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded()) {
      Broken("the plain data of a pickle prints as JSON", text);
    }
    // The writer's budget counts each value once and its string bytes: a value prints in at most 32
    // bytes (a double's digits, an escaped byte's \u00XX, the separators).
    if (text.size() > 32 * (h::kPickleExpansionPerByte * size + 1024)) Broken("the JSON stays within its budget");
  } else if (!absl::IsInvalidArgument(j.status())) {
    Broken("data that cannot be JSON is InvalidArgument", j.status().ToString());
  }
  if (!p->root().is_dict()) return 0;
  h::SnapshotReadOptions o;
  o.segments_device = 0;
  absl::StatusOr<h::SnapshotContents> c = h::ReadSnapshot(*p, "accepted: a snapshot", o);
  if (!c.ok()) {
    if (!absl::IsInvalidArgument(c.status())) Broken("a bad snapshot is InvalidArgument", c.status().ToString());
    return 0;
  }
  if (c->segments.reserved_bytes < 0 ||
      c->segments.reserved_bytes / static_cast<std::int64_t>(bucketalloc::kMaxRequestBytes) > c->segments.segments) {
    Broken("the segments' bytes are their sum, each at most kMaxRequestBytes");
  }
  if (!c->history.has_value()) return 0;
  const std::string csv = h::FormatTrace(*c->history);
  absl::StatusOr<h::Trace> again = h::ParseTrace(csv, "snapshot");
  if (!again.ok()) Broken("an imported history replays", csv + "\n" + again.status().ToString());
  if (again->events.size() != c->history->events.size()) Broken("an imported history keeps its events", csv);
  return 0;
}
