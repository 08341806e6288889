// src/harness/operations/doctor.h — `bucketalloc-bench doctor`: the operators' runbook as a classifier of a
// memory timeline (docs/operations.md, "The doctor").
//
// Owns: `Diagnose`, which reads one device's timeline (bucketalloc/timeline.h: written by a process
// with BUCKETALLOC_TIMELINE, or by a replay of a trace) the way the runbooks read the used-memory
// curve, and returns verdicts, each with its evidence (the numbers and the time span they come from)
// and the runbook's first lever:
//   - full_at_start: near the cap right after start-up (weights, parallelism, reserved buffers),
//     and short of memory at some point (an OOM or a retry); or OOMs the device refused under the
//     cap (memory used outside this allocator);
//   - climbs_capacity: reserved memory climbs and does not come back down while live memory does
//     fall back (concurrency or caches accumulating per request);
//   - leak: live memory itself keeps rising and never falls;
//   - spike_long_request: stable for a long time, then a sudden jump of live memory;
//   - fragmentation: a jump of reserved memory that live memory does not explain, or OOMs while
//     enough was free (fragmentation OOMs), or a large free cache whose largest block is small;
//   - cache_held: much of the reserved memory is cache held but unused, for long, while memory was
//     short (near the cap, an OOM or a retry); or OOMs while memory was held for stream events;
//   - healthy: none of these;
//   - inconsistent: samples that contradict themselves (live, active, cached or requested memory
//     above the reserved memory that holds it; reserved memory above a cap that was never as high),
//     which no bucketalloc timeline writes: not a timeline, or a corrupted one. No other verdict
//     for that device: its figures cannot be trusted.
// Capacity OOMs join the first verdict found that is not fragmentation or cache_held, or are a
// climbs_capacity verdict of their own. OOMs are counted from the lines' totals.
// Every threshold (fractions of the cap, of the run, counts of windows and rounds) is a field of
// `DoctorThresholds`, documented there (docs/operations.md states them in words). A repeat of a trace adds the peak
// over rounds: rising to the end is a leak, rising then settling is fragmentation reaching its steady state (healthy).
// Thread-safety: pure functions.
//
// Example:
//   absl::StatusOr<std::vector<TimelineSample>> t = ReadTimeline(text, path);
//   std::vector<Verdict> v = DiagnoseAll(*t);   // every device's; Diagnose(*t, 0) for one
//   std::string json = VerdictsToJson(v);   // {"verdicts": [{"verdict", "evidence", "lever", ...}]}
#ifndef BUCKETALLOC_HARNESS_OPERATIONS_DOCTOR_H_
#define BUCKETALLOC_HARNESS_OPERATIONS_DOCTOR_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/timeline.h"

