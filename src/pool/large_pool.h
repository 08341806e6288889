// src/pool/large_pool.h — the large pool: requests above small_pool_limit (layer L3).
//
// Owns: the segments of one device and their blocks, per stream:
//   - tiers: a request within a configured tier rounds up to it and is served from that tier's own
//     free list (a tier block is a whole segment, never split or merged), so a freed block is
//     reused in O(1) by the next request of its tier;
//   - other sizes: PyTorch's rounding, then PyTorch's best fit (the smallest admissible block, the
//     lowest address among equals) found in O(log n) in the stream's size tree
//     (memory/block_tree.h); a block of at
//     most max_split_size is split when the remainder exceeds keep_remainder; larger blocks serve
//     only requests within max_non_split_rounding of their size; free neighbours coalesce;
//   - the release order of wholly free segments (oldest first) for GC and release-and-retry;
//   - one deferred free block: the return of the last block returned waits, whole: the block stays
//     as it was (active, unmerged, out of the size tree) and the pool owes the stats ledger its
//     figures (a StatDebtor, internal/stat_ledger.h); the next request that the block, merged with
//     its free next neighbour, would have served exactly as best fit takes it back at the cost of
//     the pair's net change (the totals, and the peaks the free block would have raised), touching
//     no tree, histogram or segment count (the hit path of an alloc+free pair); whether it is that
//     best fit is known without a lookup while the free lists have not changed since the block was
//     last handed out as the best fit for its size (best_fit_); any other call of
//     any pool and any read of the ledger settle it first (the return done as it would have been
//     done then), so the pool's choices are PyTorch's best fit, block for block, and every figure
//     read is the plain algorithm's.
// What backs a segment is not its business: the SegmentBacking it is built with (the interface,
// pool/segment_backing.h) makes and gives back segments' memory, and may serve what a grow at the
// cap cannot, give back free memory inside segments, and leave holes (kUnmapped blocks), which this
// pool carves and keeps out of its lists. Backings change blocks only through the block-level calls
// below. The fast path never calls the backing. It has the shape of every pool (pool/pool.h).
// Stats it keeps: active, cached, inactive_split, the split/merge counters and oversize counts.
// Thread-safety: none; the device lock guards it, for the const calls too: a call that reads
// blocks or trees settles the deferred block (a logically const change of `mutable` members), so
// two const calls must not run at once either.
//
// Example:
//   LargePool pool(ctx, config, std::make_unique<PlainBacking>(ctx.source));
//   LargePool::Request r = pool.RequestFor(size);
//   std::optional<LargePool::Handle> h = pool.TryAllocate(ss, r);
//   if (!h) h = *pool.Serve(ss, stream, r, &served);   // or ResourceExhausted
//   pool.Return(*h);
#ifndef BUCKETALLOC_POOL_LARGE_POOL_H_
#define BUCKETALLOC_POOL_LARGE_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"
#include "internal/bits.h"
#include "internal/intrusive_list.h"
#include "internal/object_pool.h"
#include "internal/stat_ledger.h"
#include "memory/block_tree.h"
#include "memory/segment.h"
#include "memory/size_classes.h"
#include "pool/memory_source.h"
#include "pool/pool.h"
#include "pool/segment_backing.h"

