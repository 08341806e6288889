// src/pool/large_pool.cc — bins, best fit, split and coalesce, tiers, the release order, reports
// and checks of the large pool (pool/large_pool.h).
#include "pool/large_pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "internal/bits.h"
#include "internal/check.h"

namespace bucketalloc::internal {

static_assert(Pool<LargePool>);

namespace {

LargePool::StreamState& StateOf(const Segment* seg) { return *static_cast<LargePool::StreamState*>(seg->owner); }

}  // namespace

LargePool::LargePool(const PoolContext& ctx, LargePoolConfig config, std::unique_ptr<SegmentBacking> backing)
    : ctx_(ctx), config_(std::move(config)), backing_(std::move(backing)) {
  BA_CHECK(backing_ != nullptr, "a large pool without a segment backing");
  const auto& d = config_.roundup_power2_divisions;
  if (std::any_of(d.begin(), d.end(), [](std::uint32_t div) { return div > 1; })) divisions_ = d;
  tier_use_.resize(config_.tiers.size());
  tier_segments_.assign(config_.tiers.size(), 0);
  for (std::size_t t = 0; t < config_.tiers.size(); ++t) {
    tier_use_[t].tier_bytes = static_cast<std::int64_t>(config_.tiers[t]);
  }
}

// Metadata lives in the object pools. A return still deferred is dropped with the pool (the stream
// states it would touch may be gone already; an owner that keeps the ledger releases the pool,
// which settles, before it destroys it): the ledger must not keep a destroyed debtor.
LargePool::~LargePool() {
  if (ctx_.stats->owes(this)) ctx_.stats->Forgive();
}

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

inline void LargePool::InsertFree(Block* block) {
  Segment* seg = block->segment;
  StreamState& ss = StateOf(seg);
  block->state = BlockState::kFree;
  seg->free_blocks += 1;
  seg->free_bytes += block->size;
  free_.Add(block->size);
  if (seg->tier >= 0) {
    tier_use_[seg->tier].cached += 1;
    ss.tier_free[seg->tier].PushFront(block);
  } else {
    ss.tree.Insert(block);
  }
  ++list_changes_;
}

inline void LargePool::RemoveFree(Block* block) {
  Segment* seg = block->segment;
  if (seg->tier >= 0) {
    tier_use_[seg->tier].cached -= 1;
    FreeList::Unlink(block);
  } else {
    StateOf(seg).tree.Erase(block);
  }
  seg->free_blocks -= 1;
  seg->free_bytes -= block->size;
  free_.Remove(block->size);
  ++list_changes_;
}

Block* LargePool::FindFree(StreamState& ss, std::size_t rounded) {
  // PyTorch's rule: the smallest admissible block, the lowest address among equals (blocks packed
  // toward the start of their segments coalesce into whole free segments more often), which is the
  // stream's size tree's lower bound. A larger block than that one is admissible only if it is,
  // so a miss there is a miss. (Binned lists scanned at most 32 entries deep once handed out blocks
  // that were not the best fit; read whole, a bin of thousands of equal blocks cost microseconds.)
  Block* best = ss.tree.LowerBound(rounded);
  return best != nullptr && Admissible(best->size, rounded) ? best : nullptr;
}

Block* LargePool::FindAndTake(StreamState& ss, Request r) {
  if (deferred_ != nullptr) {
    if (Block* block = TakeDeferred(ss, r)) return block;
  }
  Settle();  // this pool's deferred return, or another pool's
  if (r.tier >= 0) {
    Block* block = ss.tier_free[r.tier].front();
    if (block != nullptr) Take(block, r.rounded, r.tier);
    return block;
  }
  Block* block = FindFree(ss, r.rounded);
  if (block == nullptr) return nullptr;
  Take(block, r.rounded, r.tier);
  RememberBestFit(block);  // split at its size (its rest is `next`) or taken whole
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
  BA_CHECK(deferred_ == nullptr, "a block-level call with a block deferred (call it after a settling one)");
  if (tier < 0 && ShouldSplit(block->size, rounded)) {
    InsertFree(SplitBlock(block, rounded, blocks_));
    ctx_.stats->Count(&DeviceStats::num_splits);
  }
  Activate(block);
  UpdateInactiveSplit(before, seg);
}

bool LargePool::IsBestFitOnReturn(const StreamState& ss, const Block* block, const Block* next,
                                  std::size_t rounded) const {
  const std::size_t merged = block->size + (next != nullptr ? next->size : 0);
  // The merged block must be admissible and, with a neighbour, split at `rounded` (its remainder
  // is then `next` as it stands) ...
  if (!Admissible(merged, rounded) || (next != nullptr && !ShouldSplit(merged, rounded))) return false;
  // ... and best fit: no free block of the stream comes before it in (size, address) order (the
  // tree holds `next`, which the merged block would replace).
  const Block* rival = ss.tree.LowerBound(rounded);
  if (rival != nullptr && rival == next) rival = ss.tree.After(next);
  return rival == nullptr || !(rival->size < merged || (rival->size == merged && rival->ptr < block->ptr));
}

inline Block* LargePool::TakeDeferred(StreamState& ss, Request r) {
  Block* block = deferred_;
  Segment* seg = block->segment;
  if (r.tier >= 0 || block->size != r.rounded || &StateOf(seg) != &ss) return nullptr;
  // Its return would merge it with `next` (its previous neighbour is not free), and that block must
  // be what best fit gives for r: known while the lists stand as when it was handed out as such.
  Block* next = block->next != nullptr && block->next->state == BlockState::kFree ? block->next : nullptr;
  if (IsRememberedBestFit(block)) {
    BA_DCHECK(IsBestFitOnReturn(ss, block, next, r.rounded), "the deferred block's best-fit verdict is stale");
  } else {
    if (!IsBestFitOnReturn(ss, block, next, r.rounded)) return nullptr;
    RememberBestFit(block);
  }
  // The return and the take, net: the lists, the histogram and the segment's counts end as they
  // are; the gauges' totals move both ways, and the peaks see the return's state in between.
  deferred_ = nullptr;
  ctx_.stats->Forgive();
  ++taken_back_;
  const auto size = static_cast<std::int64_t>(block->size);
  ctx_.stats->Dip(&DeviceStats::active_bytes, config_.index, size);
  ctx_.stats->Dip(&DeviceStats::active, config_.index, 1);
  ctx_.stats->Rise(&DeviceStats::cached_bytes, config_.index, size);
  const InactiveSplit now = InactiveOf(seg);
  const InactiveSplit between = seg->active_blocks == 1
                                    ? InactiveSplit{}
                                    : InactiveSplit{now.bytes + size, now.count + (next != nullptr ? 0 : 1)};
  ctx_.stats->Excursion(&DeviceStats::inactive_split_bytes, config_.index, between.bytes - now.bytes);
  ctx_.stats->Excursion(&DeviceStats::inactive_split, config_.index, between.count - now.count);
  // (The block's and the segment's free times are read only while free and in the release order,
  // and are written again when they next become so: only the remainder's is kept.)
  if (next != nullptr) {
    next->free_since = deferred_since_;  // the split's remainder keeps the merged block's time
    ctx_.stats->Count(&DeviceStats::num_merges);
    ctx_.stats->Count(&DeviceStats::num_splits);
  }
  return block;
}

void LargePool::PayStats() {
  Block* block = deferred_;
  deferred_ = nullptr;
  ReturnNow(block, deferred_since_);
}

absl::StatusOr<LargePool::Handle> LargePool::TakeAt(std::uintptr_t addr, std::size_t size, Stream stream) {
  Settle();
  const char* pool_name = config_.index == kLargePool ? "large pool" : "packed small pool";
  auto refuse = [&](absl::string_view why) {
    return absl::StrCat("cannot allocate ", size, " bytes at 0x", absl::Hex(addr), " in the ", pool_name, ": ", why);
  };
  Segment* seg = nullptr;
  for (Segment* s : segments_) {
    if (addr >= s->base && addr - s->base < s->size) {
      seg = s;
      break;
    }
  }
  if (seg == nullptr) return absl::NotFoundError(refuse("no segment of this pool holds that address"));
  if (size == 0 || size % kMinBlockSize != 0 || (addr - seg->base) % kMinBlockSize != 0) {
    return absl::InvalidArgumentError(
        refuse(absl::StrCat("accepted: a block size that is a positive multiple of ", kMinBlockSize,
                            " bytes at an offset of a multiple of ", kMinBlockSize, " bytes in its segment (offset ",
                            addr - seg->base, ")")));
  }
  if (seg->stream != stream) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("its segment at 0x", absl::Hex(seg->base), " belongs to stream 0x",
                            absl::Hex(reinterpret_cast<std::uintptr_t>(seg->stream)), ", not to stream 0x",
                            absl::Hex(reinterpret_cast<std::uintptr_t>(stream)))));
  }
  Block* block = seg->first;
  while (block != nullptr && block->ptr + block->size <= addr) block = block->next;
  BA_DCHECK(block != nullptr && block->ptr <= addr, "a segment's blocks do not tile it");
  if (block->state != BlockState::kFree) {
    return absl::FailedPreconditionError(refuse(absl::StrCat(
        "it lies in a block at 0x", absl::Hex(block->ptr), " of ", block->size, " bytes that is ",
        block->state == BlockState::kUnmapped ? "a hole (unmapped)" : "in use (live or awaiting stream events)")));
  }
  const std::uintptr_t end = block->ptr + block->size;
  if (size > end - addr) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("the free block at 0x", absl::Hex(block->ptr), " of ", block->size, " bytes ends at 0x",
                            absl::Hex(end), ", before the range does")));
  }
  const bool whole = addr == block->ptr && size == block->size;
  if (!whole && seg->tier >= 0) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("the free block at 0x", absl::Hex(block->ptr), " is a whole segment of tier ", seg->tier,
                            " (", block->size, " bytes), which is never split")));
  }
  if (!whole && block->size > config_.max_split_size) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("the free block at 0x", absl::Hex(block->ptr), " of ", block->size,
                            " bytes is above max_split_size (", config_.max_split_size, "), so it is never split")));
  }
  // Carve it as Take does, with a remainder on either side.
  const InactiveSplit before = InactiveOf(seg);
  RemoveFree(block);
  if (block->ptr < addr) {
    Block* mid = SplitBlock(block, addr - block->ptr, blocks_);
    InsertFree(block);
    ctx_.stats->Count(&DeviceStats::num_splits);
    block = mid;
  }
  if (block->size > size) {
    InsertFree(SplitBlock(block, size, blocks_));
    ctx_.stats->Count(&DeviceStats::num_splits);
  }
  Activate(block);
  UpdateInactiveSplit(before, seg);
  return Handle{block};
}

