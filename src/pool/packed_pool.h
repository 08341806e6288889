// src/pool/packed_pool.h — the packed part of the small pool: small requests above slab_limit,
// packed as PyTorch packs its small pool (layer L3).
//
// Owns: nothing of its own but a LargePool configured as PyTorch's small pool (reference/pytorch.md
// §1.3-§1.7): sizes rounded to 512 B, 2 MiB segments, best fit by stream, size and address, a block
// split whenever 512 B or more remain, free neighbours coalesced, wholly free segments released
// oldest first; no tiers; plain segments (pool/plain_backing.h), or under stitching granule ranges
// that grow in place (pool/virtual_backing.h, as expandable segments' 2 MiB small pages). Its stats and segments count
// in the small pool (with the slabs: PyTorch's small pool is every request up to 1 MiB), and its handles are a type of
// their own, so the front end tells its blocks from the large pool's. Why both: a slab holds one size class, so a
// partly used slab per class stays reserved, where shared split segments hold any mix of sizes; slabs are exact for
// sizes that divide 2 MiB and serve a hit with a pop. slab_limit chooses (docs/configuration.md). Thread-safety: none;
// the device lock guards it.
//
// Example:
//   PackedPool pool(ctx, divisions);
//   PackedPool::Request r = pool.RequestFor(300 << 10);   // 300 KiB, rounded to 512 B
//   std::optional<PackedPool::Handle> h = pool.TryAllocate(ss, r);
#ifndef BUCKETALLOC_POOL_PACKED_POOL_H_
#define BUCKETALLOC_POOL_PACKED_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "memory/size_classes.h"
#include "pool/large_pool.h"
#include "pool/pool.h"
#include "pool/virtual_backing.h"

namespace bucketalloc::internal {

class PackedPool {
 public:
  static constexpr PoolIndex kIndex = kSmallPool;
  using Request = LargePool::Request;
  struct Handle {
    Block* block = nullptr;
  };
  struct StreamState {
    explicit StreamState(const PackedPool& pool) : lists(pool.pool_) {}
    LargePool::StreamState lists;
  };

  // `divisions`: roundup_power2_divisions, which PyTorch applies to small sizes too. `no_split`:
  // a block is handed out whole, never split (a private pool's setting).
  // `virtual_memory`: its segments are granule ranges (pool/virtual_backing.h), as expandable
  // segments' small pages, so that release-and-retry gives their free granules back with an unmap
  // after one wait per stream rather than a cudaFree (a device synchronization) per segment.
  PackedPool(const PoolContext& ctx, std::vector<std::uint32_t> divisions, bool no_split = false,
             bool virtual_memory = false)
      : PackedPool(ctx, Config(std::move(divisions), no_split), virtual_memory) {}

  Request RequestFor(std::size_t size) const { return pool_.RequestFor(size); }
  std::optional<Handle> TryAllocate(StreamState& ss, const Request& r) {
    std::optional<LargePool::Handle> h = pool_.TryAllocate(ss.lists, r);
    if (!h.has_value()) return std::nullopt;
    return Handle{h->block};
  }
  absl::StatusOr<Handle> Serve(StreamState& ss, Stream stream, const Request& r, Served* served) {
    absl::StatusOr<LargePool::Handle> h = pool_.Serve(ss.lists, stream, r, served);
    if (!h.ok()) return h.status();
    return Handle{h->block};
  }
  std::optional<Request> Fallback(std::size_t, const Request&) const { return std::nullopt; }
  std::pair<std::size_t, std::size_t> OomSizes(const Request& r) const { return {r.rounded, kSlabBytes}; }
  void Return(Handle h) { pool_.Return(Of(h)); }
  // See LargePool::TakeAt.
  absl::StatusOr<Handle> TakeAt(std::uintptr_t addr, std::size_t size, Stream stream) {
    absl::StatusOr<LargePool::Handle> h = pool_.TakeAt(addr, size, stream);
    if (!h.ok()) return h.status();
    return Handle{h->block};
  }

  static std::uintptr_t Address(Handle h) { return LargePool::Address(Of(h)); }
  static std::size_t BlockSize(Handle h) { return LargePool::BlockSize(Of(h)); }
  static Stream StreamOf(Handle h) { return LargePool::StreamOf(Of(h)); }
  bool Oversize(Handle) const { return false; }
  static void SetRequested(Handle h, std::size_t requested) { LargePool::SetRequested(Of(h), requested); }
  static void MarkPending(Handle h) { LargePool::MarkPending(Of(h)); }

  std::uint64_t OldestFree() const { return pool_.OldestFree(); }
  std::size_t ReleaseOldest() { return pool_.ReleaseOldest(); }
  void ReleaseAll() { pool_.ReleaseAll(); }

  void AddFragmentation(FragmentationReport* report) const { pool_.AddFragmentation(report); }
  std::size_t LargestFree(const StreamState& ss) const { return pool_.LargestFree(ss.lists); }
  void WalkFragmentation(FragmentationReport* report) const { pool_.WalkFragmentation(report); }
  void Describe(std::vector<SpanView>* spans) const { pool_.Describe(spans); }
  InactiveSplit inactive_split() const { return pool_.inactive_split(); }
  std::size_t spare_bytes() const { return pool_.spare_bytes(); }
  std::size_t movable_bytes() const { return pool_.movable_bytes(); }
  bool virtual_memory() const { return pool_.virtual_memory(); }
  absl::Status PiecesUnder(Handle h, std::uintptr_t* first_va, std::vector<PhysicalPiece>* out) const {
    return pool_.PiecesUnder(h.block, first_va, out);
  }
  void ForEachUnit(UnitFn f) const { pool_.ForEachUnit(std::move(f)); }
  absl::Status CheckInvariants(std::int64_t active_blocks) const { return pool_.CheckInvariants(active_blocks); }
  absl::Status CheckStreamState(const StreamState& ss) const { return pool_.CheckStreamState(ss.lists); }
  absl::Status CheckHandle(Handle h, bool live) const { return pool_.CheckHandle(Of(h), live); }

 private:
  static LargePool::Handle Of(Handle h) { return LargePool::Handle{h.block}; }
  PackedPool(const PoolContext& ctx, const LargePoolConfig& config, bool virtual_memory)
      : pool_(ctx, config, MakeSegmentBacking(ctx, config, virtual_memory)) {}
  // PyTorch's small pool: 2 MiB segments (kSmallBuffer), a split whenever kMinBlockSize remains.
  static LargePoolConfig Config(std::vector<std::uint32_t> divisions, bool no_split) {
    LargePoolConfig c;
    c.index = kSmallPool;
    c.large_segment_size = kSlabBytes;
    c.granularity = kSlabBytes;
    c.grow_piece = kSlabBytes;
    c.roundup_power2_divisions = std::move(divisions);
    c.keep_remainder = no_split ? kUnlimited : kMinBlockSize - 1;
    return c;
  }

  LargePool pool_;
};

static_assert(Pool<PackedPool>);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_PACKED_POOL_H_
