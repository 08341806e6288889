// src/harness/replay/policy_pytorch_expandable.cc — the "pytorch-expandable[:large_page_mb=N]" replay
// policy: a model of PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=
// expandable_segments:True (harness/replay/policies.h), the allocator PyTorch's own OOM message
// recommends against fragmentation, and so the anchor stitching is compared with.
//
// It follows ../shared/reference/pytorch.md §1.9 and c10/cuda/CUDACachingAllocator.cpp (Note
// [Expandable Segments], ExpandableSegment, find_expandable_block, map_block, unmap_block,
// release_blocks), with the default configuration otherwise:
//   - sizes round up to 512 B; requests <= 1 MiB use the small pool, others the large;
//   - each pool has one expandable segment per stream: an address range of 1 1/8 x the device's
//     memory (cuMemAddressReserve), backed by pages of 2 MiB (small pool) or 20 MiB (large pool;
//     large_page_mb=N sets it) created and mapped as needed. A segment is a list of blocks in address
//     order: live, free (mapped) and unmapped;
//   - best fit among the stream's free blocks by (size, address), except that a block followed by
//     unmapped pages counts its size plus theirs, and the search moves on to the next larger block
//     while that one's such size is smaller (get_free_block);
//   - a miss maps new pages at the lowest address that fits: the first unmapped block of the
//     stream's segments (by address), together with the free block before it and the free and
//     unmapped blocks after it, that holds the request (find_expandable_block); a new segment when
//     none does. Mapping creates ceil(bytes / page) pages (cuMemCreate each; on OOM the ones created
//     so far are released and the map fails), maps each (cuMemMap) and grants access once for the
//     run (cuMemSetAccess); the mapped block merges with its free neighbours;
//   - every split keeps a remainder of 512 B or more (splitting in expandable mode, both pools);
//   - a freed block coalesces at once with its free neighbours (mapped state equal);
//   - when mapping fails: every free block of both pools gives back its whole pages (a stream
//     synchronization, then cuMemUnmap and cuMemRelease of each; the pieces of pages it shares with live blocks stay),
//     a segment left all unmapped is released (cuMemAddressFree), and the allocation is tried once more; then OOM.
// The device's memory is the replay's capacity (totalGlobalMem), and its physical pages are what
// the capacity counts: reserved bytes are the pages mapped. Segments are ordered by address as
// PyTorch orders them; the simulated device reserves ranges top-down (mmap), so when a stream has
// more than one segment (rare: the first one's range of 1 1/8 x the card must be used up) a GPU
// whose driver reserves bottom-up could prefer the other one.
// Not modelled (as pytorch-policy): record_stream events, garbage collection, memory fractions,
// roundup_power2_divisions, max_split_size, private pools (off by default or absent from traces).

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "harness/replay/pytorch_model.h"
#include "harness/replay/replay_allocator.h"

namespace bucketalloc::harness {
namespace {

using pytorch_model::kMinBlockSize;
using pytorch_model::kSmallSize;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kSmallPage = 2 * kMiB;
constexpr std::size_t kDefaultLargePageMiB = 20;
constexpr std::size_t kMaxLargePageMiB = 1024;

struct Segment;

// A piece of an expandable segment; a segment is a doubly linked list of blocks in address order
// covering its whole address range. Invariant: an unmapped block is page-aligned at both ends and
// never next to another unmapped block; a free mapped block is never next to another free mapped
// block (both merge); a live block is mapped.
struct Block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  Stream stream = nullptr;
  Segment* segment = nullptr;
  bool allocated = false;
  bool mapped = true;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::size_t requested = 0;  // while allocated: the caller's size
};

// BlockComparatorSize: (stream, size, ptr); BlockComparatorAddress: (stream, ptr).
std::uintptr_t StreamKey(const Block* b) { return reinterpret_cast<std::uintptr_t>(b->stream); }
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    return std::make_tuple(StreamKey(a), a->size, a->ptr) < std::make_tuple(StreamKey(b), b->size, b->ptr);
  }
};
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const {
    return std::make_pair(StreamKey(a), a->ptr) < std::make_pair(StreamKey(b), b->ptr);
  }
};

