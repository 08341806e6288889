// src/memory/segment.h — segments and their blocks (layer L2).
//
// Owns: `Segment` (one backend allocation of the large pool) and `Block` (a piece of a segment),
// and the two operations that change a segment's partition: Split and Coalesce.
// Layer: L2; used by the large pool (L3). Never calls the backend.
// Thread-safety: none; the device lock guards every segment.
//
// Invariants (checked by LargePool::CheckInvariants), once the large pool's deferred return is
// done (pool/large_pool.h; until then its block stays allocated, as before its return, and every
// count is as before it):
//   - the blocks of a segment, in `prev`/`next` order, tile [base, base + size) exactly:
//       first->ptr == base, b->next->ptr == b->ptr + b->size, last->ptr + last->size == base + size;
//   - two neighbours are never both kFree (free neighbours are always coalesced);
//   - a kFree block is in exactly one free list (its stream's size tree, or its tier's list),
//     others in none;
//   - active_blocks == number of blocks whose state is not kFree; free_blocks and free_bytes
//     count and sum the kFree ones;
//   - a segment is in the release order iff active_blocks == 0;
//   - a tier segment holds exactly one block (tier blocks are never split or merged);
//   - virtual-memory segments (stitching on) may hold holes (kUnmapped blocks): granule-aligned
//     ranges with no physical memory behind them; two holes are never neighbours, a hole is in no
//     list, and a segment is never all hole (it is released then).
//
// Example:
//   Block* rest = SplitBlock(block, 4 << 20, blocks);   // block keeps 4 MiB, rest is the remainder
//   Block* merged = MergeBlocks(block, block->next, blocks);  // with a free neighbour out of its list
#ifndef BUCKETALLOC_MEMORY_SEGMENT_H_
#define BUCKETALLOC_MEMORY_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bucketalloc/backend.h"
#include "internal/intrusive_list.h"
#include "internal/object_pool.h"

namespace bucketalloc::internal {

enum class BlockState : std::uint8_t {
  kFree,         // cached, in a free list
  kAllocated,    // held by a caller
  kPendingFree,  // freed by the caller, waiting for stream events (RecordStream)
  kUnmapped,     // a hole of a virtual-memory segment: its granules were moved or released
};

struct Segment;
struct Block;

// A mapped piece of a virtual-memory segment: granules [g0, g0 + n) of it, backed by one physical
// allocation mapped whole (pool/virtual_backing.h).
struct Piece {
  std::size_t g0 = 0;
  std::size_t n = 0;
  PhysicalHandle handle = 0;
};

// A block's links in a BlockTree (memory/block_tree.h): its children and its heap priority.
struct TreeNode {
  Block* left = nullptr;
  Block* right = nullptr;
  std::uint64_t priority = 0;
  bool linked = false;
};

struct Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // the caller's size while allocated or pending
  Segment* segment = nullptr;
  Block* prev = nullptr;  // address-order neighbours inside the segment
  Block* next = nullptr;
  ListNode free_node;            // in a tier free list while kFree (a tier segment's block)
  TreeNode tree_node;            // in its stream's size tree while kFree (other blocks)
  std::uint64_t free_since = 0;  // the pool clock when it was last returned (while kFree)
  BlockState state = BlockState::kFree;
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Stream stream = nullptr;
  void* owner = nullptr;  // the large pool's per-stream state whose free lists hold its blocks
  int tier = -1;          // index of the tier whose blocks this segment holds, or -1
  Block* first = nullptr;
  std::int32_t active_blocks = 0;
  std::int32_t free_blocks = 0;  // number and bytes of its kFree blocks
  std::size_t free_bytes = 0;
  ListNode release_node;         // in the pool's release order while wholly free
  std::uint64_t free_since = 0;  // the pool clock when it became wholly free
  // Virtual-memory segments: their pieces by address (holes are the gaps), owned by the pool's
  // VirtualBacking; nullptr otherwise.
  std::vector<Piece>* pieces = nullptr;
};

using BlockPool = ObjectPool<Block>;

// Splits `block` (kFree, not in any list) so that it keeps `size` bytes; returns the new block
// holding the remainder (kFree, not in any list, as old as `block`). Precondition: size < block->size.
Block* SplitBlock(Block* block, std::size_t size, BlockPool& blocks);

// Merges `block` (kFree, not in any list) with `neighbour` (kFree, already removed from its list)
// when `neighbour` is block->next or block->prev; returns the surviving block.
Block* MergeBlocks(Block* block, Block* neighbour, BlockPool& blocks);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_MEMORY_SEGMENT_H_
