// src/frontend/core/device_allocator.cc — the coordinator of one device (frontend/core/device_allocator.h).
#include "frontend/core/device_allocator.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "backend/stream_keys.h"
#include "bucketalloc/units.h"
#include "frontend/bookkeeping/tenants.h"
#include "frontend/observability/oom_diagnosis.h"
#include "internal/check.h"
#include "memory/size_classes.h"

namespace bucketalloc::internal {
namespace {

LargePoolConfig MakeLargeConfig(const Options& o, std::size_t granularity) {
  LargePoolConfig c;
  c.max_split_size = o.max_split_size;
  c.max_non_split_rounding = o.max_non_split_rounding;
  c.large_segment_size = o.large_segment_size;
  c.roundup_power2_divisions = o.roundup_power2_divisions;
  c.tiers = o.ResolvedTiers(granularity);
  c.tier_min_fill = o.tier_min_fill;
  c.granularity = granularity;
  c.grow_piece = std::max(granularity, o.grow_piece / granularity * granularity);
  if (o.Stitching()) c.keep_remainder = 0;
  return c;
}

}  // namespace

std::string PtrStr(const void* p) { return absl::StrCat("0x", absl::Hex(reinterpret_cast<std::uintptr_t>(p))); }

DeviceAllocator::DeviceAllocator(const Options& options, std::unique_ptr<Backend> backend, int device,
                                 std::shared_ptr<const Tenants> tenants)
    : options_(options),
      device_(device),
      backend_(std::move(backend)),
      memory_fraction_(options.memory_fraction),
      registry_(backend_.get(), &stats_, &history_),
      large_config_(MakeLargeConfig(options, backend_->Granularity())),
      pools_(PoolContext{&stats_, &registry_, &clock_}, PoolsConfig{.slab_limit = options.slab_limit,
                                                                    .small_limit = options.small_pool_limit,
                                                                    .large = large_config_,
                                                                    .stitching = options.Stitching()}),
      pending_(backend_.get()),
      // A private pool's small and large pool: configured as the device's own, except that a
      // no-split pool has no slabs and keeps every remainder in its block, and that neither it nor
      // a pool whose segments another allocator gives stitches.
      private_([this](const PrivatePoolSettings& settings) {
        LargePoolConfig large = large_config_;
        const bool stitching = options_.Stitching() && !settings.no_split && settings.segment_allocator == nullptr;
        if (settings.no_split || settings.segment_allocator != nullptr) {
          large.keep_remainder = LargePoolConfig{}.keep_remainder;  // PyTorch's, as without stitching
        }
        if (settings.no_split) large.keep_remainder = kUnlimited;
        return std::make_unique<Pools>(PoolContext{&stats_, &registry_, &clock_},
                                       PoolsConfig{.slab_limit = settings.no_split ? 0 : options_.slab_limit,
                                                   .small_limit = options_.small_pool_limit,
                                                   .large = std::move(large),
                                                   .stitching = stitching,
                                                   .no_split = settings.no_split});
      }),
      imports_(backend_.get()),
      tenants_(std::move(tenants), &private_, &registry_) {
  registry_.set_collector([this](std::size_t incoming) ABSL_NO_THREAD_SAFETY_ANALYSIS { CollectGarbage(incoming); });
  registry_.set_segment_allocators([this](std::uint16_t tag) ABSL_NO_THREAD_SAFETY_ANALYSIS -> SegmentAllocator* {
    return private_.contains(tag) ? private_.at(tag).settings.segment_allocator.get() : nullptr;
  });
  history_.set_pool_ids([this](std::uint16_t tag) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return private_.contains(tag) ? private_.at(tag).id : GraphPoolId{};
  });
}