namespace bucketalloc::internal {

class LargePool;

struct LargePoolConfig {
  // The pool its stats and segments count in: the large pool, or the small pool for the packed part
  // of the small pool (pool/packed_pool.h), which is a LargePool configured as PyTorch's small pool.
  PoolIndex index = kLargePool;
  std::size_t max_split_size = kUnlimited;
  std::size_t max_non_split_rounding = 20 * kMiB;
  std::size_t large_segment_size = 20 * kMiB;
  std::vector<std::uint32_t> roundup_power2_divisions;
  std::vector<std::size_t> tiers;  // ascending, multiples of the backend granularity
  double tier_min_fill = 0.5;
  // The backend's granularity: a segment is a multiple of it.
  std::size_t granularity = 2 * kMiB;
  // With virtual memory: the pieces a grow creates while not at the cap (a multiple of granularity).
  std::size_t grow_piece = 2 * kMiB;
  // A split leaves a remainder larger than this; a smaller one stays inside the block. PyTorch keeps
  // up to 1 MiB (it could never serve a large request alone). Over virtual memory the front end
  // splits every remainder off (0): free, it joins its free neighbours' granules, which can then
  // move whole.
  std::size_t keep_remainder = kMaxSmallSize;
  // The block freed last waits deferred (see LargePool) instead of merging at once. Every choice
  // and figure is the same either way; false is the plain algorithm (the tests compare the two).
  bool defer_free = true;
};

// The free lists of one stream (LargePool::StreamState).
struct LargeStreamState {
  explicit LargeStreamState(const LargePool& pool);
  BlockTree tree;  // the free blocks of non-tier segments, by (size, address)
  std::unique_ptr<IntrusiveList<Block, &Block::free_node>[]> tier_free;
};

class LargePool final : private StatDebtor {
 public:
  static constexpr PoolIndex kIndex = kLargePool;
  using FreeList = IntrusiveList<Block, &Block::free_node>;

  struct Request {
    std::size_t rounded = 0;  // the block size to hand out
    int tier = -1;            // the tier it rounds to, or -1
  };
  struct Handle {
    Block* block = nullptr;
  };
  using StreamState = LargeStreamState;

  // Segments come from `backing` (what kind is the caller's choice).
  LargePool(const PoolContext& ctx, LargePoolConfig config, std::unique_ptr<SegmentBacking> backing);
  ~LargePool();
  LargePool(const LargePool&) = delete;
  LargePool& operator=(const LargePool&) = delete;

  const LargePoolConfig& config() const { return config_; }
  // Requests served by taking back the block whose return was deferred (the pair's fast path).
  std::uint64_t taken_back() const { return taken_back_; }
  std::size_t num_tiers() const { return config_.tiers.size(); }
  std::size_t tier_bytes(int tier) const { return config_.tiers[tier]; }

  // Returns the tier `size` rounds up to, or -1 when it is outside the tier range.
  int TierOf(std::size_t size) const {
    for (std::size_t t = 0; t < config_.tiers.size(); ++t) {
      if (size <= config_.tiers[t]) {
        return static_cast<double>(size) >= config_.tier_min_fill * static_cast<double>(config_.tiers[t])
                   ? static_cast<int>(t)
                   : -1;
      }
    }
    return -1;
  }
  // PyTorch's rounding of a non-tier large request.
  std::size_t RoundSize(std::size_t size) const { return RoundLargeSize(size, divisions_); }
  // The segment size to allocate for a non-tier block of `rounded` bytes.
  std::size_t SegmentSizeFor(std::size_t rounded) const {
    return LargeSegmentSize(rounded, config_.large_segment_size);
  }

