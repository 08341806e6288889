// src/pool/large_pool.cc — bins, best fit, split and coalesce, tiers, the release order, reports
// and checks of the large pool (pool/large_pool.h).
#include "pool/large_pool.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "absl/strings/str_cat.h"
#include "internal/bits.h"
#include "internal/check.h"
#include "pool/segment_backing.h"
#include "pool/stitcher.h"

namespace bucketalloc::internal {

static_assert(Pool<LargePool>);

namespace {

LargePool::StreamState& StateOf(const Segment* seg) { return *static_cast<LargePool::StreamState*>(seg->owner); }

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
    : ctx_(ctx),
      config_(std::move(config)),
      granule_shift_(config_.stitching ? std::countr_zero(config_.granularity) : 0) {
  BA_CHECK(!config_.stitching || config_.index == kLargePool, "only the large pool stitches");
  if (config_.stitching) {
    auto backing = std::make_unique<VirtualBacking>(ctx_, config_.granularity);
    stitcher_ = std::make_unique<Stitcher>(ctx_, backing.get());
    backing_ = std::move(backing);
  } else {
    backing_ = std::make_unique<PlainBacking>(ctx_.source);
  }
}

LargePool::~LargePool() = default;  // metadata lives in the object pools

inline InactiveSplit LargePool::InactiveOf(const Segment* seg) {
  if (seg->active_blocks == 0) return {};
  return {static_cast<std::int64_t>(seg->free_bytes), seg->free_blocks};
}

inline void LargePool::UpdateInactiveSplit(const InactiveSplit& before, const Segment* seg) {
  const InactiveSplit after = InactiveOf(seg);
  if (after.bytes != before.bytes)
    ctx_.stats->Add(&DeviceStats::inactive_split_bytes, config_.index, after.bytes - before.bytes);
  if (after.count != before.count)
    ctx_.stats->Add(&DeviceStats::inactive_split, config_.index, after.count - before.count);
}

std::size_t LargePool::WholeGranules(const Block* block, std::size_t* g0, std::size_t* g1) const {
  const std::uintptr_t base = block->segment->base;
  const std::size_t lo = RoundUp(block->ptr - base, config_.granularity) >> granule_shift_;
  const std::size_t hi = (block->ptr + block->size - base) >> granule_shift_;
  if (g0 != nullptr) *g0 = lo;
  if (g1 != nullptr) *g1 = hi;
  return hi > lo ? hi - lo : 0;
}

inline void LargePool::InsertFree(Block* block) {
  Segment* seg = block->segment;
  StreamState& ss = StateOf(seg);
  block->state = BlockState::kFree;
  seg->free_blocks += 1;
  seg->free_bytes += block->size;
  if (config_.stitching) free_granules_ += WholeGranules(block);
  if (seg->tier >= 0) {
    ss.tier_free[seg->tier].PushFront(block);
    return;
  }
  const int bin = BinOf(block->size);
  ss.bins[bin].PushFront(block);
  ss.nonempty[bin >> 6] |= std::uint64_t{1} << (bin & 63);
}

inline void LargePool::RemoveFree(Block* block) {
  Segment* seg = block->segment;
  FreeList::Unlink(block);
  seg->free_blocks -= 1;
  seg->free_bytes -= block->size;
  if (config_.stitching) free_granules_ -= WholeGranules(block);
  if (seg->tier >= 0) return;
  StreamState& ss = StateOf(seg);
  const int bin = BinOf(block->size);
  if (ss.bins[bin].empty()) ss.nonempty[bin >> 6] &= ~(std::uint64_t{1} << (bin & 63));
}

Block* LargePool::FindFree(StreamState& ss, std::size_t rounded) {
  // PyTorch's rule: the smallest admissible block, the lowest address among equals (blocks packed
  // toward the start of their segments coalesce into whole free segments more often). Bins hold 4
  // sizes per power of two, so the best fit is in the first bin that has an admissible block, and
  // that bin is read whole: a scan cut short (it once stopped at 32 entries) hands out a block
  // that is not the best fit, and the layouts drift apart from PyTorch's (on a growth trace,
  // 0.15% more memory than PyTorch's policy needs).
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
    for (Block* b = ss.bins[bin].front(); b != nullptr; b = ss.bins[bin].next(b)) {
      if (b->size < rounded || !Admissible(b->size, rounded)) continue;
      if (better(b, best)) best = b;
    }
    if (best != nullptr) return best;
  }
  return nullptr;
}

Block* LargePool::FindAndTake(StreamState& ss, const Request& r) {
  Block* block = r.tier >= 0 ? ss.tier_free[r.tier].front() : FindFree(ss, r.rounded);
  if (block != nullptr) Take(block, r.rounded, r.tier);
  return block;
}

inline void LargePool::Activate(Block* block) {
  Segment* seg = block->segment;
  block->state = BlockState::kAllocated;
  seg->active_blocks += 1;
  decltype(release_order_)::Remove(seg);
  const auto size = static_cast<std::int64_t>(block->size);
  ctx_.stats->Increase(&DeviceStats::active_bytes, config_.index, size);
  ctx_.stats->Increase(&DeviceStats::active, config_.index, 1);
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, config_.index, size);
}

