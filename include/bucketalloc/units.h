// bucketalloc/units.h — byte units, and sizes as text (layer L0: usable by every layer).
//
// Owns: the binary units every layer counts in (kKiB, kMiB, kGiB), the largest request, the "no
// limit" size, RoundUp, the one parser and formatter of sizes, and the exact text of a number, used
// by the option table, the reports and the tools.
// Thread-safety: constants and pure functions.
//
// Example:
//   absl::StatusOr<std::size_t> s = bucketalloc::ParseSize("1.5GiB");  // 1610612736
//   std::string t = bucketalloc::FormatBytes(20 * bucketalloc::kMiB);   // "20.00 MiB"
#ifndef BUCKETALLOC_UNITS_H_
#define BUCKETALLOC_UNITS_H_

#include <cstddef>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

// The largest request accepted (2^46 bytes = 64 TiB); anything larger is an invalid size (this also
// catches a negative ssize_t converted to size_t).
inline constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 46;
// "No limit" for size options (PyTorch's SIZE_MAX default of max_split_size).
inline constexpr std::size_t kUnlimited = ~std::size_t{0};

// `n` rounded up to a whole multiple of `to` (> 0), in the wider of the two integer types: sizes to
// granules, addresses to alignments, tokens to blocks. The one rounding every layer and the harness use.
template <typename T, typename U>
constexpr std::common_type_t<T, U> RoundUp(T n, U to) {
  using R = std::common_type_t<T, U>;
  return (static_cast<R>(n) + static_cast<R>(to) - 1) / static_cast<R>(to) * static_cast<R>(to);
}

// Parses a size: "123", "64KiB", "20MiB", "1.5GiB", "2TiB" (also K/KB/M/MB/G/GB/T/TB as binary units,
// case-insensitive). InvalidArgument names the text and what is wrong with it.
absl::StatusOr<std::size_t> ParseSize(absl::string_view text);
// Formats bytes as e.g. "20.00 MiB" ("unlimited" for kUnlimited).
std::string FormatBytes(std::size_t bytes);
// Formats bytes as the shortest exact text ParseSize reads back: "16GiB", "3KiB", "1000", "0"
// ("unlimited" for kUnlimited, which the size options read).
std::string SizeText(std::size_t bytes);
// Formats a number as the shortest text that reads back as the same double ("0.9999999",
// "0.12345678", "1e-300"), for options printed to be configured again.
std::string NumberText(double value);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_UNITS_H_
