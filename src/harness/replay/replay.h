// src/harness/replay/replay.h — replays an allocation trace against an allocator policy on the simulated
// device (or a GPU) and measures what it costs in bytes, failures, nanoseconds and backend calls,
// and finds the smallest card that serves it (layer L5).
//
// The policies (bucketalloc[:CONF], pytorch-policy, pytorch-expandable[:CONF], nocache) are named by
// harness/replay/policies.h; each runs on a device of exactly `capacity` bytes (simulated: unbacked, addresses and no
// memory), so a request that the policy cannot place fails as it would on a card of that size.
//
// The replay is sequential in file order (RMM's logs are in timestamp order even for several
// threads). A free of a pointer whose allocation failed in the replay is skipped; "allocate
// failure" lines (failures of the logged run) are skipped. Every driver call is priced by a cost
// model (harness/replay/driver_costs.h: published figures by call and size) and attributed by a
// DriverMeter (harness/replay/driver_meter.h) to the request that waited for it or to the
// background, and to the warmup or the steady state (ReplayResult::driver_time), so an allocator
// cannot win on memory by hiding driver calls.
//
// For compare's report, a replay can also record (ReplayOptions::record_timeline) the trace's live
// bytes and the allocator's reserved bytes after every event, downsampled to a bounded number of
// points, and the allocator's free blocks by size at the moment reserved bytes peaked.
//
// Thread-safety: none; one replay at a time per allocator.
#ifndef BUCKETALLOC_HARNESS_REPLAY_REPLAY_H_
#define BUCKETALLOC_HARNESS_REPLAY_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/timeline.h"
#include "harness/replay/driver_costs.h"
#include "harness/replay/driver_meter.h"
#include "harness/replay/memory_breakdown.h"
#include "harness/replay/replay_allocator.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {

struct ReplayOptions {
  std::string allocator = "bucketalloc";
  std::size_t capacity = 0;  // bytes, > 0
  ReplayDeviceKind device = ReplayDeviceKind::kSim;
  int repeat = 1;  // rounds of the trace on the same allocator
  CostModel cost;  // the driver calls' prices (a100-published unless chosen)
  // Records ReplayResult::timeline (at most `timeline_points` points) and peak_fragmentation. Off
  // by default: it reads the reserved bytes after every event, and the histogram costs a second
  // replay, which min-capacity's probes need not pay.
  bool record_timeline = false;
  std::size_t timeline_points = 2000;  // >= 1
  // Stops the replay at the first OOM (min-capacity's probes: whether a capacity serves the trace
  // is all they ask); an OOM a tenant's own cap refused does not stop it. Not with record_timeline.
  bool stop_at_first_oom = false;
  // > 0: ReplayResult::samples, the memory timeline (bucketalloc/timeline.h) at the trace's time
  // (its Time column: HH:MM:SS.ffffff, days added where it wraps past midnight, or microseconds;
  // from its first event): a sample at each multiple of the interval, with the state after the
  // last event at or before it, and one at the last event; round k of a repeat starts one interval
  // after round k - 1 ends. At most kMaxTimelineSamples: an interval that would give more over the
  // trace's span is refused before the replay starts.
  double sample_interval_s = 0.0;
};

// One point of a timeline: the events [event, event + Timeline::bucket_events) summarized by their
// maxima (so no peak is lost however long the trace), and the trough of live bytes.
struct TimelinePoint {
  std::uint64_t event = 0;  // the first event of the bucket (index over all rounds)
  // The most bytes the replay held for the trace after any event of the bucket: its blocks that
  // were served (an OOM's are not), earlier rounds' unfreed blocks included.
  std::size_t live_bytes = 0;
  std::size_t live_min_bytes = 0;  // the fewest
  std::size_t reserved_bytes = 0;  // the most bytes the allocator held after any event of the bucket
  std::uint64_t ooms = 0;          // failed allocations in the bucket
};

// Live and reserved bytes over the replay. Every event of the trace counts (frees of failed
// allocations and the logged run's failures too), so the x axis is the trace's event index; round
// k's event i is k * events_per_round + i.
struct Timeline {
  std::uint64_t events = 0;         // events replayed, all rounds
  std::uint64_t bucket_events = 1;  // events per point: ceil(events / timeline_points)
  std::vector<TimelinePoint> points;
};

