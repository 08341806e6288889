// src/pool/small_pool.cc — the small pool's slow path, release, reports and checks.
#include "pool/small_pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

static_assert(Pool<SmallPool>);

absl::StatusOr<SmallPool::Handle> SmallPool::Serve(StreamState& ss, Stream stream, const Request& r, Served* served) {
  if (std::optional<Handle> h = TryAllocate(ss, r)) {
    *served = Served::kFromCache;
    return *h;
  }
  // Every empty slab of this class is in the partial list, so an empty slab here has another class.
  Slab* slab = ss.empty.front();
  *served = slab != nullptr ? Served::kFromCache : Served::kFromNewMemory;
  if (slab != nullptr) {
    SlabList::Unlink(slab);  // from its old class's partial list
  } else {
    absl::StatusOr<std::uintptr_t> base = ctx_.source->AllocateSegment(kSlabBytes, kSmallPool);
    if (!base.ok()) return base.status();
    slab = slab_meta_.New();
    slab->base = *base;
    slab->stream = stream;
    slab->owner = &ss;
    all_.insert(slab);
    free_.Add(kSlabBytes);
    ctx_.stats->Increase(&DeviceStats::cached_bytes, kSmallPool, kSlabBytes);
  }
  if (slab->cls != r.cls) {
    // The bytes of the slab tail that the new class cannot use stay cached but unusable.
    slab->Assign(r.cls);
  }
  ss.partial[r.cls].PushFront(slab);
  return TakeSlot(slab);
}

absl::StatusOr<SmallPool::Handle> SmallPool::TakeAt(std::uintptr_t addr, std::size_t size, Stream stream) {
  ctx_.stats->Settle();
  auto refuse = [&](absl::string_view why) {
    return absl::StrCat("cannot allocate ", size, " bytes at 0x", absl::Hex(addr), " in the small pool's slabs: ", why);
  };
  Slab* slab = nullptr;
  for (Slab* s : all_) {
    if (addr >= s->base && addr - s->base < kSlabBytes) {
      slab = s;
      break;
    }
  }
  if (slab == nullptr) return absl::NotFoundError(refuse("no slab of this pool holds that address"));
  if (slab->stream != stream) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("its slab at 0x", absl::Hex(slab->base), " belongs to stream 0x",
                            absl::Hex(reinterpret_cast<std::uintptr_t>(slab->stream)), ", not to stream 0x",
                            absl::Hex(reinterpret_cast<std::uintptr_t>(stream)))));
  }
  const std::uintptr_t offset = addr - slab->base;
  // An empty slab serves any class: it takes the class of `size` when that is a class size whose
  // slots include the address.
  const bool class_size =
      size > 0 && size <= kMaxSmallSize && SmallSizeClasses::ClassSize(SmallSizeClasses::ClassOf(size)) == size;
  const bool reassign = slab->live == 0 && size != slab->slot_size && class_size && offset % size == 0 &&
                        offset / size < SmallSizeClasses::SlotsPerSlab(SmallSizeClasses::ClassOf(size));
  const std::size_t slot_size = reassign ? size : slab->slot_size;
  if (size != slot_size || offset % slot_size != 0 || offset / slot_size >= slab->capacity) {
    return absl::InvalidArgumentError(
        refuse(absl::StrCat("accepted: exactly one slot of its slab at 0x", absl::Hex(slab->base), ", whose slots are ",
                            slab->slot_size, " bytes each (", slab->capacity, " of them)",
                            slab->live == 0 ? ", or a slot of a class size when empty" : "")));
  }
  const auto slot = static_cast<std::uint32_t>(offset / slot_size);
  if (reassign) {
    // As Serve re-assigns an empty slab: out of its old class's list, into the new one's.
    StreamState& ss = *static_cast<StreamState*>(slab->owner);
    const int cls = SmallSizeClasses::ClassOf(size);
    SlabList::Unlink(slab);
    slab->Assign(cls);
    ss.partial[cls].PushFront(slab);
  }
  std::uint32_t at = 0;
  while (at < slab->free_top && slab->free_stack[at] != slot) ++at;
  if (at == slab->free_top) {
    return absl::FailedPreconditionError(
        refuse(absl::StrCat("slot ", slot, " of the slab at 0x", absl::Hex(slab->base), " is in use")));
  }
  // TakeSlot pops the top of the free stack: move the slot there.
  std::swap(slab->free_stack[at], slab->free_stack[slab->free_top - 1]);
  return TakeSlot(slab);
}

bool SmallPool::ReleaseSlab(Slab* slab) {
  BA_DCHECK(slab->live == 0, "releasing a slab with live slots");
  if (!ctx_.source->ReleaseSegment(slab->base, kSlabBytes, kSmallPool)) return false;  // stays cached
  SlabList::Unlink(slab);
  EmptyList::Unlink(slab);
  decltype(release_order_)::Remove(slab);
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, kSmallPool, kSlabBytes);
  free_.Remove(kSlabBytes);
  all_.erase(slab);
  slab_meta_.Delete(slab);
  return true;
}

std::size_t SmallPool::ReleaseOldest() {
  ctx_.stats->Settle();  // a debt's peaks count with the cached bytes as they were before the release
  Slab* slab = release_order_.Oldest();
  if (slab == nullptr) return 0;
  return ReleaseSlab(slab) ? kSlabBytes : 0;
}