absl::StatusOr<std::unique_ptr<DeviceAllocator>> DeviceAllocator::Create(const Options& options,
                                                                         std::unique_ptr<Backend> backend, int device,
                                                                         std::shared_ptr<const Tenants> tenants) {
  const std::size_t granularity = backend->Granularity();
  if (!IsPowerOfTwo(granularity) || kSlabBytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucketalloc: backend '", backend->Name(), "' of device ", device, " has granularity ", granularity,
        "; accepted: a power of two up to ", kSlabBytes, " (slabs and segments are 2 MiB multiples)"));
  }
  if (options.Stitching() && !backend->SupportsVirtualMemory()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucketalloc: stitching (backend:vmm or expandable_segments:true) needs virtual memory, but backend '",
        backend->Name(), "' of device ", device,
        " has none; accepted: backend:vmm, backend:sim, or expandable_segments:false"));
  }
  absl::StatusOr<DeviceMemInfo> info = backend->GetMemInfo();
  if (!info.ok()) return info.status();
  if (tenants == nullptr && !options.tenants.empty()) tenants = std::make_shared<const Tenants>(options.tenants);
  std::unique_ptr<DeviceAllocator> d(new DeviceAllocator(options, std::move(backend), device, std::move(tenants)));
  d->device_total_ = info->total_bytes;
  absl::StatusOr<std::size_t> cap =
      ComputeCap(options.capacity, options.memory_fraction, info->total_bytes, granularity, device);
  if (!cap.ok()) return cap.status();
  MutexLock lock(d->mu_);
  d->registry_.set_cap(*cap);
  d->stats_.SetCapacity(static_cast<std::int64_t>(d->registry_.cap()));
  d->stats_.SetMaxSplitSize(options.max_split_size == kUnlimited ? -1
                                                                 : static_cast<std::int64_t>(options.max_split_size));
  if (absl::Status s = d->tenants_.AddPools(device); !s.ok()) return s;
  return d;
}

DeviceAllocator::~DeviceAllocator() {
  MutexLock lock(mu_);
  // Give back everything that is cached; live allocations still held by callers are reported.
  SyncAndReleaseAll();
  ReleasePrivatePools(/*all=*/true);
  imports_.CloseAll(device_);
  registry_.TrimAddressSpace();  // the reservations the private pools used
  pending_.DestroyEvents();
  if (!live_.empty() || !pending_.empty()) {
    std::fprintf(stderr, "bucketalloc: device %d destroyed with %zu live allocations (%s) still held\n", device_,
                 live_.size() + pending_.size(),
                 FormatBytes(static_cast<std::size_t>(stats_.Current(&DeviceStats::active_bytes, kAllPools))).c_str());
  }
}

StreamPools& DeviceAllocator::PoolsForNewStream(Stream stream) {
  registry_.Revive(stream);  // a retired handle in use again (a new stream with the old value)
  auto it = streams_.find(stream);
  if (it == streams_.end()) it = streams_.emplace(stream, pools_.NewStreamPools()).first;
  last_stream_ = stream;
  last_pools_ = it->second.get();
  return *last_pools_;
}

// ---------------------------------------------------------------------------------------------
// Allocation.

absl::Status DeviceAllocator::InvalidSize(std::size_t size) const {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: allocation size ", size, " on device ", device_,
                                                 " is invalid: accepted sizes are 0 to ", kMaxRequestBytes,
                                                 " bytes (a negative ssize_t converted to size_t is this large)"));
}

absl::StatusOr<void*> DeviceAllocator::Allocate(std::size_t size, Stream stream) {
  if (size - 1 >= kMaxRequestBytes) [[unlikely]]  // 0 (wraps around) or too large: one compare
    return size == 0 ? absl::StatusOr<void*>(nullptr) : InvalidSize(size);
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  // One call of AllocateIn, so that the fast path stays inlined in this function.
  std::uint16_t tag = 0;
  StreamPools& sp = private_.routing() || tenants_.enabled() ? RoutedPoolsFor(stream, &tag) : PoolsFor(stream);
  return PoolsOf(tag).Route(
      size, [&](auto& pool) ABSL_NO_THREAD_SAFETY_ANALYSIS { return AllocateIn(pool, sp, size, stream, tag); });
}