// Which moment of a replay a PeakFragmentation shows.
enum class BreakdownMoment : std::uint8_t {
  kPeakReserved,   // the first event after which reserved bytes are at their peak
  kDecidingEvent,  // the event that decides a min capacity: the first that fails one step (2 MiB) below it
};
// "peak_reserved" or "deciding_event" (the JSON's "moment").
absl::string_view BreakdownMomentName(BreakdownMoment moment);

// The allocator's free blocks and where its reserved bytes are at one moment of a replay (`moment`):
// for compare's timeline, after the first event at which the reserved bytes (read after each event)
// reached their highest value; for a min capacity, after its deciding event (MeasurePeakAtMin).
// Found by a second replay that stops there, because snapshotting at every new peak would walk the
// free lists once per backend growth; replays are deterministic, and the second one checks that it
// reached the same reserved bytes at that event.

struct PeakFragmentation {
  BreakdownMoment moment = BreakdownMoment::kPeakReserved;
  std::uint64_t event = 0;        // index over all rounds
  std::size_t live_bytes = 0;     // the bytes the replay held for the trace then (TimelinePoint::live_bytes)
  PoolFragmentation free_blocks;  // ReplayAllocator::Fragmentation() then
  MemoryBreakdown breakdown;      // ReplayAllocator::Breakdown() then: where the reserved bytes are
};

// What a replay measured (the JSON keys of docs/harness.md).
struct ReplayResult {
  std::string allocator;
  std::string device = "sim";  // "sim" or "cuda"
  std::size_t capacity = 0;
  std::uint64_t allocations = 0;    // allocate events replayed (all rounds)
  std::size_t peak_live_bytes = 0;  // the most bytes the trace holds at once: no allocator can do with less
  std::size_t peak_reserved_bytes = 0;
  double reserved_over_live = 0.0;
  std::uint64_t ooms = 0;
  // The OOMs by cause, which add up to `ooms`: the card's (capacity: live + request > capacity, no
  // allocator could have served it; fragmentation: the others), and those a tenant's own cap
  // refused (tenant_cap_ooms, below).
  std::uint64_t capacity_ooms = 0;
  std::uint64_t fragmentation_ooms = 0;
  // The OOMs by the trace's stream (JSON "ooms_by_stream", when any stream other than 0 failed):
  // with generate serving --tenant-split, stream 2's are long requests', stream 0's the rest.
  std::map<std::uint64_t, std::uint64_t> ooms_by_stream;
  // bucketalloc with tenants: each tenant's figures at the end (peaks of the last round; JSON
  // "tenants"), the default tenant first.
  std::vector<TenantStats> tenants;
  // Of the OOMs, those a tenant's own cap refused (a bigger card would not serve them).
  std::uint64_t tenant_cap_ooms = 0;
  // The OOMs a bigger card could serve: what min-capacity drives to 0.
  std::uint64_t card_ooms() const { return ooms - tenant_cap_ooms; }
  // The first of them (index over all rounds; not in the JSON): with stop_at_first_oom, where the
  // replay stopped.
  std::optional<std::uint64_t> first_card_oom_event;
  double p50_ns = 0.0;  // per operation (allocate or free)
  double p99_ns = 0.0;
  // Backend allocations + frees, and the virtual-memory driver calls: creates (failed ones too),
  // releases, maps (one per handle), access grants, unmaps, address reserves and releases.
  std::uint64_t backend_calls = 0;
  // The same calls by kind (the JSON's "backend_call_counts"): which calls a policy pays for.
  BackendCounters backend_counters;
  std::uint64_t granules_stitched = 0;  // granules of free blocks moved into stitched ranges (vmm)
  // The driver calls priced by the cost model, and who waited for them (JSON "driver_time");
  // simulated_backend_ms is its total_ms.
  DriverTime driver_time;
  double simulated_backend_ms = 0.0;
  std::vector<std::size_t> per_round_peak_reserved_bytes;
  // The bytes the trace still held at the end of each round (what it never frees carries over).
  std::vector<std::size_t> per_round_end_live_bytes;
  // "stable"; "rising" (peak reserved still grows in the second half of the rounds, with two rounds
  // in the second, or the bytes held at the end of a round grow round over round: a leak);
  // "single round".
  std::string verdict;
  // With ReplayOptions::record_timeline only; not part of ToJson() (compare's JSON has them under
  // "timeline" and "peak_fragmentation"). No peak_fragmentation when nothing was ever reserved.
  Timeline timeline;
  std::optional<PeakFragmentation> peak_fragmentation;
  // With ReplayOptions::sample_interval_s only; not part of ToJson() (bucketalloc-bench replay
  // --timeline writes them as JSON lines).
  std::vector<TimelineSample> samples;
  std::string ToJson() const;
};

