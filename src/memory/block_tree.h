// src/memory/block_tree.h — the free blocks of one stream ordered by (size, address) (layer L2).
//
// Owns: `BlockTree`, an intrusive treap of Blocks keyed by (size, ptr): a binary search tree by key
// that is a heap by a priority drawn from the block's address when it is inserted, so its depth is
// O(log n) expected whatever the order of inserts. LowerBound(size) is PyTorch's best fit (its
// std::set lower_bound over (stream, size, ptr)): the smallest block of at least `size` bytes, the
// lowest address among equals, in O(log n) reads. Insert and Erase are O(log n) too and allocate
// nothing (the links live in the Block), so the large pool's fast path stays free of heap
// allocations.
// A block's key must not change while it is in a tree (the pool takes it out to split or merge).
// Thread-safety: none; the device lock guards it.
//
// Example:
//   BlockTree tree;
//   tree.Insert(block);
//   Block* best = tree.LowerBound(4 << 20);   // nullptr when no block is that large
//   tree.Erase(best);
#ifndef BUCKETALLOC_MEMORY_BLOCK_TREE_H_
#define BUCKETALLOC_MEMORY_BLOCK_TREE_H_

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "memory/segment.h"

namespace bucketalloc::internal {

class BlockTree {
 public:
  std::size_t size() const { return size_; }

  void Insert(Block* block) {
    TreeNode& n = block->tree_node;
    n.left = n.right = nullptr;
    n.priority = Mix(block->ptr);
    n.linked = true;
    // Down the search path while the nodes outrank it, then it takes that place, the subtree there
    // split around it (expected O(1) nodes: most inserts land near a leaf).
    Block** link = &root_;
    while (*link != nullptr && (*link)->tree_node.priority > n.priority) {
      link = Less(block, *link) ? &(*link)->tree_node.left : &(*link)->tree_node.right;
    }
    Split(*link, block, &n.left, &n.right);
    *link = block;
    ++size_;
  }

  // Precondition: `block` is in this tree.
  void Erase(Block* block) {
    Block** link = &root_;
    while (*link != block) link = Less(block, *link) ? &(*link)->tree_node.left : &(*link)->tree_node.right;
    *link = Merge(block->tree_node.left, block->tree_node.right);
    block->tree_node = TreeNode{};
    --size_;
  }

  // The smallest block of at least `size` bytes, the lowest address among equals; nullptr if none.
  Block* LowerBound(std::size_t size) const {
    Block* best = nullptr;
    for (Block* b = root_; b != nullptr;) {
      if (b->size >= size) {
        best = b;
        b = b->tree_node.left;
      } else {
        b = b->tree_node.right;
      }
    }
    return best;
  }

  // The first block after `key` in key order (the next larger (size, address)), which need not be
  // in the tree; nullptr if none.
  Block* After(const Block* key) const {
    Block* best = nullptr;
    for (Block* b = root_; b != nullptr;) {
      if (Less(key, b)) {
        best = b;
        b = b->tree_node.left;
      } else {
        b = b->tree_node.right;
      }
    }
    return best;
  }

  // The largest block (the highest address among equals); nullptr if the tree is empty.
  Block* Last() const {
    Block* b = root_;
    while (b != nullptr && b->tree_node.right != nullptr) b = b->tree_node.right;
    return b;
  }

  // Calls f(block) in key order.
  template <typename F>
  void ForEach(F&& f) const {
    Walk(root_, f);
  }
  // The tree's depth (for tests and checks).
  int Depth() const { return DepthOf(root_); }
  // Checks the order and heap properties and the count; the first violation, or nullptr.
  const char* Check() const {
    std::size_t n = 0;
    const char* error = CheckFrom(root_, nullptr, nullptr, &n);
    if (error == nullptr && n != size_) return "the tree holds another number of blocks than it counts";
    return error;
  }

 private:
  static bool Less(const Block* a, const Block* b) { return std::tie(a->size, a->ptr) < std::tie(b->size, b->ptr); }
  // splitmix64's finalizer: addresses (multiples of 512) become well-spread priorities.
  static std::uint64_t Mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  // Splits `t` into the blocks less than `key` and the others.
  static void Split(Block* t, const Block* key, Block** less, Block** more) {
    if (t == nullptr) {
      *less = *more = nullptr;
    } else if (Less(t, key)) {
      Split(t->tree_node.right, key, &t->tree_node.right, more);
      *less = t;
    } else {
      Split(t->tree_node.left, key, less, &t->tree_node.left);
      *more = t;
    }
  }
  // Joins two trees, every key of `a` less than every key of `b`.
  static Block* Merge(Block* a, Block* b) {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    if (a->tree_node.priority > b->tree_node.priority) {
      a->tree_node.right = Merge(a->tree_node.right, b);
      return a;
    }
    b->tree_node.left = Merge(a, b->tree_node.left);
    return b;
  }
  template <typename F>
  static void Walk(Block* b, F& f) {
    if (b == nullptr) return;
    Walk(b->tree_node.left, f);
    f(b);
    Walk(b->tree_node.right, f);
  }
  static int DepthOf(const Block* b) {
    if (b == nullptr) return 0;
    const int l = DepthOf(b->tree_node.left), r = DepthOf(b->tree_node.right);
    return 1 + (l > r ? l : r);
  }
  static const char* CheckFrom(const Block* b, const Block* lo, const Block* hi, std::size_t* n) {
    if (b == nullptr) return nullptr;
    ++*n;
    if (!b->tree_node.linked) return "a block in the tree is not marked linked";
    if ((lo != nullptr && !Less(lo, b)) || (hi != nullptr && !Less(b, hi))) return "the tree is out of key order";
    for (const Block* c : {b->tree_node.left, b->tree_node.right}) {
      if (c != nullptr && c->tree_node.priority > b->tree_node.priority) return "the tree is not a heap by priority";
    }
    if (const char* e = CheckFrom(b->tree_node.left, lo, b, n)) return e;
    return CheckFrom(b->tree_node.right, b, hi, n);
  }

  Block* root_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_MEMORY_BLOCK_TREE_H_
