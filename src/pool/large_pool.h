// src/pool/large_pool.h — the large pool: requests above small_pool_limit (layer L3).
//
// Owns: the segments of one device and their blocks, per stream:
//   - tiers: a request within a configured tier rounds up to it and is served from that tier's own
//     free list (a tier block is a whole segment, never split or merged), so a freed block is
//     reused in O(1) by the next request of its tier;
//   - other sizes: PyTorch's rounding, then PyTorch's best fit (the smallest admissible block, the
//     lowest address among equals) found in free lists binned 4 per power of two (the fast path
//     scans at most 32 entries of a bin; the slow path looks again at whole bins);
//     a block of at most max_split_size is split when the remainder exceeds 1 MiB (with stitching:
//     any remainder); larger blocks
//     serve only requests within max_non_split_rounding of their size; free neighbours coalesce;
//   - the release order of wholly free segments (oldest first) for GC and release-and-retry;
//   - with stitching on (config.granule > 0, the vmm backends), each segment is an address range
//     with one physical granule mapped per granule of it. When the cap is reached, Stitch serves a
//     request from a fresh range: it unmaps the whole granules of free blocks (any stream or tier,
//     oldest first; a free block's partial granules stay, so blocks smaller than a granule still
//     share granules) and maps them there. The ranges they leave are holes (kUnmapped blocks).
//     The fast path is the same in both modes.
// Stats it keeps: active, cached, inactive_split, the split/merge counters and oversize counts.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   Block* b = pool.TryAllocate(ss, rounded, tier);
//   if (b == nullptr) b = *pool.Grow(ss, stream, segment_bytes, rounded, tier);  // or ResourceExhausted
//   pool.Return(b);
#ifndef BUCKETALLOC_POOL_LARGE_POOL_H_
#define BUCKETALLOC_POOL_LARGE_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "bucketalloc/units.h"
#include "bucketalloc/stat_types.h"
#include "internal/intrusive_list.h"
#include "internal/object_pool.h"
#include "memory/segment.h"
#include "memory/size_classes.h"
#include "pool/memory_source.h"

namespace bucketalloc::internal {

struct LargePoolConfig {
  std::size_t max_split_size = kUnlimited;
  std::size_t max_non_split_rounding = 20 * kMiB;
  std::size_t large_segment_size = 20 * kMiB;
  std::vector<std::uint32_t> roundup_power2_divisions;
  std::vector<std::size_t> tiers;  // ascending, multiples of the backend granularity
  double tier_min_fill = 0.5;
  // > 0: stitching is on and this is the physical granule size (the backend's granularity).
  std::size_t granule = 0;
  // A split leaves a remainder larger than this; a smaller one stays inside the block. PyTorch keeps
  // up to 1 MiB (it could never serve a large request alone). With stitching every remainder is
  // split off (0): free, it joins its free neighbours' granules, which can then move whole.
  std::size_t keep_remainder = kMaxSmallSize;
};

class LargePool {
 public:
  using FreeList = IntrusiveList<Block, &Block::free_node>;
  static constexpr int kBitmapWords = (kNumBins + 63) / 64;
  struct StreamState {
    explicit StreamState(std::size_t num_tiers) : tier_free(new FreeList[num_tiers]) {}
    std::array<FreeList, kNumBins> bins;
    std::array<std::uint64_t, kBitmapWords> nonempty{};  // bit b set iff bins[b] is non-empty
    std::unique_ptr<FreeList[]> tier_free;
  };

  LargePool(const PoolContext& ctx, LargePoolConfig config);
  ~LargePool();
  LargePool(const LargePool&) = delete;
  LargePool& operator=(const LargePool&) = delete;

  const LargePoolConfig& config() const { return config_; }
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
  std::size_t RoundSize(std::size_t size) const {
    return RoundLargeSize(size, config_.roundup_power2_divisions);
  }
  // The segment size to allocate for a non-tier block of `rounded` bytes.
  std::size_t SegmentSizeFor(std::size_t rounded) const {
    return LargeSegmentSize(rounded, config_.large_segment_size);
  }

  // Fast path: a cached block for `rounded` bytes (tier >= 0: a block of that tier), or nullptr.
  // Each bin from the request's own is scanned for the best fit up to kMaxBinScan entries, or
  // wholly with `full_scan` (the slow path's second look); the first bin with a fit answers. So the
  // fast path is PyTorch's best fit unless a bin holds more than kMaxBinScan blocks. The block
  // returned is kAllocated and counted active.
  Block* TryAllocate(StreamState& ss, std::size_t rounded, int tier, bool full_scan = false);
  // Slow path: allocates a segment of `bytes` (>= rounded; a tier segment when tier >= 0) from the
  // source and returns its first `rounded` bytes as an active block (the rest, if split off, is
  // cached). ResourceExhausted from the source.
  absl::StatusOr<Block*> Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded, int tier);
  // Returns an active block to the free lists (coalescing); it is no longer active.
  void Return(Block* block);

