// src/frontend/bookkeeping/pools.h — the device's pools as one list, and what the front end records of a block
// a pool handed out (layer L4).
//
// Owns: `Pools`, the pools of one device (small: slabs and packed; large) with the routing rule (a
// request goes to the first pool whose limit it is within) and the means to run one piece of code
// over every pool (ForEach) or over the pool of a handle (Visit); `StreamPools`, every pool's free lists of one
// stream; `PoolHandle`, a block of any pool (typed: the pool it came from is its type);
// `LiveEntry`, one live or pending allocation. It chooses whether the packed and large pools'
// segments are virtual memory (stitching) or plain (MakeSegmentBacking, pool/virtual_backing.h).
// Adding a pool: its files (pool/); here its member, its routing rule, its place in ForEach and
// PoolHandle and StreamPools; and its index and names in bucketalloc/stat_types.h.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   pools.Route(size, [&](auto& pool) { ... });
//   pools.ForEach([&](auto& pool) { pool.ReleaseAll(); });
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_POOLS_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_POOLS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "pool/large_pool.h"
#include "pool/packed_pool.h"
#include "pool/pool.h"
#include "pool/segment_backing.h"
#include "pool/small_pool.h"
#include "pool/virtual_backing.h"

namespace bucketalloc::internal {

// The pool type of a pool reference in a generic lambda (Route, ForEach, Visit).
template <typename Ref>
using PoolType = std::remove_cvref_t<Ref>;

// A block of one of the pools.
using PoolHandle = std::variant<SmallPool::Handle, PackedPool::Handle, LargePool::Handle>;

// One live or pending allocation.
struct LiveEntry {
  PoolHandle handle;
  std::size_t requested = 0;
  std::uint16_t private_pool = 0;  // the private pool's tag (PrivatePools); 0: the device's own pools
};

// Every pool's free lists of one stream.
class StreamPools {
 public:
  StreamPools(const SmallPool& small, const PackedPool& packed, const LargePool& large)
      : states_(small, packed, large) {}
  template <typename P>
  typename P::StreamState& of() {
    return std::get<typename P::StreamState>(states_);
  }
  template <typename P>
  const typename P::StreamState& of() const {
    return std::get<typename P::StreamState>(states_);
  }

 private:
  std::tuple<SmallPool::StreamState, PackedPool::StreamState, LargePool::StreamState> states_;
};

// What a device's (or a private pool's) pools are made of.
struct PoolsConfig {
  // Requests up to `slab_limit` go to the slabs, up to `small_limit` to the packed pool, and
  // above it to the large pool.
  std::size_t slab_limit = 0;
  std::size_t small_limit = kMaxSmallSize;
  LargePoolConfig large;  // the large pool's (its divisions are the packed pool's too)
  // The packed and large pools' segments are virtual memory (pool/virtual_backing.h: stitched at the
  // cap), else plain allocations (pool/plain_backing.h).
  bool stitching = false;
  // The packed pool never splits a block (the large pool's rule is `large.keep_remainder`).
  bool no_split = false;
};

class Pools {
 public:
  Pools(const PoolContext& ctx, const PoolsConfig& config)
      : slab_limit_(std::min(config.slab_limit, config.small_limit)),
        small_limit_(config.small_limit),
        small_(ctx),
        packed_(ctx, config.large.roundup_power2_divisions, config.no_split, config.stitching),
        large_(ctx, config.large, MakeSegmentBacking(ctx, config.large, config.stitching)) {}
  // The number of pools, and the place of pool type P among them (ForEach's order).
  static constexpr int kNumPools = 3;
  template <typename P>
  static constexpr int SlotOf() {
    if constexpr (std::is_same_v<P, SmallPool>) return 0;
    if constexpr (std::is_same_v<P, PackedPool>) return 1;
    return 2;
  }
  Pools(const Pools&) = delete;
  Pools& operator=(const Pools&) = delete;

  SmallPool& small() { return small_; }
  const SmallPool& small() const { return small_; }
  LargePool& large() { return large_; }
  const LargePool& large() const { return large_; }