  Request RequestFor(std::size_t size) const {
    const int tier = TierOf(size);
    return {tier >= 0 ? tier_bytes(tier) : RoundSize(size), tier};
  }
  // Fast path: a cached block for the request (a tier request: a block of that tier), or nullopt:
  // PyTorch's best fit, the stream's size tree's lower bound (or the deferred block, when it is
  // exactly what that best fit gives). The block returned is kAllocated and counted active.
  std::optional<Handle> TryAllocate(StreamState& ss, const Request& r) {
    Block* b = FindAndTake(ss, r);
    if (b == nullptr) return std::nullopt;
    return Handle{b};
  }
  // Slow path: a cached block (looked up again); else, for a plain request, a segment the backing
  // grows in place (SegmentBacking::Extend, virtual memory), or else a new segment (the preferred
  // size, then just the request rounded to the granularity), which serves the request it was made
  // for; else, at the cap, whatever the backing serves (SegmentBacking::ServeAtCap).
  // ResourceExhausted names every failure.
  absl::StatusOr<Handle> Serve(StreamState& ss, Stream stream, const Request& r, Served* served);
  // Rounding to the tier is a preference: a tier request falls back to its exact rounded size.
  std::optional<Request> Fallback(std::size_t size, const Request& r) const {
    if (r.tier < 0) return std::nullopt;
    return Request{RoundSize(size), -1};
  }
  std::pair<std::size_t, std::size_t> OomSizes(const Request& r) const {
    return {r.rounded, RoundUp(r.rounded, config_.granularity)};
  }
  // Returns an active block to the free lists (coalescing); it is no longer active. The return is
  // deferred (see above) when the block merges with no free previous neighbour, after the previously
  // deferred one is settled.
  void Return(Handle h);
  // Carves [addr, addr + size) out of the free block that holds it, on the free lists of `stream`
  // (the stream of the segment that holds it), and returns it as an active block: the free
  // remainders before and after it go back on the lists (a slow path: it walks the segments; for
  // restoring a checkpoint, PyTorch's setCheckpointPoolState). `size` is a block size this pool
  // produced: a multiple of 512 B at a 512 B offset; a tier segment's block only whole; a free
  // block above max_split_size (never split) only whole.
  // NotFound (nothing changed) when no segment of this pool holds addr; InvalidArgument or
  // FailedPrecondition (nothing changed), naming the address, the size and why, when the range is
  // not wholly inside one free block of that segment or breaks the rules above, or the segment is
  // on another stream.
  absl::StatusOr<Handle> TakeAt(std::uintptr_t addr, std::size_t size, Stream stream);

  static std::uintptr_t Address(Handle h) { return h.block->ptr; }
  static std::size_t BlockSize(Handle h) { return h.block->size; }
  static Stream StreamOf(Handle h) { return h.block->segment->stream; }
  bool Oversize(Handle h) const { return h.block->size > config_.max_split_size; }
  static void SetRequested(Handle h, std::size_t requested) { h.block->requested = requested; }
  static void MarkPending(Handle h) { h.block->state = BlockState::kPendingFree; }

  // Release order of wholly free segments.
  std::uint64_t OldestFree() const {
    Settle();
    return release_order_.OldestAge();
  }
  std::size_t ReleaseOldest();
  // Releases every wholly free segment, oldest first, then lets the backing give back what else
  // it can (SegmentBacking::ReleaseFreeMemory).
  void ReleaseAll();

  // Adds the free-block histogram and the tiers' use, kept as blocks move (no walk).
  void AddFragmentation(FragmentationReport* report) const;
  // Each tier's blocks in use and cached (kept, no walk).
  std::vector<TierUsage> TierUse() const;
  // The largest free block of one stream's lists: its size tree's last block or a tier block.
  std::size_t LargestFree(const StreamState& ss) const;
  // The same figures (and the largest free block) from a walk over every block: the invariant
  // check compares them with the kept ones.
  void WalkFragmentation(FragmentationReport* report) const;
  void ForEachUnit(UnitFn f) const {
    const bool virtual_memory = backing_->virtual_memory();
    for (const Segment* s : segments_) f(s->base, s->size, MappedBytes(*s), virtual_memory);
  }
  absl::Status CheckHandle(Handle h, bool live) const;
  void Describe(std::vector<SpanView>* spans) const;
  InactiveSplit inactive_split() const;
  absl::Status CheckInvariants(std::int64_t active_blocks) const;
  // Checks that the size tree of `ss` is ordered and a heap and holds only free blocks of its
  // stream's non-tier segments, and that each tier list holds only free blocks of its tier.
  absl::Status CheckStreamState(const StreamState& ss) const;

  // Allocates a segment of `bytes` (>= rounded; a tier segment when tier >= 0) from the backing
  // and returns its first `rounded` bytes as an active block (the rest, if split off, is cached).
  // ResourceExhausted from the source.
  absl::StatusOr<Block*> Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded, int tier);

