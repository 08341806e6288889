#include "pool/large_pool.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <span>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

// On the fast path each bin is scanned for the best fit up to this many entries (so an exact-size
// hit may read up to 32 entries: the lowest address among equals needs them); the slow path's full
// scan reads whole bins.
constexpr int kMaxBinScan = 32;

LargePool::StreamState& StateOf(const Segment* seg) {
  return *static_cast<LargePool::StreamState*>(seg->owner);
}

int NextNonEmpty(const LargePool::StreamState& ss, int from) {
  if (from >= kNumBins) return -1;
  for (int w = from >> 6; w < LargePool::kBitmapWords; ++w) {
    std::uint64_t bits = ss.nonempty[w];
    if (w == (from >> 6)) bits &= ~std::uint64_t{0} << (from & 63);
    if (bits != 0) return (w << 6) + std::countr_zero(bits);
  }
  return -1;
}

// The smallest size that falls in bin `bin`.
std::size_t BinLowerBound(int bin) {
  const int p = (bin >> kSubBinsLog2) + 9;
  const std::size_t sub = static_cast<std::size_t>(bin & ((1 << kSubBinsLog2) - 1));
  return (std::size_t{1} << p) + sub * (std::size_t{1} << (p - kSubBinsLog2));
}

}  // namespace

LargePool::LargePool(const PoolContext& ctx, LargePoolConfig config)
    : ctx_(ctx), config_(std::move(config)) {}

LargePool::~LargePool() = default;  // metadata lives in the object pools

LargePool::Inactive LargePool::InactiveOf(const Segment* seg) {
  if (seg->active_blocks == 0) return {};
  return {static_cast<std::int64_t>(seg->free_bytes), seg->free_blocks};
}

void LargePool::UpdateInactiveSplit(const Inactive& before, const Segment* seg) {
  const Inactive after = InactiveOf(seg);
  if (after.bytes != before.bytes) StatAdd(ctx_.stats->inactive_split_bytes, kLargePool, after.bytes - before.bytes);
  if (after.count != before.count) StatAdd(ctx_.stats->inactive_split, kLargePool, after.count - before.count);
}

void LargePool::InsertFree(Block* block) {
  Segment* seg = block->segment;
  StreamState& ss = StateOf(seg);
  block->state = BlockState::kFree;
  seg->free_blocks += 1;
  seg->free_bytes += block->size;
  if (seg->tier >= 0) {
    ss.tier_free[seg->tier].PushFront(block);
    return;
  }
  const int bin = BinOf(block->size);
  ss.bins[bin].PushFront(block);
  ss.nonempty[bin >> 6] |= std::uint64_t{1} << (bin & 63);
}

void LargePool::RemoveFree(Block* block) {
  Segment* seg = block->segment;
  FreeList::Unlink(block);
  seg->free_blocks -= 1;
  seg->free_bytes -= block->size;
  if (seg->tier >= 0) return;
  StreamState& ss = StateOf(seg);
  const int bin = BinOf(block->size);
  if (ss.bins[bin].empty()) ss.nonempty[bin >> 6] &= ~(std::uint64_t{1} << (bin & 63));
}

Block* LargePool::FindFree(StreamState& ss, std::size_t rounded, bool full_scan) {
  // PyTorch's rule: the smallest admissible block, the lowest address among equals (blocks packed
  // toward the start of their segments coalesce into whole free segments more often). Bins hold 4
  // sizes per power of two, so the best fit is in the first bin that has an admissible block; each
  // bin is scanned up to kMaxBinScan entries on the fast path, wholly with `full_scan`.
  const int max_scan = full_scan ? std::numeric_limits<int>::max() : kMaxBinScan;
  auto better = [](const Block* a, const Block* b) {
    return b == nullptr || a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
  };
  const int first = BinOf(rounded);
  for (int bin = (ss.bins[first].empty() ? NextNonEmpty(ss, first + 1) : first); bin >= 0;
       bin = NextNonEmpty(ss, bin + 1)) {
    const std::size_t lower = BinLowerBound(bin);
    if (bin > first && lower > config_.max_split_size && lower - rounded > config_.max_non_split_rounding) {
      return nullptr;  // every block from here on is oversize and too large for this request
    }
    Block* best = nullptr;
    int scanned = 0;
    for (Block* b = ss.bins[bin].front(); b != nullptr && scanned < max_scan;
         b = ss.bins[bin].next(b), ++scanned) {
      if (b->size < rounded || !Admissible(b->size, rounded)) continue;
      if (better(b, best)) best = b;
    }
    if (best != nullptr) return best;
  }
  return nullptr;
}