absl::StatusOr<void*> DeviceAllocator::AllocateAt(GraphPoolId pool, void* addr, std::size_t block_size,
                                                  std::size_t requested, Stream stream) {
  const auto ptr = reinterpret_cast<std::uintptr_t>(addr);
  auto what = [&] {
    return absl::StrCat("bucketalloc: allocate ", block_size, " bytes (requested ", requested, ") at ", PtrStr(addr),
                        " in ",
                        pool == GraphPoolId{} ? std::string("the device's own pools")
                                              : absl::StrCat("private pool (", pool.first, ", ", pool.second, ")"),
                        " of device ", device_);
  };
  if (requested == 0 || requested > kMaxRequestBytes || block_size > kMaxRequestBytes ||
      (block_size != 0 && requested > block_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": accepted: 0 < requested <= block_size <= ", kMaxRequestBytes,
                     " (a block size bucketalloc handed out, e.g. from a snapshot or bucketalloc_visit_segments), "
                     "or block_size 0 for the block the pool rounds the request to"));
  }
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  std::uint16_t tag = 0;
  if (pool != GraphPoolId{}) {
    tag = private_.TagOf(pool);
    if (tag == 0 || private_.at(tag).freeable()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what(), ": the pool is ", tag == 0 ? "unknown on this device" : "freeable (no graph or MemPool uses it)",
          "; accepted: a private pool in use (its use count above 0), or (0, 0) for the device's own pools"));
    }
  }
  // The pool whose unit holds the address carves the range; the others answer NotFound.
  absl::Status status = absl::NotFoundError("");
  PoolsOf(tag).ForEach([&](auto& p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    using P = PoolType<decltype(p)>;
    if (!absl::IsNotFound(status)) return;
    // With block size 0, the slabs round only sizes they have a class for (the address's pool
    // decides which pool carves it).
    if constexpr (std::is_same_v<P, SmallPool>) {
      if (block_size == 0 && requested > kMaxSmallSize) return;
    }
    std::size_t bytes = block_size;
    if (bytes == 0) {  // the pool's rounding of the request
      if constexpr (std::is_same_v<P, SmallPool>) {
        bytes = SmallSizeClasses::ClassSize(p.RequestFor(requested).cls);
      } else {
        bytes = p.RequestFor(requested).rounded;
      }
    }
    absl::StatusOr<typename P::Handle> h = p.TakeAt(ptr, bytes, stream);
    status = h.status();
    if (!h.ok()) return;
    P::SetRequested(*h, requested);
    CommitLive(p, ptr, *h, requested, tag);
    history_.Record(TraceAction::kAlloc, ptr, requested, stream, 0, tag);
  });
  if (absl::IsNotFound(status)) {
    return absl::NotFoundError(absl::StrCat(what(), ": no segment or slab of that pool holds the address"));
  }
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(what(), ": ", status.message()));  // pool's why
  MaybeCheckInvariants();
  return addr;
}

StreamPools& DeviceAllocator::RoutedPoolsFor(Stream stream, std::uint16_t* tag) {
  *tag =
      private_.routing()
          ? private_.TagFor(stream, [&](Stream s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return StreamCaptures(s, false); })
          : 0;
  if (*tag == 0 && tenants_.enabled()) *tag = tenants_.TagFor(stream);  // a capture's routing comes first
  if (*tag == 0) return PoolsFor(stream);
  if (stream == last_routed_stream_ && *tag == last_routed_tag_ && last_routed_pools_ != nullptr) [[likely]]
    return *last_routed_pools_;
  registry_.Revive(stream);  // a retired handle in use again (a new stream with the old value)
  last_routed_stream_ = stream;
  last_routed_tag_ = *tag;
  last_routed_pools_ = &private_.StreamPoolsFor(*tag, stream);  // stable: the map holds unique_ptrs
  return *last_routed_pools_;
}

template <typename P>
inline absl::StatusOr<void*> DeviceAllocator::AllocateIn(P& pool, StreamPools& sp, std::size_t size, Stream stream,
                                                         std::uint16_t private_pool) {
  typename P::StreamState& ss = sp.of<P>();
  const typename P::Request request = pool.RequestFor(size);
  std::optional<typename P::Handle> h = pool.TryAllocate(ss, request);
  const bool hit = h.has_value();
  if (hit) {
    stats_.Count(&DeviceStats::num_cache_hits);
  } else {
    absl::StatusOr<typename P::Handle> slow = AllocateSlow(pool, ss, stream, size, request, private_pool);
    if (!slow.ok()) return slow.status();
    h = *slow;
  }
  P::SetRequested(*h, size);
  const std::uintptr_t ptr = P::Address(*h);
  CommitLive(pool, ptr, *h, size, private_pool);
  history_.Record(TraceAction::kAlloc, ptr, size, stream, 0, private_pool);
  if (!hit) {
    if (tenants_.over_cap()) [[unlikely]]
      TrimTenantsToCaps();  // pending frees of a tenant over its cap may have come back on this slow path
    MaybeCheckInvariants();
  }
  return reinterpret_cast<void*>(ptr);
}

