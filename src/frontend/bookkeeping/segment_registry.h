// src/frontend/bookkeeping/segment_registry.h — the device memory of one device: the cap and the registry of
// what the backend gave (layer L4).
//
// Owns: the pools' MemorySource: every backend allocation (segments and slabs) and, with
// stitching, every address range with its mapped bytes, registered by address (the ranges carved
// from the device's address arena, frontend/bookkeeping/address_arena.h), and the physical memory that
// exists (its handles and bytes); the cap, checked
// before any growth; the reserved and segment stats; the history's segment events; a collection
// hook run before growth (garbage collection, which the device runs over its pools); and, for the
// slow path of a CUDA graph capture, growth without collection.
// Invariants (CheckInvariants): registered ranges do not overlap; the backend holds exactly the
// registered allocations (their count; and their bytes, when it counts bytes) and exactly the
// physical allocations created and not released, whose bytes are the mapped plus spare bytes; the
// address arena's own. A tenant's pool (SetOwnerCap) grows only within its cap as well as the
// device's (its reserved bytes may stay above a cap lowered at run time, never grow past it).
// Thread-safety: none; the device lock guards it.
//
// Example:
//   SegmentRegistry registry(backend, &ledger, &history, cap);
//   absl::StatusOr<std::uintptr_t> base = registry.AllocateSegment(2 << 20, kSmallPool);
//   std::optional<SegmentRegistry::Range> r = registry.Holding(ptr);  // the segment or slab of ptr
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_SEGMENT_REGISTRY_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_SEGMENT_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/capture.h"
#include "bucketalloc/stat_types.h"
#include "frontend/bookkeeping/address_arena.h"
#include "frontend/observability/history.h"
#include "internal/stat_ledger.h"
#include "memory/size_classes.h"
#include "pool/memory_source.h"

namespace bucketalloc::internal {

class SegmentRegistry final : public MemorySource {
 public:
  // A segment's base must be a multiple of this, as every block's is.
  static constexpr std::size_t kSegmentAlignment = kMinBlockSize;
  // A registered backend allocation, or (vmm) an address range with `mapped` bytes of granules.
  struct Range {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    PoolIndex pool = kLargePool;
    bool virtual_memory = false;
    std::size_t mapped = 0;
    std::uint16_t owner = 0;  // the private pool that grew it (its tag; 0: the device's own pools)
    bool external = false;    // given by the owner's SegmentAllocator, not by the backend
  };
  // What the registry holds, per pool, for the device-wide check.
  struct Totals {
    std::int64_t reserved[kNumPoolIndices] = {};  // allocations' bytes and mapped granules
    std::int64_t segments[kNumPoolIndices] = {};
    std::size_t ranges = 0;  // virtual-memory ranges
  };

  SegmentRegistry(Backend* backend, StatLedger* stats, HistoryRing* history)
      : backend_(backend),
        stats_(stats),
        history_(history),
        granularity_(backend->Granularity()),
        arena_(backend, granularity_) {}

  std::size_t cap() const { return cap_; }
  void set_cap(std::size_t cap) { cap_ = cap; }
  // `collect(incoming)` runs before the backend is asked for `incoming` more bytes.
  void set_collector(std::function<void(std::size_t)> collect) { collect_ = std::move(collect); }
  // The slow path now running: its stream (for the history), and whether it runs during a capture,
  // when the source grows but collects nothing (no release is legal then).
  void BeginSlowPath(Stream stream) { slow_path_stream_ = stream; }
  Stream slow_path_stream() const { return slow_path_stream_; }
  void set_capturing(bool capturing) { capturing_ = capturing; }
  // The private pool (tag; 0: the device's own pools) whose growth and releases run now: what it
  // reserves is also counted as its own (PyTorch's reserved_bytes_by_private_pools).
  void set_owner(std::uint16_t tag) { owner_ = tag; }
  std::uint16_t owner() const { return owner_; }
  // Tenants: private pool `tag` (a tenant's pool) may reserve at most `cap` bytes; `name` is said
  // when that refuses growth.
  void SetOwnerCap(std::uint16_t tag, std::size_t cap, std::string name) { owner_caps_[tag] = {cap, std::move(name)}; }
  // The cap of tenant pool `tag` (nullopt: none).
  std::optional<std::size_t> OwnerCap(std::uint16_t tag) const {
    auto it = owner_caps_.find(tag);
    return it == owner_caps_.end() ? std::nullopt : std::optional<std::size_t>(it->second.cap);
  }
  // The bytes private pool `tag` (0: the device's own pools) has reserved now.
  std::size_t OwnedNow(std::uint16_t tag) const;
  // Whether pool `tag` has a cap (a tenant's) that reserving `bytes` more would exceed.
  bool OverOwnerCap(std::uint16_t tag, std::size_t bytes) const {
    const std::optional<std::size_t> cap = OwnerCap(tag);
    return cap.has_value() && OwnedNow(tag) + bytes > *cap;
  }
  // The reserved bytes counted for private pool `tag` (0: the device's own pools), or nullptr when
  // it never reserved any.
  const StatArray* OwnedReserved(std::uint16_t tag) const;
  // `allocator_of(tag)`: where private pool `tag`'s segments come from (nullptr: the backend), as
  // PyTorch's MemPool(allocator) gets them; the pool's settings own it (PrivatePoolSettings), and
  // it stays while the pool holds memory. The cap and the stats count such segments as any other;
  // the backend's counts do not.
  void set_segment_allocators(std::function<SegmentAllocator*(std::uint16_t tag)> allocator_of) {
    allocator_of_ = std::move(allocator_of);
  }
  // Forgets the counts of private pool `tag` (the pool is gone).
  void ForgetOwner(std::uint16_t tag) { owned_.erase(tag); }
  void ResetOwnedPeaks();
  void ResetOwnedAccumulated();
  bool Capturing() const override { return capturing_; }
  void CollectFor(std::size_t to_map) override {
    if (to_map > 0 && collect_ && !capturing_) collect_(to_map);
  }
  std::size_t GrowableRangeBytes() const override { return cap_; }

