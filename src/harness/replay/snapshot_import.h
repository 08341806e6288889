// src/harness/replay/snapshot_import.h — what the harness reads of a PyTorch memory snapshot (layer L5,
// the benchmark harness): a device's history as a trace, and the totals of a device's segments.
//
// Owns: `ReadSnapshot`, over either form a snapshot comes in: torch.cuda.memory._dump_snapshot's
// pickle (parsed by harness/replay/snapshot_pickle.h, read in place: nothing but the fields below is
// copied, and shared values are never expanded) or bucketalloc_torch.snapshot()'s JSON.
// The layouts read (reference/pytorch.md §4.2; docs/harness.md, "Reading a snapshot"): every one
// torch has written since _dump_snapshot exists (torch 2.1), and torch 2.0's _snapshot() dict. A
// trace entry needs an "action" (a string); an `alloc` or `free_completed` also needs "addr", and an
// `alloc` "size" (integers); "stream" (default 0) and "time_us" (a number) are read when present.
// Other actions (segment_*, free_requested, snapshot, oom, whose address field is "device_free") are
// skipped unread. A history without any "time_us" (torch before 2.2) is timed by entry order, 1 µs
// per entry, and says so in `warnings`; an entry without it in a history that has it takes the time
// of the entry before. alloc -> allocate and free_completed
// -> free of a block it allocated (a free_requested alone is ignored; a free whose alloc the ring
// buffer dropped is dropped).
// A segment's "total_size", "allocated_size", "active_size" and "requested_size" (each absent in
// some layouts: 0) and its inactive blocks' sizes are integers from 0 to kMaxRequestBytes.
// Every error is InvalidArgument naming the source, the entry (device_traces[D][I], segments[I],
// ...), the one field at fault, what it holds and what is accepted. The walk counts what it visits
// against a budget in proportion to the input, so that shared containers cannot make it quadratic.
// Thread-safety: none needed (functions of their input).
#ifndef BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_IMPORT_H_
#define BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_IMPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "harness/replay/snapshot_pickle.h"
#include "harness/replay/trace.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {

struct SnapshotReadOptions {
  int device = -1;           // whose history: -1 the first device with one
  int segments_device = -1;  // whose segments to total: -1 none
};

// The totals of one device's segments (those without a "device" count for every device).
struct SnapshotSegmentTotals {
  std::int64_t segments = 0;
  std::int64_t reserved_bytes = 0;            // total_size
  std::int64_t allocated_bytes = 0;           // allocated_size
  std::int64_t active_bytes = 0;              // active_size
  std::int64_t requested_bytes = 0;           // requested_size
  std::int64_t largest_free_block_bytes = 0;  // the largest inactive block
};

struct SnapshotContents {
  bool has_segments = false;       // a "segments" list
  bool has_device_traces = false;  // a "device_traces" list
  std::optional<Trace> history;    // the device's history; nullopt when it has none
  int history_device = -1;
  SnapshotSegmentTotals segments;  // of SnapshotReadOptions::segments_device
  std::vector<std::string> warnings;
};

// A snapshot's JSON (an object; `source` names it in errors).
absl::StatusOr<SnapshotContents> ReadSnapshot(const nlohmann::json& snapshot, absl::string_view source,
                                              const SnapshotReadOptions& options = {});
// A parsed snapshot pickle (its root must be a dict with "device_traces": InvalidArgument naming
// the pickle's source and `accepted` otherwise).
absl::StatusOr<SnapshotContents> ReadSnapshot(const PlainPickle& snapshot, absl::string_view accepted,
                                              const SnapshotReadOptions& options = {});

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_IMPORT_H_