void LargePool::Take(Block* block, std::size_t rounded, int tier) {
  Segment* seg = block->segment;
  const InactiveSplit before = InactiveOf(seg);
  RemoveFree(block);
  if (tier < 0 && ShouldSplit(block, rounded)) {
    InsertFree(SplitBlock(block, rounded, blocks_));
    ctx_.stats->Count(&DeviceStats::num_splits);
  }
  Activate(block);
  UpdateInactiveSplit(before, seg);
}

absl::StatusOr<Block*> LargePool::Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded,
                                       int tier) {
  BA_DCHECK(bytes >= rounded, "a segment smaller than its request");
  absl::StatusOr<Segment*> seg = backing_->Grow(*this, ss, stream, bytes, tier);
  if (!seg.ok()) return seg.status();
  // The new segment serves the request it was made for, whatever the admission rules for cached
  // blocks would say.
  Take((*seg)->first, rounded, tier);
  return (*seg)->first;
}

absl::StatusOr<LargePool::Handle> LargePool::Serve(StreamState& ss, Stream stream, const Request& r, Served* served) {
  if (Block* block = FindAndTake(ss, r)) {
    *served = Served::kFromCache;
    return Handle{block};
  }
  const std::size_t minimal = RoundUp(r.rounded, config_.granularity);
  const std::size_t preferred = r.tier >= 0 ? minimal : SegmentSizeFor(r.rounded);
  absl::StatusOr<Block*> block = Grow(ss, stream, preferred, r.rounded, r.tier);
  if (absl::IsResourceExhausted(block.status()) && preferred != minimal) {
    block = Grow(ss, stream, minimal, r.rounded, r.tier);
  }
  *served = Served::kFromNewMemory;
  if (block.ok()) return Handle{*block};
  // No stitching during a capture: it unmaps granules, which CUDA forbids then.
  if (!absl::IsResourceExhausted(block.status()) || stitcher_ == nullptr || ctx_.source->Capturing()) {
    return block.status();
  }
  // At the cap, with stitching: the granules of free blocks.
  absl::StatusOr<Block*> stitched = stitcher_->Stitch(*this, ss, stream, r.rounded, r.tier);
  if (stitched.ok()) return Handle{*stitched};
  // A failed stitch changed nothing a caller can see (even a backend fault): release-and-retry
  // and the OOM report follow, which names both failures.
  return absl::ResourceExhaustedError(
      absl::StrCat(block.status().message(), "; stitching: ", stitched.status().message()));
}

Segment* LargePool::AddSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes, int tier,
                               const std::vector<PhysicalHandle>* granules) {
  Segment* seg = segment_meta_.New();
  seg->base = base;
  seg->size = bytes;
  seg->stream = stream;
  seg->owner = &ss;
  seg->tier = tier;
  const std::size_t g = granules == nullptr ? bytes : config_.granularity;
  const std::size_t n = granules == nullptr ? 1 : granules->size();
  BA_DCHECK(granules == nullptr || n * g == bytes, "a segment's granules do not cover it");
  std::size_t mapped = 0;
  Block* prev = nullptr;
  for (std::size_t i = 0; i < n;) {
    const bool hole = granules != nullptr && (*granules)[i] == 0;
    std::size_t j = i + 1;
    while (j < n && ((*granules)[j] == 0) == hole) ++j;
    Block* block = blocks_.New();
    block->ptr = base + i * g;
    block->size = (j - i) * g;
    block->segment = seg;
    block->prev = prev;
    block->free_since = *ctx_.clock;
    (prev == nullptr ? seg->first : prev->next) = block;
    if (hole) {
      block->state = BlockState::kUnmapped;
    } else {
      InsertFree(block);
      mapped += block->size;
    }
    prev = block;
    i = j;
  }
  segments_.insert(seg);
  release_order_.Push(seg, *ctx_.clock);
  ctx_.stats->Increase(&DeviceStats::cached_bytes, config_.index, static_cast<std::int64_t>(mapped));
  if (bytes > config_.max_split_size) ctx_.stats->device(&DeviceStats::oversize_segments).Increase(1);
  return seg;
}