  // MemorySource.
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t bytes, PoolIndex pool) override;
  bool ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) override;
  absl::StatusOr<std::uintptr_t> ReserveRange(std::size_t bytes, std::size_t to_map, PoolIndex pool) override;
  void ReleaseRange(std::uintptr_t va, std::size_t bytes) override;
  void AbandonRange(std::uintptr_t va, std::size_t bytes) override;
  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes, PoolIndex pool) override;
  bool ReleasePhysical(const PhysicalPiece& piece, PoolIndex pool) override;
  absl::Status MapPieces(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) override;
  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override;
  // Gives back the address reservations no range uses (empty_cache, the allocator's end).
  void TrimAddressSpace();
  // Waits for `stream`'s work: an event on it; the device for a pseudo key; nothing for a stream
  // retired (RetireStream) and not used since, whose handle may be dead.
  absl::Status SynchronizeStream(Stream stream) override;
  // Waits for `stream`'s work now and remembers that nothing of it is pending, before the host
  // destroys the stream (a handle value CUDA may give a new stream later): no later wait records on
  // the dead handle, and a new stream with the same handle inherits only idle blocks.
  absl::Status RetireStream(Stream stream);
  // The stream is used again (a new stream with that handle, or the same one).
  void Revive(Stream stream) {
    if (!retired_.empty()) retired_.erase(stream);
  }
  std::size_t Headroom() const override;

  // The registered range that contains [addr, addr + size), or nullopt.
  std::optional<Range> Holding(std::uintptr_t addr, std::size_t size = 1) const;
  // The registered range that starts at `base`, or nullopt.
  std::optional<Range> At(std::uintptr_t base) const;
  Totals totals() const;
  // The number of large-pool ranges larger than `bytes` (oversize segments).
  std::int64_t LargeRangesOver(std::size_t bytes) const;
  // `spare_bytes`: physical memory the pools hold unmapped (it exists, and is reserved).
  absl::Status CheckInvariants(std::size_t spare_bytes) const;
  // For the device-wide check, each linear (not a lookup each): every block of `blocks` ((address,
  // size), sorted by address) lies inside one registered range (one walk beside the ranges); and
  // `units` (the pools' segments and slabs as ranges, in any order) are exactly the registered
  // ranges, each with its bytes, pool, kind and mapped bytes (as multisets, by a sum of 64-bit
  // mixes). The error names the first block or unit that does not.
  absl::Status CheckHolds(absl::Span<const std::pair<std::uintptr_t, std::size_t>> blocks) const;
  absl::Status CheckUnits(absl::Span<const Range> units) const;

 private:
  // ResourceExhausted when reserving `bytes` more would exceed the cap.
  absl::Status CheckHeadroom(std::size_t bytes) const;
  // What a private pool's SegmentAllocator returned for `bytes` (one lookup in the registered
  // ranges): Internal naming it when it is NULL, wraps past the address space's end, overlaps a
  // registered range (a repeated pointer; not given back: its free could release memory live blocks
  // use) or is not kSegmentAlignment-aligned (given back through its Free); nothing is registered.
  absl::Status CheckExternalSegment(SegmentAllocator& external, std::uintptr_t base, std::size_t bytes) const;
  // Counts `delta` reserved bytes of `pool` for pool tag `owner` (0: the device's own pools).
  void CountOwned(std::uint16_t owner, PoolIndex pool, std::int64_t delta);

  Backend* const backend_;
  StatLedger* const stats_;
  HistoryRing* const history_;
  const std::size_t granularity_;
  std::size_t cap_ = 0;
  std::function<void(std::size_t)> collect_;
  Stream slow_path_stream_ = nullptr;
  bool capturing_ = false;
  std::uint16_t owner_ = 0;
  absl::flat_hash_map<std::uint16_t, StatArray> owned_;  // reserved bytes per pool tag (0 too)
  struct OwnerCapEntry {
    std::size_t cap = 0;
    std::string name;
  };
  absl::flat_hash_map<std::uint16_t, OwnerCapEntry> owner_caps_;  // tenants' pools
  // The private pools whose segments another allocator gives (PyTorch's MemPool(allocator)).
  std::function<SegmentAllocator*(std::uint16_t tag)> allocator_of_;
  absl::btree_map<std::uintptr_t, Range> ranges_;
  AddressArena arena_;
  std::int64_t physical_handles_ = 0;  // physical allocations created and not released, and their bytes
  std::size_t physical_bytes_ = 0;
  absl::flat_hash_set<Stream> retired_;  // streams waited for by RetireStream, unused since
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_SEGMENT_REGISTRY_H_
