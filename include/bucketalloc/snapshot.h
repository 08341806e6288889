// bucketalloc/snapshot.h — memory snapshots and allocation history in the layout of PyTorch's
// torch.cuda.memory._snapshot(), so that PyTorch's memory_viz tools read them unchanged.
//
// A snapshot lists every segment (a large-pool segment or a small-pool slab) with its blocks in
// address order, each allocated, awaiting stream events, or free. While history recording is on,
// each device keeps its last `max_entries` events (alloc, free_requested, free_completed,
// segment_alloc, segment_free, oom) in a ring buffer that is allocated when recording is turned on,
// so that recording costs one branch and one clock read per event and no heap allocation.
//
// Example:
//   allocator->RecordHistory(true, 100000);
//   ...
//   absl::StatusOr<MemorySnapshot> s = allocator->Snapshot(/*device=*/-1);
//   std::string json = SnapshotToJson(*s);
#ifndef BUCKETALLOC_SNAPSHOT_H_
#define BUCKETALLOC_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "bucketalloc/capture.h"

namespace bucketalloc {

// A block's state, named as PyTorch names it.
enum class BlockSnapshotState {
  kActiveAllocated,    // "active_allocated": held by a caller
  kActivePendingFree,  // "active_pending_free": freed, waiting for stream events (record_stream)
  kInactive,           // "inactive": free, cached
};
absl::string_view BlockStateName(BlockSnapshotState state);

struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 when inactive
  BlockSnapshotState state = BlockSnapshotState::kInactive;
};

// One backend allocation: a large-pool segment ("large") or a small-pool slab ("small").
// Invariant: blocks tile [address, address + total_size) in address order.
struct SegmentSnapshot {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;  // sum of active_allocated blocks
  std::size_t active_size = 0;     // sum of active_allocated and active_pending_free blocks
  std::size_t requested_size = 0;  // sum of the requests of active blocks
  std::uintptr_t stream = 0;
  bool small = false;
  int tier = -1;            // the tier whose blocks the segment holds, or -1 (bucketalloc's own field)
  bool expandable = false;  // a mapped run of a stitched (vmm) range: PyTorch's is_expandable
  GraphPoolId pool_id;      // PyTorch's segment_pool_id: the private pool, or {0, 0}
  std::string tenant;       // with tenants: the tenant whose pool holds it ("default" for the device's own)
  std::vector<BlockSnapshot> blocks;
};

enum class TraceAction : std::uint8_t {
  kAlloc,          // "alloc": addr, size = the requested size (as PyTorch records it)
  kFreeRequested,  // "free_requested": the caller freed addr (size as for alloc)
  kFreeCompleted,  // "free_completed": the block is reusable (stream events done, graph released)
  kSegmentAlloc,   // "segment_alloc": a backend allocation (segment or slab)
  kSegmentFree,    // "segment_free": a backend free
  kSegmentMap,     // "segment_map": (vmm) a granule mapped at addr (PyTorch's expandable segments)
  kSegmentUnmap,   // "segment_unmap": (vmm) the granule at addr unmapped
  kOom,            // "oom": size = the request, device_free = the device's free bytes
};
absl::string_view TraceActionName(TraceAction action);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  std::int64_t time_us = 0;     // microseconds since the Unix epoch
  std::size_t device_free = 0;  // kOom only
  GraphPoolId pool;             // the private pool of the block or segment ({0, 0}: the device's own)
};

// Called with every history event of a device as it is recorded (Allocator::SetTraceHook), on the
// thread that caused it, under the device's lock: it must not call the allocator.
using TraceHookFn = void (*)(int device, const TraceEntry& entry, void* ctx);
struct TraceHook {
  TraceHookFn fn = nullptr;
  void* ctx = nullptr;
};

// The most history entries a device keeps (64 bytes each: 1 GiB at the limit).
inline constexpr std::size_t kMaxHistoryEntries = std::size_t{1} << 24;

struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;  // every device's, in device then address order
  // device_traces[d]: the history of device d, oldest first (empty while recording is off or for
  // a device not created yet). Sized to the allocator's device count.
  std::vector<std::vector<TraceEntry>> device_traces;
  std::string settings;            // the effective configuration (BUCKETALLOC_CONF syntax)
  std::size_t max_split_size = 0;  // kUnlimited when unset
  double garbage_collection_threshold = 0.0;
};

// The snapshot as JSON: {"segments": [...], "device_traces": [[...], ...], "allocator_settings":
// {...}}, with PyTorch's key names (segment: device, address, total_size, allocated_size,
// active_size, requested_size, stream, segment_type, segment_pool_id, is_expandable, frames,
// blocks; block: address, size, requested_size, state, frames; trace entry: action, addr (or
// device_free for "oom"), size, stream, time_us, frames). Frames are empty: bucketalloc records no
// stacks.
std::string SnapshotToJson(const MemorySnapshot& snapshot);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_SNAPSHOT_H_