template <typename P>
inline void DeviceAllocator::CommitLive(const P& pool, std::uintptr_t ptr, typename P::Handle h, std::size_t size,
                                        std::uint16_t private_pool) {
  stats_.Increase(&DeviceStats::requested_bytes, P::kIndex, static_cast<std::int64_t>(size));
  stats_.Increase(&DeviceStats::allocated_bytes, P::kIndex, static_cast<std::int64_t>(P::BlockSize(h)));
  stats_.Increase(&DeviceStats::allocation, P::kIndex, 1);
  if (pool.Oversize(h)) stats_.device(&DeviceStats::oversize_allocations).Increase(1);
  if (tenants_.enabled()) [[unlikely]]
    tenants_.StepUse(private_pool, P::kIndex, P::BlockSize(h), P::BlockSize(h), size, 1);
  live_.Emplace(ptr, h, size, private_pool);
}

template <typename P>
absl::StatusOr<typename P::Handle> DeviceAllocator::AllocateSlow(P& pool, typename P::StreamState& ss, Stream stream,
                                                                 std::size_t size, const typename P::Request& request,
                                                                 std::uint16_t& private_pool) {
  registry_.BeginSlowPath(stream);
  registry_.set_owner(private_pool);  // what a private pool grows is counted as its own
  absl::Cleanup no_owner = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { registry_.set_owner(0); };
  auto serve = [&](const typename P::Request& r) {
    Served served = Served::kFromNewMemory;
    absl::StatusOr<typename P::Handle> h = pool.Serve(ss, stream, r, &served);
    if (h.ok())
      stats_.Count(served == Served::kFromCache ? &DeviceStats::num_cache_hits : &DeviceStats::num_cache_misses);
    return h;
  };
  auto fallback = [&](absl::StatusOr<typename P::Handle>* h) -> std::optional<typename P::Request> {
    std::optional<typename P::Request> smaller = pool.Fallback(size, request);
    if (!smaller.has_value()) return std::nullopt;
    *h = serve(*smaller);
    if (h->ok()) stats_.Count(&DeviceStats::num_tier_fallbacks);
    return smaller;
  };
  // During a capture the source grows (the backend allocates in relaxed capture mode, which CUDA
  // allows and PyTorch does) but collects, releases and stitches nothing; no event is polled and
  // nothing is released and retried: CUDA forbids the queries, synchronizations and frees.
  const bool capturing = CaptureRestricts(stream);
  if (!capturing && !pending_.empty()) RetirePending(PendingFrees::Mode::kPollAll);
  registry_.set_capturing(capturing);
  const std::int64_t rejections = stats_.counter(&DeviceStats::num_oom_rejections);
  absl::StatusOr<typename P::Handle> h = serve(request);
  // throw_on_cudamalloc_oom (PyTorch's): growth the cap refused fails at once, without releasing
  // the cache and retrying.
  const bool rejected =
      options_.throw_on_cudamalloc_oom && stats_.counter(&DeviceStats::num_oom_rejections) != rejections;
  const bool tenant = tenants_.OwnsPool(private_pool);
  if (!capturing && !rejected && absl::IsResourceExhausted(h.status()) && tenant) {
    // A tenant gives back its own cache first (after synchronizing pending stream events): its cap
    // is usually what refused, and the other tenants' caches stay theirs.
    SyncPendingFrees();
    ReleasePoolCache(private_pool);
    stats_.Count(&DeviceStats::num_alloc_retries);
    h = serve(request);
  }
  // Releasing the other tenants' caches cannot help when the tenant's own cap refuses the growth.
  if (!capturing && !rejected && absl::IsResourceExhausted(h.status()) &&
      !(tenant && tenants_.AtCap(private_pool, pool.OomSizes(request).second))) {
    // Release the cache (after synchronizing pending stream events) and try once more.
    SyncAndReleaseAll();
    stats_.Count(&DeviceStats::num_alloc_retries);
    h = serve(request);
  }
  typename P::Request needed = request;
  if (absl::IsResourceExhausted(h.status()) || (capturing && absl::IsFailedPrecondition(h.status()))) {
    if (std::optional<typename P::Request> smaller = fallback(&h); smaller.has_value()) needed = *smaller;
  }
  registry_.set_capturing(false);
  if (absl::IsResourceExhausted(h.status()) && !rejected && private_pool == 0 && !private_.use_on_oom().empty()) {
    if (std::optional<typename P::Handle> lent = BorrowFromUseOnOomPools<P>(stream, request, &private_pool)) {
      stats_.Count(&DeviceStats::num_cache_hits);
      return *lent;
    }
  }
  if (!absl::IsResourceExhausted(h.status())) {
    // A backend that cannot allocate during a capture refused (FailedPrecondition).
    if (capturing && absl::IsFailedPrecondition(h.status())) return CaptureMiss(size, stream);
    return h;
  }
  const auto [rounded, segment] = pool.OomSizes(needed);
  return OutOfMemory(P::kIndex, size, rounded, segment, h.status(), private_pool, rejected);
}

