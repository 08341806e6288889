// src/internal/bits.h — bit and size arithmetic (layer L0).
//
// Owns: power-of-two helpers and overflow-safe rounding used by the size classes and pools.
// Thread-safety: pure functions.
//
// Example: RoundUp(3000, 512) == 3072; Log2Floor(4096) == 12.
#ifndef BUCKETALLOC_INTERNAL_BITS_H_
#define BUCKETALLOC_INTERNAL_BITS_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "bucketalloc/units.h"

namespace bucketalloc::internal {

constexpr bool IsPowerOfTwo(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Rounds up to a multiple of any positive value (bucketalloc/units.h). Precondition: no overflow
// (callers bound sizes by kMaxRequestBytes).
using ::bucketalloc::RoundUp;

// floor(log2(x)) for x > 0.
constexpr int Log2Floor(std::size_t x) { return 63 - std::countl_zero(static_cast<std::uint64_t>(x)); }

// ceil(log2(x)) for x > 0.
constexpr int Log2Ceil(std::size_t x) { return x <= 1 ? 0 : Log2Floor(x - 1) + 1; }

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_BITS_H_