absl::StatusOr<Block*> LargePool::Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded,
                                       int tier) {
  BA_DCHECK(bytes >= rounded, "a segment smaller than its request");
  Settle();
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
  *served = Served::kFromNewMemory;
  // A plain request where the backing grows segments in place (virtual memory): new memory beside
  // the stream's free bytes (FindAndTake settled on its miss, so block-level calls may follow);
  // else a new segment.
  std::optional<absl::StatusOr<Block*>> grown;
  if (r.tier < 0) grown = backing_->Extend(*this, ss, stream, r.rounded);
  if (!grown.has_value()) {
    const std::size_t minimal = RoundUp(r.rounded, config_.granularity);
    const std::size_t preferred = r.tier >= 0 ? minimal : SegmentSizeFor(r.rounded);
    grown = Grow(ss, stream, preferred, r.rounded, r.tier);
    if (absl::IsResourceExhausted(grown->status()) && preferred != minimal) {
      grown = Grow(ss, stream, minimal, r.rounded, r.tier);
    }
  }
  absl::StatusOr<Block*>& block = *grown;
  if (block.ok()) return Handle{*block};
  if (!absl::IsResourceExhausted(block.status())) return block.status();
  // At the cap: whatever else the backing can do (nullopt: nothing).
  std::optional<absl::StatusOr<Block*>> at_cap = backing_->ServeAtCap(*this, ss, stream, r.rounded, r.tier);
  if (!at_cap.has_value()) return block.status();
  if (at_cap->ok()) return Handle{**at_cap};
  // A failure there changed nothing a caller can see (even a backend fault): release-and-retry
  // and the OOM report follow, which names both failures.
  return absl::ResourceExhaustedError(absl::StrCat(block.status().message(), "; ", at_cap->status().message()));
}