std::size_t SmallPool::LargestFree(const StreamState& ss) const {
  if (!ss.empty.empty()) return kSlabBytes;
  for (int cls = SmallSizeClasses::kNumClasses - 1; cls >= 0; --cls) {
    if (const Slab* slab = ss.partial[cls].front()) return slab->slot_size;
  }
  return 0;
}

void SmallPool::WalkFragmentation(FragmentationReport* report) const {
  PoolFragmentation& out = report->pools[kSmallPool];
  for (const Slab* slab : all_) {
    if (slab->live == 0) {
      out.AddFree(kSlabBytes);  // an empty slab serves any class
    } else {
      out.AddFree(slab->slot_size, slab->free_slots());
    }
  }
}

void SmallPool::Describe(std::vector<SpanView>* spans) const {
  for (const Slab* slab : all_) {
    SpanView& span = spans->emplace_back();
    span.base = slab->base;
    span.size = kSlabBytes;
    span.stream = slab->stream;
    span.pool = kSmallPool;
    std::vector<bool> in_use(slab->capacity, true);
    for (std::uint32_t i = 0; i < slab->free_top; ++i) in_use[slab->free_stack[i]] = false;
    for (std::uint32_t i = 0; i < slab->capacity; ++i) {
      span.blocks.push_back({slab->SlotAddress(i), slab->slot_size, in_use[i]});
    }
    const std::size_t used = std::size_t{slab->capacity} * slab->slot_size;
    if (used < kSlabBytes) span.blocks.push_back({slab->base + used, kSlabBytes - used, false});
  }
}

InactiveSplit SmallPool::inactive_split() const {
  InactiveSplit split;
  for (const Slab* s : all_) {
    if (s->live == 0) continue;
    split.bytes += static_cast<std::int64_t>(s->free_slots()) * s->slot_size;
    split.count += s->free_slots();
  }
  return split;
}

absl::Status SmallPool::CheckInvariants(std::int64_t active_slots) const {
  std::int64_t live = 0;
  std::int64_t empty = 0;
  for (const Slab* slab : all_) {
    if (slab->live > slab->capacity || slab->free_top != slab->capacity - slab->live) {
      return absl::InternalError(
          absl::StrCat("small pool: slab ", absl::Hex(slab->base), " has inconsistent slot counts"));
    }
    std::vector<bool> seen(slab->capacity, false);
    for (std::uint32_t i = 0; i < slab->free_top; ++i) {
      const std::uint32_t slot = slab->free_stack[i];
      if (slot >= slab->capacity || seen[slot]) {
        return absl::InternalError(
            absl::StrCat("small pool: slab ", absl::Hex(slab->base), " free stack has a bad or repeated slot ", slot));
      }
      seen[slot] = true;
    }
    const bool listed = slab->list_node.linked();
    if (listed == slab->full()) {
      return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base), " is ",
                                              listed ? "full but listed" : "not full but unlisted"));
    }
    if ((slab->live == 0) != slab->empty_node.linked() ||
        (slab->live == 0) != decltype(release_order_)::Contains(slab)) {
      return absl::InternalError(absl::StrCat("small pool: slab ", absl::Hex(slab->base),
                                              " is in the empty list and release order iff it is empty: violated"));
    }
    empty += slab->live == 0;
    live += slab->live;
  }
  if (empty != release_order_.Count()) return absl::InternalError("small pool: release order misses empty slabs");
  if (live != active_slots) {
    return absl::InternalError(
        absl::StrCat("small pool: slabs hold ", live, " active slots but ", active_slots, " small blocks are active"));
  }
  if (static_cast<std::size_t>(all_.size()) != slab_meta_.live()) {
    return absl::InternalError("small pool: slab metadata is held that belongs to no slab");
  }
  FragmentationReport walked;
  WalkFragmentation(&walked);
  if (!free_.Matches(walked.pools[kSmallPool])) {
    return absl::InternalError(absl::StrCat("small pool: the kept free-block histogram (", free_.total(),
                                            " bytes) differs from a walk's (", walked.pools[kSmallPool].total_free,
                                            " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status SmallPool::CheckHandle(Handle h, bool) const {
  if (!all_.contains(h.slab) || h.slot >= h.slab->capacity) {
    return absl::InternalError(absl::StrCat("small pool: a handle names slot ", h.slot, " of no slab of this pool"));
  }
  return absl::OkStatus();
}

absl::Status SmallPool::CheckStreamState(const StreamState& ss) const {
  for (int cls = 0; cls < SmallSizeClasses::kNumClasses; ++cls) {
    for (const Slab* s = ss.partial[cls].front(); s != nullptr; s = ss.partial[cls].next(s)) {
      if (s->cls != cls || s->owner != &ss || s->full()) {
        return absl::InternalError(absl::StrCat("small pool: the class ", cls, " list holds slab ", absl::Hex(s->base),
                                                " of class ", s->cls, " that does not belong there"));
      }
    }
  }
  for (const Slab* s = ss.empty.front(); s != nullptr; s = ss.empty.next(s)) {
    if (s->live != 0 || s->owner != &ss) {
      return absl::InternalError(absl::StrCat("small pool: the empty list holds slab ", absl::Hex(s->base),
                                              " with live slots or of another stream"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
