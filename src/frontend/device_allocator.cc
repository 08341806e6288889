// src/frontend/device_allocator.cc — the coordinator of one device (frontend/device_allocator.h).
#include "frontend/device_allocator.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backend/stream_keys.h"
#include "bucketalloc/units.h"
#include "frontend/oom_diagnosis.h"
#include "frontend/snapshot_walk.h"
#include "frontend/tenants.h"
#include "internal/check.h"
#include "memory/size_classes.h"

namespace bucketalloc::internal {
namespace {

std::string PtrStr(const void* p) { return absl::StrCat("0x", absl::Hex(reinterpret_cast<std::uintptr_t>(p))); }

LargePoolConfig MakeLargeConfig(const Options& o, std::size_t granularity) {
  LargePoolConfig c;
  c.max_split_size = o.max_split_size;
  c.max_non_split_rounding = o.max_non_split_rounding;
  c.large_segment_size = o.large_segment_size;
  c.roundup_power2_divisions = o.roundup_power2_divisions;
  c.tiers = o.ResolvedTiers(granularity);
  c.tier_min_fill = o.tier_min_fill;
  c.granularity = granularity;
  if (o.Stitching()) c.keep_remainder = 0;
  return c;
}

// The cap: the smaller of capacity (0: the device) and fraction x total, in whole granules. A cap
// under one granule would fail every allocation: an error naming both settings.
absl::StatusOr<std::size_t> ComputeCap(std::size_t capacity, double fraction, std::size_t total,
                                       std::size_t granularity, int device) {
  std::size_t cap = capacity == 0 ? total : std::min(capacity, total);
  const auto by_fraction = static_cast<std::size_t>(fraction * static_cast<double>(total));
  cap = std::min(cap, by_fraction) / granularity * granularity;
  if (cap > 0) return cap;
  return absl::InvalidArgumentError(absl::StrCat(
      "bucketalloc: capacity:", SizeText(capacity), " and memory_fraction:", NumberText(fraction), " give device ",
      device, " (", FormatBytes(total), ") a cap of ",
      FormatBytes(std::min(capacity == 0 ? total : capacity, by_fraction)), ", less than one ",
      FormatBytes(granularity),
      " granule, so every allocation would fail; accepted: a capacity of 0 "
      "(the whole device) or at least one granule, and a memory_fraction that leaves at least one granule"));
}

}  // namespace

DeviceAllocator::DeviceAllocator(const Options& options, std::unique_ptr<Backend> backend, int device,
                                 std::shared_ptr<const Tenants> tenants)
    : options_(options),
      device_(device),
      backend_(std::move(backend)),
      memory_fraction_(options.memory_fraction),
      registry_(backend_.get(), &stats_, &history_),
      large_config_(MakeLargeConfig(options, backend_->Granularity())),
      pools_(PoolContext{&stats_, &registry_, &clock_}, options.slab_limit, options.small_pool_limit, large_config_,
             /*stitching=*/options.Stitching()),
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
                                       settings.no_split ? 0 : options_.slab_limit, options_.small_pool_limit,
                                       std::move(large), stitching, /*no_split=*/settings.no_split);
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
  if (size == 0) return nullptr;
  if (size > kMaxRequestBytes) [[unlikely]]
    return InvalidSize(size);
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
  if (absl::IsResourceExhausted(h.status()) && !rejected && private_pool == 0 && !use_on_oom_.empty()) {
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
  for (const GraphPoolId& id : use_on_oom_) {
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

bool DeviceAllocator::StreamCaptures(Stream stream, bool if_unknown) {
  stream = StreamOfKey(stream);                   // this thread's per-thread key: cudaStreamPerThread
  if (IsPseudoStream(stream)) return if_unknown;  // another thread's per-thread stream cannot be asked
  absl::StatusOr<bool> capturing = backend_->IsCapturing(stream);
  return capturing.ok() ? *capturing : if_unknown;
}

void DeviceAllocator::EndAbandonedCaptures() {
  if (!private_.routing()) return;
  const int ended =
      private_.EndAbandoned([&](Stream s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return StreamCaptures(s, true); });
  if (ended > 0) stats_.Count(&DeviceStats::num_abandoned_captures, ended);
}

bool DeviceAllocator::CaptureRestricts(Stream stream) {
  EndAbandonedCaptures();
  if (CaptureMayRun()) return true;
  if (!options_.probe_stream_capture) return false;
  return StreamCaptures(stream, false);  // an error here is reported by the backend call that follows
}

absl::Status DeviceAllocator::CaptureMiss(std::size_t size, Stream stream) {
  stats_.Count(&DeviceStats::num_capture_refusals);
  return absl::FailedPreconditionError(
      absl::StrCat("bucketalloc: cannot allocate ", size, " bytes on device ", device_, " for stream ", PtrStr(stream),
                   " during CUDA graph capture: no cached block fits, and backend '", backend_->Name(),
                   "' cannot allocate while a capture runs. Run the captured work once on the capturing stream before "
                   "capturing (so that its blocks are cached on that stream), and do not empty the cache between that "
                   "warm-up and the capture"));
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
  s.stitching = options_.Stitching() && pool == kLargePool;
  s.movable = PoolsOf(private_pool).large().movable_bytes();
  const bool at_tenant_cap = tenants_.NarrowOom(private_pool, segment, &s);
  OomReport r = DiagnoseOom(s);
  tenants_.AccountOom(private_pool, at_tenant_cap, &r);
  r.rejected = rejected;
  stats_.Count(OomCounter(r.cause));
  history_.Record(TraceAction::kOom, 0, size, registry_.slow_path_stream(), r.device_free, private_pool);
  std::string message = r.ToString();
  if (recent_ooms_.size() == DeviceMetrics::kRecentOoms) recent_ooms_.pop_front();
  recent_ooms_.push_back(OomEvent{static_cast<std::uint64_t>(stats_.Snapshot(/*since_start=*/true).num_ooms),
                                  absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), size, r.cause,
                                  r.at_tenant_cap ? r.tenant : std::string(), r.at_tenant_cap ? r.tenant_cap : 0});
  last_oom_ = std::move(r);
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
  if (pending_.Contains(addr)) return InvalidFree(ptr, "double free (it is already freed and awaiting stream events)");
  if (registry_.Holding(addr).has_value()) {
    return InvalidFree(ptr,
                       "double free, or a pointer into a block rather than its start: no live "
                       "allocation starts at this address inside bucketalloc's memory");
  }
  return InvalidFree(ptr, "the pointer was not allocated by bucketalloc on this device");
}

absl::Status DeviceAllocator::FreeSizeMismatch(void* ptr, std::size_t requested, std::size_t given) {
  return InvalidFree(ptr,
                     absl::StrCat("size mismatch: allocated with ", requested, " bytes, freed with ", given, " bytes"));
}

absl::Status DeviceAllocator::Free(void* ptr, std::optional<std::size_t> size) {
  if (ptr == nullptr) return absl::OkStatus();
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  LiveEntry* found = live_.Find(addr);
  if (found == nullptr) [[unlikely]]
    return FreeOfNoLiveAllocation(ptr);
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
  // Blocks awaiting stream events are polled on every free and every slow path, never on a hit, and
  // never during a capture (CUDA forbids event queries then).
  if (!pending_.empty() && !CaptureMayRun()) RetirePending(PendingFrees::Mode::kPollUntilBusy);
  if (tenants_.over_cap()) [[unlikely]]
    TrimTenantsToCaps();
  return absl::OkStatus();
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

void DeviceAllocator::ReleasePrivatePools(bool all) {
  std::vector<std::uint16_t> tags;
  private_.ForEach([&](std::uint16_t tag, const PrivatePools::Pool& p) {
    if (all || p.freeable()) tags.push_back(tag);
  });
  if (tags.empty()) return;
  // PyTorch returns a private pool's memory by cudaFree, which waits for the device: a replay of the
  // graph launched on any stream may still write it.
  if (absl::Status s = backend_->SynchronizeDevice(); !s.ok()) {
    std::fprintf(stderr, "bucketalloc: device %d: synchronizing before releasing private pools failed: %s\n", device_,
                 std::string(s.message()).c_str());
    return;
  }
  stats_.Count(&DeviceStats::num_sync_all_streams);
  for (std::uint16_t tag : tags) {
    ReleasePoolCache(tag);
    ForgetPrivatePoolIfEmpty(tag);
  }
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

// ---- CUDA IPC ------------------------------------------------------------------------------------

absl::StatusOr<SharedMemory> DeviceAllocator::ShareBlock(void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  const LiveEntry* entry = live_.Find(addr);
  std::optional<SegmentRegistry::Range> range = entry != nullptr ? registry_.Holding(addr) : std::nullopt;
  if (!range.has_value()) {  // invariant: a live block lies in one registered range
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: sharing ", PtrStr(ptr), " on device ", device_,
                                                   ": no live allocation starts at this address"));
  }
  return ShareRange(
      backend_.get(), *range, addr,
      [&](std::uintptr_t* base, std::vector<PhysicalPiece>* pieces) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return PoolsOf(entry->private_pool).Visit(entry->handle, [&](auto& pool, auto h) -> absl::Status {
          if constexpr (std::is_same_v<PoolType<decltype(pool)>, LargePool>) {
            return pool.PiecesUnder(h.block, base, pieces);
          } else {
            return absl::InternalError("bucketalloc: a slab block in a virtual-memory range");
          }
        });
      },
      device_);
}