Segment* LargePool::AddSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes, int tier,
                               std::size_t mapped) {
  BA_CHECK(deferred_ == nullptr, "a block-level call with a block deferred (call it after a settling one)");
  mapped = std::min(mapped, bytes);
  BA_DCHECK(mapped > 0, "a segment with nothing mapped");
  Segment* seg = segment_meta_.New();
  seg->base = base;
  seg->size = bytes;
  seg->stream = stream;
  seg->owner = &ss;
  seg->tier = tier;
  if (tier >= 0) tier_segments_[tier] += 1;
  Block* block = blocks_.New();
  block->ptr = base;
  block->size = mapped;
  block->segment = seg;
  block->free_since = *ctx_.clock;
  seg->first = block;
  InsertFree(block);
  if (mapped < bytes) {
    Block* hole = blocks_.New();
    hole->ptr = base + mapped;
    hole->size = bytes - mapped;
    hole->segment = seg;
    hole->prev = block;
    hole->state = BlockState::kUnmapped;
    block->next = hole;
  }
  segments_.insert(seg);
  release_order_.Push(seg, *ctx_.clock);
  ctx_.stats->Increase(&DeviceStats::cached_bytes, config_.index, static_cast<std::int64_t>(mapped));
  if (bytes > config_.max_split_size) ctx_.stats->device(&DeviceStats::oversize_segments).Increase(1);
  return seg;
}