void LargePool::Activate(Block* block) {
  Segment* seg = block->segment;
  block->state = BlockState::kAllocated;
  seg->active_blocks += 1;
  if (seg->release_node.linked()) decltype(release_order_)::Unlink(seg);
  DeviceStats& st = *ctx_.stats;
  const auto size = static_cast<std::int64_t>(block->size);
  StatAdd(st.active_bytes, kLargePool, size);
  StatAdd(st.active, kLargePool, 1);
  StatAdd(st.cached_bytes, kLargePool, -size);
}

void LargePool::Take(Block* block, std::size_t rounded, int tier) {
  Segment* seg = block->segment;
  const Inactive before = InactiveOf(seg);
  RemoveFree(block);
  if (tier < 0 && ShouldSplit(block, rounded)) {
    InsertFree(SplitBlock(block, rounded, blocks_));
    ++ctx_.stats->num_splits;
  }
  Activate(block);
  UpdateInactiveSplit(before, seg);
}

Block* LargePool::TryAllocate(StreamState& ss, std::size_t rounded, int tier, bool full_scan) {
  Block* block = tier >= 0 ? ss.tier_free[tier].front() : FindFree(ss, rounded, full_scan);
  if (block != nullptr) Take(block, rounded, tier);
  return block;
}

absl::StatusOr<Block*> LargePool::Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded,
                                       int tier) {
  BA_DCHECK(bytes >= rounded, "a segment smaller than its request");
  absl::StatusOr<std::uintptr_t> base = ctx_.source->AllocateSegment(bytes, kLargePool);
  if (!base.ok()) return base.status();
  Segment* seg = segment_meta_.New();
  seg->base = *base;
  seg->size = bytes;
  seg->stream = stream;
  seg->owner = &ss;
  seg->tier = tier;
  Block* block = blocks_.New();
  block->ptr = seg->base;
  block->size = bytes;
  block->segment = seg;
  seg->first = block;
  segments_.insert(seg);
  InsertFree(block);
  seg->free_since = *ctx_.clock;
  release_order_.PushBack(seg);
  StatAdd(ctx_.stats->cached_bytes, kLargePool, static_cast<std::int64_t>(bytes));
  if (bytes > config_.max_split_size) ctx_.stats->oversize_segments.Add(1);
  // The new segment serves the request it was made for, whatever the admission rules for cached
  // blocks would say.
  Take(block, rounded, tier);
  return block;
}

void LargePool::Return(Block* block) {
  Segment* seg = block->segment;
  const Inactive before = InactiveOf(seg);
  DeviceStats& st = *ctx_.stats;
  const auto size = static_cast<std::int64_t>(block->size);
  StatAdd(st.active_bytes, kLargePool, -size);
  StatAdd(st.active, kLargePool, -1);
  StatAdd(st.cached_bytes, kLargePool, size);
  seg->active_blocks -= 1;
  block->state = BlockState::kFree;
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kFree) {
      RemoveFree(neighbour);
      block = MergeBlocks(block, neighbour, blocks_);
      ++st.num_merges;
    }
  }
  InsertFree(block);
  if (seg->active_blocks == 0) {
    seg->free_since = *ctx_.clock;
    release_order_.PushBack(seg);
  }
  UpdateInactiveSplit(before, seg);
}

std::uint64_t LargePool::OldestFree() const {
  const Segment* s = release_order_.front();
  return s == nullptr ? std::numeric_limits<std::uint64_t>::max() : s->free_since;
}

bool LargePool::ReleaseSegment(Segment* seg) {
  Block* block = seg->first;
  BA_CHECK(seg->active_blocks == 0 && block->next == nullptr && block->state == BlockState::kFree,
           "releasing a segment that is not wholly free");
  if (!ctx_.source->ReleaseSegment(seg->base, seg->size, kLargePool)) return false;  // stays cached
  RemoveFree(block);
  decltype(release_order_)::Unlink(seg);
  StatAdd(ctx_.stats->cached_bytes, kLargePool, -static_cast<std::int64_t>(seg->size));
  if (seg->size > config_.max_split_size) ctx_.stats->oversize_segments.Add(-1);
  segments_.erase(seg);
  blocks_.Delete(block);
  segment_meta_.Delete(seg);
  return true;
}

std::size_t LargePool::ReleaseOldest() {
  Segment* seg = release_order_.front();
  if (seg == nullptr) return 0;
  const std::size_t bytes = seg->size;
  return ReleaseSegment(seg) ? bytes : 0;
}

std::size_t LargePool::ReleaseFree(std::size_t target) {
  std::size_t released = 0;
  while (released < target) {
    const std::size_t n = ReleaseOldest();
    if (n == 0) break;
    released += n;
  }
  return released;
}

std::size_t LargePool::largest_free_block() const {
  std::size_t largest = 0;
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) largest = std::max(largest, b->size);
    }
  }
  return largest;
}

