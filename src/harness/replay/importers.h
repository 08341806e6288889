// src/harness/replay/importers.h — turns other allocation logs into traces (layer L5, the benchmark harness).
//
// PyTorch profiler memory events (Kineto), in two forms:
//   - the trace JSON of torch.profiler with profile_memory=True (optionally .gz): "[memory]" instant
//     events whose args hold "Device Type", "Device Id", "Addr" and "Bytes" (negative for a free);
//   - the CSV form of the same events (columns ts_us, device_type, device_id, addr, bytes; others are
//     ignored), as in HTA's memory-event exports.
// Only CUDA events (Device Type 1) of one device are kept (`device`, or the first CUDA device seen
// when it is -1). A free of an address the log never allocated (allocated before the profile began)
// is dropped. Time becomes the event's microsecond timestamp.
// Memory snapshots (torch.cuda.memory._dump_snapshot's pickle, or bucketalloc_torch.snapshot() as
// JSON): a device's history (device_traces[N], recorded with _record_memory_history) becomes a trace
// as harness/replay/snapshot_import.h reads it.
#ifndef BUCKETALLOC_HARNESS_REPLAY_IMPORTERS_H_
#define BUCKETALLOC_HARNESS_REPLAY_IMPORTERS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "harness/replay/snapshot_import.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {

absl::StatusOr<Trace> ImportKinetoCsv(absl::string_view text, int device = -1, absl::string_view source = "kineto csv");
absl::StatusOr<Trace> ImportKinetoJson(absl::string_view text, int device = -1,
                                       absl::string_view source = "kineto json");
// Reads `path` (gzip-compressed when it ends in .gz) and imports it as JSON or CSV by its content.
absl::StatusOr<Trace> ImportKinetoFile(const std::string& path, int device = -1);

// A recording of a workload, by its content: a trace (RMM CSV), a profiler trace (Kineto JSON,
// JSON.gz or CSV) or a snapshot with its history (a pickle, or JSON). InvalidArgument names the file, what it
// seemed to be and what is accepted. A snapshot's warnings (a history without time_us) are added to
// `warnings` when given.
absl::StatusOr<Trace> ReadRecording(const std::string& path, int device = -1,
                                    std::vector<std::string>* warnings = nullptr);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_IMPORTERS_H_
