// src/harness/replay/memory_breakdown.h — where an allocator's reserved bytes are at one moment of a
// replay (layer L5): what live blocks hold, and which free bytes could go back or move.
//
// Owns: `MemoryBreakdown` (the figures, their JSON and one line of text) and `MemorySpan`, the
// description of one span of memory an allocator holds (a segment, a slab, an expandable segment's
// mapped part) with its blocks, from which BreakDown() counts them. Every replay policy describes
// its own memory so (ReplayAllocator::Breakdown), so that compare and min-capacity explain any
// difference in bytes between two allocators by figures (docs/harness.md, "Where the bytes are").
//
// The unit: the memory that goes back to the device, or moves, only whole. Without virtual memory
// it is the span itself (a cudaMalloc segment); with it, one physical allocation (a page of
// PyTorch's expandable segments, a granule piece of a stitched segment). A free byte in a unit that
// also holds a live byte can neither go back nor move while that block lives.
// Invariant: the parts add up to `reserved`.
// Thread-safety: none (a value).
//
// Example:
//   MemorySpan s{.base = seg, .size = 20 << 20, .unit = 0};
//   s.blocks = {{seg, 12 << 20, 12'000'000, true}, {seg + (12 << 20), 8 << 20, 0, false}};
//   MemoryBreakdown b = BreakDown({s}, 20 << 20);  // live 12e6, rounding, 8 MiB shared with live
#ifndef BUCKETALLOC_HARNESS_REPLAY_MEMORY_BREAKDOWN_H_
#define BUCKETALLOC_HARNESS_REPLAY_MEMORY_BREAKDOWN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace bucketalloc::harness {

struct MemoryBreakdown {
  std::size_t reserved = 0;        // the allocator's reserved bytes then
  std::size_t live_requested = 0;  // the bytes the live allocations asked for
  std::size_t live_rounding = 0;   // live blocks' bytes beyond what they asked for
  std::size_t free_small_pool = 0;
  // Free bytes of the other pools in a unit (above) that also holds a live block.
  std::size_t free_shared_with_live = 0;
  // Free bytes of the other pools in units no live block holds: what a release could give back.
  std::size_t free_whole_units = 0;
  // What no span describes: reserved bytes outside every span (spare physical pieces), or a model
  // that describes no spans.
  std::size_t other = 0;

  // {"reserved_bytes", "live_requested_bytes", ..., "other_bytes"}, and each part over `peak_live`.
  std::string ToJson(std::size_t peak_live) const;
  // "live 1.0000, rounding 0.0012, free: small pool 0.0008, shared with live 0.0031, whole units
  // 0.0001, other 0" (each over `peak_live`).
  std::string Text(std::size_t peak_live) const;
};

// One span of memory an allocator holds, its blocks tiling it in address order.
struct MemorySpan {
  struct Block {
    std::uintptr_t ptr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;  // live: what the caller asked for
    bool live = false;          // allocated, or awaiting stream events: not free
  };
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool small_pool = false;
  // The bytes of the unit that goes back or moves whole: 0 for the span itself, else a power of
  // two the span's base and size are multiples of (a page, a granule).
  std::size_t unit = 0;
  std::vector<Block> blocks;
};

// The breakdown of `spans` for an allocator with `reserved` bytes (`other` is what the spans leave).
MemoryBreakdown BreakDown(absl::Span<const MemorySpan> spans, std::size_t reserved);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_MEMORY_BREAKDOWN_H_
