#include "memory/slab.h"

#include "internal/check.h"

namespace bucketalloc::internal {

void Slab::Assign(int new_cls) {
  BA_DCHECK(live == 0, "re-assigning a slab with live slots");
  cls = new_cls;
  slot_size = static_cast<std::uint32_t>(SmallSizeClasses::ClassSize(new_cls));
  capacity = SmallSizeClasses::SlotsPerSlab(new_cls);
  // Pop order is ascending addresses: slot 0 first.
  for (std::uint32_t i = 0; i < capacity; ++i) {
    free_stack[i] = static_cast<std::uint16_t>(capacity - 1 - i);
  }
  free_top = capacity;
}

}  // namespace bucketalloc::internal