template <typename P>
std::optional<typename P::Handle> DeviceAllocator::BorrowFromUseOnOomPools(Stream stream,
                                                                           const typename P::Request& request,
                                                                           std::uint16_t* tag) {
  for (const GraphPoolId& id : private_.use_on_oom()) {
    const std::uint16_t lender = private_.TagOf(id);
    if (lender == 0 || private_.at(lender).freeable()) continue;
    P& pool = PoolsOf(lender).template Get<P>();
    std::optional<typename P::Handle> h =
        pool.TryAllocate(private_.StreamPoolsFor(lender, stream).template of<P>(), request);
    if (h.has_value()) {
      *tag = lender;
      return h;
    }
  }
  return std::nullopt;
}

void DeviceAllocator::CollectGarbage(std::size_t incoming) {
  if (options_.garbage_collection_threshold <= 0.0) return;
  // The device's own pools give back (a tenant's or private pool's growth may have called this).
  const std::uint16_t owner = registry_.owner();
  if (registry_.OverOwnerCap(owner, incoming)) {
    return;  // a tenant at its own cap: the device's cache going back would not let it grow
  }
  registry_.set_owner(0);
  absl::Cleanup restore = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { registry_.set_owner(owner); };
  const auto limit =
      static_cast<std::size_t>(options_.garbage_collection_threshold * static_cast<double>(registry_.cap()));
  auto reserved = [&] { return static_cast<std::size_t>(stats_.Current(&DeviceStats::reserved_bytes, kAllPools)); };
  while (reserved() + incoming > limit) {
    // Oldest first across the pools (the first pool among equals).
    std::uint64_t oldest = std::numeric_limits<std::uint64_t>::max();
    pools_.ForEach([&](const auto& pool) { oldest = std::min(oldest, pool.OldestFree()); });
    std::size_t released = 0;
    bool chosen = false;
    pools_.ForEach([&](auto& pool) {
      if (chosen || pool.OldestFree() != oldest) return;
      chosen = true;
      released = pool.ReleaseOldest();
    });
    if (released == 0) break;
    stats_.Count(&DeviceStats::num_gc_releases);
  }
}

absl::Status DeviceAllocator::OutOfMemory(PoolIndex pool, std::size_t size, std::size_t rounded, std::size_t segment,
                                          const absl::Status& cause, std::uint16_t private_pool, bool rejected) {
  stats_.Count(&DeviceStats::num_ooms);
  OomSituation s;
  s.device = device_;
  s.pool = pool;
  s.requested = size;
  s.rounded = rounded;
  s.segment = segment;
  s.capacity = registry_.cap();
  s.fragmentation = FragmentationLocked();
  s.figures = MemoryFiguresOf(stats_.Snapshot(/*since_start=*/false), s.fragmentation);
  s.pool_cached = static_cast<std::size_t>(stats_.Current(&DeviceStats::cached_bytes, pool));
  s.device_total = device_total_;
  if (absl::StatusOr<DeviceMemInfo> info = backend_->GetMemInfo(); info.ok()) s.device_free = info->free_bytes;
  s.failure = std::string(cause.message());
  if (std::optional<std::size_t> movable = PoolsOf(private_pool).MovableFor(size)) {
    s.stitching = true;
    s.movable = *movable;
  }
  const bool at_tenant_cap = tenants_.NarrowOom(private_pool, segment, &s);
  OomReport r = DiagnoseOom(s);
  tenants_.AccountOom(private_pool, at_tenant_cap, &r);
  r.rejected = rejected;
  stats_.Count(OomCounter(r.cause));
  history_.Record(TraceAction::kOom, 0, size, registry_.slow_path_stream(), r.device_free, private_pool);
  std::string message = r.ToString();
  ooms_.Record(std::move(r), static_cast<std::uint64_t>(stats_.Snapshot(/*since_start=*/true).num_ooms), size);
  MaybeCheckInvariants();
  return absl::ResourceExhaustedError(message);
}