  // Runs f(pool) with the pool a request of `size` bytes goes to: the slabs up to slab_limit, the
  // packed pool up to small_pool_limit, the large pool above.
  template <typename F>
  decltype(auto) Route(std::size_t size, F&& f) {
    if (size <= slab_limit_) return f(small());
    if (size <= small_limit_) return f(packed_);
    return f(large());
  }
  // For an OOM report: the bytes a stitch could move in the pool a request of `size` goes to, when
  // that pool's segments are virtual memory (nullopt: it does not stitch; slabs never do).
  std::optional<std::size_t> MovableFor(std::size_t size) {
    return Route(size, [](const auto& pool) -> std::optional<std::size_t> {
      if constexpr (std::is_same_v<std::decay_t<decltype(pool)>, SmallPool>) {
        return std::nullopt;
      } else {
        if (!pool.virtual_memory()) return std::nullopt;
        return pool.movable_bytes();
      }
    });
  }
  // Runs f(pool) for every pool, in PoolIndex order.
  template <typename F>
  void ForEach(F&& f) {
    f(small_);
    f(packed_);
    f(large_);
  }
  template <typename F>
  void ForEach(F&& f) const {
    f(small_);
    f(packed_);
    f(large_);
  }
  // Runs f(pool, handle) with the pool `handle` came from.
  template <typename F>
  decltype(auto) Visit(const PoolHandle& handle, F&& f) {
    return std::visit([&](auto h) -> decltype(auto) { return f(PoolOf<decltype(h)>(), h); }, handle);
  }
  template <typename F>
  decltype(auto) Visit(const PoolHandle& handle, F&& f) const {
    return std::visit([&](auto h) -> decltype(auto) { return f(PoolOf<decltype(h)>(), h); }, handle);
  }
  // True while a pool holds a unit (segment, slab) or spare pieces.
  bool HoldsMemory() const {
    bool holds = false;
    ForEach([&](const auto& pool) {
      holds = holds || pool.spare_bytes() > 0;
      pool.ForEachUnit([&](std::uintptr_t, std::size_t, std::size_t, bool) { holds = true; });
    });
    return holds;
  }
  // Adds every pool's fragmentation figures (kept as blocks move) and the largest free block of the
  // free lists of `streams` (a map of Stream to std::unique_ptr<StreamPools> of these pools): a
  // scrape's cost is O(pools x streams x bins), whatever the number of blocks.
  template <typename StreamMap>
  void AddFragmentation(const StreamMap& streams, FragmentationReport* report) const {
    ForEach([&](const auto& pool) {
      using P = PoolType<decltype(pool)>;
      pool.AddFragmentation(report);
      std::int64_t& largest = report->pools[P::kIndex].largest_free;
      for (const auto& entry : streams) {
        largest = std::max(largest, static_cast<std::int64_t>(pool.LargestFree(entry.second->template of<P>())));
      }
    });
  }
  // The pool of type P.
  template <typename P>
  P& Get() {
    if constexpr (std::is_same_v<P, SmallPool>) {
      return small_;
    } else if constexpr (std::is_same_v<P, PackedPool>) {
      return packed_;
    } else {
      return large_;
    }
  }
  std::unique_ptr<StreamPools> NewStreamPools() const {
    return std::make_unique<StreamPools>(small(), packed_, large());
  }

 private:
  template <typename H>
  auto& PoolOf() {
    if constexpr (std::is_same_v<H, SmallPool::Handle>) {
      return small();
    } else if constexpr (std::is_same_v<H, PackedPool::Handle>) {
      return packed_;
    } else {
      return large();
    }
  }
  template <typename H>
  const auto& PoolOf() const {
    if constexpr (std::is_same_v<H, SmallPool::Handle>) {
      return small();
    } else if constexpr (std::is_same_v<H, PackedPool::Handle>) {
      return packed_;
    } else {
      return large();
    }
  }

  const std::size_t slab_limit_;
  const std::size_t small_limit_;
  SmallPool small_;
  PackedPool packed_;
  LargePool large_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_POOLS_H_
