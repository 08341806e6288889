#include "pool/small_pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

SmallPool::~SmallPool() {
  for (Slab* slab : all_) delete slab;
}

// inactive_split counts the free slots of slabs that also hold active slots. When a slab's live
// count goes from `before` to `before + step` (step = +1 or -1) it changes by this much.
void SmallPool::AddInactive(const Slab* slab, std::uint32_t before, int step) {
  const std::uint32_t after = before + step;
  auto contribution = [slab](std::uint32_t live) -> std::int64_t {
    return live == 0 ? 0 : static_cast<std::int64_t>(slab->capacity - live);
  };
  const std::int64_t slots = contribution(after) - contribution(before);
  StatAdd(ctx_.stats->inactive_split_bytes, kSmallPool, slots * slab->slot_size);
  StatAdd(ctx_.stats->inactive_split, kSmallPool, slots);
}

void SmallPool::TakeSlot(Slab* slab, Slot* out) {
  AddInactive(slab, slab->live, +1);
  if (slab->empty_node.linked()) {  // an empty slab comes back into use
    EmptyList::Unlink(slab);
    ReleaseList::Unlink(slab);
  }
  out->slab = slab;
  out->slot = slab->PopSlot();
  if (slab->full()) SlabList::Unlink(slab);
  const std::int64_t size = slab->slot_size;
  DeviceStats& st = *ctx_.stats;
  StatAdd(st.active_bytes, kSmallPool, size);
  StatAdd(st.active, kSmallPool, 1);
  StatAdd(st.cached_bytes, kSmallPool, -size);
}

absl::Status SmallPool::AllocateSlow(StreamState& ss, Stream stream, int cls, Slot* out,
                                     bool* from_cache) {
  // Every empty slab of this class is in the partial list, so an empty slab here has another class.
  Slab* slab = ss.empty.front();
  *from_cache = slab != nullptr;
  if (slab != nullptr) {
    SlabList::Unlink(slab);  // from its old class's partial list
  } else {
    absl::StatusOr<std::uintptr_t> base = ctx_.source->AllocateSegment(kSlabBytes, kSmallPool);
    if (!base.ok()) return base.status();
    slab = new Slab;
    slab->base = *base;
    slab->stream = stream;
    slab->owner = &ss;
    all_.insert(slab);
    StatAdd(ctx_.stats->cached_bytes, kSmallPool, kSlabBytes);
  }
  if (slab->cls != cls) {
    // The bytes of the slab tail that the new class cannot use stay cached but unusable.
    slab->Assign(cls);
  }
  ss.partial[cls].PushFront(slab);
  TakeSlot(slab, out);
  return absl::OkStatus();
}

void SmallPool::Return(Slab* slab, std::uint32_t slot) {
  AddInactive(slab, slab->live, -1);
  const bool was_full = slab->full();
  slab->PushSlot(slot);
  const std::int64_t size = slab->slot_size;
  DeviceStats& st = *ctx_.stats;
  StatAdd(st.active_bytes, kSmallPool, -size);
  StatAdd(st.active, kSmallPool, -1);
  StatAdd(st.cached_bytes, kSmallPool, size);
  StreamState* ss = static_cast<StreamState*>(slab->owner);
  if (was_full) ss->partial[slab->cls].PushBack(slab);
  if (slab->live == 0) {
    slab->free_since = *ctx_.clock;
    ss->empty.PushBack(slab);
    release_order_.PushBack(slab);
  }
}

std::uint64_t SmallPool::OldestEmpty() const {
  const Slab* s = release_order_.front();
  return s == nullptr ? std::numeric_limits<std::uint64_t>::max() : s->free_since;
}

bool SmallPool::ReleaseSlab(Slab* slab) {
  BA_DCHECK(slab->live == 0, "releasing a slab with live slots");
  if (!ctx_.source->ReleaseSegment(slab->base, kSlabBytes, kSmallPool)) return false;  // stays cached
  SlabList::Unlink(slab);
  EmptyList::Unlink(slab);
  ReleaseList::Unlink(slab);
  StatAdd(ctx_.stats->cached_bytes, kSmallPool, -static_cast<std::int64_t>(kSlabBytes));
  all_.erase(slab);
  delete slab;
  return true;
}

std::size_t SmallPool::ReleaseOldest() {
  Slab* slab = release_order_.front();
  if (slab == nullptr) return 0;
  return ReleaseSlab(slab) ? kSlabBytes : 0;
}

std::size_t SmallPool::ReleaseEmpty(std::size_t target) {
  std::size_t released = 0;
  while (released < target) {
    const std::size_t n = ReleaseOldest();
    if (n == 0) break;
    released += n;
  }
  return released;
}

void SmallPool::Fragmentation(PoolFragmentation* out) const {
  auto add_free = [out](std::int64_t size, std::int64_t count) {
    if (count == 0) return;
    const int bin = std::min(Log2Floor(static_cast<std::size_t>(size)), kHistogramBins - 1);
    out->free_count[bin] += count;
    out->free_bytes[bin] += size * count;
    out->total_free += size * count;
    out->largest_free = std::max(out->largest_free, size);
  };
  for (const Slab* slab : all_) {
    if (slab->live == 0) {
      add_free(kSlabBytes, 1);  // an empty slab serves any class
    } else {
      add_free(slab->slot_size, slab->free_slots());
    }
  }
}

absl::Status SmallPool::CheckInvariants(std::int64_t live_slots) const {
  std::int64_t live = 0;
  std::int64_t empty_in_order = 0;
  for (const Slab* s = release_order_.front(); s != nullptr; s = release_order_.next(s)) {
    ++empty_in_order;
    if (s->live != 0) return absl::InternalError("small pool: a slab with live slots is in the release order");
  }
  std::int64_t empty = 0;
  for (const Slab* slab : all_) {
    if (slab->live > slab->capacity || slab->free_top != slab->capacity - slab->live) {
      return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base),
                                              " has inconsistent slot counts"));
    }
    std::vector<bool> seen(slab->capacity, false);
    for (std::uint32_t i = 0; i < slab->free_top; ++i) {
      const std::uint32_t slot = slab->free_stack[i];
      if (slot >= slab->capacity || seen[slot]) {
        return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base),
                                                " free stack has a bad or repeated slot ", slot));
      }
      seen[slot] = true;
    }
    const bool listed = slab->list_node.linked();
    if (listed == slab->full()) {
      return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base), " is ",
                                              listed ? "full but listed" : "not full but unlisted"));
    }
    if ((slab->live == 0) != slab->empty_node.linked() || (slab->live == 0) != slab->release_node.linked()) {
      return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base),
                                              " is in the empty list and release order iff it is empty: violated"));
    }
    empty += slab->live == 0;
    live += slab->live;
  }
  if (empty != empty_in_order) return absl::InternalError("small pool: release order misses empty slabs");
  if (live != live_slots) {
    return absl::InternalError(absl::StrCat("small pool: slabs hold ", live, " active slots but ",
                                            live_slots, " small blocks are active"));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