void LargePool::DropSegment(Segment* seg) {
  BA_CHECK(deferred_ == nullptr, "a block-level call with a block deferred (call it after a settling one)");
  BA_DCHECK(seg->active_blocks == 0 && seg->free_blocks == 0, "dropping a segment that holds blocks");
  decltype(release_order_)::Remove(seg);
  if (seg->tier >= 0) tier_segments_[seg->tier] -= 1;
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
  BA_CHECK(deferred_ == nullptr, "a block-level call with a block deferred (call it after a settling one)");
  Segment* seg = block->segment;
  const InactiveSplit before = InactiveOf(seg);
  RemoveFree(block);
  if (seg->tier >= 0) tier_segments_[seg->tier] -= 1;
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

Block* LargePool::FillHole(Block* hole, std::uintptr_t lo, std::uintptr_t hi) {
  BA_CHECK(deferred_ == nullptr, "a block-level call with a block deferred (call it after a settling one)");
  BA_DCHECK(hole->state == BlockState::kUnmapped && lo >= hole->ptr && lo < hi && hi <= hole->ptr + hole->size,
            "filling a range that is not inside a hole");
  Segment* seg = hole->segment;
  const InactiveSplit before = InactiveOf(seg);
  Block* block = hole;
  if (block->ptr < lo) block = SplitBlock(block, lo - block->ptr, blocks_);
  if (block->ptr + block->size > hi) SplitBlock(block, hi - block->ptr, blocks_)->state = BlockState::kUnmapped;
  block->state = BlockState::kFree;
  // New memory is free from now; merged with the free block before it, it takes that block's age
  // (MergeBlocks keeps the lower block's), so that a stitch, oldest first, may move it again. (Now
  // for the merged block was measured too: 0.001 x peak live more on mooncake Llama growth.)
  block->free_since = *ctx_.clock;
  ctx_.stats->Increase(&DeviceStats::cached_bytes, config_.index, static_cast<std::int64_t>(hi - lo));
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kFree) {
      RemoveFree(neighbour);
      block = MergeBlocks(block, neighbour, blocks_);
    }
  }
  InsertFree(block);
  UpdateInactiveSplit(before, seg);
  return block;
}

