// src/harness/planning/tuner.h — the settings that need the least memory for one workload: `bucketalloc-bench
// tune` (layer L5, the benchmark harness; docs/harness.md, "Tune").
//
// Owns: `TraceShape` (what a trace's sizes say: its recurring large sizes and their common quantum),
// `SplitTrace` (the part tuned on and the part held out), and `Tune`, the search.
//
// The search, on the tuning part (the first half of the trace, or all of it with a separate
// validation trace):
//   1. Candidates: bucketalloc's default and one change of it each (stitching; tiers of the
//      trace's recurring large sizes, those that divide one another and all of them; max_split_size_mb at the large
//      sizes' quantiles; roundup_power2_divisions 2, 4, 8; large_segment_size_mb 2 and 64; garbage_collection_threshold
//      0.8), and PyTorch's allocator as the harness models it (pytorch-policy with max_split_size_mb
//      or roundup_power2_divisions; pytorch-expandable).
//   2. Each candidate is first replayed once with no cap (a screen): its peak reserved bytes bound
//      its min capacity from above (a capacity it never reaches never changes what it does), and its
//      backend time then is taken as the least it needs (a tighter card only adds release-and-retry
//      calls). Candidates go on from the lowest bound.
//   3. Pruning: a candidate that fails at 2 MiB under the best min capacity found so far, and whose
//      screen already costs at least the backend time of a measured point needing no more memory,
//      is dominated on both axes and stops there (one probe). The others get a full min-capacity
//      search (MinCapacity, within their bounds).
//   4. Combination: the changes that beat the default are combined, greedily, best first: each
//      change is added to the best combination so far and kept when it needs less memory (a
//      combination failing 2 MiB under the best stops after that one probe).
//   5. Validation: the best few of each family and the baselines (bucketalloc's default and
//      backend:vmm, pytorch-policy, pytorch-expandable) are measured on the held-out part. The
//      recommendation is the best on the tuning part that is, on the held-out part, no worse than
//      every baseline of its family (bucketalloc: the default and stitching, within 0.002 x that
//      part's peak live bytes; PyTorch: pytorch-policy's default); failing that, the best baseline
//      there.
// The front: the measured points not dominated in (min capacity, driver time on requests' path at
// it, synchronizations at it).
// Every figure is from the simulated device (deterministic): the same trace and options give the same
// answer, whatever the number of threads (candidates are measured two at a time against the best
// before them; more threads speed the screens and the held-out check) — without a budget, whose
// deadline falls wherever the clock puts it.
// Thread-safety: Tune runs replays on `jobs` threads of its own; one Tune at a time per caller.
#ifndef BUCKETALLOC_HARNESS_PLANNING_TUNER_H_
#define BUCKETALLOC_HARNESS_PLANNING_TUNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "harness/replay/replay.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {

// What a trace's sizes say about the settings worth trying.
struct TraceShape {
  std::uint64_t allocations = 0;
  std::uint64_t large_allocations = 0;  // above 1 MiB (bucketalloc's and PyTorch's small pool limit)
  std::size_t peak_live_bytes = 0;
  // The recurring large sizes (each at least 1% of the large allocations and 8 of them, at most 32
  // sizes, together at least half of the large allocations), ascending: the tiers a tiered KV
  // layout allocates; empty when the large sizes do not recur so (a growth or paged layout).
  std::vector<std::size_t> recurring_sizes;
  double recurring_share = 0.0;  // of the large allocations
  // Of them, those that divide one another, from the most frequent on (each a multiple of the
  // smallest taken, or a divisor of it), ascending: a KV cache's tiers (tokens x bytes per token,
  // the tokens doubling), without the recurring activations of other shapes; and their greatest
  // common divisor, the quantum (the smallest tier's bytes; 0 without them).
  std::vector<std::size_t> tier_sizes;
  std::size_t quantum_bytes = 0;
  // The large allocations' sizes at the 50th, 90th and 99th percentiles (max_split_size_mb's
  // candidates); zeros without large allocations.
  std::size_t large_p50 = 0, large_p90 = 0, large_p99 = 0;
};
TraceShape ReadShape(const Trace& trace);

// The part tuned on (events [0, n/2)) and the part held out: the blocks live at the midpoint
// allocated again, in their order, then events [n/2, n). Each part replays on its own.
struct TraceParts {
  Trace tune;
  Trace held_out;
};
TraceParts SplitTrace(const Trace& trace);