// ---------------------------------------------------------------------------------------------
// Free and stream uses.

absl::Status DeviceAllocator::InvalidFree(void* ptr, absl::string_view what) {
  stats_.Count(&DeviceStats::num_invalid_frees);
  return absl::InvalidArgumentError(
      absl::StrCat("bucketalloc: invalid free of ", PtrStr(ptr), " on device ", device_, ": ", what));
}

absl::Status DeviceAllocator::FreeOfNoLiveAllocation(void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  absl::Status refused;
  {
    // The lock was dropped since Free found no live allocation: what is said is the state now (a
    // pointer freed, released or handed out meanwhile is named by what it is now; it is refused
    // either way).
    MutexLock lock(mu_);
    if (!fork_child_error_.ok()) return fork_child_error_;
    if (pending_.Contains(addr))
      return InvalidFree(ptr, "double free (it is already freed and awaiting stream events)");
    if (live_.Find(addr) != nullptr || registry_.Holding(addr).has_value()) {  // live again: freed meanwhile
      return InvalidFree(ptr,
                         "double free, or a pointer into a block rather than its start: no live "
                         "allocation started at this address inside bucketalloc's memory");
    }
    refused = InvalidFree(ptr, "the pointer was not allocated by bucketalloc on this device");
  }
  // Another device's pointer: say so, so that the caller's device bookkeeping is fixed. Asked with
  // no lock held (the other device takes its own).
  const int other = live_elsewhere_ ? live_elsewhere_(ptr, device_) : -1;
  if (other < 0) return refused;
  return absl::InvalidArgumentError(
      absl::StrCat(refused.message(), " (it is a live allocation of device ", other, "; free it with that device)"));
}

absl::Status DeviceAllocator::FreeSizeMismatch(void* ptr, std::size_t requested, std::size_t given) {
  return InvalidFree(ptr,
                     absl::StrCat("size mismatch: allocated with ", requested, " bytes, freed with ", given, " bytes"));
}

absl::Status DeviceAllocator::Free(void* ptr, std::optional<std::size_t> size) {
  if (ptr == nullptr) return absl::OkStatus();
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  {
    MutexLock lock(mu_);
    if (!fork_child_error_.ok()) [[unlikely]]
      return fork_child_error_;
    LiveEntry* found = live_.Find(addr);
    if (found != nullptr) [[likely]] {
      const LiveEntry entry = *found;
      if (size.has_value() && *size != entry.requested) [[unlikely]]
        return FreeSizeMismatch(ptr, entry.requested, *size);
      live_.Erase(found);
      if (pending_.has_uses()) [[unlikely]] {
        FreeInUse(addr, entry);
      } else {
        PoolsOf(entry.private_pool).Visit(entry.handle, [&](auto& pool, auto h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          using P = PoolType<decltype(pool)>;
          if (tenants_.enabled()) [[unlikely]]  // no longer live, nor active
            tenants_.StepUse(entry.private_pool, P::kIndex, -P::BlockSize(h), -P::BlockSize(h), -entry.requested, -1);
          Release(pool, addr, h, entry);
          Complete(pool, addr, h, entry);
        });
      }
      // Blocks awaiting stream events are polled on every free and every slow path, never on a
      // hit, and never during a capture (CUDA forbids event queries then).
      if (!pending_.empty() && !CaptureMayRun()) RetirePending(PendingFrees::Mode::kPollUntilBusy);
      if (tenants_.over_cap()) [[unlikely]]
        TrimTenantsToCaps();
      return absl::OkStatus();
    }
  }
  return FreeOfNoLiveAllocation(ptr);  // out of line, with the lock dropped
}