  // Stitching (granule > 0), after a grow of the request failed. Serves `rounded` bytes from a
  // fresh range whose granules are created within the cap's headroom (none when the headroom would
  // have fit the grow: the device refused) and, for the rest, moved from free blocks: oldest first,
  // plain blocks before tier blocks that would give more than needed, after their streams' work
  // has completed (a stream that cannot be synchronized keeps its granules). Returns
  // ResourceExhausted, having changed nothing, when too few granules can move; another error when
  // a backend call failed (the granules unmapped by then go back to the device, a refused release
  // keeps one as a spare: still reserved, used first by the next Grow or Stitch, released by
  // ReleaseFree). Live blocks are never touched.
  absl::StatusOr<Block*> Stitch(StreamState& ss, Stream stream, std::size_t rounded, int tier);
  // Bytes of spare granules: unmapped but not released (counted in reserved_bytes).
  std::size_t spare_bytes() const { return spare_.size() * config_.granule; }
  // Whole granules inside free blocks: what Stitch may take (0 without stitching).
  std::size_t free_granules() const { return free_granules_; }
  // Bytes of `seg` backed by memory: its size, less its holes.
  std::size_t MappedBytes(const Segment& seg) const;

  // Release order of wholly free segments.
  std::uint64_t OldestFree() const;
  std::size_t ReleaseOldest();
  // Releases wholly free segments, oldest first, until `target` bytes are released. With stitching
  // on, a release of everything (target = max) also gives back the spare granules and the whole
  // granules of free blocks in partly used segments.
  std::size_t ReleaseFree(std::size_t target);

  std::size_t largest_free_block() const;
  void Fragmentation(PoolFragmentation* out, std::vector<TierUsage>* tiers) const;
  absl::Status CheckInvariants(std::int64_t active_blocks) const;
  template <typename F>
  void ForEachSegment(F&& f) const {
    for (const Segment* s : segments_) f(*s);
  }

 private:
  bool Admissible(std::size_t block_size, std::size_t rounded) const {
    return block_size <= config_.max_split_size ||
           block_size - rounded <= config_.max_non_split_rounding;
  }
  bool ShouldSplit(const Block* block, std::size_t rounded) const {
    return block->size <= config_.max_split_size && block->size - rounded > config_.keep_remainder;
  }
  Block* FindFree(StreamState& ss, std::size_t rounded, bool full_scan);
  // Takes free `block` (in a free list) for `rounded` bytes: splits off the rest when allowed.
  void Take(Block* block, std::size_t rounded, int tier);
  void InsertFree(Block* block);
  void RemoveFree(Block* block);
  void Activate(Block* block);
  struct Inactive {
    std::int64_t bytes = 0;
    std::int64_t count = 0;
  };
  // A segment's share of inactive_split: its free pieces while it also holds active blocks.
  static Inactive InactiveOf(const Segment* seg);
  void UpdateInactiveSplit(const Inactive& before, const Segment* seg);
  // Releases a wholly free segment; false when the source refused (it stays cached; with
  // stitching the granules unmapped before the refusal are gone and holes mark them).
  bool ReleaseSegment(Segment* seg);

  // Stitching helpers.
  bool stitching() const { return config_.granule != 0; }
  // The whole granules inside `block` (a block of a stitching segment), as [*g0, *g1) of its segment.
  std::size_t WholeGranules(const Block* block, std::size_t* g0 = nullptr, std::size_t* g1 = nullptr) const;
  // A new segment over [base, base + bytes): without stitching one free block; with it, one free
  // block per run of mapped granules and a hole per run of zeros in `granules`. Counts the mapped
  // bytes cached and puts it in the release order.
  Segment* AddSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes, int tier,
                      std::vector<PhysicalHandle> granules);
  // Forgets a segment that holds no active block (its free blocks must be out of the lists).
  void DropSegment(Segment* seg);
  // Fills `out` up to `n` granules: spares first, then new ones. On failure `out` keeps what it got.
  absl::Status TakeGranules(std::size_t n, std::vector<PhysicalHandle>* out);
  // Maps `granules` into the fresh range [base, base + bytes) and makes it a segment. On a failed
  // map the mapped prefix stays as a free segment (a hole after it) or, when nothing mapped, the
  // range is released; the unmapped granules are released. Returns the segment or the error.
  absl::StatusOr<Segment*> MapNewSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes,
                                         int tier, std::vector<PhysicalHandle> granules);
  // Unmaps granules [g0, g1) of the segment of free `block` (whole granules inside it), one at a
  // time, appending their handles to `out`; stops at the first failure. The unmapped run becomes a
  // hole; the rest of the block stays free. The caller drops the segment if it is all hole now.
  absl::Status UnmapRun(Block* block, std::size_t g0, std::size_t g1, std::vector<PhysicalHandle>* out);
  // Releases `handles` to the device (one the backend refuses stays a spare).
  void ReleaseGranules(std::vector<PhysicalHandle>* handles);
  void AddSpare(PhysicalHandle handle);
  // Unmaps and releases the whole granules of the free blocks of partly used segments and the spares.
  void ReleaseFreeGranules();

  PoolContext ctx_;
  LargePoolConfig config_;
  int granule_shift_ = 0;  // log2(config_.granule) when stitching
  BlockPool blocks_;
  ObjectPool<Segment, 64> segment_meta_;
  IntrusiveList<Segment, &Segment::release_node> release_order_;  // wholly free, oldest first
  absl::flat_hash_set<Segment*> segments_;  // all segments; changes only on slow paths
  // Stitching: each segment's granules (0 = a hole), and the spare granules.
  absl::flat_hash_map<const Segment*, std::vector<PhysicalHandle>> granules_;
  std::vector<PhysicalHandle> spare_;
  std::size_t free_granules_ = 0;  // sum of WholeGranules over free blocks (kept by Insert/RemoveFree)
};

// Checks that every list of `ss` holds only free blocks of its bin or tier and that the bitmap
// matches the bins.
absl::Status CheckStreamFreeLists(const LargePool::StreamState& ss, std::size_t num_tiers);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_LARGE_POOL_H_
