// src/harness/pytorch_policy.h — a model of PyTorch's native CUDA caching allocator policy, as a
// replay allocator (layer L5, the benchmark harness): the baseline bucketalloc is compared with.
//
// It follows ../shared/reference/pytorch.md §1 (CUDACachingAllocator, default configuration):
//   - sizes round up to 512 B (kMinBlockSize); requests <= 1 MiB use the small pool, others the large;
//   - segment sizes: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else rounded up to 2 MiB;
//   - best fit per pool by (stream, size, address): the smallest free block of the stream that fits;
//   - a small block is split when at least 512 B remain; a large one when more than 1 MiB remains
//     (max_split_size unlimited, so no oversize rules apply);
//   - a freed block coalesces at once with its free neighbours in the same segment;
//   - a failed cudaMalloc releases every cached block that is a whole segment (not split), in both
//     pools, and retries once; then the request is an OOM.
// Fragmentation() walks both pools' cached free blocks (whole segments and the free pieces of split
// ones) into power-of-two bins, as bucketalloc's histogram does.
// Not modelled: record_stream events, garbage collection, expandable segments, memory fractions,
// roundup_power2_divisions, max_split_size (all off by default).
#ifndef BUCKETALLOC_HARNESS_PYTORCH_POLICY_H_
#define BUCKETALLOC_HARNESS_PYTORCH_POLICY_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "harness/replay.h"

namespace bucketalloc::harness {

// PyTorch's policy over a device of `capacity` bytes (simulated by default).
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchPolicy(std::size_t capacity,
                                                                   ReplayDeviceKind kind = ReplayDeviceKind::kSim);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_PYTORCH_POLICY_H_