// A BlockPool: its free mapped blocks and its unmapped blocks.
struct Pool {
  std::size_t page = 0;
  std::set<Block*, BySize> blocks;
  std::set<Block*, ByAddress> unmapped;
};

// One ExpandableSegment of `pool`: `pages` pages of `page` bytes from `va`; handles[i] is page i's
// physical memory while it is mapped.
struct Segment {
  Pool* pool = nullptr;
  std::uintptr_t va = 0;
  std::size_t page = 0;
  std::size_t pages = 0;
  std::vector<std::optional<PhysicalHandle>> handles;
};

class PyTorchExpandablePolicy final : public DeviceReplayAllocator {
 public:
  PyTorchExpandablePolicy(std::unique_ptr<ReplayDevice> device, std::size_t large_page)
      : DeviceReplayAllocator(std::move(device)) {
    small_.page = kSmallPage;
    large_.page = large_page;
  }

  ~PyTorchExpandablePolicy() override {
    // Every block is live, free or unmapped; every mapped page goes back (on a GPU the next replay
    // needs the memory), then each segment's address range.
    std::vector<Block*> blocks;
    live_.ForEach([&](Block* b) { blocks.push_back(b); });
    for (Pool* pool : {&small_, &large_}) {
      blocks.insert(blocks.end(), pool->blocks.begin(), pool->blocks.end());
      blocks.insert(blocks.end(), pool->unmapped.begin(), pool->unmapped.end());
    }
    for (Block* b : blocks) delete b;
    for (const std::unique_ptr<Segment>& s : segments_) {
      for (std::size_t i = 0; i < s->handles.size(); ++i) {
        if (!s->handles[i].has_value()) continue;
        device().Unmap(s->va + i * s->page, s->page).IgnoreError();
        device().ReleasePhysical(*s->handles[i], s->page).IgnoreError();
      }
      device().ReleaseAddressRange(s->va, s->pages * s->page).IgnoreError();
    }
  }

  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) override {
    if (size == 0) return nullptr;
    const std::size_t rounded = pytorch_model::RoundSize(size);
    Pool& pool = rounded <= kSmallSize ? small_ : large_;
    Block* block = FindFree(pool, stream, rounded);
    if (block == nullptr) {
      // alloc_block, then release_cached_blocks and alloc_block again.
      absl::StatusOr<Block*> mapped = AllocateExpandable(pool, stream, rounded);
      if (mapped.ok() && *mapped == nullptr) {
        if (absl::Status s = ReleaseCachedBlocks(); !s.ok()) return s;
        mapped = AllocateExpandable(pool, stream, rounded);
      }
      if (!mapped.ok()) return mapped.status();
      if (*mapped == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("pytorch-expandable: out of memory (", rounded,
                                                         " bytes asked, ", device().used_bytes(), " of ",
                                                         device().capacity(), " bytes mapped)"));
      }
      block = *mapped;
    }
    if (block->size - rounded >= kMinBlockSize) {  // should_split in expandable mode
      Block* rest = new Block{block->ptr + rounded, block->size - rounded, stream, block->segment, false, true, block,
                              block->next};
      if (block->next != nullptr) block->next->prev = rest;
      block->next = rest;
      block->size = rounded;
      pool.blocks.insert(rest);
    }
    live_.Add(block, size);
    return reinterpret_cast<void*>(block->ptr);
  }

  absl::Status Free(void* ptr, std::size_t) override {
    if (ptr == nullptr) return absl::OkStatus();
    absl::StatusOr<Block*> taken = live_.Take(ptr, "pytorch-expandable");
    if (!taken.ok()) return taken.status();
    Block* block = *taken;
    Pool& pool = PoolOf(block);
    TryMerge(block, block->prev, pool);
    TryMerge(block, block->next, pool);
    pool.blocks.insert(block);
    return absl::OkStatus();
  }

  // The free mapped blocks of both pools.
  PoolFragmentation Fragmentation() const override {
    PoolFragmentation f;
    for (const Pool* pool : {&small_, &large_}) {
      for (const Block* b : pool->blocks) f.AddFree(b->size);
    }
    live_.Report(f);
    f.reserved = static_cast<std::int64_t>(device().used_bytes());
    return f;
  }

  // Each run of mapped blocks of a segment (whole pages: unmapped blocks are page-aligned), a page
  // the unit that goes back whole.
  MemoryBreakdown Breakdown() const override {
    std::vector<MemorySpan> spans;
    auto add_segment = [&](const Block* head) {
      MemorySpan* span = nullptr;
      for (const Block* b = head; b != nullptr; b = b->next) {
        if (!b->mapped) {
          span = nullptr;
          continue;
        }
        if (span == nullptr) {
          span = &spans.emplace_back();
          span->base = b->ptr;
          span->small_pool = b->segment->pool == &small_;
          span->unit = b->segment->page;
        }
        span->blocks.push_back({b->ptr, b->size, b->requested, b->allocated});
        span->size += b->size;
      }
    };
    pytorch_model::ForEachSegmentHead(live_, add_segment, small_.blocks, small_.unmapped, large_.blocks,
                                      large_.unmapped);
    return BreakDown(spans, device().used_bytes());
  }

 private:
  static Pool& PoolOf(const Block* b) { return *b->segment->pool; }

  // get_free_block: the smallest free block of the stream that fits, by the size it can expand to.
  static Block* FindFree(Pool& pool, Stream stream, std::size_t size) {
    Block key{0, size, stream};
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
    };
    for (auto next = std::next(it);
         next != pool.blocks.end() && (*next)->stream == stream && expandable_size(*next) < expandable_size(*it);
         ++next) {
      it = next;
    }
    Block* b = *it;
    pool.blocks.erase(it);
    return b;
  }

  static bool Allocatable(const Block* b) { return b != nullptr && !b->allocated; }

  // find_expandable_block: the lowest-addressed run of free and unmapped blocks, starting at an
  // unmapped block or the free block before it, that holds `size`; else a new segment's block;
  // nullptr when no segment could hold `size`.
  absl::StatusOr<Block*> FindExpandable(Pool& pool, Stream stream, std::size_t size) {
    Block key{0, 0, stream};
    for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* c = *it;
      if (Allocatable(c->prev)) c = c->prev;
      std::size_t bytes = 0;
      for (const Block* b = c; bytes < size && Allocatable(b); b = b->next) bytes += b->size;
      if (bytes >= size) return c;
    }
    const std::size_t capacity = device().capacity();
    const std::size_t pages = (capacity + capacity / 8 + pool.page - 1) / pool.page;
    // A request larger than a segment's range needs more pages than the card has: PyTorch reserves a
    // segment for it and fails to map it (an OOM). The OOM is the same without the reservation,
    // which a replay that goes on after OOMs would otherwise pile up.
    if (size > pages * pool.page) return nullptr;
    absl::StatusOr<std::uintptr_t> va = device().ReserveAddressRange(pages * pool.page);
    if (!va.ok()) return va.status();
    auto segment = std::make_unique<Segment>(Segment{&pool, *va, pool.page, pages, {}});
    Block* c = new Block{*va, pages * pool.page, stream, segment.get(), false, /*mapped=*/false};
    segments_.push_back(std::move(segment));
    pool.unmapped.insert(c);
    return c;
  }

  // map_block: maps the pages of [to_map->ptr, +bytes) (rounded up to pages) of the unmapped block
  // `to_map`, which becomes a free block merged with its free neighbours (the unmapped rest after
  // it). False when the device has not the memory (nothing is created then).
  absl::StatusOr<bool> MapBlock(Block* to_map, std::size_t bytes) {
    Pool& pool = PoolOf(to_map);
    Segment& s = *to_map->segment;
    const std::size_t begin = (to_map->ptr - s.va) / s.page;
    const std::size_t end = (to_map->ptr + bytes - s.va + s.page - 1) / s.page;
    std::vector<PhysicalPiece> pages;
    for (std::size_t i = begin; i < end; ++i) {
      absl::StatusOr<PhysicalHandle> h = device().CreatePhysical(s.page);
      if (!h.ok()) {
        for (const PhysicalPiece& created : pages) device().ReleasePhysical(created.handle, s.page).IgnoreError();
        if (absl::IsResourceExhausted(h.status())) return false;
        return h.status();
      }
      pages.push_back({*h, s.page});
    }
    std::size_t mapped = 0;
    if (absl::Status st = device().MapRun(s.va + begin * s.page, pages, &mapped); !st.ok()) {
      for (std::size_t i = 0; i < mapped; ++i) device().Unmap(s.va + (begin + i) * s.page, s.page).IgnoreError();
      for (const PhysicalPiece& created : pages) device().ReleasePhysical(created.handle, s.page).IgnoreError();
      return st;
    }
    if (s.handles.size() < end) s.handles.resize(end);
    for (std::size_t i = begin; i < end; ++i) s.handles[i] = pages[i - begin].handle;
    const std::size_t mapped_bytes = (end - begin) * s.page;
    pool.unmapped.erase(to_map);
    to_map->mapped = true;
    if (mapped_bytes < to_map->size) {
      Block* rest = new Block{to_map->ptr + mapped_bytes,
                              to_map->size - mapped_bytes,
                              to_map->stream,
                              to_map->segment,
                              false,
                              /*mapped=*/false,
                              to_map,
                              to_map->next};
      if (to_map->next != nullptr) to_map->next->prev = rest;
      to_map->next = rest;
      to_map->size = mapped_bytes;
      pool.unmapped.insert(rest);
    }
    TryMerge(to_map, to_map->prev, pool);
    TryMerge(to_map, to_map->next, pool);
    pool.blocks.insert(to_map);
    NotePeak();
    return true;
  }

  // try_allocate_expandable_block: maps what the run FindExpandable chose lacks, block by block;
  // nullptr when the device has not the memory (what was mapped before stays mapped and free).
  absl::StatusOr<Block*> AllocateExpandable(Pool& pool, Stream stream, std::size_t size) {
    absl::StatusOr<Block*> found = FindExpandable(pool, stream, size);
    if (!found.ok()) return found.status();
    Block* candidate = *found;
    if (candidate == nullptr) return nullptr;
    if (!candidate->mapped) {
      absl::StatusOr<bool> ok = MapBlock(candidate, std::min(candidate->size, size));
      if (!ok.ok()) return ok.status();
      if (!*ok) return nullptr;
    }
    while (candidate->size < size) {
      // The run continues with an unmapped block: what FindExpandable counted.
      Block* next = candidate->next;
      if (next == nullptr || next->mapped || next->allocated) {
        return absl::InternalError("pytorch-expandable: the run of free and unmapped blocks changed while mapping");
      }
      absl::StatusOr<bool> ok = MapBlock(next, std::min(size - candidate->size, next->size));
      if (!ok.ok()) return ok.status();
      if (!*ok) return nullptr;
      candidate = next;  // it absorbed the free block before it
    }
    pool.blocks.erase(candidate);
    return candidate;
  }

  // try_merge_blocks: `src` joins `dst` (in neither of the pool's sets) when it is free and equally
  // mapped.
  static void TryMerge(Block* dst, Block* src, Pool& pool) {
    if (src == nullptr || src->allocated || src->mapped != dst->mapped) return;
    if (src->mapped) {
      pool.blocks.erase(src);
    } else {
      pool.unmapped.erase(src);
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    dst->size += src->size;
    delete src;
  }

  // unmap_block: the whole pages inside free `block` go back to the device; the pieces before and
  // after them stay free blocks, and the unmapped block merges with unmapped neighbours. A failed
  // driver call ends the replay (PyTorch raises); the pages given back by then are forgotten, so
  // that the destructor does not unmap them again.
  absl::Status UnmapBlock(Block* block) {
    Pool& pool = PoolOf(block);
    Segment& s = *block->segment;
    const std::size_t begin = (block->ptr - s.va + s.page - 1) / s.page;
    const std::size_t end = (block->ptr + block->size - s.va) / s.page;
    if (begin >= end) return absl::OkStatus();
    // unmapHandles: "unlike cudaFree, MemUnmap and MemRelease do not appear to synchronize in all
    // cases, so we have to wait for the stream to finish" (a cudaStreamSynchronize per call).
    if (absl::Status st = device().Synchronize(); !st.ok()) return st;
    for (std::size_t i = begin; i < end; ++i) {
      if (absl::Status st = device().Unmap(s.va + i * s.page, s.page); !st.ok()) return st;
      if (absl::Status st = device().ReleasePhysical(*s.handles[i], s.page); !st.ok()) return st;
      s.handles[i].reset();
    }
    while (!s.handles.empty() && !s.handles.back().has_value()) s.handles.pop_back();
    pool.blocks.erase(block);
    const std::uintptr_t lo = s.va + begin * s.page, hi = s.va + end * s.page;
    if (lo > block->ptr) {
      Block* before =
          new Block{block->ptr, lo - block->ptr, block->stream, block->segment, false, true, block->prev, block};
      if (block->prev != nullptr) block->prev->next = before;
      block->prev = before;
      pool.blocks.insert(before);
    }
    if (block->ptr + block->size > hi) {
      Block* after =
          new Block{hi, block->ptr + block->size - hi, block->stream, block->segment, false, true, block, block->next};
      if (block->next != nullptr) block->next->prev = after;
      block->next = after;
      pool.blocks.insert(after);
    }
    block->ptr = lo;
    block->size = hi - lo;
    block->mapped = false;
    TryMerge(block, block->prev, pool);
    TryMerge(block, block->next, pool);
    pool.unmapped.insert(block);
    return absl::OkStatus();
  }

  // release_cached_blocks (release_blocks of the large pool, then the small): every free block's
  // whole pages are unmapped; a segment left all unmapped gives its address range back.
  absl::Status ReleaseCachedBlocks() {
    for (Pool* pool : {&large_, &small_}) {
      const std::vector<Block*> to_unmap(pool->blocks.begin(), pool->blocks.end());
      for (Block* b : to_unmap) {
        if (absl::Status s = UnmapBlock(b); !s.ok()) return s;
        if (!b->mapped && b->prev == nullptr && b->next == nullptr) {
          if (absl::Status s = ReleaseSegment(b, *pool); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReleaseSegment(Block* whole, Pool& pool) {
    Segment* s = whole->segment;
    if (absl::Status st = device().ReleaseAddressRange(s->va, s->pages * s->page); !st.ok()) return st;
    pool.unmapped.erase(whole);
    delete whole;
    segments_.erase(std::find_if(segments_.begin(), segments_.end(),
                                 [s](const std::unique_ptr<Segment>& p) { return p.get() == s; }));
    return absl::OkStatus();
  }

  Pool small_, large_;
  std::vector<std::unique_ptr<Segment>> segments_;
  pytorch_model::LiveBlocks<Block> live_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchExpandablePolicy(absl::string_view conf,
                                                                             std::size_t capacity,
                                                                             ReplayDeviceKind kind,
                                                                             DriverMeter* meter) {
  std::size_t large_page_mib = kDefaultLargePageMiB;
  if (!conf.empty()) {
    absl::string_view value = conf;
    const bool keyed = absl::ConsumePrefix(&value, "large_page_mb=") || absl::ConsumePrefix(&value, "large_page_mb:");
    if (!keyed || !absl::SimpleAtoi(value, &large_page_mib) || large_page_mib == 0 || large_page_mib % 2 != 0 ||
        large_page_mib > kMaxLargePageMiB) {
      return absl::InvalidArgumentError(
          absl::StrCat("allocator \"pytorch-expandable:", conf,
                       "\": accepted large_page_mb=N, the large pool's page in MiB, an even "
                       "number from 2 to ",
                       kMaxLargePageMiB, " (PyTorch's is 20)"));
    }
  }
  absl::StatusOr<std::unique_ptr<ReplayDevice>> device =
      MakeReplayDevice(capacity, kind, /*virtual_memory=*/true, meter);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ReplayAllocator>(
      std::make_unique<PyTorchExpandablePolicy>(std::move(*device), large_page_mib * kMiB));
}

}  // namespace bucketalloc::harness