// The peak of bytes held at once by the trace's allocations (failures of the logged run excluded),
// over `rounds` rounds of it: what one round never frees stays held through the later ones.
std::size_t PeakLiveBytes(const Trace& trace, int rounds = 1);

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options);

// The most samples a replay's timeline may have (ReplayOptions::sample_interval_s): a replay whose
// interval would give more is refused before it starts.
inline constexpr std::size_t kMaxTimelineSamples = 1000000;

// The seconds from the trace's first event to its last (its Time column, as the timeline reads
// it); InvalidArgument naming the line of a time it cannot read.
absl::StatusOr<double> TraceDuration(const Trace& trace);

// The smallest capacity (2 MiB resolution) at which `allocator` serves the trace with zero OOMs
// (with tenants: zero OOMs but those the tenants' own caps refuse, ReplayResult::card_ooms), found
// by bisection, then a grid of five probes below the answer and a bisection below the
// smallest that passes (serving is not always monotone in capacity; see docs/harness.md).
// `progress` (may be null) receives one line per probe.
struct MinCapacityResult {
  std::size_t min_capacity_bytes = 0;
  double min_capacity_over_live = 0.0;
  // From the trace's meta file (harness/workload/serving.h) when it has one: the workload's true peak need
  // (no layout rounding), so min_capacity_over_true_need shows the layout's and the allocator's cost.
  std::optional<std::size_t> true_need_bytes;
  ReplayResult at_min;  // the replay at that capacity
  // Where the bytes are at that capacity at the moment that decides it (MeasurePeakAtMin; the JSON's
  // "peak_at_min": event, moment, live_bytes, breakdown). Not measured by the search itself: two
  // replays more.
  std::optional<PeakFragmentation> peak_at_min;
  double min_capacity_over_true_need() const;  // 0 without a true need
  std::string ToJson() const;                  // true_need_bytes and min_capacity_over_true_need only when known
};
absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              void (*progress)(const std::string& line) = nullptr);

// The same search, given what is known already (tune's bounds, harness/planning/tuner.h): a
// capacity that fails, or one expected to serve the trace (probed first: the bisection starts
// between the two, and doubling goes on from a `passing` that fails), and a deadline checked before
// every probe.
struct MinCapacitySearch {
  std::size_t failing = 0;  // a capacity known not to serve the trace; 0: just under its peak of live bytes
  std::size_t passing = 0;  // a capacity expected to serve it; 0: the peak of live bytes, doubled until it does
  // Asked before each probe; true ends the search with DeadlineExceeded.
  std::function<bool()> expired;
  std::function<void(const std::string& line)> progress;  // one line per probe; may be empty
};
absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              const MinCapacitySearch& search);

// Sets m->peak_at_min: where the bytes of `allocator` are at m->min_capacity_bytes at the moment that
// decides that capacity (compare and min-capacity report it for every allocator): right after the
// event that is the first to fail one step (2 MiB) below it (BreakdownMoment::kDecidingEvent; one
// replay below finds it, one at the min capacity stops there). Where no step below fails (the
// smallest card; the rest refused by tenants' caps), after the first event at which reserved bytes
// peak (kPeakReserved). The first moment the reserved bytes peak is not it: stitching's cap fills
// long before it binds.
absl::Status MeasurePeakAtMin(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                              MinCapacityResult* m);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_REPLAY_H_
