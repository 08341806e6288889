// src/harness/operations/doctor_input.cc — what `bucketalloc-bench doctor` reads, made a timeline
// (harness/operations/doctor.h): a timeline as it is, a snapshot's history or a trace replayed with samples,
// a snapshot without history as the one moment its segments show.
#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bucketalloc/units.h"
#include "harness/operations/doctor.h"
#include "harness/replay/importers.h"
#include "harness/replay/replay.h"
#include "harness/replay/snapshot_import.h"
#include "harness/replay/snapshot_pickle.h"
#include "harness/replay/trace.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";
// A replay's sampling interval by default: its duration (all rounds) over this many samples, and
// at least kShortestInterval seconds.
constexpr double kSamplesPerReplay = 500.0;
constexpr double kShortestInterval = 1e-6;
constexpr char kExpected[] =
    "expected a file: a timeline (JSON lines, one sample per line, as BUCKETALLOC_TIMELINE and replay --timeline "
    "write them), a snapshot (torch.cuda.memory._dump_snapshot's pickle, or bucketalloc_torch.snapshot() as JSON) or "
    "a trace (RMM CSV)";

absl::Status NeedsCapacity(absl::string_view kind) {
  return absl::InvalidArgumentError(absl::StrCat("doctor: a ", kind,
                                                 " needs --capacity SIZE (the card: to replay it on, and what its "
                                                 "memory is a fraction of; e.g. 80GiB)"));
}

absl::StatusOr<DoctorInput> Replayed(const Trace& trace, const DoctorOptions& o, const char* kind) {
  if (o.capacity == 0) return NeedsCapacity(kind);
  if (trace.events.empty()) return absl::InvalidArgumentError(absl::StrCat("doctor: the ", kind, " has no events"));
  ReplayOptions r;
  r.allocator = o.allocator;
  r.capacity = o.capacity;
  r.repeat = o.repeat;
  r.sample_interval_s = o.interval_s;
  if (r.sample_interval_s <= 0) {
    absl::StatusOr<double> duration = TraceDuration(trace);
    if (!duration.ok()) return duration.status();
    r.sample_interval_s = std::max(*duration * o.repeat / kSamplesPerReplay, kShortestInterval);
  }
  absl::StatusOr<ReplayResult> result = Replay(trace, r);
  if (!result.ok()) return result.status();
  DoctorInput in;
  in.kind = kind;
  in.samples = std::move(result->samples);
  for (TimelineSample& sample : in.samples) sample.device = o.device;  // a snapshot's device
  in.per_round_peak_reserved = std::move(result->per_round_peak_reserved_bytes);
  in.per_round_end_live = std::move(result->per_round_end_live_bytes);
  in.rounds_device = o.device;
  return in;
}

// A snapshot's history as a trace (alloc -> allocate, free_completed -> free of a live block, as
// tools/import_torch_snapshot.py maps it), or its segments as one sample when it has none.
absl::StatusOr<DoctorInput> FromSnapshot(absl::StatusOr<SnapshotContents> c, const DoctorOptions& o) {
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("doctor: ", c.status().message()));
  if (c->history.has_value()) {
    absl::StatusOr<DoctorInput> in = Replayed(*c->history, o, "snapshot");
    if (in.ok()) in->warnings.insert(in->warnings.end(), c->warnings.begin(), c->warnings.end());
    return in;
  }
  if (!c->has_segments) {
    return absl::InvalidArgumentError("doctor: the snapshot has neither history nor a \"segments\" list");
  }
  if (o.capacity == 0) return NeedsCapacity("snapshot without history");
  const SnapshotSegmentTotals& t = c->segments;
  TimelineSample s;
  s.device = o.device;
  s.reserved_bytes = t.reserved_bytes;
  s.allocated_bytes = t.allocated_bytes;
  s.active_bytes = t.active_bytes;
  s.requested_bytes = t.requested_bytes;
  s.largest_free_block_bytes = t.largest_free_block_bytes;
  s.cached_bytes = std::max<std::int64_t>(0, s.reserved_bytes - s.active_bytes);
  s.capacity_bytes = static_cast<std::int64_t>(o.capacity);
  if (s.reserved_bytes > s.capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("doctor: the snapshot's segments of device ", o.device, " hold ",
                                                   FormatBytes(static_cast<std::size_t>(s.reserved_bytes)),
                                                   ", more than --capacity ", FormatBytes(o.capacity),
                                                   "; accepted: the card's memory (or its cap), at least that"));
  }
  s.external_fragmentation =
      s.cached_bytes > 0 ? 1.0 - static_cast<double>(s.largest_free_block_bytes) / static_cast<double>(s.cached_bytes)
                         : 0.0;
  DoctorInput in;
  in.kind = "snapshot";
  in.samples.push_back(s);
  return in;
}

