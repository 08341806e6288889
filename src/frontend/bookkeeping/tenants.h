// src/frontend/bookkeeping/tenants.h — tenants (Options::tenants; docs/configuration.md, "Tenants"): the one
// owner of tenant state (layer L4).
//
// Owns, in two parts:
//   - Tenants, one per Allocator and shared by its devices: the tenants' names, the stream
//     bindings, each thread's tenant and each tenant's cap (as set at run time). Thread-safe.
//   - DeviceTenants, one per device, under the device's lock: each tenant's pool there (a private
//     pool, frontend/bookkeeping/private_pools.h, whose growth the segment registry holds to its cap), what
//     each tenant's blocks hold (kept as they move, so a scrape walks nothing), its OOMs, and the
//     trim of a tenant over a lowered cap.
// The coordinator calls DeviceTenants at four points: routing (TagFor), the cap check of the slow
// path (OwnsPool, AtCap), OOM accounting (NarrowOom, AccountOom) and stats (Stats); and StepUse
// wherever a block changes hands. Tenant index 0 is the default tenant (the device's own pools,
// pool tag 0); tenants[i] is index i + 1.
//
// Invariants (CheckInvariants): a binding names an existing tenant other than the default; each
// tenant has its pool, that pool has a cap in the registry (the device's copy of Tenants::Cap; the
// two differ after a SetTenantCap a device refused during a capture), and its kept use equals a
// walk over the live and pending blocks.
// Thread-safety: Tenants takes its own lock (never while holding it does it call out; a device
// takes it under its own lock, so it comes last in the fork handlers too). A request's lookup (Of)
// reads a thread-local cache of the thread's last few streams and takes no lock while the bindings
// stay as they are. DeviceTenants is guarded by the device's lock.
//
// Example:
//   auto tenants = std::make_shared<Tenants>(options.tenants);   // tenants:[short:20GiB,long:40GiB]
//   tenants->SetThreadTenant(*tenants->Index("long"));             // this thread's requests: "long"
//   tenants->Bind(stream, 1);                                      // requests on `stream`: "short"
//   tenants->Of(stream);                                           // 1; any other stream: 2
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_TENANTS_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_TENANTS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "frontend/bookkeeping/private_pools.h"
#include "frontend/bookkeeping/segment_registry.h"
#include "frontend/observability/oom_diagnosis.h"
#include "internal/mutex.h"

namespace bucketalloc::internal {

class Tenants {
 public:
  explicit Tenants(std::vector<TenantSpec> specs);

  // Whether any tenant is configured (the default tenant alone is none).
  bool enabled() const { return !specs_.empty(); }
  // The number of tenants, the default one included.
  int count() const { return static_cast<int>(specs_.size()) + 1; }
  // The index of tenant `name` ("default": 0); NotFound naming the accepted names.
  absl::StatusOr<int> Index(absl::string_view name) const;
  // The name of tenant `index` ("default" for 0).
  const std::string& Name(int index) const;

  // Binds `stream` (a pool key) to tenant `index`; index 0 unbinds it.
  void Bind(Stream stream, int index);
  // Forgets `stream`'s binding (a retired stream: a new stream with this handle is bound to none).
  void Forget(Stream stream) {
    if (has_bindings_.load(std::memory_order_acquire)) Bind(stream, 0);
  }
  // The tenant of a request on `stream`: its binding, else the calling thread's tenant.
  // No lock while the bindings stay as they are: a thread-local cache holds the answers for the
  // thread's last kCachedStreams streams (of any Tenants object).
  int Of(Stream stream) const {
    if (!has_bindings_.load(std::memory_order_acquire)) return ThreadTenant();
    return OfBound(stream);
  }
  // The calling thread's tenant (0 when it set none). A thread keeps its tenants for its last 8
  // Tenants objects (a process has one allocator; tests and the harness a few).
  int ThreadTenant() const;
  void SetThreadTenant(int index);

  // Sets tenant `index`'s cap (index >= 1): InvalidArgument for the default tenant or a cap outside
  // 2 MiB to 16 TiB (the caps stay as they were). Devices apply it (DeviceTenants::ApplyCap).
  absl::Status SetCap(int index, std::size_t cap);
  // Tenant `index`'s cap (index >= 1): the last SetCap, else its spec's.
  std::size_t Cap(int index) const;

  absl::Status CheckInvariants() const;

  // fork(2) (the Allocator's handlers, after every device's lock): the lock, so that the child's
  // copy of the bindings is whole.
  void PrepareFork() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_) { mu_.Lock(); }
  void AfterFork() ABSL_UNLOCK_FUNCTION(mu_) { mu_.Unlock(); }

  static constexpr int kCachedStreams = 4;

 private:
  ABSL_ATTRIBUTE_NOINLINE int OfBound(Stream stream) const;

  const std::uint64_t id_;  // unique in the process: keys the threads' tenants and caches
  const std::vector<TenantSpec> specs_;
  mutable Mutex mu_;
  absl::flat_hash_map<Stream, int> bindings_ ABSL_GUARDED_BY(mu_);
  std::vector<std::size_t> caps_ ABSL_GUARDED_BY(mu_);  // index i + 1 at i
  std::atomic<bool> has_bindings_{false};
  // Advances on every change of the bindings (under mu_): a thread's cached answer is for one.
  std::atomic<std::uint64_t> version_{0};
};

class DeviceTenants {
 public:
  // What the live and pending blocks of one pool tag hold, per pool index (kAllPools: all).
  struct Use {
    std::array<std::size_t, kNumPoolIndices> allocated{}, requested{}, active{};
    std::int64_t live = 0;
  };

