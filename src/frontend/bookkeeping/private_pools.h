// src/frontend/bookkeeping/private_pools.h — CUDA graph captures and the private memory pools they allocate
// into, on one device (layer L4). PyTorch's PrivatePool semantics (c10/cuda/CUDACachingAllocator.cpp:
// beginAllocateToPool, endAllocateToPool, releasePool, graph_pools_freeable).
//
// Owns: the routings now running (a capture or a MemPool context: a pool and a stream filter), and
// the private pools by tag (slot 0 is the device's own pools, never stored here), each with its own
// small and large pool (own segments and slabs, own free lists per stream) and a use count: +1 per
// Begin of a routing into it, -1 per Release. A private pool's blocks serve only requests routed to
// it: during a capture a freed block returns to its pool's free lists and serves later requests of
// the same pool, in the same capture or another capture sharing the pool, as PyTorch's do. A pool
// whose count reaches 0 is freeable: the device gives its wholly free memory back after a device
// synchronization (release-and-retry, empty_cache), and forgets the pool once it holds no memory.
// It also owns the use_on_oom pools (PyTorch's MemPool(use_on_oom=True)): the pools whose cached
// blocks a request of the device's own pools may take before it fails.
// A tenant's pool (AddTenant) is a private pool that no capture routes to and that is never
// freeable: the device routes a tenant's requests to it.
// Invariants (CheckInvariants): every routing names a pool in use (count > 0) that is not a
// tenant's; a pool's count is at least the routings into it; a stored pool is in use or still holds
// memory; a tenant's pool has a count of exactly 1; each pool's own checks.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   pools.Begin(id, filter, device);                // beginAllocateToPool: count + 1
//   std::uint16_t tag = pools.TagFor(stream);       // 0: the device's own pools
//   pools.End(id, device);                          // endAllocateToPool
//   pools.Release(id);                              // releasePool: count - 1; 0: freeable
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_PRIVATE_POOLS_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_PRIVATE_POOLS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/capture.h"
#include "frontend/bookkeeping/pools.h"

namespace bucketalloc::internal {

class PrivatePools {
 public:
  // One private pool.
  struct Pool {
    GraphPoolId id;
    int use_count = 0;             // routings begun into it and not released; 0: freeable
    PrivatePoolSettings settings;  // how it gets and splits its memory (Configure)
    std::unique_ptr<Pools> pools;
    absl::flat_hash_map<Stream, std::unique_ptr<StreamPools>> streams;  // its free lists per stream
    bool freeable() const { return use_count == 0; }
    // A tenant's pool: its index (1 up; its id is TenantPoolId(index)), else 0. Permanent, never
    // routed to by a capture.
    int tenant() const { return id.first == kTenantIdFirst ? static_cast<int>(id.second) : 0; }
  };
  // The id of tenant `index`'s pool: a first half no PyTorch pool id has (PyTorch counts up from 0
  // or 1 in one half and leaves the other 0), so that Begin and Release refuse or ignore it.
  static GraphPoolId TenantPoolId(int index) { return GraphPoolId{kTenantIdFirst, static_cast<std::uint64_t>(index)}; }
  static constexpr std::uint64_t kTenantIdFirst = 0xB0CE7A110C7E4A47ull;

  // `make_pools(settings)` builds the small and large pool of a private pool.
  using MakePools = std::function<std::unique_ptr<Pools>(const PrivatePoolSettings&)>;
  explicit PrivatePools(MakePools make_pools) : make_pools_(std::move(make_pools)), pools_(1) {}

  // True while some routing runs (a capture or a MemPool context).
  bool routing() const { return !routings_.empty(); }
  // PyTorch's markCaptureBegin/markCaptureEnd: a CUDA graph capture starts or ends on the device.
  // From the first mark on, only a marked capture counts as one (CaptureMayRun); a routing with
  // none underway is a MemPool context. A mark left unbalanced (a capture that failed between its
  // marks) is forgotten when End, Release or EndAbandoned leave no routing.
  void MarkCapture(bool begin) {
    captures_marked_ = true;
    if (begin) {
      ++marked_captures_;
    } else if (marked_captures_ > 0) {
      --marked_captures_;
    }
  }
  // Whether a CUDA graph capture may be running: a marked one, or, for a caller that never marks
  // them (the C ABI's captures, the LD_PRELOAD shim), any routing.
  bool CaptureMayRun() const { return routing() && (!captures_marked_ || marked_captures_ > 0); }
  // The tag of the pool a request on `stream` goes to now: the latest routing whose filter accepts
  // it, else 0 (the device's own pools). The first time a routing serves a stream it remembers it,
  // and asks `capturing(stream)`: a routing that served a capturing stream is a capture's (else a
  // MemPool context's).
  std::uint16_t TagFor(Stream stream, absl::FunctionRef<bool(Stream)> capturing);
  // The private pool of a non-zero tag.
  Pool& at(std::uint16_t tag) { return *pools_[tag]; }
  const Pool& at(std::uint16_t tag) const { return *pools_[tag]; }
  // The free lists of `stream` in pool `tag`.
  StreamPools& StreamPoolsFor(std::uint16_t tag, Stream stream);
  // Calls f(tag, pool) for every stored private pool.
  template <typename F>
  void ForEach(F&& f) {
    for (std::size_t t = 1; t < pools_.size(); ++t)
      if (pools_[t] != nullptr) f(static_cast<std::uint16_t>(t), *pools_[t]);
  }
  template <typename F>
  void ForEach(F&& f) const {
    for (std::size_t t = 1; t < pools_.size(); ++t)
      if (pools_[t] != nullptr) f(static_cast<std::uint16_t>(t), static_cast<const Pool&>(*pools_[t]));
  }
  // The number of tag slots (stored pools and free slots, slot 0 included).
  std::size_t num_tags() const { return pools_.size(); }