void DeviceAllocator::TrimTenantsToCaps() {
  if (CaptureMayRun() || !tenants_.TrimToCaps()) return;
  registry_.TrimAddressSpace();
  MaybeCheckInvariants();
}

template <typename P>
inline void DeviceAllocator::Release(const P& pool, std::uintptr_t ptr, typename P::Handle h, const LiveEntry& entry) {
  const std::size_t requested = entry.requested;
  stats_.Decrease(&DeviceStats::requested_bytes, P::kIndex, static_cast<std::int64_t>(requested));
  stats_.Decrease(&DeviceStats::allocated_bytes, P::kIndex, static_cast<std::int64_t>(P::BlockSize(h)));
  stats_.Decrease(&DeviceStats::allocation, P::kIndex, 1);
  if (pool.Oversize(h)) stats_.device(&DeviceStats::oversize_allocations).Decrease(1);
  ++clock_;
  history_.Record(TraceAction::kFreeRequested, ptr, requested, P::StreamOf(h), 0, entry.private_pool);
}

template <typename P>
inline void DeviceAllocator::Complete(P& pool, std::uintptr_t ptr, typename P::Handle h, const LiveEntry& entry) {
  // Recorded before the return, which may merge the block (its stream is read from its segment).
  history_.Record(TraceAction::kFreeCompleted, ptr, entry.requested, P::StreamOf(h), 0, entry.private_pool);
  pool.Return(h);
}

void DeviceAllocator::FreeInUse(std::uintptr_t addr, const LiveEntry& entry) {
  // Streams other than the allocation stream that used the block (RecordStream): its reuse waits for
  // an event on each. The events are recorded now, or later when a capture runs (an event recorded
  // during capture is a graph node and would report completion at once) or recording fails: the
  // block then waits without events (deferred) and is armed on a later free or slow path, as
  // PyTorch defers the events of frees during a capture.
  PendingFrees::Uses uses = pending_.TakeUses(addr);
  PendingFrees::Events events;
  if (!uses.empty()) {
    if (CaptureMayRun() || !pending_.RecordEvents(uses, &events).ok()) {
      stats_.Count(&DeviceStats::num_deferred_frees);
    } else {
      // Another thread's per-thread stream was waited for by a device synchronization: done.
      uses.erase(std::remove_if(uses.begin(), uses.end(), IsPseudoStream), uses.end());
    }
  }
  PoolsOf(entry.private_pool).Visit(entry.handle, [&](auto& pool, auto h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    using P = PoolType<decltype(pool)>;
    if (tenants_.enabled()) [[unlikely]]  // no longer live; still active while it awaits its streams
      tenants_.StepUse(entry.private_pool, P::kIndex, uses.empty() ? -P::BlockSize(h) : 0, -P::BlockSize(h),
                       -entry.requested, -1);
    Release(pool, addr, h, entry);
    if (!uses.empty()) {
      PoolType<decltype(pool)>::MarkPending(h);
      pending_.Hold(addr, entry, std::move(events), std::move(uses));
    } else {
      Complete(pool, addr, h, entry);
    }
  });
}

void DeviceAllocator::ReturnEntry(std::uintptr_t ptr, const LiveEntry& entry) {
  PoolsOf(entry.private_pool).Visit(entry.handle, [&](auto& pool, auto h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    using P = PoolType<decltype(pool)>;
    if (tenants_.enabled()) [[unlikely]]  // its streams are done: no longer active
      tenants_.StepUse(entry.private_pool, P::kIndex, -P::BlockSize(h), 0, 0, 0);
    Complete(pool, ptr, h, entry);
  });
}

void DeviceAllocator::RetirePending(PendingFrees::Mode mode) {
  pending_.Retire(mode, /*may_arm=*/!CaptureMayRun(),
                  [&](std::uintptr_t ptr, const LiveEntry& e) ABSL_NO_THREAD_SAFETY_ANALYSIS { ReturnEntry(ptr, e); });
}

void DeviceAllocator::SyncPendingFrees() {
  if (pending_.empty()) return;
  stats_.Count(&DeviceStats::num_sync_all_streams);
  RetirePending(PendingFrees::Mode::kSynchronize);
}

