#include "memory/size_classes.h"

#include <algorithm>

namespace bucketalloc::internal {
namespace {

// 512-byte steps to 4 KiB; four steps per power of two to 256 KiB; above that the largest
// 512-multiples that divide a 2 MiB slab into 7, 6, 5, 4, 3 and 2 blocks (so the slab tail is
// under 512 B per block instead of up to 25% of the slab).
constexpr std::array<std::size_t, SmallSizeClasses::kNumClasses> MakeClassSizes() {
  std::array<std::size_t, SmallSizeClasses::kNumClasses> sizes{};
  int n = 0;
  for (std::size_t s = 512; s <= 4096; s += 512) sizes[n++] = s;
  for (std::size_t base = 4096; base < 256 * kKiB; base *= 2) {
    for (std::size_t k = 1; k <= 4; ++k) sizes[n++] = base + k * (base / 4);
  }
  for (std::size_t k = 7; k >= 2; --k) sizes[n++] = kSlabBytes / k / kMinBlockSize * kMinBlockSize;
  return sizes;
}

constexpr std::array<std::size_t, SmallSizeClasses::kNumClasses> kSizes = MakeClassSizes();
static_assert(kSizes.back() == kMaxSmallSize, "the last small class is the small-pool limit");
static_assert(kSizes[0] == kMinBlockSize);

constexpr std::array<std::uint8_t, kMaxSmallSize / kMinBlockSize + 1> MakeClassOfUnit() {
  std::array<std::uint8_t, kMaxSmallSize / kMinBlockSize + 1> table{};
  int cls = 0;
  for (std::size_t unit = 0; unit < table.size(); ++unit) {
    while (kSizes[cls] < unit * kMinBlockSize) ++cls;
    table[unit] = static_cast<std::uint8_t>(cls);
  }
  return table;
}

}  // namespace

const std::array<std::size_t, SmallSizeClasses::kNumClasses> SmallSizeClasses::kClassSize = kSizes;
const std::array<std::uint8_t, kMaxSmallSize / kMinBlockSize + 1> SmallSizeClasses::kClassOfUnit = MakeClassOfUnit();

double SmallSizeClasses::WorstCaseWaste() {
  double worst = 0.0;
  std::size_t prev = 0;
  for (int c = 0; c < kNumClasses; ++c) {
    const std::size_t size = kClassSize[c];
    const std::size_t smallest_request = std::max(prev + 1, kMinBlockSize);  // 512 B is the minimum block
    const std::size_t slots = kSlabBytes / size;
    // Each block occupies its class size plus its share of the slab tail.
    const double occupied = static_cast<double>(kSlabBytes) / static_cast<double>(slots);
    worst = std::max(worst, 1.0 - static_cast<double>(smallest_request) / occupied);
    prev = size;
  }
  return worst;
}

std::size_t RoundDividedSize(std::size_t size, std::span<const std::uint32_t> divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  // Interval index: max(0, log2(size) - 20), clamped to the last entry.
  int index = Log2Floor(size) - 20;
  index = std::clamp(index, 0, static_cast<int>(divisions.size()) - 1);
  const std::size_t div = divisions.empty() ? 0 : divisions[index];
  if (div > 1 && size > kMinBlockSize * div) {
    if (IsPowerOfTwo(size)) return size;
    const std::size_t floor_pow2 = std::size_t{1} << Log2Floor(size);
    const std::size_t step = floor_pow2 / div;
    if (step == 0) return floor_pow2 * 2;
    return RoundUp(size, step);
  }
  return RoundUp(size, kMinBlockSize);
}

}  // namespace bucketalloc::internal
