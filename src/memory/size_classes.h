// src/memory/size_classes.h — size classes of the small pool's slabs and PyTorch-compatible
// rounding (layer L2).
//
// Owns: the mapping from a request size to
//   - a small-pool class (38 classes from 512 B to 1 MiB, each packed into 2 MiB slabs);
//   - the rounded size of a large request (PyTorch's round_size, with roundup_power2_divisions).
// Worst-case waste of the small classes (rounding plus the slab tail) is computed by
// SmallSizeClasses::WorstCaseWaste() and checked by its test; see docs/architecture.md.
// Thread-safety: constant tables and pure functions.
//
// Example: int c = SmallSizeClasses::ClassOf(3000);  // 3072-byte class
#ifndef BUCKETALLOC_MEMORY_SIZE_CLASSES_H_
#define BUCKETALLOC_MEMORY_SIZE_CLASSES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bucketalloc/units.h"
#include "internal/bits.h"

namespace bucketalloc::internal {

inline constexpr std::size_t kMinBlockSize = 512;         // every size rounds to >= 512 B
inline constexpr std::size_t kSlabBytes = 2 * kMiB;       // small blocks are packed in 2 MiB
inline constexpr std::size_t kMaxSmallSize = kMiB;        // largest small-pool class
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;  // below: packed in a large segment
inline constexpr std::size_t kRoundLarge = 2 * kMiB;      // larger: segments round to 2 MiB
static_assert(kSlabBytes % kMaxSmallSize == 0 && kSlabBytes / kMaxSmallSize >= 2,
              "a slab holds at least two blocks of the largest small class");
static_assert(IsPowerOfTwo(kMinBlockSize) && IsPowerOfTwo(kSlabBytes));

class SmallSizeClasses {
 public:
  static constexpr int kNumClasses = 38;
  // Most slots one slab can hold (all of the 512 B class).
  static constexpr std::uint32_t kMaxSlotsPerSlab = kSlabBytes / kMinBlockSize;

  // Returns the class of `size` in [1, kMaxSmallSize].
  static int ClassOf(std::size_t size) { return kClassOfUnit[(size + kMinBlockSize - 1) / kMinBlockSize]; }
  static std::size_t ClassSize(int cls) { return kClassSize[cls]; }
  static std::uint32_t SlotsPerSlab(int cls) { return static_cast<std::uint32_t>(kSlabBytes / kClassSize[cls]); }
  static std::span<const std::size_t> Sizes() { return kClassSize; }

  // The largest fraction of a block's footprint that a request of at least 512 B wastes: for each
  // class, (class size - smallest request of the class) plus the slab tail, over the bytes the
  // request occupies. Used by tests and docs.
  static double WorstCaseWaste();

 private:
  static const std::array<std::size_t, kNumClasses> kClassSize;
  static const std::array<std::uint8_t, kMaxSmallSize / kMinBlockSize + 1> kClassOfUnit;
};

// PyTorch's round_size for the large pool: 512-byte multiples, or the next 1/div step of the
// power-of-two interval when roundup_power2_divisions gives div > 1 for that interval.
// `divisions` has 16 entries (1 MiB, 2 MiB, ... intervals; the last covers everything above).
// The rounding with divisions, out of line (RoundLargeSize calls it).
std::size_t RoundDividedSize(std::size_t size, std::span<const std::uint32_t> divisions);
inline std::size_t RoundLargeSize(std::size_t size, std::span<const std::uint32_t> divisions) {
  if (divisions.empty()) [[likely]]  // no roundup_power2_divisions (the default): 512-byte multiples
    return size < kMinBlockSize ? kMinBlockSize : RoundUp(size, kMinBlockSize);
  return RoundDividedSize(size, divisions);
}

// PyTorch's get_allocation_size: the segment to allocate for a large block of `rounded` bytes.
inline std::size_t LargeSegmentSize(std::size_t rounded, std::size_t large_segment_size) {
  if (rounded < kMinLargeAlloc && rounded <= large_segment_size) return large_segment_size;
  return RoundUp(rounded, kRoundLarge);
}

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_MEMORY_SIZE_CLASSES_H_