  // The tenants of `tenants` (null: none) on a device whose private pools and segment registry are
  // `pools` and `registry` (the device's, guarded by its lock, as this is).
  DeviceTenants(std::shared_ptr<const Tenants> tenants, PrivatePools* pools, SegmentRegistry* registry)
      : tenants_(std::move(tenants)), pools_(pools), registry_(registry) {}
  // Creates each tenant's pool on `device`, with its cap in the registry (once, before any request).
  absl::Status AddPools(int device);

  bool enabled() const { return !tags_.empty(); }
  const Tenants& tenants() const { return *tenants_; }

  // Routing: the pool tag of the tenant of a request on `stream` (0: the default tenant's).
  std::uint16_t TagFor(Stream stream) const { return tags_[static_cast<std::size_t>(tenants_->Of(stream))]; }
  // The tenant whose pool has tag `tag` (0: the default tenant, or a pool no tenant owns).
  int TenantOfTag(std::uint16_t tag) const;
  // The cap check: whether `tag` is a tenant's own pool (not the default tenant's), and whether
  // growing it by `bytes` would pass its cap.
  bool OwnsPool(std::uint16_t tag) const { return TenantOfTag(tag) != 0; }
  bool AtCap(std::uint16_t tag, std::size_t bytes) const { return registry_->OverOwnerCap(tag, bytes); }
  // The pool tags of the tenants' own pools (index 1 up).
  absl::Span<const std::uint16_t> pool_tags() const { return absl::MakeConstSpan(tags_).subspan(enabled() ? 1 : 0); }
  // The tenant name a snapshot shows for pool `id`'s segments ("" without tenants and for a graph
  // pool's).
  std::string NameOfPool(GraphPoolId id) const;

  // Accounting, as one of pool tag `tag`'s blocks moves: in `pool`, `active` bytes held by a caller
  // or awaiting stream events, `allocated` and `requested` bytes live, `live` allocations
  // (unsigned: a step down wraps back exactly). The "all pools" figures are summed when read.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void StepUse(std::uint16_t tag, PoolIndex pool, std::size_t active,
                                            std::size_t allocated, std::size_t requested, std::int64_t live) {
    if (tag >= uses_.size()) [[unlikely]]
      GrowUses(tag);
    Use& use = uses_[tag];
    use.active[pool] += active;
    use.allocated[pool] += allocated;
    use.requested[pool] += requested;
    use.live += live;
  }
  // What pool tag `tag`'s blocks hold, with the "all pools" sums.
  Use UseOf(std::uint16_t tag) const;

  // OOM accounting. When the tenant's own cap refused `segment` bytes of growth of pool `tag`:
  // narrows `s` to the tenant (its cap as the capacity, its figures, the fragmentation of its
  // pools) and returns true.
  bool NarrowOom(std::uint16_t tag, std::size_t segment, OomSituation* s) const;
  // Names the tenant in `r` and counts its OOM (at its cap: the cause becomes kTenantCap).
  void AccountOom(std::uint16_t tag, bool at_cap, OomReport* r);

  // Applies tenant `index`'s cap (index >= 1; the registry holds its growth to it).
  void ApplyCap(int index, std::size_t cap);
  // Whether tenant `index` reserves more than `bytes` here.
  bool ReservesOver(int index, std::size_t bytes) const { return registry_->OwnedNow(PoolTag(index)) > bytes; }
  // The pool tag of tenant `index` (index >= 1).
  std::uint16_t PoolTag(int index) const { return tags_.at(static_cast<std::size_t>(index)); }
  // Whether some tenant may reserve more than its cap (its live memory was above a lowered cap):
  // the free path then trims (TrimToCaps). One test on the free path without it.
  bool over_cap() const { return over_cap_; }
  void set_over_cap() { over_cap_ = true; }
  // Each tenant over its cap gives back its wholly free memory, oldest first, until it fits.
  // Returns whether anything was released.
  bool TrimToCaps();

  // Each tenant's figures, the default tenant first; empty without tenants.
  std::vector<TenantStats> Stats() const;

  // `walk(add)` calls add(tag, pool, block bytes, requested bytes, live) for each live and pending
  // block of the device; the kept use must equal what it adds up.
  using AddBlock =
      absl::FunctionRef<void(std::uint16_t tag, PoolIndex pool, std::size_t block, std::size_t requested, bool live)>;
  absl::Status CheckInvariants(absl::FunctionRef<void(AddBlock)> walk) const;

 private:
  ABSL_ATTRIBUTE_NOINLINE void GrowUses(std::uint16_t tag) { uses_.resize(std::size_t{tag} + 1); }
  // The fragmentation report of pool tag `tag` alone (its blocks hold `use`).
  FragmentationReport FragmentationOf(std::uint16_t tag, const Use& use) const;

  std::shared_ptr<const Tenants> tenants_;
  PrivatePools* const pools_;
  SegmentRegistry* const registry_;
  // The pool tag of each tenant index (index 0: 0); empty without tenants.
  std::vector<std::uint16_t> tags_;
  struct Ooms {
    std::int64_t all = 0;
    std::int64_t at_cap = 0;  // refused by the tenant's own cap
  };
  std::vector<Ooms> ooms_;
  // Per pool tag (0: the device's own, the default tenant's): what its blocks hold. Kept for every
  // tag while tenants are enabled (a graph pool's too: no branch on the hot path).
  std::vector<Use> uses_;
  bool over_cap_ = false;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_TENANTS_H_