void DeviceAllocator::SyncAndReleaseAll() {
  SyncPendingFrees();
  // A private pool's or tenant's slow path may call this: each pool's releases are counted as its
  // own, and the caller's owner comes back after.
  const std::uint16_t owner = registry_.owner();
  absl::Cleanup restore = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { registry_.set_owner(owner); };
  registry_.set_owner(0);
  pools_.ForEach([](auto& pool) { pool.ReleaseAll(); });
  for (std::uint16_t tag : tenants_.pool_tags()) ReleasePoolCache(tag);
  ReleasePrivatePools(/*all=*/false);
  registry_.TrimAddressSpace();
}

void DeviceAllocator::ReleasePoolCache(std::uint16_t tag) {
  const std::uint16_t owner = registry_.owner();
  registry_.set_owner(tag);
  private_.at(tag).pools->ForEach([](auto& pool) { pool.ReleaseAll(); });
  registry_.set_owner(owner);
}

absl::Status DeviceAllocator::RecordStream(void* ptr, Stream stream) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const LiveEntry* found = live_.Find(addr);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: record_stream(", PtrStr(ptr), ") on device ", device_,
                                                   ": no live allocation starts at this address"));
  }
  const Stream own = PoolsOf(found->private_pool).Visit(found->handle, [](auto& pool, auto h) {
    return PoolType<decltype(pool)>::StreamOf(h);
  });
  if (stream == own) return absl::OkStatus();  // uses on the allocation stream are ordered
  pending_.AddUse(addr, stream);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The cache, stream retirement, fork.

absl::Status DeviceAllocator::EmptyCache() {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  EndAbandonedCaptures();
  if (private_.routing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: empty_cache on device ", device_,
                     " during CUDA graph capture or a MemPool context: CUDA forbids the synchronization and cudaFree "
                     "it needs during a capture (PyTorch skips it in both); nothing was released. Call it after the "
                     "capture or context ends"));
  }
  SyncAndReleaseAll();
  MaybeCheckInvariants();
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> DeviceAllocator::Prefetch(std::size_t spare_target, std::size_t max_create) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  absl::StatusOr<std::size_t> created = pools_.large().Prefetch(spare_target, max_create);
  MaybeCheckInvariants();
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat("bucketalloc: prefetch to ", FormatBytes(spare_target),
                                     " of spare memory on device ", device_, ": ", created.status().message()));
  }
  return created;
}

absl::Status DeviceAllocator::RetireStream(Stream stream) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  bool key = streams_.contains(stream);
  private_.ForEach([&](std::uint16_t, const PrivatePools::Pool& p) { key = key || p.streams.contains(stream); });
  const bool used = pending_.NamesUse(stream);
  if ((!key && !used) || IsPseudoStream(stream)) return absl::OkStatus();  // nothing kept for it
  if (CaptureMayRun()) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: retiring stream ", absl::Hex(reinterpret_cast<std::uintptr_t>(stream)),
                     " on device ", device_, " during CUDA graph capture: CUDA forbids the wait it needs"));
  }
  if (key) {
    // The next request on this handle (maybe a new stream) goes through PoolsForNewStream (or
    // RoutedPoolsFor's first lookup), which revives it.
    last_stream_ = nullptr;
    last_pools_ = nullptr;
    last_routed_pools_ = nullptr;
  }
  // A pool key is remembered as retired; a stream that is only a use (RecordStream) is waited for.
  if (absl::Status s = key ? registry_.RetireStream(stream) : registry_.SynchronizeStream(stream); !s.ok()) return s;
  pending_.ForgetStream(stream);  // its work is done: no use of it needs waiting for
  return absl::OkStatus();
}

// fork(2) (Allocator's pthread_atfork handlers): the device lock, then the backend's, so the
// forking thread is the only one inside; the child keeps its copy of the state and learns from the
// backend whether the device is usable there.
void DeviceAllocator::PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu_.Lock();
  backend_->PrepareFork();
}

void DeviceAllocator::ParentAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  backend_->ParentAfterFork();
  mu_.Unlock();
}

void DeviceAllocator::ChildAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (absl::Status s = backend_->ChildAfterFork(); !s.ok() && fork_child_error_.ok()) fork_child_error_ = s;
  mu_.Unlock();
}

}  // namespace bucketalloc::internal
