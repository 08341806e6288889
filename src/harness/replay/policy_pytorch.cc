// src/harness/replay/policy_pytorch.cc — the "pytorch-policy" replay policy: a model of PyTorch's native
// CUDA caching allocator (harness/replay/policies.h), the baseline bucketalloc is compared with.
//
// It follows ../shared/reference/pytorch.md §1 (CUDACachingAllocator, default configuration):
//   - sizes round up to 512 B (kMinBlockSize); requests <= 1 MiB use the small pool, others the large;
//   - segment sizes: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else rounded up to 2 MiB;
//   - best fit per pool by (stream, size, address): the smallest free block of the stream that fits;
//   - a small block is split when at least 512 B remain; a large one when more than 1 MiB remains
//     (max_split_size unlimited, so no oversize rules apply);
//   - a freed block coalesces at once with its free neighbours in the same segment;
//   - a failed cudaMalloc releases every cached block that is a whole segment (not split), in both
//     pools, and retries once; then the request is an OOM.
// Fragmentation() walks both pools' cached free blocks (whole segments and the free pieces of split
// ones) into power-of-two bins, as bucketalloc's histogram does.
// Not modelled: record_stream events, garbage collection, expandable segments, memory fractions,
// roundup_power2_divisions, max_split_size (all off by default).

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"
#include "harness/replay/pytorch_model.h"
#include "harness/replay/replay_allocator.h"

namespace bucketalloc::harness {
namespace {

using pytorch_model::kMinBlockSize;
using pytorch_model::kSmallSize;

constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;
constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;
constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
constexpr std::size_t kRoundLarge = std::size_t{2} << 20;

// A piece of a segment; segments are doubly linked lists of blocks in address order.
struct Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  Stream stream = nullptr;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::size_t requested = 0;  // while allocated: the caller's size
};

// BlockComparatorSize: (stream, size, ptr).
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    const auto sa = reinterpret_cast<std::uintptr_t>(a->stream), sb = reinterpret_cast<std::uintptr_t>(b->stream);
    return std::tie(sa, a->size, a->ptr) < std::tie(sb, b->size, b->ptr);
  }
};
using BlockPool = std::set<Block*, BySize>;

class PyTorchPolicy final : public DeviceReplayAllocator {
 public:
  using DeviceReplayAllocator::DeviceReplayAllocator;
  ~PyTorchPolicy() override {
    // Every block is either live or in a free pool. Segments go back to the device (on a GPU the
    // next replay needs the memory); a segment starts at a block without a predecessor.
    std::vector<Block*> blocks;
    live_.ForEach([&](Block* b) { blocks.push_back(b); });
    for (BlockPool* pool : {&small_, &large_}) blocks.insert(blocks.end(), pool->begin(), pool->end());
    for (Block* b : blocks) {
      if (b->prev != nullptr) continue;
      std::size_t segment = 0;
      for (Block* x = b; x != nullptr; x = x->next) segment += x->size;
      device().Free(reinterpret_cast<void*>(b->ptr), segment).IgnoreError();
    }
    for (Block* b : blocks) delete b;
  }

  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) override {
    if (size == 0) return nullptr;
    const std::size_t rounded = pytorch_model::RoundSize(size);
    const bool small = rounded <= kSmallSize;
    BlockPool& pool = small ? small_ : large_;
    Block* block = FindFree(pool, stream, rounded);
    if (block == nullptr) {
      const std::size_t segment = small                      ? kSmallBuffer
                                  : rounded < kMinLargeAlloc ? kLargeBuffer
                                                             : RoundUp(rounded, kRoundLarge);
      absl::StatusOr<void*> p = device().Allocate(segment);
      if (!p.ok()) {
        ReleaseCachedBlocks();
        p = device().Allocate(segment);
      }
      if (!p.ok())
        return absl::ResourceExhaustedError(absl::StrCat("pytorch-policy: out of memory (", p.status().message(), ")"));
      block = new Block{reinterpret_cast<std::uintptr_t>(*p), segment, stream, small};
      NotePeak();
    } else {
      pool.erase(block);
    }
    const std::size_t remaining = block->size - rounded;
    if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
      Block* rest = new Block{block->ptr + rounded, remaining, stream, small, false, block, block->next};
      if (block->next != nullptr) block->next->prev = rest;
      block->next = rest;
      block->size = rounded;
      pool.insert(rest);
    }
    live_.Add(block, size);
    return reinterpret_cast<void*>(block->ptr);
  }

  absl::Status Free(void* ptr, std::size_t) override {
    if (ptr == nullptr) return absl::OkStatus();
    absl::StatusOr<Block*> taken = live_.Take(ptr, "pytorch-policy");
    if (!taken.ok()) return taken.status();
    Block* block = *taken;
    BlockPool& pool = block->small ? small_ : large_;
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour == nullptr || neighbour->allocated) continue;
      pool.erase(neighbour);
      if (neighbour == block->prev) {  // the block grows down over its free predecessor
        block->ptr = neighbour->ptr;
        block->prev = neighbour->prev;
        if (block->prev != nullptr) block->prev->next = block;
      } else {
        block->next = neighbour->next;
        if (block->next != nullptr) block->next->prev = block;
      }
      block->size += neighbour->size;
      delete neighbour;
    }
    pool.insert(block);
    return absl::OkStatus();
  }

  // The cached free blocks of both pools (whole segments and the free pieces of split ones).
  PoolFragmentation Fragmentation() const override {
    PoolFragmentation f;
    for (const BlockPool* pool : {&small_, &large_}) {
      for (const Block* b : *pool) f.AddFree(b->size);
    }
    live_.Report(f);
    f.reserved = static_cast<std::int64_t>(device().used_bytes());
    return f;
  }

 private:
  // get_free_block: the smallest free block of the stream that fits (max_split_size unlimited).
  static Block* FindFree(BlockPool& pool, Stream stream, std::size_t size) {
    Block key{0, size, stream};
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    return *it;
  }

  // release_cached_blocks: every free block that is a whole segment goes back to the device.
  void ReleaseCachedBlocks() {
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr && device().Free(reinterpret_cast<void*>(b->ptr), b->size).ok()) {
          it = pool->erase(it);
          delete b;
        } else {
          ++it;
        }
      }
    }
  }

  BlockPool small_, large_;
  pytorch_model::LiveBlocks<Block> live_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchPolicy(absl::string_view, std::size_t capacity,
                                                                   ReplayDeviceKind kind) {
  absl::StatusOr<std::unique_ptr<ReplayDevice>> device = MakeReplayDevice(capacity, kind);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ReplayAllocator>(std::make_unique<PyTorchPolicy>(std::move(*device)));
}

}  // namespace bucketalloc::harness
