// src/pool/pool.h — the one shape of a pool (layer L3).
//
// Owns: the `Pool` concept, what the front end asks of every pool: make a request of a size,
// allocate on the fast path or serve on the slow path, return a block, release its wholly free
// memory in age order, report fragmentation and its memory spans, and check itself; `ReleaseOrder`,
// the age-ordered list of wholly free units (empty slabs, free segments) that both pools keep; and
// `ReleaseOldestUntil`, the one loop that releases from it.
// The front end holds its pools in one list (src/frontend/bookkeeping/pools.h) and runs the same code over
// each; a pool's own file says how it serves.
// Thread-safety: none; the device lock guards every pool.
//
// Example:
//   template <Pool P> void Warm(P& pool, typename P::StreamState& ss, std::size_t size) {
//     if (auto h = pool.TryAllocate(ss, pool.RequestFor(size))) pool.Return(*h);
//   }
#ifndef BUCKETALLOC_POOL_POOL_H_
#define BUCKETALLOC_POOL_POOL_H_

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "internal/bits.h"
#include "internal/intrusive_list.h"

namespace bucketalloc::internal {

// How a slow path served a request: from memory already cached (a cache hit after all) or from new
// device memory (a miss).
enum class Served { kFromCache, kFromNewMemory };

// A span of memory a pool holds (a slab, a segment, or a mapped run of a stitched segment) with its
// blocks in address order, for snapshots. A block in use is live or awaiting stream events; the
// front end knows which.
struct SpanView {
  struct Block {
    std::uintptr_t ptr = 0;
    std::size_t size = 0;
    bool in_use = false;
  };
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Stream stream = nullptr;
  PoolIndex pool = kAllPools;   // the pool that holds it
  int tier = -1;                // the tier whose blocks it holds, or -1
  bool virtual_memory = false;  // a mapped run of a stitched range
  std::vector<Block> blocks;
};

// The pieces of a pool's partly used memory that count as inactive_split.
struct InactiveSplit {
  std::int64_t bytes = 0;
  std::int64_t count = 0;
};

// Calls for each unit of memory a pool holds (a slab, a segment): its base, its bytes, the bytes
// backed by memory (a stitched segment's holes are not), and whether it is a virtual-memory range.
using UnitFn = absl::FunctionRef<void(std::uintptr_t base, std::size_t bytes, std::size_t mapped, bool virtual_memory)>;

// Wholly free units of a pool (T with a ListNode and an age field), oldest first. Invariant: a unit
// is in it iff it holds no active block.
template <typename T, ListNode T::*kNode, std::uint64_t T::*kSince>
class ReleaseOrder {
 public:
  // Appends `unit`, free since `now`.
  void Push(T* unit, std::uint64_t now) {
    unit->*kSince = now;
    list_.PushBack(unit);
  }
  // Removes `unit` if it is in the order.
  static void Remove(T* unit) {
    if ((unit->*kNode).linked()) IntrusiveList<T, kNode>::Unlink(unit);
  }
  static bool Contains(const T* unit) { return (unit->*kNode).linked(); }
  T* Oldest() const { return list_.front(); }
  // The age of the oldest unit, or UINT64_MAX when there is none (garbage collection compares
  // pools by it).
  std::uint64_t OldestAge() const {
    const T* oldest = list_.front();
    return oldest == nullptr ? std::numeric_limits<std::uint64_t>::max() : oldest->*kSince;
  }
  // The number of units (slow: a walk).
  std::int64_t Count() const {
    std::int64_t n = 0;
    for (const T* u = list_.front(); u != nullptr; u = list_.next(u)) ++n;
    return n;
  }