  // Starts routing the requests `filter` accepts into pool `id` (created, or its count + 1).
  // InvalidArgument without a filter; FailedPrecondition while a routing into `id` already runs (as
  // PyTorch refuses); ResourceExhausted past 65535 pools.
  absl::Status Begin(GraphPoolId id, CaptureFilter filter, int device);
  // One more use of pool `id` with no routing into it (PyTorch's createOrIncrefPool: a MemPool is
  // made); creates the pool when it is not stored. InvalidArgument for a tenant's id;
  // ResourceExhausted past 65535 pools.
  absl::Status Incref(GraphPoolId id, int device);
  // The use count of pool `id` (0 when it is not stored).
  int UseCount(GraphPoolId id) const {
    const std::uint16_t tag = Find(id);
    return tag == 0 ? 0 : pools_[tag]->use_count;
  }
  // The tag of pool `id` (stored, in use or freeable), or 0.
  std::uint16_t TagOf(GraphPoolId id) const { return Find(id); }
  // Sets how pool `id` gets and splits its memory, rebuilding its pools (PyTorch's MemPool
  // constructor: setNoSplit, an allocator of its own). NotFound for a pool not stored here;
  // InvalidArgument for a tenant's; FailedPrecondition once it holds memory (a pool's blocks keep
  // the settings they were made with).
  absl::Status Configure(GraphPoolId id, PrivatePoolSettings settings, int device);
  // Creates tenant `index`'s pool (use count 1 for good: never freeable, never forgotten) and
  // returns its tag. ResourceExhausted past 65535 pools.
  absl::StatusOr<std::uint16_t> AddTenant(int index, int device);
  // Ends the routing into `id`. NotFound for a pool not in use here, FailedPrecondition when no
  // routing into it runs.
  absl::Status End(GraphPoolId id, int device);
  // Releases one use of `id` (the graph or MemPool is gone). A routing into it still running was
  // abandoned (its capture failed before End): it ends first. Returns the pool's tag when it became
  // freeable, else 0 (also for a pool not in use here: no error, it never allocated on this device).
  std::uint16_t Release(GraphPoolId id);
  // Ends every capture's routing none of whose served streams still captures (`capturing(stream)`):
  // a capture abandoned without End (cudaStreamEndCapture failed). Returns how many ended.
  int EndAbandoned(absl::FunctionRef<bool(Stream)> capturing);
  // Forgets pool `tag` if it is freeable and holds no memory; true when it did.
  bool ForgetIfEmpty(std::uint16_t tag);
  // True when `tag` names a stored private pool.
  bool contains(std::uint16_t tag) const { return tag != 0 && tag < pools_.size() && pools_[tag] != nullptr; }
  // PyTorch's MemPool(use_on_oom=True): the pools whose cached blocks a request of the device's own
  // pools may take before it fails, in the order they were named (an id, stored here or not yet).
  void SetUseOnOom(GraphPoolId id, bool use_on_oom) {
    auto it = std::find(use_on_oom_.begin(), use_on_oom_.end(), id);
    if (use_on_oom && it == use_on_oom_.end()) use_on_oom_.push_back(id);
    if (!use_on_oom && it != use_on_oom_.end()) use_on_oom_.erase(it);
  }
  const std::vector<GraphPoolId>& use_on_oom() const { return use_on_oom_; }

  // `blocks_per_tag[tag]`: the live and pending blocks of each tag (num_tags() entries).
  absl::Status CheckInvariants(const std::vector<std::int64_t>& blocks_per_tag) const;

 private:
  // Stores a new pool `id` (use count 0) in a free slot and returns its tag; ResourceExhausted past
  // 65535 pools.
  absl::StatusOr<std::uint16_t> Store(GraphPoolId id, int device);
  struct Routing {
    std::uint16_t tag = 0;
    CaptureFilter filter;
    absl::InlinedVector<Stream, 2> served;  // the streams whose requests it routed
    bool captured = false;                  // one of them was capturing when first served
  };
  // The tag of pool `id` (stored, in use or freeable), or 0.
  std::uint16_t Find(GraphPoolId id) const;
  absl::Status NotInUse(GraphPoolId id, absl::string_view what, int device) const;
  void ForgetMarksIfNotRouting() {
    if (!routing()) marked_captures_ = 0;
  }

  MakePools make_pools_;
  std::vector<Routing> routings_;
  std::vector<std::unique_ptr<Pool>> pools_;  // by tag; slot 0 and erased slots are null
  // The tag of every stored pool by its id, and the erased slots, so that Begin, End and Release
  // take constant time however many pools are open (a linear search made 20,000 pools' capture
  // ends quadratic: 2.7 s). Invariant: by_id_ maps exactly the stored pools' ids to their tags;
  // free_slots_ holds exactly the null slots above 0.
  absl::flat_hash_map<GraphPoolId, std::uint16_t> by_id_;
  std::vector<std::uint16_t> free_slots_;
  std::vector<GraphPoolId> use_on_oom_;  // SetUseOnOom's, in order
  bool captures_marked_ = false;         // MarkCapture was called
  int marked_captures_ = 0;              // marked captures underway
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_PRIVATE_POOLS_H_
