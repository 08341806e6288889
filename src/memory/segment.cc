#include "memory/segment.h"

#include "internal/check.h"

namespace bucketalloc::internal {

Block* SplitBlock(Block* block, std::size_t size, BlockPool& blocks) {
  BA_DCHECK(size < block->size, "split leaves an empty remainder");
  Block* rest = blocks.New();
  rest->ptr = block->ptr + size;
  rest->size = block->size - size;
  rest->segment = block->segment;
  rest->free_since = block->free_since;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  return rest;
}

Block* MergeBlocks(Block* block, Block* neighbour, BlockPool& blocks) {
  Block* low = block;
  Block* high = neighbour;
  if (neighbour->next == block) {
    low = neighbour;
    high = block;
  }
  BA_DCHECK(low->next == high, "merging blocks that are not neighbours");
  low->size += high->size;
  low->next = high->next;
  if (high->next != nullptr) high->next->prev = low;
  blocks.Delete(high);
  return low;
}

}  // namespace bucketalloc::internal