absl::StatusOr<void*> DeviceAllocator::OpenShared(int pid, absl::Span<const SharedPiece> pieces) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  if (CaptureMayRun()) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: opening shared memory on device ", device_,
                                                      " during CUDA graph capture; open it before or after"));
  }
  absl::StatusOr<std::uintptr_t> base = imports_.Open(pid, pieces, device_);
  if (!base.ok()) return base.status();
  return reinterpret_cast<void*>(*base);
}

absl::Status DeviceAllocator::CloseShared(void* base) {
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  auto refusal = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (!fork_child_error_.ok()) [[unlikely]]
      return fork_child_error_;
    if (CaptureMayRun()) {
      return absl::FailedPreconditionError(absl::StrCat("bucketalloc: closing shared memory on device ", device_,
                                                        " during CUDA graph capture: the unmap needs a device "
                                                        "synchronization, which CUDA forbids then; close it after"));
    }
    return absl::OkStatus();
  };
  {
    MutexLock lock(mu_);
    if (absl::Status s = refusal(); !s.ok()) return s;
  }
  // The receiver's kernels may still read it: wait for the device (there is no stream to wait
  // for), without the device lock, so that allocations go on meanwhile.
  if (absl::Status s = backend_->SynchronizeDevice(); !s.ok()) return s;
  MutexLock lock(mu_);
  if (absl::Status s = refusal(); !s.ok()) return s;  // a capture that began meanwhile
  return imports_.Close(addr, device_);
}