void LargePool::DropSegment(Segment* seg) {
  BA_DCHECK(seg->active_blocks == 0 && seg->free_blocks == 0, "dropping a segment that holds blocks");
  decltype(release_order_)::Remove(seg);
  if (seg->size > config_.max_split_size) ctx_.stats->device(&DeviceStats::oversize_segments).Decrease(1);
  for (Block* b = seg->first; b != nullptr;) {
    Block* next = b->next;
    blocks_.Delete(b);
    b = next;
  }
  backing_->Forget(seg);
  segments_.erase(seg);
  segment_meta_.Delete(seg);
}

void LargePool::DropFreeSegment(Segment* seg) {
  RemoveFree(seg->first);
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, config_.index, static_cast<std::int64_t>(seg->size));
  DropSegment(seg);
}

void LargePool::MakeHole(Block* block, std::uintptr_t lo, std::uintptr_t hi) {
  Segment* seg = block->segment;
  const InactiveSplit before = InactiveOf(seg);
  RemoveFree(block);
  seg->tier = -1;
  if (block->ptr < lo) {
    Block* mid = SplitBlock(block, lo - block->ptr, blocks_);
    InsertFree(block);
    block = mid;
  }
  if (block->ptr + block->size > hi) InsertFree(SplitBlock(block, hi - block->ptr, blocks_));
  block->state = BlockState::kUnmapped;
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, config_.index, static_cast<std::int64_t>(block->size));
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kUnmapped)
      block = MergeBlocks(block, neighbour, blocks_);
  }
  UpdateInactiveSplit(before, seg);
}

void LargePool::Return(Handle h) {
  Block* block = h.block;
  Segment* seg = block->segment;
  const InactiveSplit before = InactiveOf(seg);
  const auto size = static_cast<std::int64_t>(block->size);
  ctx_.stats->Decrease(&DeviceStats::active_bytes, config_.index, size);
  ctx_.stats->Decrease(&DeviceStats::active, config_.index, 1);
  ctx_.stats->Increase(&DeviceStats::cached_bytes, config_.index, size);
  seg->active_blocks -= 1;
  block->state = BlockState::kFree;
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kFree) {
      RemoveFree(neighbour);
      block = MergeBlocks(block, neighbour, blocks_);
      ctx_.stats->Count(&DeviceStats::num_merges);
    }
  }
  block->free_since = *ctx_.clock;
  InsertFree(block);
  if (seg->active_blocks == 0) release_order_.Push(seg, *ctx_.clock);
  UpdateInactiveSplit(before, seg);
}

std::size_t LargePool::ReleaseOldest() {
  Segment* seg = release_order_.Oldest();
  if (seg == nullptr) return 0;
  BA_CHECK(seg->active_blocks == 0, "releasing a segment that is not wholly free");
  const std::size_t bytes = MappedBytes(*seg);
  return backing_->Release(*this, seg) ? bytes : 0;
}

void LargePool::ReleaseAll() {
  ReleaseOldestUntil(*this, std::numeric_limits<std::size_t>::max());
  if (stitcher_ != nullptr) stitcher_->ReleaseFreeGranules(*this);
}

std::size_t LargePool::spare_bytes() const { return backing_->spare_bytes(); }

std::size_t LargePool::MappedBytes(const Segment& seg) const {
  std::size_t holes = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) holes += b->state == BlockState::kUnmapped ? b->size : 0;
  return seg.size - holes;
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

void LargePool::AddFragmentation(FragmentationReport* report) const {
  PoolFragmentation& out = report->pools[config_.index];
  std::vector<TierUsage>& tiers = report->tiers;
  if (num_tiers() > 0) {  // the tiers are the large pool's; a pool without them leaves the report's alone
    tiers.assign(config_.tiers.size(), TierUsage{});
    for (std::size_t t = 0; t < config_.tiers.size(); ++t)
      tiers[t].tier_bytes = static_cast<std::int64_t>(config_.tiers[t]);
  }
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kUnmapped) continue;
      if (seg->tier >= 0) (b->state == BlockState::kFree ? tiers[seg->tier].cached : tiers[seg->tier].in_use) += 1;
      if (b->state == BlockState::kFree) out.AddFree(b->size);
    }
  }
}

