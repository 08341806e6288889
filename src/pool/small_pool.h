// src/pool/small_pool.h — the small pool: requests up to small_pool_limit (<= 1 MiB), rounded to
// one of 38 size classes and packed in 2 MiB slabs, one class per slab (layer L3).
//
// Owns: the slabs of one device (their metadata recycled by an object pool), per stream: a list of
// partly used slabs per class and a list of empty slabs (reusable by any class of that stream
// without a backend call), and the release order of empty slabs (oldest first) used by garbage
// collection and release-and-retry. It has the shape of every pool (pool/pool.h).
// Stats it keeps: active, cached and inactive_split of the small pool.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   SmallPool::Request r = pool.RequestFor(3000);        // the 3072-byte class
//   std::optional<SmallPool::Handle> h = pool.TryAllocate(stream_state, r);
//   if (!h) h = *pool.Serve(stream_state, stream, r, &served);
//   pool.Return(*h);
#ifndef BUCKETALLOC_POOL_SMALL_POOL_H_
#define BUCKETALLOC_POOL_SMALL_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/stat_types.h"
#include "internal/intrusive_list.h"
#include "internal/object_pool.h"
#include "memory/size_classes.h"
#include "memory/slab.h"
#include "pool/memory_source.h"
#include "pool/pool.h"

namespace bucketalloc::internal {

class SmallPool {
 public:
  static constexpr PoolIndex kIndex = kSmallPool;
  using SlabList = IntrusiveList<Slab, &Slab::list_node>;
  using EmptyList = IntrusiveList<Slab, &Slab::empty_node>;

  struct Request {
    int cls = 0;  // the size class
  };
  // One slot of a slab.
  struct Handle {
    Slab* slab = nullptr;
    std::uint32_t slot = 0;
  };
  // The free lists of one stream.
  struct StreamState {
    explicit StreamState(const SmallPool&) {}
    std::array<SlabList, SmallSizeClasses::kNumClasses> partial;  // live < capacity (empty included)
    EmptyList empty;                                              // live == 0
  };

  explicit SmallPool(const PoolContext& ctx) : ctx_(ctx) {}
  SmallPool(const SmallPool&) = delete;
  SmallPool& operator=(const SmallPool&) = delete;

  Request RequestFor(std::size_t size) const { return {SmallSizeClasses::ClassOf(size)}; }

  // Fast path: a slot of the request's class from a partly used slab of this stream.
  std::optional<Handle> TryAllocate(StreamState& ss, const Request& r) {
    ctx_.stats->Settle();  // the packed part's deferred return counts first (it shares the gauges)
    Slab* slab = ss.partial[r.cls].front();
    if (slab == nullptr) return std::nullopt;
    return TakeSlot(slab);
  }
  // Slow path: a partly used slab again, else an empty slab of another class of this stream
  // (re-assigned, no backend call: kFromCache), else a new slab from the source (kFromNewMemory).
  absl::StatusOr<Handle> Serve(StreamState& ss, Stream stream, const Request& r, Served* served);
  std::optional<Request> Fallback(std::size_t, const Request&) const { return std::nullopt; }
  std::pair<std::size_t, std::size_t> OomSizes(const Request& r) const {
    return {SmallSizeClasses::ClassSize(r.cls), kSlabBytes};
  }

  // Returns a slot to its slab (the block is no longer active).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Return(Handle h) {
    ctx_.stats->Settle();
    Slab* slab = h.slab;
    StepInactive(slab, -1);
    const bool was_full = slab->full();
    slab->PushSlot(h.slot);
    const std::int64_t size = slab->slot_size;
    ctx_.stats->Decrease(&DeviceStats::active_bytes, kSmallPool, size);
    ctx_.stats->Decrease(&DeviceStats::active, kSmallPool, 1);
    ctx_.stats->Increase(&DeviceStats::cached_bytes, kSmallPool, size);
    StreamState* ss = static_cast<StreamState*>(slab->owner);
    if (was_full) ss->partial[slab->cls].PushBack(slab);
    if (slab->live == 0) {
      ss->empty.PushBack(slab);
      release_order_.Push(slab, *ctx_.clock);
    }
  }

  // Takes the free slot at `addr` of `size` bytes (the slot size of its slab) on the free lists of
  // `stream` (the stream of the slab that holds it) and returns it as an active block (a slow path:
  // it walks the slabs; for restoring a checkpoint, PyTorch's setCheckpointPoolState). An empty
  // slab of another class is given `size`'s class first when `size` is a class size.
  // NotFound (nothing changed) when no slab of this pool holds addr; InvalidArgument or
  // FailedPrecondition (nothing changed), naming the address, the size and why, when the range is
  // not exactly one free slot of that size, or the slab is on another stream.
  absl::StatusOr<Handle> TakeAt(std::uintptr_t addr, std::size_t size, Stream stream);