bool DeviceAllocator::HasOpenShared(void* base) const {
  MutexLock lock(mu_);
  return imports_.contains(reinterpret_cast<std::uintptr_t>(base));
}

bool DeviceAllocator::OwnsLive(void* ptr) const {
  MutexLock lock(mu_);
  return live_.contains(reinterpret_cast<std::uintptr_t>(ptr));
}

bool DeviceAllocator::InReservedMemory(void* ptr) const {
  MutexLock lock(mu_);
  return registry_.Holding(reinterpret_cast<std::uintptr_t>(ptr)).has_value();
}

absl::StatusOr<std::pair<void*, std::size_t>> DeviceAllocator::BaseAllocation(void* ptr) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  std::optional<SegmentRegistry::Range> range = live_.contains(addr) ? registry_.Holding(addr) : std::nullopt;
  if (!range.has_value()) {  // invariant: a live block lies in one registered range
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: base allocation of ", PtrStr(ptr), " on device ",
                                                   device_, ": no live allocation starts at this address"));
  }
  return std::pair<void*, std::size_t>{reinterpret_cast<void*>(range->base), range->bytes};
}

// ---------------------------------------------------------------------------------------------
// The cache, captures, the cap.

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

absl::Status DeviceAllocator::BeginCapture(GraphPoolId pool, CaptureFilter filter) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  return private_.Begin(pool, std::move(filter), device_);
}

