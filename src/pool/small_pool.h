// src/pool/small_pool.h — the small pool: requests up to small_pool_limit (<= 1 MiB), rounded to
// one of 38 size classes and packed in 2 MiB slabs, one class per slab (layer L3).
//
// Owns: the slabs of one device, per stream: a list of partly used slabs per class and a list of
// empty slabs (reusable by any class of that stream without a backend call), and the release order
// of empty slabs (oldest first) used by garbage collection and release-and-retry.
// Stats it keeps: allocated, active, cached and inactive_split for the small pool.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   SmallPool::Slot s;
//   if (!pool.TryAllocate(stream_state, cls, &s)) status = pool.AllocateSlow(stream_state, stream, cls, &s);
//   pool.Return(s.slab, s.slot);
#ifndef BUCKETALLOC_POOL_SMALL_POOL_H_
#define BUCKETALLOC_POOL_SMALL_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "bucketalloc/stat_types.h"
#include "internal/intrusive_list.h"
#include "internal/object_pool.h"
#include "memory/size_classes.h"
#include "memory/slab.h"
#include "pool/memory_source.h"

namespace bucketalloc::internal {

class SmallPool {
 public:
  using SlabList = IntrusiveList<Slab, &Slab::list_node>;
  using EmptyList = IntrusiveList<Slab, &Slab::empty_node>;
  using ReleaseList = IntrusiveList<Slab, &Slab::release_node>;
  struct StreamState {
    std::array<SlabList, SmallSizeClasses::kNumClasses> partial;  // live < capacity (empty included)
    EmptyList empty;                                                // live == 0
  };
  struct Slot {
    Slab* slab = nullptr;
    std::uint32_t slot = 0;
    std::uintptr_t address() const { return slab->SlotAddress(slot); }
  };

  explicit SmallPool(const PoolContext& ctx) : ctx_(ctx) {}
  SmallPool(const SmallPool&) = delete;
  SmallPool& operator=(const SmallPool&) = delete;

  // Fast path: takes a slot of class `cls` from a partly used slab of this stream.
  bool TryAllocate(StreamState& ss, int cls, Slot* out) {
    Slab* slab = ss.partial[cls].front();
    if (slab == nullptr) return false;
    TakeSlot(slab, out);
    return true;
  }
  // Slow path: re-assigns an empty slab of another class of this stream, else allocates a new slab
  // from the source.
  // `*from_cache` tells whether memory was already cached. ResourceExhausted from the source.
  absl::Status AllocateSlow(StreamState& ss, Stream stream, int cls, Slot* out, bool* from_cache);

  // Returns a slot to its slab (the block is no longer active).
  void Return(Slab* slab, std::uint32_t slot);

  // Releases empty slabs, oldest first, until `target` bytes are released (SIZE_MAX = all).
  // Returns the bytes released.
  std::size_t ReleaseEmpty(std::size_t target);
  // The free_since of the oldest empty slab, or UINT64_MAX when there is none.
  std::uint64_t OldestEmpty() const;
  // Releases the oldest empty slab; returns its bytes (0 if none).
  std::size_t ReleaseOldest();

  void Fragmentation(PoolFragmentation* out) const;
  absl::Status CheckInvariants(std::int64_t live_entries) const;

  // Calls f(const Slab&) for every slab (reports and checks; slow).
  template <typename F>
  void ForEachSlab(F&& f) const {
    for (const Slab* s : all_) f(*s);
  }

  // Frees all slab metadata; memory must have been released (or is abandoned at shutdown).
  ~SmallPool();

 private:
  void TakeSlot(Slab* slab, Slot* out);
  void AddInactive(const Slab* slab, std::uint32_t live_before, int step);
  bool ReleaseSlab(Slab* slab);  // false (nothing changed) when the source refused

  PoolContext ctx_;
  ReleaseList release_order_;  // empty slabs, oldest first
  // Every slab (owned), for reports and invariant checks; changes only on slow paths.
  absl::flat_hash_set<Slab*> all_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_SMALL_POOL_H_