  static std::uintptr_t Address(Handle h) { return h.slab->SlotAddress(h.slot); }
  static std::size_t BlockSize(Handle h) { return h.slab->slot_size; }
  static Stream StreamOf(Handle h) { return h.slab->stream; }
  bool Oversize(Handle) const { return false; }
  static void SetRequested(Handle, std::size_t) {}  // the live entry keeps it
  static void MarkPending(Handle) {}                // a pending slot is simply not free

  // Release order of empty slabs.
  std::uint64_t OldestFree() const { return release_order_.OldestAge(); }
  std::size_t ReleaseOldest();
  void ReleaseAll() { ReleaseOldestUntil(*this, ~std::size_t{0}); }

  // Adds the free-block histogram, kept as slots move (no walk): a slab with live slots counts its
  // free slots, an empty one counts as one free block of kSlabBytes (it serves any class).
  void AddFragmentation(FragmentationReport* report) const { free_.AddTo(&report->pools[kSmallPool]); }
  // The largest free block of one stream's slabs: an empty slab, else the largest class with a free slot.
  std::size_t LargestFree(const StreamState& ss) const;
  // The same histogram (and the largest free block) from a walk over every slab, for the checks.
  void WalkFragmentation(FragmentationReport* report) const;
  void ForEachUnit(UnitFn f) const {
    for (const Slab* s : all_) f(s->base, kSlabBytes, kSlabBytes, false);
  }
  absl::Status CheckHandle(Handle h, bool live) const;
  void Describe(std::vector<SpanView>* spans) const;
  // The free slots of slabs that also hold active slots.
  InactiveSplit inactive_split() const;
  std::size_t spare_bytes() const { return 0; }
  absl::Status CheckInvariants(std::int64_t active_slots) const;
  absl::Status CheckStreamState(const StreamState& ss) const;

 private:
  // Pops a slot of `slab` (in its class's partial list).
  ABSL_ATTRIBUTE_ALWAYS_INLINE Handle TakeSlot(Slab* slab) {
    StepInactive(slab, +1);
    if (slab->empty_node.linked()) {  // an empty slab comes back into use
      EmptyList::Unlink(slab);
      ReleaseOrder<Slab, &Slab::release_node, &Slab::free_since>::Remove(slab);
    }
    Handle h{slab, slab->PopSlot()};
    if (slab->full()) SlabList::Unlink(slab);
    const std::int64_t size = slab->slot_size;
    ctx_.stats->Increase(&DeviceStats::active_bytes, kSmallPool, size);
    ctx_.stats->Increase(&DeviceStats::active, kSmallPool, 1);
    ctx_.stats->Decrease(&DeviceStats::cached_bytes, kSmallPool, size);
    return h;
  }
  // inactive_split counts the free slots of slabs that also hold active slots: when `slab`'s live
  // count is about to change by `step` (+1 or -1), it changes by this much.
  // The free-block histogram changes with it: an empty slab counts as one block of kSlabBytes.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void StepInactive(const Slab* slab, int step) {
    const std::uint32_t before = slab->live;
    const std::uint32_t after = before + step;
    const std::int64_t slots = (after == 0 ? 0 : std::int64_t{slab->capacity} - after) -
                               (before == 0 ? 0 : std::int64_t{slab->capacity} - before);
    ctx_.stats->Add(&DeviceStats::inactive_split_bytes, kSmallPool, slots * slab->slot_size);
    ctx_.stats->Add(&DeviceStats::inactive_split, kSmallPool, slots);
    if (before == 0) {
      free_.Remove(kSlabBytes);
      free_.Step(slab->slot_size, std::int64_t{slab->capacity} - after);
    } else if (after == 0) {
      free_.Step(slab->slot_size, -(std::int64_t{slab->capacity} - before));
      free_.Add(kSlabBytes);
    } else if (step > 0) {
      free_.Remove(slab->slot_size);
    } else {
      free_.Add(slab->slot_size);
    }
  }
  bool ReleaseSlab(Slab* slab);  // false (nothing changed) when the source refused

  PoolContext ctx_;
  ObjectPool<Slab, 16> slab_meta_;
  ReleaseOrder<Slab, &Slab::release_node, &Slab::free_since> release_order_;  // empty slabs, oldest first
  // Every slab, for reports and invariant checks; changes only on slow paths.
  absl::flat_hash_set<Slab*> all_;
  FreeHistogram free_;  // kept by StepInactive and new and released slabs; equal to a walk's
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_SMALL_POOL_H_
