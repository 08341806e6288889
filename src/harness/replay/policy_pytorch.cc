// src/harness/replay/policy_pytorch.cc — the "pytorch-policy[:CONF]" replay policy: a model of PyTorch's
// native CUDA caching allocator (harness/replay/policies.h), the baseline bucketalloc is compared with.
//
// It follows ../shared/reference/pytorch.md §1 (CUDACachingAllocator):
//   - sizes round up to 512 B (kMinBlockSize), or to roundup_power2_divisions' steps (§1.4); requests
//     <= 1 MiB use the small pool, others the large;
//   - segment sizes: <= 1 MiB -> 2 MiB; < 10 MiB -> large_segment_size (20 MiB); else rounded up to
//     2 MiB;
//   - best fit per pool by (stream, size, address): the smallest free block of the stream that fits;
//     with max_split_size set, a block of at least max_split_size serves no request below it, and
//     one of at least the request + max_non_split_rounding (20 MiB) none at all (§1.5);
//   - a small block is split when at least 512 B remain; a large one when the request is below
//     max_split_size and more than 1 MiB remains (§1.6);
//   - a freed block coalesces at once with its free neighbours in the same segment;
//   - a failed cudaMalloc first releases oversize cached blocks of the pool (max_split_size set:
//     release_available_cached_blocks, §1.8 step 5) and retries; then releases every cached block
//     that is a whole segment (not split), in both pools, and retries once; then the request is an
//     OOM.
// A CONF is PyTorch's own (PYTORCH_CUDA_ALLOC_CONF), of the keys modelled: max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions and large_segment_size_mb, read and checked as
// bucketalloc reads them (bucketalloc/options.h), e.g. pytorch-policy:max_split_size_mb:256.
// Fragmentation() walks both pools' cached free blocks (whole segments and the free pieces of split
// ones) into power-of-two bins, as bucketalloc's histogram does.
// Not modelled: record_stream events, garbage collection (PyTorch's needs a memory fraction, which a
// replay on a card of exactly its capacity does not set), expandable segments (pytorch-expandable),
// memory fractions.

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/units.h"
#include "harness/replay/pytorch_model.h"
#include "harness/replay/replay_allocator.h"

namespace bucketalloc::harness {
namespace {

using pytorch_model::kMinBlockSize;
using pytorch_model::kSmallSize;

constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;
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

// The settings of PyTorch's CONF the model follows (their defaults: PyTorch's).
struct Settings {
  std::size_t max_split_size = kUnlimited;
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  std::size_t large_segment_size = std::size_t{20} << 20;  // kLargeBuffer
  std::vector<std::uint32_t> divisions;                    // per interval; empty: none above 1
};

class PyTorchPolicy final : public DeviceReplayAllocator {
 public:
  PyTorchPolicy(std::unique_ptr<ReplayDevice> device, Settings settings)
      : DeviceReplayAllocator(std::move(device)), settings_(std::move(settings)) {}
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
    const std::size_t rounded = pytorch_model::RoundSize(size, settings_.divisions);
    const bool small = rounded <= kSmallSize;
    BlockPool& pool = small ? small_ : large_;
    Block* block = FindFree(pool, stream, rounded);
    if (block == nullptr) {
      const std::size_t segment = small                      ? kSmallBuffer
                                  : rounded < kMinLargeAlloc ? settings_.large_segment_size
                                                             : RoundUp(rounded, kRoundLarge);
      absl::StatusOr<void*> p = device().Allocate(segment);
      if (!p.ok() && ReleaseOversizeBlocks(pool, stream, rounded)) p = device().Allocate(segment);
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
    if (small ? remaining >= kMinBlockSize : rounded < settings_.max_split_size && remaining > kSmallSize) {
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

  // Each segment (one cudaMalloc: the unit that goes back whole), its blocks in address order.
  MemoryBreakdown Breakdown() const override {
    std::vector<MemorySpan> spans;
    auto add_segment = [&](const Block* head) {
      MemorySpan& span = spans.emplace_back();
      span.base = head->ptr;
      span.small_pool = head->small;
      for (const Block* b = head; b != nullptr; b = b->next) {
        span.blocks.push_back({b->ptr, b->size, b->requested, b->allocated});
        span.size += b->size;
      }
    };
    pytorch_model::ForEachSegmentHead(live_, add_segment, small_, large_);
    return BreakDown(spans, device().used_bytes());
  }

 private:
  // get_free_block: the smallest free block of the stream that fits, unless it is oversize (at
  // least max_split_size) and the request is not, or the request is and the block exceeds it by
  // max_non_split_rounding or more.
  Block* FindFree(BlockPool& pool, Stream stream, std::size_t size) const {
    Block key{0, size, stream};
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    const std::size_t max_split = settings_.max_split_size;
    if (size < max_split && (*it)->size >= max_split) return nullptr;
    if (size >= max_split && (*it)->size >= size + settings_.max_non_split_rounding) return nullptr;
    return *it;
  }

  // release_available_cached_blocks (max_split_size set): the stream's smallest oversize block of
  // at least max(size, max_split_size) goes back to the device; without one, its largest oversize
  // blocks, largest first, until they add up to that much. True when it released enough.
  bool ReleaseOversizeBlocks(BlockPool& pool, Stream stream, std::size_t size) {
    const std::size_t max_split = settings_.max_split_size;
    if (max_split == kUnlimited) return false;
    const std::size_t want = std::max(size, max_split);
    Block key{0, want, stream};
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->stream == stream) return Release(pool, &it);
    std::size_t released = 0;
    while (released < want && it != pool.begin()) {
      --it;
      const std::size_t bytes = (*it)->size;
      if ((*it)->stream != stream || bytes < max_split) break;
      if (!Release(pool, &it)) break;  // not a whole segment: not oversize after all
      released += bytes;
    }
    return released >= want;
  }

  // The free block at *it goes back to the device when it is a whole segment, as an oversize block
  // is (a block of at least max_split_size is never split, and a segment holding one is its size).
  // *it moves to the block after it; true when it was released.
  bool Release(BlockPool& pool, BlockPool::iterator* it) {
    Block* b = **it;
    if (b->prev != nullptr || b->next != nullptr || !device().Free(reinterpret_cast<void*>(b->ptr), b->size).ok()) {
      ++*it;
      return false;
    }
    delete b;
    *it = pool.erase(*it);
    return true;
  }

  // release_cached_blocks: every free block that is a whole segment goes back to the device.
  void ReleaseCachedBlocks() {
    for (BlockPool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) Release(*pool, &it);
    }
  }