absl::Status DeviceAllocator::EndCapture(GraphPoolId pool) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  return private_.End(pool, device_);
}

absl::Status DeviceAllocator::ReleasePool(GraphPoolId pool) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  // At a use count of 0 the pool is freeable: its memory goes back at the next release (an OOM's
  // release-and-retry, empty_cache), after a device synchronization, as in PyTorch.
  // A pool with nothing to give back is forgotten now.
  ForgetPrivatePoolIfEmpty(private_.Release(pool));
  MaybeCheckInvariants();
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: memory fraction ", fraction, " for device ", device_,
                                                   " is invalid; accepted: a number in (0, 1]"));
  }
  absl::StatusOr<std::size_t> cap =
      ComputeCap(options_.capacity, fraction, device_total_, backend_->Granularity(), device_);
  if (!cap.ok()) return cap.status();  // the cap stays as it was
  MutexLock lock(mu_);
  registry_.set_cap(*cap);
  stats_.SetCapacity(static_cast<std::int64_t>(registry_.cap()));
  memory_fraction_ = fraction;
  return absl::OkStatus();
}

double DeviceAllocator::memory_fraction() const {
  MutexLock lock(mu_);
  return memory_fraction_;
}

// ---- PyTorch's pool, cache and stats calls (MemPool, emptyCache(pool), cacheInfo) ------------

absl::Status DeviceAllocator::IncrefPool(GraphPoolId pool) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  absl::Status s = private_.Incref(pool, device_);
  MaybeCheckInvariants();
  return s;
}

void DeviceAllocator::MarkCapture(bool begin) {
  MutexLock lock(mu_);
  private_.MarkCapture(begin);
}

absl::Status DeviceAllocator::ConfigurePool(GraphPoolId pool, absl::FunctionRef<void(PrivatePoolSettings&)> change) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  const std::uint16_t found = private_.TagOf(pool);
  PrivatePoolSettings settings = found == 0 ? PrivatePoolSettings{} : private_.at(found).settings;
  change(settings);
  if (absl::Status s = private_.Configure(pool, std::move(settings), device_); !s.ok()) return s;
  const std::uint16_t tag = private_.TagOf(pool);
  if (last_routed_tag_ == tag) last_routed_pools_ = nullptr;  // its free lists were rebuilt
  MaybeCheckInvariants();
  return absl::OkStatus();
}

void DeviceAllocator::SetUseOnOom(GraphPoolId pool, bool use_on_oom) {
  MutexLock lock(mu_);
  auto it = std::find(use_on_oom_.begin(), use_on_oom_.end(), pool);
  if (use_on_oom && it == use_on_oom_.end()) use_on_oom_.push_back(pool);
  if (!use_on_oom && it != use_on_oom_.end()) use_on_oom_.erase(it);
}

int DeviceAllocator::PoolUseCount(GraphPoolId pool) const {
  MutexLock lock(mu_);
  return private_.UseCount(pool);
}

