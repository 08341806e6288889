// src/memory/slab.h — a slab: one 2 MiB backend allocation cut into equal slots of one small
// size class (layer L2).
//
// Owns: the slot free stack of one slab. A slab with no live slot can be re-assigned to another
// class of the same stream without a backend call, or released to the backend.
// Thread-safety: none; the device lock guards every slab.
//
// Invariants (checked by SmallPool::CheckInvariants):
//   - 0 <= live <= capacity; free_top == capacity - live;
//   - free_stack[0, free_top) holds distinct slot indices < capacity, none of them live;
//   - a slab is in its stream's partial list of its class iff live < capacity (an empty slab stays
//     there, so the next request of its class is still a cache hit);
//   - a slab with live == 0 is also in its stream's empty list (from which another class can take
//     it) and in the pool's release order; a slab with live > 0 is in neither.
//
// Example:
//   slab->Assign(cls);  std::uint32_t slot = slab->PopSlot();  ...;  slab->PushSlot(slot);
#ifndef BUCKETALLOC_MEMORY_SLAB_H_
#define BUCKETALLOC_MEMORY_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "bucketalloc/backend.h"
#include "internal/intrusive_list.h"
#include "memory/size_classes.h"

namespace bucketalloc::internal {

struct Slab {
  std::uintptr_t base = 0;
  Stream stream = nullptr;
  void* owner = nullptr;  // the small pool's per-stream state that lists this slab
  int cls = -1;           // the size class its slots have, or -1 before the first Assign
  std::uint32_t slot_size = 0;
  std::uint32_t capacity = 0;
  std::uint32_t live = 0;
  std::uint32_t free_top = 0;
  ListNode list_node;     // in its stream's partial list of its class while live < capacity
  ListNode empty_node;    // in its stream's empty list while live == 0
  ListNode release_node;  // in the pool's release order while live == 0
  std::uint64_t free_since = 0;
  // The free slots, [0, free_top); inline, so that a Slab is trivially destructible metadata
  // recycled by an ObjectPool like a Block.
  std::uint16_t free_stack[SmallSizeClasses::kMaxSlotsPerSlab];

  // Gives an empty slab the slots of class `cls`.
  void Assign(int new_cls);
  std::uint32_t PopSlot() {
    ++live;
    return free_stack[--free_top];
  }
  void PushSlot(std::uint32_t slot) {
    --live;
    free_stack[free_top++] = static_cast<std::uint16_t>(slot);
  }
  std::uintptr_t SlotAddress(std::uint32_t slot) const { return base + std::uintptr_t{slot} * slot_size; }
  bool full() const { return live == capacity; }
  std::uint32_t free_slots() const { return capacity - live; }
};
static_assert(SmallSizeClasses::kMaxSlotsPerSlab <= 65536, "slot indices fit in uint16");
static_assert(std::is_trivially_destructible_v<Slab>, "slabs are recycled by an ObjectPool");

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_MEMORY_SLAB_H_