SnapshotReadOptions SnapshotOptions(const DoctorOptions& o) {
  SnapshotReadOptions r;
  r.device = o.device;
  r.segments_device = o.device;
  return r;
}

// `in`, or its error naming `path` (a snapshot's or a replay's own errors do not).
absl::StatusOr<DoctorInput> NamingThePath(absl::StatusOr<DoctorInput> in, const std::string& path) {
  if (in.ok() || absl::StrContains(in.status().message(), path)) return in;
  return absl::Status(in.status().code(),
                      absl::StrCat("doctor: ", path, ": ", absl::StripPrefix(in.status().message(), "doctor: ")));
}

}  // namespace

absl::StatusOr<DoctorInput> ReadDoctorInput(const std::string& path, const DoctorOptions& o) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("doctor: ", path, " is a directory; ", kExpected));
  }
  absl::StatusOr<std::string> read = ReadTextFile(path, "the doctor's input");
  if (!read.ok()) return absl::Status(read.status().code(), absl::StrCat("doctor: ", read.status().message()));
  if (LooksLikePickle(*read)) {  // torch.cuda.memory._dump_snapshot's
    absl::StatusOr<PlainPickle> p = PlainPickle::Parse(std::move(*read), path);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("doctor: ", p.status().message()));
    return NamingThePath(FromSnapshot(ReadSnapshot(*p, kExpected, SnapshotOptions(o)), o), path);
  }
  absl::string_view text = *read;
  if (absl::StartsWith(text, kUtf8Bom)) text.remove_prefix(kUtf8Bom.size());  // an editor's byte-order mark
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("doctor: ", path, " is empty; ", kExpected));
  }
  if (text[first] == '{') {
    // A snapshot is one JSON object; a timeline one object per line.
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("segments")) {
      return NamingThePath(FromSnapshot(ReadSnapshot(j, path, SnapshotOptions(o)), o), path);
    }
    std::vector<std::string> warnings;  // damaged lines, skipped
    absl::StatusOr<std::vector<TimelineSample>> samples = ReadTimeline(text, path, &warnings);
    if (!samples.ok()) return samples.status();
    if (samples->empty()) {
      // The reader leaves out a last line that is cut off: read as a whole line, it says why.
      absl::StatusOr<std::vector<TimelineSample>> whole = ReadTimeline(absl::StrCat(text, "\n"), path);
      return absl::InvalidArgumentError(absl::StrCat(
          "doctor: ", path, " holds no timeline sample",
          whole.ok() ? "" : absl::StrCat(" (its only line is cut off or not a sample: ", whole.status().message(), ")"),
          "; ", kExpected));
    }
    for (std::size_t i = 0; i < samples->size(); ++i) {
      const TimelineSample& s = (*samples)[i];
      if (s.device < 0 || s.device > kMaxDoctorDevice) {
        return absl::InvalidArgumentError(absl::StrCat("doctor: ", path, ": sample ", i + 1, " (time_s ", s.time_s,
                                                       ") is of device ", s.device, "; accepted: devices 0 to ",
                                                       kMaxDoctorDevice, " (no bucketalloc process has more)"));
      }
    }
    DoctorInput in;
    in.kind = "timeline";
    in.samples = std::move(*samples);
    in.warnings = std::move(warnings);
    return in;
  }
  absl::StatusOr<Trace> trace = ParseTrace(text, path);
  if (!trace.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("doctor: ", path,
                                                   " is neither a timeline (JSON lines), a snapshot (JSON) nor a "
                                                   "trace (RMM CSV): ",
                                                   trace.status().message()));
  }
  return NamingThePath(Replayed(*trace, o, "trace"), path);
}

}  // namespace bucketalloc::harness
