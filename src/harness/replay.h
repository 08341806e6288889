// src/harness/replay.h — replays an allocation trace against an allocator on the simulated device
// and measures what it costs in bytes, failures, nanoseconds and backend calls (layer L5).
//
// Allocators (MakeReplayAllocator's spec):
//   bucketalloc            bucketalloc with its defaults
//   bucketalloc:CONF       bucketalloc with a BUCKETALLOC_CONF string, e.g. bucketalloc:max_split_size_mb:256
//   pytorch-policy         a model of PyTorch's native caching allocator (harness/pytorch_policy.h)
//   nocache                one backend call per request (cudaMalloc/cudaFree), memory rounded to 2 MiB
// Each runs on a simulated device of exactly `capacity` bytes (unbacked: addresses, no memory), so
// a request that the allocator cannot place fails as it would on a card of that size.
//
// The replay is sequential in file order (RMM's logs are in timestamp order even for several
// threads). A free of a pointer whose allocation failed in the replay is skipped; "allocate
// failure" lines (failures of the logged run) are skipped. Backend calls are priced by a cost model
// (CostModel: published figures for cudaMalloc and cudaFree, whose implicit synchronization is part
// of its price), so an allocator cannot win on memory by hiding driver calls.
//
// For compare's report, a replay can also record (ReplayOptions::record_timeline) the trace's live
// bytes and the allocator's reserved bytes after every event, downsampled to a bounded number of
// points, and the allocator's free blocks by size at the moment reserved bytes peaked.
//
// Thread-safety: none; one replay at a time per allocator.
#ifndef BUCKETALLOC_HARNESS_REPLAY_H_
#define BUCKETALLOC_HARNESS_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stats.h"
#include "harness/trace.h"

namespace bucketalloc::harness {

// The price of backend calls in simulated time. Defaults: cudaMalloc ~50 us, cudaFree ~10 us
// (reference/pytorch.md §6: the only published per-call figures found; to be calibrated on a GPU).
struct CostModel {
  double malloc_us = 50.0;
  double free_us = 10.0;
  // One virtual-memory call (create, release, map with its access grant, or unmap of a granule).
  double vmm_call_us = 10.0;
};

class ReplayAllocator {
 public:
  virtual ~ReplayAllocator() = default;
  // Allocates `size` bytes for `stream`; ResourceExhausted when it cannot (an OOM).
  virtual absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) = 0;
  virtual absl::Status Free(void* ptr, std::size_t size) = 0;
  // Reserved from the device now, and the peak since the last ResetPeak().
  virtual std::size_t reserved_bytes() const = 0;
  virtual std::size_t peak_reserved_bytes() const = 0;
  virtual void ResetPeak() = 0;
  virtual BackendCounters backend_counters() const = 0;
  // Physical granules moved from free blocks into stitched ranges (bucketalloc with stitching).
  virtual std::uint64_t granules_stitched() const { return 0; }
  // Returns the allocator's cached free blocks in power-of-two bins, with its reserved, allocated
  // (block sizes of live allocations) and requested bytes. The default, for an allocator that
  // caches nothing, has empty bins and reports reserved bytes as allocated. Not timed: it may walk
  // every free block.
  virtual PoolFragmentation Fragmentation() const;
};

// Where a replay runs: the simulated device (unbacked: addresses, no memory; the default, and what
// every figure in docs/harness.md uses, since it is reproducible) or CUDA device 0 through cudaMalloc
// (bucketalloc with backend:cuda; nocache and pytorch-policy on cudaMalloc), capped at the capacity.
enum class ReplayDeviceKind : std::uint8_t { kSim, kCuda };
absl::StatusOr<ReplayDeviceKind> ParseReplayDeviceKind(absl::string_view name);  // sim, cuda

// The memory under nocache and pytorch-policy: a backend of exactly `capacity` bytes. Allocate
// returns ResourceExhausted past the capacity (the simulated device enforces it itself; on CUDA
// this wrapper does, and counts the refusal as a failed backend allocation, as the simulated device
// counts its own).
class ReplayDevice {
 public:
  ReplayDevice(std::unique_ptr<Backend> backend, std::size_t capacity, bool enforce_capacity)
      : backend_(std::move(backend)), capacity_(capacity), enforce_capacity_(enforce_capacity) {}
  absl::StatusOr<void*> Allocate(std::size_t bytes);  // bytes: a multiple of Granularity()
  absl::Status Free(void* ptr, std::size_t bytes);
  std::size_t used_bytes() const { return used_; }
  std::size_t Granularity() const { return backend_->Granularity(); }
  BackendCounters counters() const;

 private:
  std::unique_ptr<Backend> backend_;
  std::size_t capacity_;
  bool enforce_capacity_;
  std::size_t used_ = 0;
  std::int64_t refused_ = 0;
};

absl::StatusOr<std::unique_ptr<ReplayDevice>> MakeReplayDevice(std::size_t capacity,
                                                               ReplayDeviceKind kind = ReplayDeviceKind::kSim);

// Creates the allocator named by `spec` (see the file comment) on a device of `capacity` bytes.
// InvalidArgument names a bad spec or configuration and what is accepted; on CUDA without a usable
// device, FailedPrecondition names the CUDA error.
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeReplayAllocator(absl::string_view spec, std::size_t capacity,
                                                                     ReplayDeviceKind kind = ReplayDeviceKind::kSim);