void LargePool::Describe(std::vector<SpanView>* spans) const {
  for (const Segment* s : segments_) {
    // A stitched segment's holes are not memory: each mapped run is a span of its own.
    SpanView* span = nullptr;
    for (const Block* b = s->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kUnmapped) {
        span = nullptr;
        continue;
      }
      if (span == nullptr) {
        span = &spans->emplace_back();
        span->base = b->ptr;
        span->stream = s->stream;
        span->pool = config_.index;
        span->tier = s->tier;
        span->virtual_memory = config_.stitching;
      }
      span->size += b->size;
      span->blocks.push_back({b->ptr, b->size, b->state != BlockState::kFree});
    }
  }
}

InactiveSplit LargePool::inactive_split() const {
  InactiveSplit split;
  for (const Segment* s : segments_) {
    const InactiveSplit of = InactiveOf(s);
    split.bytes += of.bytes;
    split.count += of.count;
  }
  return split;
}

absl::Status LargePool::CheckInvariants(std::int64_t active_blocks) const {
  auto fail = [](const Segment* seg, absl::string_view what) {
    return absl::InternalError(
        absl::StrCat("large pool: segment ", absl::Hex(seg->base), " (", seg->size, " bytes): ", what));
  };
  std::int64_t active = 0;
  std::int64_t wholly_free = 0;
  std::size_t whole = 0;
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
      if (b->state == BlockState::kUnmapped) {
        if (b->free_node.linked()) return fail(seg, "a hole is in a free list");
        if (b->next != nullptr && b->next->state == BlockState::kUnmapped) return fail(seg, "two neighbouring holes");
      } else if (b->state == BlockState::kFree) {
        ++seg_free;
        seg_free_bytes += b->size;
        if (config_.stitching) whole += WholeGranules(b);
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
    if (seg_active != seg->active_blocks || seg_free != seg->free_blocks || seg_free_bytes != seg->free_bytes) {
      return fail(seg, "its block counts are wrong");
    }
    if (seg->tier >= 0 && blocks != 1) return fail(seg, "a tier segment was split");
    if (seg_active + seg_free == 0) return fail(seg, "it is all hole but was not released");
    if ((seg->active_blocks == 0) != decltype(release_order_)::Contains(seg)) {
      return fail(seg, "release-order membership does not match its active blocks");
    }
    wholly_free += seg->active_blocks == 0;
    active += seg_active;
  }
  if (wholly_free != release_order_.Count()) return absl::InternalError("large pool: release order is inconsistent");
  if (absl::Status s = backing_->CheckInvariants(*this); !s.ok()) return s;
  if (whole != free_granules_) {
    return absl::InternalError(
        absl::StrCat("large pool: free blocks hold ", whole, " whole granules but ", free_granules_, " are counted"));
  }
  if (active != active_blocks) {
    return absl::InternalError(
        absl::StrCat("large pool: segments hold ", active, " active blocks but ", active_blocks, " are recorded"));
  }
  if (segments_.size() != segment_meta_.live()) {
    return absl::InternalError("large pool: segment metadata is held that belongs to no segment");
  }
  return absl::OkStatus();
}

absl::Status LargePool::CheckHandle(Handle h, bool live) const {
  const Block* b = h.block;
  if (!segments_.contains(b->segment)) return absl::InternalError("large pool: a handle names a block of no segment");
  if (b->state != (live ? BlockState::kAllocated : BlockState::kPendingFree)) {
    return absl::InternalError(absl::StrCat("block ", absl::Hex(b->ptr), " has the wrong state"));
  }
  return absl::OkStatus();
}

absl::Status LargePool::CheckStreamState(const StreamState& ss) const {
  for (int bin = 0; bin < kNumBins; ++bin) {
    const bool bit = (ss.nonempty[bin >> 6] >> (bin & 63)) & 1;
    if (bit == ss.bins[bin].empty()) {
      return absl::InternalError(absl::StrCat("large pool: bitmap bit of bin ", bin, " is wrong"));
    }
    for (const Block* b = ss.bins[bin].front(); b != nullptr; b = ss.bins[bin].next(b)) {
      if (b->state != BlockState::kFree || BinOf(b->size) != bin || b->segment->tier >= 0 || b->segment->owner != &ss) {
        return absl::InternalError(
            absl::StrCat("large pool: bin ", bin, " holds a block of size ", b->size, " that does not belong there"));
      }
    }
  }
  for (std::size_t t = 0; t < num_tiers(); ++t) {
    for (const Block* b = ss.tier_free[t].front(); b != nullptr; b = ss.tier_free[t].next(b)) {
      if (b->state != BlockState::kFree || b->segment->tier != static_cast<int>(t)) {
        return absl::InternalError(absl::StrCat("large pool: tier ", t, " list holds a foreign block"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