  const Settings settings_;
  BlockPool small_, large_;
  pytorch_model::LiveBlocks<Block> live_;
};

// The keys of PyTorch's CONF the model follows.
constexpr const char* kModelledKeys[] = {"max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
                                         "large_segment_size_mb"};

// `conf` (PyTorch's CONF of the modelled keys) read as bucketalloc reads PYTORCH_CUDA_ALLOC_CONF.
absl::StatusOr<Settings> ParseSettings(absl::string_view conf) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator \"pytorch-policy:", conf, "\": ", why, "; accepted: PyTorch's CONF of the keys the model follows (",
        absl::StrJoin(kModelledKeys, ", "), "), e.g. pytorch-policy:max_split_size_mb:256"));
  };
  Settings s;
  if (conf.empty()) return s;
  absl::StatusOr<std::vector<OptionSetting>> settings = SplitOptions(conf);
  if (!settings.ok()) return bad(settings.status().message());
  for (const OptionSetting& o : *settings) {
    if (std::find(std::begin(kModelledKeys), std::end(kModelledKeys), o.key) == std::end(kModelledKeys)) {
      return bad(absl::StrCat("'", o.key, "' is not a key the model follows"));
    }
  }
  absl::StatusOr<Options> options = ParseOptions(conf);
  if (!options.ok()) return bad(options.status().message());
  // PyTorch's own floors, where they are above bucketalloc's (a large segment under 10 MiB would
  // be smaller than the requests it is for).
  if (options->large_segment_size <= 10 * kMiB) {
    return bad(absl::StrCat("large_segment_size_mb ", options->large_segment_size / kMiB,
                            " is PyTorch's floor or below: PyTorch takes a whole number above 10 (the model an even "
                            "one: its segments are whole 2 MiB pages)"));
  }
  if (options->max_non_split_rounding < options->large_segment_size) {
    return bad(absl::StrCat("max_non_split_rounding_mb ", options->max_non_split_rounding / kMiB,
                            " is below large_segment_size_mb, which PyTorch takes as its floor"));
  }
  s.max_split_size = options->max_split_size;
  s.max_non_split_rounding = options->max_non_split_rounding;
  s.large_segment_size = options->large_segment_size;
  const std::vector<std::uint32_t>& d = options->roundup_power2_divisions;
  if (std::any_of(d.begin(), d.end(), [](std::uint32_t div) { return div > 1; })) s.divisions = d;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchPolicy(absl::string_view conf, std::size_t capacity,
                                                                   ReplayDeviceKind kind, DriverMeter* meter) {
  absl::StatusOr<Settings> settings = ParseSettings(conf);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<std::unique_ptr<ReplayDevice>> device =
      MakeReplayDevice(capacity, kind, /*virtual_memory=*/false, meter);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ReplayAllocator>(std::make_unique<PyTorchPolicy>(std::move(*device), std::move(*settings)));
}

}  // namespace bucketalloc::harness
