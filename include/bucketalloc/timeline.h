// bucketalloc/timeline.h — the memory timeline: one JSON line per device and interval, written by
// a process (BUCKETALLOC_TIMELINE, bucketalloc_timeline_start, bucketalloc_torch.start_timeline)
// and by the harness's replay of a trace (at the trace's time), and read by one reader
// (ReadTimeline), which `bucketalloc-bench doctor` uses.
//
// Owns: `TimelineSample` (what a line holds: the device's memory figures then, its counters, and
// the OOMs since its previous line), its JSON line and the reader. docs/operations.md has the
// format; the keys are the metrics' names without their prefix. The memory figures' members and
// keys are the figures' keys (BUCKETALLOC_MEMORY_FIGURES, bucketalloc/stats.h): a figure declared
// there is in every line.
// Layer: L4 (front end). Thread-safety: pure functions of their arguments.
//
// Example:
//   TimelineSample s = TimelineSampleOf(metrics, /*time_s=*/absl::ToUnixMicros(absl::Now()) / 1e6, last_seq);
//   out << TimelineToJsonLine(s) << "\n";
//   std::vector<std::string> warnings;  // lines skipped
//   absl::StatusOr<std::vector<TimelineSample>> all = ReadTimeline(text, "run.jsonl", &warnings);
#ifndef BUCKETALLOC_TIMELINE_H_
#define BUCKETALLOC_TIMELINE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/stats.h"

namespace bucketalloc {

struct TimelineSample {
  // Seconds since the Unix epoch (a process), or since the trace's first event (a replay).
  double time_s = 0.0;
  int device = 0;
  // The memory now (all pools): the cap, then each memory figure under its key (reserved_bytes,
  // allocated_bytes, active_bytes, cached_bytes, requested_bytes, largest_free_block_bytes,
  // live_allocations), set together by SetMemoryFigures.
  std::int64_t capacity_bytes = 0;
#define BUCKETALLOC_DECLARE_SAMPLE_FIGURE(type, name, key, meaning) std::int64_t key = 0;
  BUCKETALLOC_MEMORY_FIGURES(BUCKETALLOC_DECLARE_SAMPLE_FIGURE)
#undef BUCKETALLOC_DECLARE_SAMPLE_FIGURE
  double external_fragmentation = 0.0;
  double internal_fragmentation = 0.0;
  // Counters since the start.
  std::int64_t allocations_total = 0;
  std::int64_t frees_total = 0;
  std::int64_t cache_hits_total = 0;
  std::int64_t alloc_retries_total = 0;
  std::array<std::int64_t, kNumOomCauses> ooms_total{};  // by OomCause
  // The OOMs since the device's previous line.
  std::vector<OomEvent> ooms;
};

// The sample of one device's metrics at `time_s`; `ooms` holds its recent OOMs numbered after
// `after_seq` (the last one a previous sample listed; 0 for all). Its memory figures are
// MemoryFiguresOf(m.stats, m.fragmentation).
TimelineSample TimelineSampleOf(const DeviceMetrics& m, double time_s, std::uint64_t after_seq);

// Sets the memory figures of `sample` (each under its key) to `figures`.
void SetMemoryFigures(const MemoryFigures& figures, TimelineSample* sample);

// One line of JSON (no newline): {"time_s", "device", "capacity_bytes", ..., "ooms_total":
// {"capacity", "fragmentation", "cache_held", "device_exhausted", "tenant_cap"}, "ooms": [{"seq", "time_s",
// "size", "cause"}]}.
std::string TimelineToJsonLine(const TimelineSample& s);

inline constexpr int kDefaultTimelineIntervalMs = 1000;
inline constexpr int kMaxTimelineIntervalMs = 3600 * 1000;

// Parses "PATH[,interval_ms]" (BUCKETALLOC_TIMELINE's value, bucketalloc-bench replay --timeline):
// interval_ms from 1 to kMaxTimelineIntervalMs, kDefaultTimelineIntervalMs when left out;
// InvalidArgument naming what is accepted. The part after the last comma is always the interval,
// so a PATH that contains a comma needs one: "a,b.jsonl" is refused (interval "b.jsonl", and the
// error says so), "a,b.jsonl,1000" is the file a,b.jsonl.
absl::Status ParseTimelineSpec(absl::string_view spec, std::string* path, int* interval_ms);

// The most warnings ReadTimeline gives one per line; the rest are counted in one more.
inline constexpr std::size_t kMaxTimelineWarnings = 10;

// Reads a timeline (JSON lines; blank lines are skipped). A line that is not a sample (a missing or
// mistyped key, a negative figure, a line cut by a full disk) is skipped: `warnings`, when given,
// gets "SOURCE:LINE: not a timeline sample: WHY; skipped" for each of the first
// kMaxTimelineWarnings and one line counting the rest. InvalidArgument naming `source`, the first
// such line and what is wrong when no line is a sample though some are not blank (not a timeline);
// empty text is no samples and no error. A last line cut off without its newline (a process killed
// while writing it) is left out without a warning, and a device's time that goes back (a wall
// clock stepped back) is kept at the previous line's.
absl::StatusOr<std::vector<TimelineSample>> ReadTimeline(absl::string_view text, absl::string_view source,
                                                         std::vector<std::string>* warnings = nullptr);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_TIMELINE_H_