// The longest search a budget may allow (--budget-s): over 115 days.
inline constexpr double kMaxTuneBudgetSeconds = 1e7;

struct TuneOptions {
  // The card: OOMs of the recommendations and defaults at it are reported (0: not reported).
  std::size_t capacity = 0;
  // Held-out data: another recording of the same service (the whole trace is then tuned on); nullopt:
  // the trace's second half.
  std::optional<Trace> validate;
  std::string validate_name;  // named in the report ("second half" without one)
  double budget_s = 0.0;      // > 0: no new probe starts after this many seconds (at most kMaxTuneBudgetSeconds)
  int jobs = 0;               // threads for replays; 0: the machine's cores
  CostModel cost;
  // Each finished candidate (and phase): done and total so far, and a line saying what finished.
  std::function<void(int done, int total, const std::string& line)> progress;
};

// One allocator's figures on one part: its min capacity, and its backend calls and driver time
// there under the cost profile (backend_ms: the total; the front weighs driver_time's request path
// and synchronizations against memory).
struct TuneFigures {
  std::size_t min_capacity_bytes = 0;
  double over_live = 0.0;  // min capacity / the part's peak of live bytes
  std::uint64_t backend_calls = 0;
  double backend_ms = 0.0;
  DriverTime driver_time;  // who waited for it, and the synchronizations
};

struct TunePoint {
  std::string allocator;  // as replay --allocator takes it
  bool pytorch = false;   // PyTorch's allocator (pytorch-policy[:CONF], pytorch-expandable)
  std::string policy;     // the policy it configures: bucketalloc, pytorch-policy, pytorch-expandable
  std::string change;     // what it changes from its family's default
  // The screen: peak reserved with no cap (the upper bound), the backend time and who waited then.
  std::size_t screen_peak_reserved_bytes = 0;
  double screen_backend_ms = 0.0;
  DriverTime screen_driver_time;
  // "measured", "pruned" (fails at `fails_at`, 2 MiB under the family's best, and its screen costs
  // at least a measured point's request-path time and synchronizations, or is a combination no
  // better than the one before it),
  // "budget" (the budget ran out first) or "failed" (its replay failed: `error`).
  std::string state;
  std::size_t fails_at = 0;
  std::string error;
  std::optional<TuneFigures> tune;      // measured
  std::optional<TuneFigures> held_out;  // validated
  bool on_front = false;
};

// "81.83 GiB (1.040 x live), 9162 calls, 351.6 ms", or "-" without figures.
std::string TuneFiguresText(const std::optional<TuneFigures>& f);
// A point on the tuning part: its figures, or what its state says instead (the capacity it failed
// at when pruned, the budget, its error).
std::string TunePointText(const TunePoint& p);

struct TuneChoice {
  int point = -1;          // into TuneResult::points
  int default_point = -1;  // the family's default
  std::string conf;        // the environment's text: BUCKETALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF ("" = defaults)
  std::string why;
  // At TuneOptions::capacity, the whole trace: OOMs of the choice and of the default (fragmentation's in brackets).
  std::optional<std::uint64_t> ooms, fragmentation_ooms, default_ooms, default_fragmentation_ooms;
};

struct TuneResult {
  TraceShape shape;  // of the whole trace
  std::size_t tune_peak_live_bytes = 0, held_out_peak_live_bytes = 0;
  std::string held_out_name;
  bool held_out_is_second_half = true;  // false: TuneOptions::validate (the whole trace tuned on)
  std::vector<TunePoint> points;
  TuneChoice bucketalloc, pytorch;
  std::size_t capacity = 0;
  bool budget_ran_out = false;
  double seconds = 0.0;
  int replays = 0;  // every replay run, probes and screens
  std::string ToJson() const;
  // A self-contained page (harness/reports/page.h, no script): the front as a plot of min capacity
  // against backend time on the tuning part, every measured point with its allocator in a tooltip,
  // the two recommendations marked; the recommended settings as text to copy; the table of points.
  std::string ToHtml(const std::string& recording) const;
};

// InvalidArgument for a trace without allocations or without large ones (nothing to tune), or
// held-out data of that kind; DeadlineExceeded when the budget runs out before both families'
// defaults are measured (it names the time it had taken).
absl::StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_PLANNING_TUNER_H_