// Splits compare's --allocators list. A BUCKETALLOC_CONF has commas of its own, so the list splits at
// commas outside brackets, and a piece that does not start with an allocator name (bucketalloc,
// pytorch-policy, nocache) continues the previous one's CONF:
//   "bucketalloc,bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048,nocache"
//   -> {"bucketalloc", "bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048", "nocache"}
std::vector<std::string> SplitAllocatorList(absl::string_view list);

struct ReplayOptions {
  std::string allocator = "bucketalloc";
  std::size_t capacity = 0;  // bytes, > 0
  ReplayDeviceKind device = ReplayDeviceKind::kSim;
  int repeat = 1;            // rounds of the trace on the same allocator
  CostModel cost;
  // Records ReplayResult::timeline (at most `timeline_points` points) and peak_fragmentation. Off
  // by default: it reads the reserved bytes after every event, and the histogram costs a second
  // replay, which min-capacity's probes need not pay.
  bool record_timeline = false;
  std::size_t timeline_points = 2000;  // >= 1
  // Stops the replay at the first OOM (min-capacity's probes: whether a capacity serves the trace
  // is all they ask). Not with record_timeline.
  bool stop_at_first_oom = false;
};

// One point of a timeline: the events [event, event + Timeline::bucket_events) summarized by their
// maxima (so no peak is lost however long the trace), and the trough of live bytes.
struct TimelinePoint {
  std::uint64_t event = 0;          // the first event of the bucket (index over all rounds)
  // The most bytes the replay held for the trace after any event of the bucket: its blocks that
  // were served (an OOM's are not), earlier rounds' unfreed blocks included.
  std::size_t live_bytes = 0;
  std::size_t live_min_bytes = 0;   // the fewest
  std::size_t reserved_bytes = 0;   // the most bytes the allocator held after any event of the bucket
  std::uint64_t ooms = 0;           // failed allocations in the bucket
};

// Live and reserved bytes over the replay. Every event of the trace counts (frees of failed
// allocations and the logged run's failures too), so the x axis is the trace's event index; round
// k's event i is k * events_per_round + i.
struct Timeline {
  std::uint64_t events = 0;         // events replayed, all rounds
  std::uint64_t bucket_events = 1;  // events per point: ceil(events / timeline_points)
  std::vector<TimelinePoint> points;
};

// The allocator's free blocks when its reserved bytes peaked: after the first event at which the
// reserved bytes (read after each event) reached their highest value. Found by a second replay that
// stops there, because snapshotting at every new peak would walk the free lists once per backend
// growth; replays are deterministic, and the second one checks that it reached the same reserved
// bytes at that event.
struct PeakFragmentation {
  std::uint64_t event = 0;       // index over all rounds
  std::size_t live_bytes = 0;    // the bytes the replay held for the trace then (TimelinePoint::live_bytes)
  PoolFragmentation free_blocks; // ReplayAllocator::Fragmentation() then
};

// What a replay measured (the JSON keys of docs/harness.md).
struct ReplayResult {
  std::string allocator;
  std::string device = "sim";  // "sim" or "cuda"
  std::size_t capacity = 0;
  std::uint64_t allocations = 0;      // allocate events replayed (all rounds)
  std::size_t peak_live_bytes = 0;    // the most bytes the trace holds at once: no allocator can do with less
  std::size_t peak_reserved_bytes = 0;
  double reserved_over_live = 0.0;
  std::uint64_t ooms = 0;
  std::uint64_t capacity_ooms = 0;       // live + request > capacity: no allocator could have served it
  std::uint64_t fragmentation_ooms = 0;  // all other OOMs
  double p50_ns = 0.0;                   // per operation (allocate or free)
  double p99_ns = 0.0;
  std::uint64_t backend_calls = 0;       // backend allocations + frees (+ vmm creates, releases, maps, unmaps)
  std::uint64_t granules_stitched = 0;   // granules of free blocks moved into stitched ranges (vmm)
  double simulated_backend_ms = 0.0;     // backend calls priced by the cost model
  std::vector<std::size_t> per_round_peak_reserved_bytes;
  // "stable"; "rising" (peak reserved still grows in the second half of the rounds, with two rounds
  // in the second, or the bytes held at the end of a round grow round over round: a leak);
  // "single round".
  std::string verdict;
  // With ReplayOptions::record_timeline only; not part of ToJson() (compare's JSON has them under
  // "timeline" and "peak_fragmentation"). No peak_fragmentation when nothing was ever reserved.
  Timeline timeline;
  std::optional<PeakFragmentation> peak_fragmentation;
  std::string ToJson() const;
};

// The peak of bytes held at once by the trace's allocations (failures of the logged run excluded),
// over `rounds` rounds of it: what one round never frees stays held through the later ones.
std::size_t PeakLiveBytes(const Trace& trace, int rounds = 1);

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options);

// The smallest capacity (2 MiB resolution) at which `allocator` serves the trace with zero OOMs,
// found by bisection, then a grid of five probes below the answer and a bisection below the
// smallest that passes (serving is not always monotone in capacity; see docs/harness.md).
// `progress` (may be null) receives one line per probe.
struct MinCapacityResult {
  std::size_t min_capacity_bytes = 0;
  double min_capacity_over_live = 0.0;
  // From the trace's meta file (harness/serving.h) when it has one: the workload's true peak need
  // (no layout rounding), so min_capacity_over_true_need shows the layout's and the allocator's cost.
  std::optional<std::size_t> true_need_bytes;
  ReplayResult at_min;  // the replay at that capacity
  double min_capacity_over_true_need() const;  // 0 without a true need
  std::string ToJson() const;  // true_need_bytes and min_capacity_over_true_need only when known
};
absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              void (*progress)(const std::string& line) = nullptr);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_H_