absl::Status DeviceAllocator::EmptyPoolCache(GraphPoolId pool) {
  if (pool == GraphPoolId{}) return EmptyCache();
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  EndAbandonedCaptures();
  if (private_.routing()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: empty_cache of private pool (", pool.first, ", ", pool.second, ") on device ", device_,
        " during CUDA graph capture or a MemPool context: CUDA forbids the synchronization and cudaFree it needs; "
        "nothing was released. Call it after the capture or context ends"));
  }
  const std::uint16_t tag = private_.TagOf(pool);
  // As PyTorch: only a freeable pool (no graph or MemPool uses it any more) gives memory back; a
  // pool in use keeps its free blocks, which a replay of its graph may still write.
  if (tag == 0 || !private_.at(tag).freeable()) return absl::OkStatus();
  SyncPendingFrees();
  // A replay of the pool's graph may still run on any stream: wait for the device, as PyTorch's
  // cudaFree does, before giving the memory back.
  if (absl::Status s = backend_->SynchronizeDevice(); !s.ok()) return s;
  stats_.Count(&DeviceStats::num_sync_all_streams);
  ReleasePoolCache(tag);
  ForgetPrivatePoolIfEmpty(tag);
  registry_.TrimAddressSpace();
  MaybeCheckInvariants();
  return absl::OkStatus();
}

std::size_t DeviceAllocator::CacheInfo(bool with_headroom) {
  std::size_t largest = 0;
  std::size_t headroom = 0;
  {
    MutexLock lock(mu_);
    largest = static_cast<std::size_t>(FragmentationLocked().all().largest_free);
    headroom = registry_.Headroom();
  }
  if (with_headroom && headroom > largest) {
    // What the device could still give under the cap: its free memory, asked outside the lock.
    absl::StatusOr<DeviceMemInfo> info = backend_->GetMemInfo();
    if (info.ok()) largest = std::max(largest, std::min(headroom, info->free_bytes));
  }
  return largest;
}

void DeviceAllocator::ResetAccumulatedStats() {
  MutexLock lock(mu_);
  stats_.ResetAccumulated();
  registry_.ResetOwnedAccumulated();
}

void DeviceAllocator::SetTraceHook(TraceHook hook) {
  MutexLock lock(mu_);
  history_.SetHook(hook, device_);
}

// ---------------------------------------------------------------------------------------------
// Reports.

DeviceStats DeviceAllocator::GetStats() const {
  MutexLock lock(mu_);
  return StatsLocked();
}

DeviceStats DeviceAllocator::StatsLocked(bool since_start) const {
  DeviceStats s = stats_.Snapshot(since_start);
  private_.ForEach([&](std::uint16_t tag, const PrivatePools::Pool& p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (p.tenant() != 0) return;  // tenants' pools are reported per tenant (GetTenantStats)
    if (const StatArray* reserved = registry_.OwnedReserved(tag)) {
      s.reserved_bytes_by_private_pools.push_back(PrivatePoolStats{p.id.first, p.id.second, *reserved});
    }
  });
  return s;
}

DeviceMetrics DeviceAllocator::GetMetrics() const {
  DeviceMetrics m;
  m.device = device_;
  MutexLock lock(mu_);
  m.stats = StatsLocked(/*since_start=*/true);  // Prometheus counters never go back
  m.fragmentation = FragmentationLocked();
  m.backend_calls = backend_->counters();
  m.recent_ooms.assign(recent_ooms_.begin(), recent_ooms_.end());
  m.tenants = tenants_.Stats();
  return m;
}

// ---------------------------------------------------------------------------------------------
// Tenants (frontend/tenants.h).

absl::Status DeviceAllocator::SetTenantCap(int index, std::size_t cap) {
  MutexLock lock(mu_);
  if (!fork_child_error_.ok()) [[unlikely]]
    return fork_child_error_;
  EndAbandonedCaptures();
  if (CaptureMayRun() && tenants_.ReservesOver(index, cap)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: lowering tenant '", tenants_.tenants().Name(index), "''s cap below what it reserves on device ",
        device_,
        " during CUDA graph capture: releasing its cache needs the synchronization and frees CUDA forbids then; "
        "the cap is unchanged. Set it after the capture ends"));
  }
  tenants_.ApplyCap(index, cap);
  if (!tenants_.ReservesOver(index, cap)) return absl::OkStatus();
  // Over the new cap: give back what the tenant caches (after waiting for every pending free's
  // stream events); live blocks stay, and its growth is refused until it fits
  // (SegmentRegistry::Headroom).
  SyncPendingFrees();
  ReleasePoolCache(tenants_.PoolTag(index));
  registry_.TrimAddressSpace();
  if (tenants_.ReservesOver(index, cap)) tenants_.set_over_cap();  // live memory above it: its frees give it back
  MaybeCheckInvariants();
  return absl::OkStatus();
}