void LargePool::Fragmentation(PoolFragmentation* out, std::vector<TierUsage>* tiers) const {
  tiers->assign(config_.tiers.size(), TierUsage{});
  for (std::size_t t = 0; t < config_.tiers.size(); ++t) {
    (*tiers)[t].tier_bytes = static_cast<std::int64_t>(config_.tiers[t]);
  }
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (seg->tier >= 0) {
        (b->state == BlockState::kFree ? (*tiers)[seg->tier].cached : (*tiers)[seg->tier].in_use) += 1;
      }
      if (b->state != BlockState::kFree) continue;
      const auto size = static_cast<std::int64_t>(b->size);
      const int bin = std::min(Log2Floor(b->size), kHistogramBins - 1);
      out->free_count[bin] += 1;
      out->free_bytes[bin] += size;
      out->total_free += size;
      out->largest_free = std::max(out->largest_free, size);
    }
  }
}

absl::Status LargePool::CheckInvariants(std::int64_t active_blocks) const {
  auto fail = [](const Segment* seg, absl::string_view what) {
    return absl::InternalError(absl::StrCat("large pool: segment ", absl::Hex(seg->base), " (",
                                            seg->size, " bytes): ", what));
  };
  std::int64_t active = 0;
  std::int64_t in_order = 0;
  for (const Segment* s = release_order_.front(); s != nullptr; s = release_order_.next(s)) ++in_order;
  std::int64_t wholly_free = 0;
  for (const Segment* seg : segments_) {
    if (seg->first == nullptr || seg->first->ptr != seg->base || seg->first->prev != nullptr) {
      return fail(seg, "its first block does not start it");
    }
    std::uintptr_t expect = seg->base;
    std::int32_t seg_active = 0, seg_free = 0;
    std::size_t seg_free_bytes = 0;
    int blocks = 0;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      ++blocks;
      if (b->segment != seg) return fail(seg, "a block points to another segment");
      if (b->ptr != expect || b->size == 0) return fail(seg, "its blocks do not tile it");
      if (b->next != nullptr && b->next->prev != b) return fail(seg, "broken neighbour links");
      expect += b->size;
      if (b->state == BlockState::kFree) {
        ++seg_free;
        seg_free_bytes += b->size;
        if (!b->free_node.linked()) return fail(seg, "a free block is in no free list");
        if (b->next != nullptr && b->next->state == BlockState::kFree) {
          return fail(seg, "two neighbouring free blocks were not coalesced");
        }
      } else {
        ++seg_active;
        if (b->free_node.linked()) return fail(seg, "an active block is in a free list");
      }
    }
    if (expect != seg->base + seg->size) return fail(seg, "its blocks do not reach its end");
    if (seg_active != seg->active_blocks || seg_free != seg->free_blocks ||
        seg_free_bytes != seg->free_bytes) {
      return fail(seg, "its block counts are wrong");
    }
    if (seg->tier >= 0 && blocks != 1) return fail(seg, "a tier segment was split");
    if ((seg->active_blocks == 0) != seg->release_node.linked()) {
      return fail(seg, "release-order membership does not match its active blocks");
    }
    wholly_free += seg->active_blocks == 0;
    active += seg_active;
  }
  if (wholly_free != in_order) return absl::InternalError("large pool: release order is inconsistent");
  if (active != active_blocks) {
    return absl::InternalError(absl::StrCat("large pool: segments hold ", active,
                                            " active blocks but ", active_blocks, " are recorded"));
  }
  return absl::OkStatus();
}

absl::Status CheckStreamFreeLists(const LargePool::StreamState& ss, std::size_t num_tiers) {
  for (int bin = 0; bin < kNumBins; ++bin) {
    const bool bit = (ss.nonempty[bin >> 6] >> (bin & 63)) & 1;
    if (bit == ss.bins[bin].empty()) {
      return absl::InternalError(absl::StrCat("large pool: bitmap bit of bin ", bin, " is wrong"));
    }
    for (const Block* b = ss.bins[bin].front(); b != nullptr; b = ss.bins[bin].next(b)) {
      if (b->state != BlockState::kFree || BinOf(b->size) != bin || b->segment->tier >= 0 ||
          b->segment->owner != &ss) {
        return absl::InternalError(absl::StrCat("large pool: bin ", bin, " holds a block of size ",
                                                b->size, " that does not belong there"));
      }
    }
  }
  for (std::size_t t = 0; t < num_tiers; ++t) {
    for (const Block* b = ss.tier_free[t].front(); b != nullptr; b = ss.tier_free[t].next(b)) {
      if (b->state != BlockState::kFree || b->segment->tier != static_cast<int>(t)) {
        return absl::InternalError(absl::StrCat("large pool: tier ", t, " list holds a foreign block"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
