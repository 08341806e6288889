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

namespace bucketalloc::internal {

constexpr bool IsPowerOfTwo(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Rounds `x` up to a multiple of `align` (any positive value). Precondition: no overflow
// (callers bound x by kMaxRequestBytes).
constexpr std::size_t RoundUp(std::size_t x, std::size_t align) { return (x + align - 1) / align * align; }

// floor(log2(x)) for x > 0.
constexpr int Log2Floor(std::size_t x) { return 63 - std::countl_zero(static_cast<std::uint64_t>(x)); }

// ceil(log2(x)) for x > 0.
constexpr int Log2Ceil(std::size_t x) { return x <= 1 ? 0 : Log2Floor(x - 1) + 1; }

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_BITS_H_
