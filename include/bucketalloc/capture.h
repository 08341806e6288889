// bucketalloc/capture.h — the vocabulary of CUDA graph capture and private pools: graph-pool ids,
// stream filters (see Allocator::BeginCapture), and how a private pool gets and splits its memory
// (Allocator::SetPoolNoSplit, Allocator::SetPoolSegmentAllocator).
#ifndef BUCKETALLOC_CAPTURE_H_
#define BUCKETALLOC_CAPTURE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"

#include "bucketalloc/backend.h"

namespace bucketalloc {

// The identity of a CUDA-graph memory pool (PyTorch's MempoolId_t: a pair of integers).
struct GraphPoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  friend bool operator==(const GraphPoolId&, const GraphPoolId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const GraphPoolId& id) {
    return H::combine(std::move(h), id.first, id.second);
  }
};

// Which streams' allocations belong to a capture (PyTorch passes one for the capturing stream).
using CaptureFilter = std::function<bool(Stream)>;

// Where a private pool's segments come from when not from the device's backend: another allocator
// (PyTorch's MemPool(allocator), e.g. vLLM's CuMemAllocator, whose memory it can unmap and map
// again). The pool caches, splits and reports its segments as any other; it asks Allocate for a
// new segment (`bytes`: a multiple of the backend's granularity) and gives one back with Free,
// under the device's lock (neither may call back into bucketalloc). Allocate returns
// ResourceExhausted when it has no memory (the pool then releases its cache and retries), else
// memory at a 512-byte-aligned address that no segment of the device holds: the request fails with
// Internal naming a pointer that is null, overlaps a segment (one returned twice; not given back) or
// is misaligned (given back through Free), and nothing is registered.
class SegmentAllocator {
 public:
  virtual ~SegmentAllocator() = default;
  virtual absl::StatusOr<void*> Allocate(std::size_t bytes, Stream stream) = 0;
  virtual void Free(void* ptr, std::size_t bytes) = 0;
};

// How a private pool gets and splits its memory. Set while the pool holds no memory (right after
// IncrefPool, as PyTorch's MemPool constructor does).
struct PrivatePoolSettings {
  // No block of the pool is ever split (PyTorch's MemPool(no_split=True), setNoSplit): a request
  // takes a whole free block or a new segment of its own, so each allocation is whole segments
  // (what NCCL window registration and symmetric memory register). No slabs, no stitching.
  bool no_split = false;
  // The pool's segments come from this allocator (nullptr: the backend). Not stitched: another
  // allocator's memory is not the backend's physical granules.
  std::shared_ptr<SegmentAllocator> segment_allocator;
};

}  // namespace bucketalloc

#endif  // BUCKETALLOC_CAPTURE_H_
