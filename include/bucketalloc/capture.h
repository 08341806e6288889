// bucketalloc/capture.h — the vocabulary of CUDA graph capture: graph-pool ids and stream filters
// (see Allocator::BeginCapture).
#ifndef BUCKETALLOC_CAPTURE_H_
#define BUCKETALLOC_CAPTURE_H_

#include <cstdint>
#include <functional>
#include <utility>

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

}  // namespace bucketalloc

#endif  // BUCKETALLOC_CAPTURE_H_
