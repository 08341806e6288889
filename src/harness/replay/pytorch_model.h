// src/harness/replay/pytorch_model.h — what the models of PyTorch's caching allocator share (layer L5):
// its size rounding (reference/pytorch.md §1.1, §1.4, default configuration) and the live blocks
// by address with their bytes (pytorch-policy: harness/replay/policy_pytorch.cc; pytorch-expandable:
// harness/replay/policy_pytorch_expandable.cc).
// Thread-safety: none, as the models.
#ifndef BUCKETALLOC_HARNESS_REPLAY_PYTORCH_MODEL_H_
#define BUCKETALLOC_HARNESS_REPLAY_PYTORCH_MODEL_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"

namespace bucketalloc::harness::pytorch_model {

inline constexpr std::size_t kMinBlockSize = 512;                // "all sizes are rounded to at least 512 bytes"
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;  // "largest 'small' allocation is 1 MiB"

// round_size without roundup_power2_divisions.
inline std::size_t RoundSize(std::size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : RoundUp(size, kMinBlockSize);
}

// round_size with roundup_power2_divisions (reference/pytorch.md §1.4): `divisions` has an entry per
// power-of-two interval from 1 MiB (index max(0, log2(size) - 20), the last covering everything
// above); with div > 1 for the size's interval and size > 512 x div, the size rounds up to the next
// 1/div step of its interval [2^k, 2^(k+1)) (a power of two stays as it is; a step under 1 byte
// gives 2^(k+1)). Otherwise 512-byte multiples.
inline std::size_t RoundSize(std::size_t size, const std::vector<std::uint32_t>& divisions) {
  if (size < kMinBlockSize || divisions.empty()) return RoundSize(size);
  const int log2 = std::bit_width(size) - 1;
  const std::size_t index =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(0, log2 - 20)), divisions.size() - 1);
  const std::size_t div = divisions[index];
  if (div <= 1 || size <= kMinBlockSize * div) return RoundSize(size);
  const std::size_t floor = std::size_t{1} << log2;
  if (size == floor) return size;
  const std::size_t step = floor >> (std::bit_width(div) - 1);
  if (step == 0) return floor << 1;
  const std::size_t down = size & ~(step - 1);
  return down == size ? size : down + step;
}

// The live blocks of a model by address. `Block` has ptr, size, allocated and requested.
// Invariant: allocated() and requested() are the sums of the live blocks' sizes and callers' sizes.
template <typename Block>
class LiveBlocks {
 public:
  // `block` (of `block->size` bytes) is handed out for a request of `requested` bytes.
  void Add(Block* block, std::size_t requested) {
    block->allocated = true;
    block->requested = requested;
    allocated_ += block->size;
    requested_ += requested;
    live_[block->ptr] = block;
  }
  // The live block at `ptr`, no longer live; InvalidArgument naming `model` when there is none.
  absl::StatusOr<Block*> Take(void* ptr, absl::string_view model) {
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == live_.end()) return absl::InvalidArgumentError(absl::StrCat(model, ": free of an unknown pointer"));
    Block* block = it->second;
    live_.erase(it);
    block->allocated = false;
    allocated_ -= block->size;
    requested_ -= block->requested;
    return block;
  }
  // Sets f's allocated and requested bytes.
  void Report(PoolFragmentation& f) const {
    f.allocated = static_cast<std::int64_t>(allocated_);
    f.requested = static_cast<std::int64_t>(requested_);
  }
  template <typename F>
  void ForEach(F f) const {
    for (const auto& [ptr, block] : live_) f(block);
  }

 private:
  absl::flat_hash_map<std::uintptr_t, Block*> live_;
  std::size_t allocated_ = 0;  // block sizes of live allocations
  std::size_t requested_ = 0;  // their callers' sizes
};

// Calls f(head) for the first block of each segment of a model (the block without a predecessor)
// among its live blocks and `sets` (its sets of free or unmapped blocks): every block of a model is
// in exactly one of them.
template <typename Block, typename F, typename... Sets>
void ForEachSegmentHead(const LiveBlocks<Block>& live, F f, const Sets&... sets) {
  auto heads = [&](const Block* b) {
    if (b->prev == nullptr) f(b);
  };
  live.ForEach(heads);
  (std::for_each(sets.begin(), sets.end(), heads), ...);
}

}  // namespace bucketalloc::harness::pytorch_model

#endif  // BUCKETALLOC_HARNESS_REPLAY_PYTORCH_MODEL_H_