std::vector<TenantStats> DeviceAllocator::GetTenantStats() const {
  MutexLock lock(mu_);
  return tenants_.Stats();
}

void DeviceAllocator::ResetPeakStats() {
  MutexLock lock(mu_);
  stats_.ResetPeaks();
  registry_.ResetOwnedPeaks();
}

std::optional<OomReport> DeviceAllocator::LastOom() const {
  MutexLock lock(mu_);
  return last_oom_;
}

FragmentationReport DeviceAllocator::GetFragmentation() const {
  MutexLock lock(mu_);
  return FragmentationLocked();
}

FragmentationReport DeviceAllocator::FragmentationLocked() const {
  FragmentationReport r;
  pools_.AddFragmentation(streams_, &r);
  private_.ForEach([&](std::uint16_t, const PrivatePools::Pool& p) { p.pools->AddFragmentation(p.streams, &r); });
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {
    const auto pool = static_cast<PoolIndex>(p);
    r.pools[p].requested = stats_.Current(&DeviceStats::requested_bytes, pool);
    r.pools[p].allocated = stats_.Current(&DeviceStats::allocated_bytes, pool);
    r.pools[p].reserved = stats_.Current(&DeviceStats::reserved_bytes, pool);
    r.all().Merge(r.pools[p]);
  }
  return r;
}

std::size_t DeviceAllocator::SpareBytes() const {
  std::size_t spare = 0;
  ForEachPools(
      [&](const Pools& pools, GraphPoolId) { pools.ForEach([&](const auto& pool) { spare += pool.spare_bytes(); }); });
  return spare;
}

absl::Status DeviceAllocator::SetHistory(bool enabled, std::size_t max_entries) {
  MutexLock lock(mu_);
  absl::Status s = history_.Reset(enabled ? std::max<std::size_t>(max_entries, 1) : 0);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), " on device ", device_));
  return s;
}

std::vector<TraceEntry> DeviceAllocator::AppendSnapshot(std::vector<SegmentSnapshot>* segments) const {
  MutexLock lock(mu_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> pending;
  pending_.ForEach([&](std::uintptr_t ptr, const LiveEntry& e) { pending.emplace(ptr, e.requested); });
  const std::size_t first = segments->size();
  ForEachPools([&](const Pools& pools, GraphPoolId id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::vector<SpanView> spans;
    pools.ForEach([&](const auto& pool) { pool.Describe(&spans); });
    const std::size_t before = segments->size();
    AppendSegmentSnapshots(
        device_, std::move(spans),
        [&](std::uintptr_t ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS -> BlockUse {
          if (const LiveEntry* e = live_.Find(ptr)) return {BlockSnapshotState::kActiveAllocated, e->requested};
          auto it = pending.find(ptr);
          return {BlockSnapshotState::kActivePendingFree, it == pending.end() ? 0 : it->second};
        },
        segments);
    const std::string tenant = tenants_.NameOfPool(id);
    for (std::size_t i = before; i < segments->size(); ++i) {
      (*segments)[i].pool_id = id;
      (*segments)[i].tenant = tenant;
    }
  });
  // The device's segments in address order, whichever pool holds them.
  std::sort(segments->begin() + static_cast<std::ptrdiff_t>(first), segments->end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  return history_.Entries();
}

}  // namespace bucketalloc::internal
