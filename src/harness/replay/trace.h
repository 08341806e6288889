// src/harness/replay/trace.h — allocation traces in RMM's replay-log CSV (layer L5, the benchmark harness).
//
// Owns: `Trace` (the events of one allocation log, in file order) and its CSV reader and writer.
// The format is RMM's logging_resource_adaptor output, so RMM users' logs replay here and our traces
// replay in RMM's replay benchmark:
//   Thread,Time,Action,Pointer,Size,Stream
//   140202,13:45:01.123456,allocate,0x7f5e40000000,1048576,0x0
//   140202,13:45:01.123460,free,0x7f5e40000000,1048576,0x0
//   140202,13:45:01.123470,allocate failure,(nil),99999999999,0x0
// Pointers and streams are hex ("0x..."), decimal, or "(nil)"; Time is kept as text (RMM writes
// HH:MM:SS.ffffff and its parser ignores it). A header line is required.
// Thread-safety: none (values).
//
// Example:
//   absl::StatusOr<Trace> t = ReadTraceFile("run.csv");
//   for (const TraceEvent& e : t->events) ...
#ifndef BUCKETALLOC_HARNESS_REPLAY_TRACE_H_
#define BUCKETALLOC_HARNESS_REPLAY_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::harness {

enum class TraceAction : std::uint8_t { kAllocate, kFree, kAllocateFailure };

struct TraceEvent {
  std::uint64_t thread = 0;
  std::string time;  // as written (RMM: HH:MM:SS.ffffff); not used by the replay
  TraceAction action = TraceAction::kAllocate;
  std::uint64_t pointer = 0;  // 0 for a failure
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  int line = 0;  // 1-based line in the file it came from (0 when generated)
};

// The stream of long requests' events in a generated serving trace (generate serving
// --tenant-split, ServingOptions::tenant_split_tokens in harness/workload/serving.h writes it; the
// bucketalloc policy routes it to a tenant of its own).
inline constexpr std::uint64_t kLongRequestStream = 2;

struct Trace {
  std::vector<TraceEvent> events;
};

// Parses RMM CSV text. Errors (InvalidArgument) name the line number, the field and what is
// accepted; `source` names the file in messages.
absl::StatusOr<Trace> ParseTrace(absl::string_view text, absl::string_view source = "trace");
absl::StatusOr<Trace> ReadTraceFile(const std::string& path);

// The largest Size a trace event may have: the largest request any replayed allocator accepts
// (bucketalloc's kMaxRequestBytes). Larger sizes are a line error for every policy, at reading and
// again before a replay of a generated trace; OK or InvalidArgument naming the line.
absl::Status CheckEventSize(const TraceEvent& e, absl::string_view source);
// CheckEventSize of every event (a generated or imported trace was never read from CSV).
absl::Status CheckTrace(const Trace& trace, absl::string_view source = "trace");

// `text` as it may appear in an error message: C-escaped (a binary line prints as \x.. escapes),
// and cut to `max_bytes` of input with "..." when longer.
std::string Excerpt(absl::string_view text, std::size_t max_bytes = 80);

// Reads a whole file (gzip-decompressed when `path` ends in .gz); NotFound names `path` and `what`
// it was meant to be, InvalidArgument a directory.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what);

// Writes `text` to `path` (created or truncated) and closes it: every failure, of the open, a write,
// the flush or the close (a full disk, /dev/full), is an error naming `path`, `what` it was and why.
absl::Status WriteWholeFile(const std::string& path, absl::string_view text, absl::string_view what);

// Writes RMM CSV (with the header).
std::string FormatTrace(const Trace& trace);
absl::Status WriteTraceFile(const Trace& trace, const std::string& path);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_TRACE_H_