  // The largest free block (slow: a walk).
  std::size_t largest_free_block() const;
  // Bytes of reserved memory in no segment (the backing's spares).
  std::size_t spare_bytes() const;
  // Physical memory created ahead of need as the backing's spares (SegmentBacking::Prefetch).
  absl::StatusOr<std::size_t> Prefetch(std::size_t spare_target, std::size_t max_create) {
    return backing_->Prefetch(spare_target, max_create);
  }
  // Bytes the backing could move out of free blocks (SegmentBacking::MovableBytes; a walk).
  std::size_t movable_bytes() const;
  // Its segments are virtual memory, stitched at the cap (SegmentBacking::virtual_memory).
  bool virtual_memory() const { return backing_->virtual_memory(); }
  // Bytes of `seg` backed by memory: its size, less its holes.
  std::size_t MappedBytes(const Segment& seg) const;
  // CUDA IPC: the physical pieces under allocated `block` (SegmentBacking::PiecesUnder).
  absl::Status PiecesUnder(const Block* block, std::uintptr_t* first_va, std::vector<PhysicalPiece>* out) const;

  // ---- Block-level calls, for whatever backs the segments (pool/segment_backing.h) ----
  // Slow paths only, under the same lock; each keeps the pool's lists, counts and stats true.

  // Every segment.
  const absl::flat_hash_set<Segment*>& segments() const {
    Settle();
    return segments_;
  }
  template <typename F>
  void ForEachSegment(F&& f) const {
    Settle();
    for (const Segment* s : segments_) f(*s);
  }
  // A new segment over [base, base + bytes): one free block of its first `mapped` bytes (all of it
  // by default), and a hole after them (virtual memory: a segment that grows in place, or a map
  // that failed part-way). Counts the
  // mapped bytes cached and puts the segment in the release order.
  Segment* AddSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes, int tier,
                      std::size_t mapped = kUnlimited);
  // Forgets a segment that holds no free or active block (all hole), after its backing forgot it.
  void DropSegment(Segment* seg);
  // Forgets a wholly free segment of one free block whose memory the backing gave back.
  void DropFreeSegment(Segment* seg);
  // Carves [lo, hi) (whole granules inside free `block`) into a hole: [free rest][hole][free rest],
  // holes merged with holes. A tier block that loses granules is plain free memory from then on
  // (the tier list would hand it out at the tier's size).
  void MakeHole(Block* block, std::uintptr_t lo, std::uintptr_t hi);
  // The reverse: [lo, hi) (whole granules inside hole `hole`, just mapped) becomes free memory merged
  // with its free neighbours, the hole's rest on either side stays a hole. Returns the free block
  // that holds it (in its free list).
  Block* FillHole(Block* hole, std::uintptr_t lo, std::uintptr_t hi);
  // Takes free `block` (in a free list) for `rounded` bytes: splits off the rest when allowed.
  void Take(Block* block, std::size_t rounded, int tier);

 private:
  bool Admissible(std::size_t block_size, std::size_t rounded) const {
    return block_size <= config_.max_split_size || block_size - rounded <= config_.max_non_split_rounding;
  }
  bool ShouldSplit(std::size_t block_size, std::size_t rounded) const {
    return block_size <= config_.max_split_size && block_size - rounded > config_.keep_remainder;
  }
  Block* FindAndTake(StreamState& ss, Request r);
  // The deferred block for `r` when the block it would be after its return (merged with its free
  // next neighbour) is exactly what best fit and the split would give for `r` on `ss`: taken back,
  // the return and the take counted as they would count; else nullptr (nothing changed).
  Block* TakeDeferred(StreamState& ss, Request r);
  // Whether `block` (active, its previous neighbour not free) returned and merged with `next` (its
  // free next neighbour, or nullptr) is the block best fit gives for `rounded` on `ss`, split at
  // `rounded` when merged: the size tree asked.
  bool IsBestFitOnReturn(const StreamState& ss, const Block* block, const Block* next, std::size_t rounded) const;
  // best_fit_: `block` was just handed out as the best fit for its size; and whether that still holds.
  void RememberBestFit(const Block* block) {
    best_fit_ = block;
    best_fit_changes_ = list_changes_;
  }
  bool IsRememberedBestFit(const Block* block) const {
    return block == best_fit_ && list_changes_ == best_fit_changes_;
  }
  // The return of `block` (active), free since `since`: merged with its free neighbours, in its
  // free list, every figure counted.
  void ReturnNow(Block* block, std::uint64_t since);
  // The deferred return, done (StatDebtor: the ledger calls it when it is read or a pool settles).
  void PayStats() override;
  // Has the ledger's debt paid, this pool's deferred return or another pool's: logically const,
  // every call that reads blocks, trees or figures or counts calls it first.
  void Settle() const { ctx_.stats->Settle(); }
  Block* FindFree(StreamState& ss, std::size_t rounded);
  ABSL_ATTRIBUTE_ALWAYS_INLINE void InsertFree(Block* block);
  ABSL_ATTRIBUTE_ALWAYS_INLINE void RemoveFree(Block* block);
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Activate(Block* block);
  // A segment's share of inactive_split: its free pieces while it also holds active blocks.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static InactiveSplit InactiveOf(const Segment* seg);
  ABSL_ATTRIBUTE_ALWAYS_INLINE void UpdateInactiveSplit(const InactiveSplit& before, const Segment* seg);

  PoolContext ctx_;
  LargePoolConfig config_;
  // config_.roundup_power2_divisions, or empty when no entry divides (above 1): the rounding's fast
  // case.
  std::vector<std::uint32_t> divisions_;
  mutable BlockPool blocks_;  // mutable: Settle merges blocks
  // The block whose return is deferred, or nullptr. Invariant: it is kAllocated and counted active
  // as before its return, its previous neighbour is not free, its segment is not a tier's, and the
  // ledger's debtor is this pool exactly while it is set. mutable: Settle clears it.
  mutable Block* deferred_ = nullptr;
  std::uint64_t deferred_since_ = 0;  // the clock at its return: its free time
  std::uint64_t taken_back_ = 0;
  // Inserts and erases in the free lists so far: while the count stands, every lookup answers the same.
  std::uint64_t list_changes_ = 0;
  // The block last handed out as the best fit for exactly its size (split off the front of that
  // free block, whose rest is its free next neighbour, or taken whole), and list_changes_ then.
  // While the count stands, the block returned and merged with its free next neighbour is that
  // best fit again for a request of its size on its stream, and splits the same way: its take-back
  // needs no lookup. (A Block is recycled only after a merge or a release, which change the lists.)
  const Block* best_fit_ = nullptr;
  std::uint64_t best_fit_changes_ = 0;
  ObjectPool<Segment, 64> segment_meta_;
  ReleaseOrder<Segment, &Segment::release_node, &Segment::free_since> release_order_;  // wholly free, oldest first
  absl::flat_hash_set<Segment*> segments_;  // all segments; changes only on slow paths
  // The free blocks by size (kept by Insert/RemoveFree), per tier the free blocks of its segments
  // (kept by Insert/RemoveFree) and its segments (kept by Add/DropSegment and MakeHole: slow paths
  // only); a tier segment is one block, so the blocks in use are segments - cached (TierUse).
  // Invariant: equal to a walk's (WalkFragmentation).
  FreeHistogram free_;
  std::vector<TierUsage> tier_use_;
  std::vector<std::int64_t> tier_segments_;
  std::unique_ptr<SegmentBacking> backing_;
};

inline LargeStreamState::LargeStreamState(const LargePool& pool)
    : tier_free(new LargePool::FreeList[pool.num_tiers()]) {}

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_LARGE_POOL_H_
