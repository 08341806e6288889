// src/frontend/graph_captures.h — CUDA graph captures and their memory pools on one device (L4).
//
// Owns: the running captures (each with its graph pool and stream filter) and the graph pools
// known to the device, by tag (slot 0 unused; a released pool's slot is reused once it holds no
// block). While any capture runs the device makes no backend call (docs/architecture.md, "CUDA graph
// capture"); a block allocated during a capture on a stream its filter accepts carries the pool's
// tag and, once freed, is held until the pool is released, because every replay of the graph
// still writes it.
// Invariants (CheckInvariants): each pool's block count equals the blocks that carry its tag; every
// running capture names an open (unreleased) pool.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   captures.Begin(pool_id, filter, device);       // PyTorch's beginAllocateToPool
//   std::uint16_t tag = captures.TagFor(stream);   // 0 outside captures
//   captures.End(pool_id, device);  captures.Release(pool_id, device);
#ifndef BUCKETALLOC_FRONTEND_GRAPH_CAPTURES_H_
#define BUCKETALLOC_FRONTEND_GRAPH_CAPTURES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/capture.h"
#include "internal/check.h"

namespace bucketalloc::internal {

class GraphCaptures {
 public:
  GraphCaptures() : pools_(1) {}

  // True while a capture runs on the device.
  bool running() const { return !captures_.empty(); }
  // The graph pool tag of an allocation on `stream` now: the latest running capture whose filter
  // accepts it, or 0.
  std::uint16_t TagFor(Stream stream) const;
  // True while a block of `tag` must stay held: its pool is not released.
  bool Holds(std::uint16_t tag) const { return tag != 0 && !pools_[tag].released; }
  // Counts a block that carries `tag` (0: none), and forgets one.
  void Tag(std::uint16_t tag) {
    if (tag != 0) ++pools_[tag].blocks;
  }
  void Untag(std::uint16_t tag) {
    if (tag == 0) return;
    BA_DCHECK(pools_[tag].blocks > 0, "a graph pool's block count went negative");
    --pools_[tag].blocks;
  }
  std::size_t num_tags() const { return pools_.size(); }

  // Starts a capture into `pool` (a new pool or an open one). InvalidArgument without a filter;
  // ResourceExhausted past 65535 open pools.
  absl::Status Begin(GraphPoolId pool, CaptureFilter filter, int device);
  // Ends the latest running capture into `pool`. NotFound for an unknown pool, FailedPrecondition
  // when none runs.
  absl::Status End(GraphPoolId pool, int device);
  // Releases `pool`: its held blocks become reusable. True when the pool was known (a pool that
  // never captured on this device is no error); FailedPrecondition while a capture into it runs.
  absl::StatusOr<bool> Release(GraphPoolId pool, int device);

  // `blocks_per_tag[tag]`: the live and pending blocks that carry each tag (num_tags() entries).
  absl::Status CheckInvariants(const std::vector<std::int64_t>& blocks_per_tag) const;

 private:
  struct GraphPool {
    GraphPoolId id;
    bool released = false;    // ReleasePool was called: its blocks are reusable again
    std::int64_t blocks = 0;  // live or held blocks that carry its tag
  };
  struct ActiveCapture {
    std::uint16_t tag = 0;
    CaptureFilter filter;
  };
  absl::StatusOr<std::uint16_t> Find(GraphPoolId id, absl::string_view what, int device) const;
  // True while a capture into the pool of `tag` runs.
  bool Capturing(std::uint16_t tag) const;

  std::vector<ActiveCapture> captures_;
  std::vector<GraphPool> pools_;  // by tag; slot 0 unused
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_GRAPH_CAPTURES_H_