void LargePool::Return(Handle h) {
  Settle();
  Block* block = h.block;
  if (config_.defer_free && block->segment->tier < 0 &&
      (block->prev == nullptr || block->prev->state != BlockState::kFree)) [[likely]] {
    block->state = BlockState::kAllocated;  // was kPendingFree when it awaited stream events: active either way
    deferred_ = block;
    deferred_since_ = *ctx_.clock;
    ctx_.stats->Owe(this);
    return;
  }
  ReturnNow(block, *ctx_.clock);
}

void LargePool::ReturnNow(Block* block, std::uint64_t since) {
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
  block->free_since = since;
  InsertFree(block);
  if (seg->active_blocks == 0) release_order_.Push(seg, since);
  UpdateInactiveSplit(before, seg);
}

std::size_t LargePool::ReleaseOldest() {
  Settle();
  Segment* seg = release_order_.Oldest();
  if (seg == nullptr) return 0;
  BA_CHECK(seg->active_blocks == 0, "releasing a segment that is not wholly free");
  const std::size_t bytes = MappedBytes(*seg);
  return backing_->Release(*this, seg) ? bytes : 0;
}

void LargePool::ReleaseAll() {
  Settle();
  ReleaseOldestUntil(*this, std::numeric_limits<std::size_t>::max());
  backing_->ReleaseFreeMemory(*this);
}

std::size_t LargePool::spare_bytes() const { return backing_->spare_bytes(); }

std::size_t LargePool::movable_bytes() const {
  Settle();
  return backing_->MovableBytes(*this);
}

std::size_t LargePool::MappedBytes(const Segment& seg) const {
  std::size_t holes = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) holes += b->state == BlockState::kUnmapped ? b->size : 0;
  return seg.size - holes;
}

std::size_t LargePool::largest_free_block() const {
  Settle();
  std::size_t largest = 0;
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) largest = std::max(largest, b->size);
    }
  }
  return largest;
}

// The device's large pool and every private pool's share the tiers: the first sizes the report's
// list, each adds its counts (a pool without tiers, the packed small pool, leaves it alone).
static void AddTierUse(const std::vector<TierUsage>& use, FragmentationReport* report) {
  if (use.empty()) return;
  std::vector<TierUsage>& tiers = report->tiers;
  if (tiers.size() != use.size()) {
    tiers.assign(use.size(), TierUsage{});
    for (std::size_t t = 0; t < use.size(); ++t) tiers[t].tier_bytes = use[t].tier_bytes;
  }
  for (std::size_t t = 0; t < use.size(); ++t) {
    tiers[t].in_use += use[t].in_use;
    tiers[t].cached += use[t].cached;
  }
}

void LargePool::AddFragmentation(FragmentationReport* report) const {
  Settle();
  free_.AddTo(&report->pools[config_.index]);
  AddTierUse(TierUse(), report);
}

std::vector<TierUsage> LargePool::TierUse() const {
  std::vector<TierUsage> use = tier_use_;  // the cached blocks, kept by Insert/RemoveFree
  for (std::size_t t = 0; t < use.size(); ++t) use[t].in_use = tier_segments_[t] - use[t].cached;
  return use;
}

std::size_t LargePool::LargestFree(const StreamState& ss) const {
  Settle();
  const Block* last = ss.tree.Last();
  std::size_t largest = last == nullptr ? 0 : last->size;
  for (std::size_t t = 0; t < num_tiers(); ++t) {
    if (const Block* b = ss.tier_free[t].front()) largest = std::max(largest, b->size);
  }
  return largest;
}

void LargePool::WalkFragmentation(FragmentationReport* report) const {
  Settle();
  PoolFragmentation& out = report->pools[config_.index];
  std::vector<TierUsage>& tiers = report->tiers;
  // The device's large pool and every private pool's share the tiers: the first sizes the list,
  // each adds its counts (a pool without tiers, the packed small pool, leaves it alone).
  if (num_tiers() > 0 && tiers.size() != config_.tiers.size()) {
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
  Settle();
  const bool virtual_memory = backing_->virtual_memory();
  for (const Segment* s : segments_) {
    // A segment's holes are not memory: each mapped run is a span of its own.
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
        span->virtual_memory = virtual_memory;
      }
      span->size += b->size;
      span->blocks.push_back({b->ptr, b->size, b->state != BlockState::kFree});
    }
  }
}