 private:
  IntrusiveList<T, kNode> list_;
};

// What the front end asks of a pool. `Handle` names one block the pool handed out; `Request` is a
// size made ready for the pool (its class, tier or rounding); `StreamState` is the pool's free
// lists of one stream, constructed from the pool.
template <typename P>
concept Pool = requires(P& pool, const P& cpool, typename P::StreamState& ss, const typename P::StreamState& css,
                        const typename P::Request& request, typename P::Handle h, Stream stream, std::size_t n,
                        Served* served, FragmentationReport* report, std::vector<SpanView>* spans, bool live,
                        UnitFn units, std::uintptr_t addr) {
  { P::kIndex } -> std::convertible_to<PoolIndex>;
  requires std::constructible_from<typename P::StreamState, const P&>;
  // The fast path: a cached block, or nullopt. No backend call, no heap allocation.
  { cpool.RequestFor(n) } -> std::same_as<typename P::Request>;
  { pool.TryAllocate(ss, request) } -> std::same_as<std::optional<typename P::Handle>>;
  {pool.Return(h)};
  // The slow path: look again (whole lists), then new memory from the source. ResourceExhausted
  // when the memory cannot be had (the front end then releases and retries); FailedPrecondition
  // when the source refuses during a capture.
  { pool.Serve(ss, stream, request, served) } -> std::same_as<absl::StatusOr<typename P::Handle>>;
  // A slow path outside the request flow (restoring a checkpoint): the free block [addr, addr + n)
  // of the unit of stream `stream` that holds addr, carved out and active. NotFound when no unit of
  // the pool holds addr; another error, naming why, when the range is not one free block's part
  // that the pool could have handed out; nothing changes on an error.
  { pool.TakeAt(addr, n, stream) } -> std::same_as<absl::StatusOr<typename P::Handle>>;
  // A smaller request to try before an OOM (a tier request's exact size), or nullopt.
  { cpool.Fallback(n, request) } -> std::same_as<std::optional<typename P::Request>>;
  // The OOM report's rounded size and the backend allocation the request needed.
  { cpool.OomSizes(request) } -> std::same_as<std::pair<std::size_t, std::size_t>>;
  // A handed-out block.
  { P::Address(h) } -> std::same_as<std::uintptr_t>;
  { P::BlockSize(h) } -> std::same_as<std::size_t>;
  { P::StreamOf(h) } -> std::same_as<Stream>;
  { cpool.Oversize(h) } -> std::same_as<bool>;
  {P::SetRequested(h, n)};
  {P::MarkPending(h)};
  // Release in age order: the age of the oldest wholly free unit, releasing it (its bytes; 0 when
  // there is none or the source refused), and releasing everything that can go.
  { cpool.OldestFree() } -> std::same_as<std::uint64_t>;
  { pool.ReleaseOldest() } -> std::same_as<std::size_t>;
  {pool.ReleaseAll()};
  // Reports and checks.
  // The histogram of free blocks and tier use, kept as blocks move (no walk), and the largest free
  // block of one stream's lists.
  {cpool.AddFragmentation(report)};
  { cpool.LargestFree(css) } -> std::same_as<std::size_t>;
  {cpool.Describe(spans)};
  { cpool.inactive_split() } -> std::same_as<InactiveSplit>;
  // Reserved bytes the pool holds in no unit (a virtual-memory pool's spare pieces).
  { cpool.spare_bytes() } -> std::same_as<std::size_t>;
  {cpool.ForEachUnit(units)};
  { cpool.CheckInvariants(n) } -> std::same_as<absl::Status>;
  { cpool.CheckStreamState(css) } -> std::same_as<absl::Status>;
  // Checks a handle the front end holds for a live (or, live == false, pending) block.
  { cpool.CheckHandle(h, live) } -> std::same_as<absl::Status>;
};

// The free blocks of a pool by size (the fragmentation histogram's counts and bytes), kept as
// blocks move so that a metrics scrape or a timeline sample reads O(bins) figures under the device
// lock instead of walking every block. A step is two adds at the size's floor(log2) (no clamp, no
// multiply: on the fast path); the report's last bin gathers the sizes above it when read.
// Invariant: equal to the histogram of a walk over the pool's free blocks (each pool's
// CheckInvariants compares them).
struct FreeHistogram {
  static constexpr int kBins = 64;  // one per floor(log2(size)) of a 64-bit size
  std::array<std::int64_t, kBins> count{};
  std::array<std::int64_t, kBins> bytes{};

  // One more (Add) or one fewer (Remove) free block of `size` bytes (size > 0: no test for 0, which
  // std::countl_zero would add).
  static int BinOf(std::size_t size) { return 63 - __builtin_clzll(static_cast<unsigned long long>(size)); }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Add(std::size_t size) {
    const int bin = BinOf(size);
    count[bin] += 1;
    bytes[bin] += static_cast<std::int64_t>(size);
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Remove(std::size_t size) {
    const int bin = BinOf(size);
    count[bin] -= 1;
    bytes[bin] -= static_cast<std::int64_t>(size);
  }
  // `n` free blocks of `size` bytes more (n < 0: fewer); for the slabs' slot counts.
  void Step(std::size_t size, std::int64_t n) {
    const int bin = BinOf(size);
    count[bin] += n;
    bytes[bin] += n * static_cast<std::int64_t>(size);
  }
  // Adds the counts to `out`'s histogram (bins at or above kHistogramBins - 1 in its last) and
  // total (not its largest block: the pool knows that from its free lists).
  void AddTo(PoolFragmentation* out) const {
    for (int i = 0; i < kBins; ++i) {
      const int to = std::min(i, kHistogramBins - 1);
      out->free_count[to] += count[i];
      out->free_bytes[to] += bytes[i];
      out->total_free += bytes[i];
    }
  }
  // True when `walked` (a walk's report of the same blocks, alone in its pool) has these counts.
  bool Matches(const PoolFragmentation& walked) const {
    PoolFragmentation kept;
    AddTo(&kept);
    return walked.free_count == kept.free_count && walked.free_bytes == kept.free_bytes &&
           walked.total_free == kept.total_free;
  }
  // The bytes of every free block (a sum over the bins).
  std::int64_t total() const {
    std::int64_t t = 0;
    for (std::int64_t b : bytes) t += b;
    return t;
  }
};

// Releases `pool`'s wholly free units, oldest first, until `target` bytes are released or none is
// left (or the source refuses); returns the bytes released.
template <typename P>
std::size_t ReleaseOldestUntil(P& pool, std::size_t target) {
  std::size_t released = 0;
  while (released < target) {
    const std::size_t n = pool.ReleaseOldest();
    if (n == 0) break;
    released += n;
  }
  return released;
}

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_POOL_POOL_H_