namespace bucketalloc::harness {

// What the doctor finds on a device (docs/runbook.md: a section each). kInconsistent: samples that
// contradict themselves (see the top of this file).
enum class Finding {
  kFullAtStart,
  kClimbsCapacity,
  kLeak,
  kSpikeLongRequest,
  kFragmentation,
  kCacheHeld,
  kTenantCap,
  kOverCap,
  kHealthy,
  kInconsistent,
};
// A finding's name in the text, the JSON and the page ("full_at_start", ...).
absl::string_view FindingName(Finding finding);

struct Verdict {
  Finding verdict = Finding::kHealthy;
  std::string evidence;  // the numbers and the span they come from
  std::string lever;     // the runbook's first lever
  double from_s = 0.0;   // the span of the timeline the evidence comes from
  double to_s = 0.0;
  int device = 0;
};

// Every threshold of the doctor's decisions, in one place (docs/operations.md, "The doctor", states
// them in words). Fractions of the cap are of the peak of reserved memory when the timeline has no cap;
// "the run" is the device's timeline from its first sample to its last.
struct DoctorThresholds {
  // full_at_start.
  double full = 0.90;            // of the cap: "near the limit" (also what makes a held cache short of memory)
  double start_fraction = 0.10;  // of the run: "right after start-up"
  // The curve's patterns (leak, climbs_capacity, a jump) read the run's body, in windows of equal time.
  double body_end = 0.98;  // of the run: where its body ends; what follows (teardown, a replay's end) is left out
  int curve_samples = 3;   // samples in the body, at least, to read a curve
  int windows = 10;        // windows of the body
  // leak: the troughs of live memory (each window's least, the first window left out) rise.
  double climb = 0.10;             // of the cap: a rise that counts (a leak's, a climb's, live memory falling back)
  double leak_noise = 0.005;       // of the cap: a change of the troughs beyond noise (rising or falling)
  int leak_troughs = 4;            // windows with a trough, at least
  double leak_rising = 0.5;        // of the troughs' steps, at least: rising
  double leak_falling = 0.2;       // of the troughs' steps, at most: falling
  double leak_largest_step = 0.5;  // of the total rise, at most: one step (a larger one is a jump that stays)
  // climbs_capacity: reserved's peaks rise from the first part of the body to the last, in steps.
  int climb_parts = 3;       // the body in this many parts: the first part's peak against the last's
  double climb_step = 0.02;  // of the cap: a window's peak above every earlier one by this much is a step
  int climb_steps = 3;       // steps, at least (one step is a jump)
  double settle = 0.90;      // of its peak: reserved "does not come back down" while it stays above
  // spike_long_request or fragmentation: a sudden jump of reserved memory after a plateau.
  double jump = 0.15;          // of the cap: a sudden jump
  double jump_span = 0.05;     // of the run: how sudden
  double plateau = 0.30;       // of the run: how long stable before it
  double plateau_band = 0.05;  // of the cap: how stable
  double spike_live = 0.70;    // of the jump, at least: live memory's rise that makes it a spike
  // cache_held.
  double cache_share = 0.30;  // of reserved: cache held but unused
  double cache_cap = 0.10;    // of the cap, at least
  double cache_time = 0.50;   // of the run: for how long
  // A repeat's rounds (DiagnoseRounds).
  int settle_rounds = 3;     // rounds, at least, to tell fragmentation settling from still rising
  double round_rise = 0.01;  // of the highest peak (less what earlier rounds left): a rise that counts
};

// The highest device index the doctor reads: 2^16 devices, as many as `--snapshot-device` takes.
// The library writes the indices of the devices its backend counts (at most 64 simulated ones; CUDA's
// count from the driver); a higher one is not a bucketalloc timeline's.
inline constexpr int kMaxDoctorDevice = 65535;

// The verdicts for `device` in `samples` (those of other devices are skipped), healthy when no
// pattern shows; an empty timeline for the device is one healthy verdict saying so. Linear in
// the samples.
std::vector<Verdict> Diagnose(absl::Span<const TimelineSample> samples, int device,
                              const DoctorThresholds& t = DoctorThresholds{});
// The verdicts of every device in `samples`, the devices in the order they first appear (none for
// no samples). Linear in the samples, however many devices: they are grouped in one pass.
std::vector<Verdict> DiagnoseAll(absl::Span<const TimelineSample> samples,
                                 const DoctorThresholds& t = DoctorThresholds{});

// The rounds of a repeat (ReplayResult's per-round peaks of reserved memory and live bytes at each
// round's end): a leak when what the trace never frees grows round over round (a trace that loads
// its weights at its start loads them each round: the lever says so); with three rounds or more,
// the peaks less what earlier rounds left: still rising in the second half (by more than
// t.round_rise of the highest) is fragmentation that has not settled, rising then settling is its
// steady state (a healthy verdict that says so); nothing with one round.
std::vector<Verdict> DiagnoseRounds(absl::Span<const std::size_t> per_round_peak_reserved,
                                    absl::Span<const std::size_t> per_round_end_live, int device,
                                    const DoctorThresholds& t = DoctorThresholds{});

// What the doctor reads: a timeline (JSON lines), a snapshot (bucketalloc_torch.snapshot() or
// bucketalloc_snapshot_json, saved as JSON: its history replayed, or without one the moment its
// segments show), or a trace (RMM CSV, replayed). A snapshot's history and a trace are replayed by
// `allocator` on a card of `capacity` (required for them), `repeat` times, sampled every
// `interval_s` of the trace's time (0: a 500th of its duration).
struct DoctorOptions {
  std::size_t capacity = 0;
  std::string allocator = "bucketalloc";
  int repeat = 1;
  double interval_s = 0.0;
  int device = 0;  // a snapshot's device
};
struct DoctorInput {
  std::string kind;  // "timeline", "snapshot" or "trace"
  std::vector<TimelineSample> samples;
  // A replay's rounds (ReplayResult's per-round peaks and live bytes at each round's end), of the
  // device `rounds_device` (DoctorOptions::device), which DiagnoseInput reads with DiagnoseRounds;
  // empty for a timeline or a snapshot without history.
  std::vector<std::size_t> per_round_peak_reserved, per_round_end_live;
  int rounds_device = 0;
  // A timeline's lines that are not samples, skipped (ReadTimeline's warnings): for stderr.
  std::vector<std::string> warnings;
};
// Errors name `path` and what is expected: a directory; a file with no sample (empty, a timeline
// whose only line is cut off, a JSON object that is neither a snapshot nor a timeline line); a
// device index above kMaxDoctorDevice; a snapshot whose segments hold more than --capacity. A UTF-8
// byte-order mark at the start is skipped; a timeline's damaged lines are skipped, each named in
// DoctorInput::warnings.
absl::StatusOr<DoctorInput> ReadDoctorInput(const std::string& path, const DoctorOptions& options);

// Every device's verdicts of what the doctor read: its samples' (DiagnoseAll), then its rounds'
// (DiagnoseRounds: a leak over the rounds replaces the device's healthy verdict; a settling peak
// adds to it).
std::vector<Verdict> DiagnoseInput(const DoctorInput& input, const DoctorThresholds& t = DoctorThresholds{});
// How many devices' samples contradict themselves (their verdict is kInconsistent): not a diagnosis.
int InconsistentDevices(absl::Span<const Verdict> verdicts);

// {"verdicts": [{"verdict", "evidence", "lever", "from_s", "to_s", "device"}]}.
std::string VerdictsToJson(absl::Span<const Verdict> verdicts);
// The verdicts as text, one paragraph each.
std::string VerdictsToText(absl::Span<const Verdict> verdicts);
// A self-contained HTML page (harness/reports/page.h): the verdicts first, then each device's curve (reserved,
// allocated, the cap) as inline SVG with the verdicts' spans marked.
std::string DoctorHtml(absl::Span<const Verdict> verdicts, absl::Span<const TimelineSample> samples,
                       const std::string& title);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_OPERATIONS_DOCTOR_H_