InactiveSplit LargePool::inactive_split() const {
  Settle();
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
  if (const Block* d = deferred_; d != nullptr) {
    // The deferred block's own rules; settled, every rule below holds with its figures.
    if (!segments_.contains(d->segment) || d->segment->tier >= 0 || d->state != BlockState::kAllocated ||
        d->tree_node.linked || d->free_node.linked() || (d->prev != nullptr && d->prev->state == BlockState::kFree) ||
        !ctx_.stats->owes(this)) {
      return fail(d->segment,
                  "the block whose return is deferred breaks its rules (allocated, in no list, no free block "
                  "before it, the ledger's debtor)");
    }
    Settle();
  } else if (ctx_.stats->owes(this)) {
    return absl::InternalError("large pool: the ledger's debtor with no deferred return");
  }
  std::int64_t active = 0;
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
      if (b->state == BlockState::kUnmapped) {
        if (b->free_node.linked() || b->tree_node.linked) return fail(seg, "a hole is in a free list");
        if (b->next != nullptr && b->next->state == BlockState::kUnmapped) return fail(seg, "two neighbouring holes");
      } else if (b->state == BlockState::kFree) {
        ++seg_free;
        seg_free_bytes += b->size;
        if (b->free_node.linked() == b->tree_node.linked)
          return fail(seg, "a free block is not in exactly one free list");
        if (b->next != nullptr && b->next->state == BlockState::kFree) {
          return fail(seg, "two neighbouring free blocks were not coalesced");
        }
      } else {
        ++seg_active;
        if (b->free_node.linked() || b->tree_node.linked) return fail(seg, "an active block is in a free list");
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
  if (active != active_blocks) {
    return absl::InternalError(
        absl::StrCat("large pool: segments hold ", active, " active blocks but ", active_blocks, " are recorded"));
  }
  if (segments_.size() != segment_meta_.live()) {
    return absl::InternalError("large pool: segment metadata is held that belongs to no segment");
  }
  FragmentationReport walked;
  WalkFragmentation(&walked);
  if (!free_.Matches(walked.pools[config_.index])) {
    return absl::InternalError(absl::StrCat("large pool: the kept free-block histogram (", free_.total(),
                                            " bytes) differs from a walk's (", walked.pools[config_.index].total_free,
                                            " bytes)"));
  }
  const std::vector<TierUsage> kept = TierUse();
  for (std::size_t t = 0; t < kept.size(); ++t) {
    if (walked.tiers[t].in_use != kept[t].in_use || walked.tiers[t].cached != kept[t].cached) {
      return absl::InternalError(absl::StrCat("large pool: tier ", t, " counts ", kept[t].in_use, " in use and ",
                                              kept[t].cached, " cached, a walk ", walked.tiers[t].in_use, " and ",
                                              walked.tiers[t].cached));
    }
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
  Settle();
  if (const char* error = ss.tree.Check(); error != nullptr)
    return absl::InternalError(absl::StrCat("large pool: ", error));
  absl::Status status;
  ss.tree.ForEach([&](const Block* b) {
    if (status.ok() && (b->state != BlockState::kFree || b->segment->tier >= 0 || b->segment->owner != &ss)) {
      status = absl::InternalError(
          absl::StrCat("large pool: the size tree holds a block of size ", b->size, " that does not belong there"));
    }
  });
  if (!status.ok()) return status;
  for (std::size_t t = 0; t < num_tiers(); ++t) {
    for (const Block* b = ss.tier_free[t].front(); b != nullptr; b = ss.tier_free[t].next(b)) {
      if (b->state != BlockState::kFree || b->segment->tier != static_cast<int>(t)) {
        return absl::InternalError(absl::StrCat("large pool: tier ", t, " list holds a foreign block"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LargePool::PiecesUnder(const Block* block, std::uintptr_t* first_va,
                                    std::vector<PhysicalPiece>* out) const {
  Settle();
  return backing_->PiecesUnder(*this, block, first_va, out);
}

}  // namespace bucketalloc::internal
