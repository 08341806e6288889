#include "frontend/device_allocator.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_format.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
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
  c.granule = o.Stitching() ? granularity : 0;
  if (o.Stitching()) c.keep_remainder = 0;
  return c;
}

std::size_t ComputeCap(std::size_t capacity, double fraction, std::size_t total, std::size_t granularity) {
  std::size_t cap = capacity == 0 ? total : std::min(capacity, total);
  const auto by_fraction = static_cast<std::size_t>(fraction * static_cast<double>(total));
  cap = std::min(cap, by_fraction);
  return cap / granularity * granularity;
}

}  // namespace

std::size_t DeviceAllocator::LiveEntry::allocated_size() const {
  return small ? static_cast<const Slab*>(owner)->slot_size : static_cast<const Block*>(owner)->size;
}

Stream DeviceAllocator::LiveEntry::stream() const {
  return small ? static_cast<const Slab*>(owner)->stream : static_cast<const Block*>(owner)->segment->stream;
}

DeviceAllocator::DeviceAllocator(const Options& options, std::unique_ptr<Backend> backend, int device)
    : options_(options),
      device_(device),
      backend_(std::move(backend)),
      small_(PoolContext{&stats_, this, &clock_}),
      large_(PoolContext{&stats_, this, &clock_}, MakeLargeConfig(options, backend_->Granularity())),
      small_limit_(options.small_pool_limit) {}

absl::StatusOr<std::unique_ptr<DeviceAllocator>> DeviceAllocator::Create(const Options& options,
                                                                         std::unique_ptr<Backend> backend,
                                                                         int device) {
  const std::size_t granularity = backend->Granularity();
  if (!IsPowerOfTwo(granularity) || kSlabBytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: backend '", backend->Name(), "' of device ", device,
                                                   " has granularity ", granularity,
                                                   "; accepted: a power of two up to ", kSlabBytes,
                                                   " (slabs and segments are 2 MiB multiples)"));
  }
  if (options.Stitching() && !backend->SupportsVirtualMemory()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucketalloc: stitching (backend:vmm or expandable_segments:true) needs virtual memory, but backend '",
        backend->Name(), "' of device ", device, " has none; accepted: backend:vmm, backend:sim, or "
        "expandable_segments:false"));
  }
  absl::StatusOr<DeviceMemInfo> info = backend->GetMemInfo();
  if (!info.ok()) return info.status();
  std::unique_ptr<DeviceAllocator> d(new DeviceAllocator(options, std::move(backend), device));
  d->device_total_ = info->total_bytes;
  MutexLock lock(d->mu_);
  d->cap_ = ComputeCap(options.capacity, options.memory_fraction, info->total_bytes,
                       d->backend_->Granularity());
  d->stats_.max_split_size =
      options.max_split_size == kUnlimited ? -1 : static_cast<std::int64_t>(options.max_split_size);
  d->stats_.capacity_bytes = static_cast<std::int64_t>(d->cap_);
  return d;
}

DeviceAllocator::~DeviceAllocator() {
  MutexLock lock(mu_);
  // Give back everything that is cached; live allocations still held by callers are reported.
  SyncAndReleaseAll();
  for (PendingFree& p : pending_) {
    for (Event e : p.events) backend_->DestroyEvent(e);
  }
  if (!live_.empty() || !pending_.empty()) {
    std::fprintf(stderr, "bucketalloc: device %d destroyed with %zu live allocations (%s) still held\n",
                 device_, live_.size() + pending_.size(),
                 FormatBytes(static_cast<std::size_t>(stats_.active_bytes[kAllPools].current)).c_str());
  }
}

DeviceAllocator::StreamPools& DeviceAllocator::PoolsFor(Stream stream) {
  if (last_pools_ != nullptr && stream == last_stream_) return *last_pools_;
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    it = streams_.emplace(stream, std::make_unique<StreamPools>(large_.num_tiers())).first;
  }
  last_stream_ = stream;
  last_pools_ = it->second.get();
  return *last_pools_;
}

void DeviceAllocator::CommitLive(std::uintptr_t ptr, const LiveEntry& entry) {
  const PoolIndex pool = entry.small ? kSmallPool : kLargePool;
  const auto requested = static_cast<std::int64_t>(entry.requested);
  StatAdd(stats_.requested_bytes, pool, requested);
  StatAdd(stats_.allocated_bytes, pool, static_cast<std::int64_t>(entry.allocated_size()));
  StatAdd(stats_.allocation, pool, 1);
  if (!entry.small && entry.allocated_size() > options_.max_split_size) stats_.oversize_allocations.Add(1);
  if (entry.graph != 0) ++graph_pools_[entry.graph].blocks;
  live_.Insert(ptr, entry);
}

absl::StatusOr<void*> DeviceAllocator::Allocate(std::size_t size, Stream stream) {
  if (size == 0) return nullptr;
  if (size > kMaxRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucketalloc: allocation size ", size, " on device ", device_, " is invalid: accepted sizes are 0 to ",
        kMaxRequestBytes, " bytes (a negative ssize_t converted to size_t is this large)"));
  }
  MutexLock lock(mu_);
  StreamPools& sp = PoolsFor(stream);
  const std::uint16_t graph = captures_.empty() ? 0 : GraphTagFor(stream);
  if (size <= small_limit_) {
    const int cls = SmallSizeClasses::ClassOf(size);
    SmallPool::Slot slot;
    const bool hit = small_.TryAllocate(sp.small, cls, &slot);
    if (hit) {
      ++stats_.num_cache_hits;
    } else if (absl::Status s = AllocateSmallSlow(sp, stream, size, cls, &slot); !s.ok()) {
      return s;
    }
    CommitLive(slot.address(), LiveEntry{slot.slab, size, slot.slot, graph, true});
    Trace(TraceAction::kAlloc, slot.address(), size, stream);
    if (!hit) MaybeCheckInvariants();
    return reinterpret_cast<void*>(slot.address());
  }
  const int tier = large_.TierOf(size);
  const std::size_t rounded = tier >= 0 ? large_.tier_bytes(tier) : large_.RoundSize(size);
  Block* block = large_.TryAllocate(sp.large, rounded, tier);
  const bool hit = block != nullptr;
  if (hit) {
    ++stats_.num_cache_hits;
  } else {
    absl::StatusOr<Block*> slow = AllocateLargeSlow(sp, stream, size, tier);
    if (!slow.ok()) return slow.status();
    block = *slow;
  }
  block->requested = size;
  CommitLive(block->ptr, LiveEntry{block, size, 0, graph, false});
  Trace(TraceAction::kAlloc, block->ptr, size, stream);
  if (!hit) MaybeCheckInvariants();
  return reinterpret_cast<void*>(block->ptr);
}

absl::Status DeviceAllocator::AllocateSmallSlow(StreamPools& sp, Stream stream, std::size_t size, int cls,
                                                SmallPool::Slot* slot) {
  slow_path_stream_ = stream;
  if (CaptureRestricts(stream)) {
    // Only cached memory: an empty slab of the stream may take this class; AllocateSegment refuses.
    slow_path_capturing_ = true;
    bool from_cache = false;
    absl::Status s = small_.AllocateSlow(sp.small, stream, cls, slot, &from_cache);
    slow_path_capturing_ = false;
    if (s.ok()) ++stats_.num_cache_hits;
    return s.ok() || !absl::IsFailedPrecondition(s) ? s : CaptureMiss(size, stream);
  }
  if (!pending_.empty()) RetirePending(RetireMode::kPollAll);
  // Two rounds: the second after synchronizing pending events and releasing the cache, which may
  // have returned a slot of this class to a slab that is still partly used.
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      SyncAndReleaseAll();
      ++stats_.num_alloc_retries;
    }
    if (small_.TryAllocate(sp.small, cls, slot)) {
      ++stats_.num_cache_hits;
      return absl::OkStatus();
    }
    bool from_cache = false;
    absl::Status s = small_.AllocateSlow(sp.small, stream, cls, slot, &from_cache);
    if (s.ok()) {
      ++(from_cache ? stats_.num_cache_hits : stats_.num_cache_misses);
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(s)) return s;
    if (round == 1) return OutOfMemory(kSmallPool, size, SmallSizeClasses::ClassSize(cls), kSlabBytes, s);
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<Block*> DeviceAllocator::ServeLarge(StreamPools& sp, Stream stream, std::size_t rounded, int tier) {
  if (Block* block = large_.TryAllocate(sp.large, rounded, tier, /*full_scan=*/true)) {
    ++stats_.num_cache_hits;
    return block;
  }
  const std::size_t minimal = RoundUp(rounded, backend_->Granularity());
  const std::size_t preferred = tier >= 0 ? minimal : large_.SegmentSizeFor(rounded);
  absl::StatusOr<Block*> block = large_.Grow(sp.large, stream, preferred, rounded, tier);
  if (absl::IsResourceExhausted(block.status()) && preferred != minimal) {
    block = large_.Grow(sp.large, stream, minimal, rounded, tier);
  }
  if (block.ok()) ++stats_.num_cache_misses;
  return block;
}

absl::StatusOr<Block*> DeviceAllocator::AllocateLargeSlow(StreamPools& sp, Stream stream, std::size_t size,
                                                          int tier) {
  slow_path_stream_ = stream;
  const std::size_t rounded = tier >= 0 ? large_.tier_bytes(tier) : large_.RoundSize(size);
  if (CaptureRestricts(stream)) {
    // Only cached memory (the whole bin is scanned, a tier request may take an exact-size block);
    // AllocateSegment refuses.
    slow_path_capturing_ = true;
    absl::StatusOr<Block*> block = ServeLarge(sp, stream, rounded, tier);
    if (absl::IsFailedPrecondition(block.status()) && tier >= 0) {
      block = ServeLarge(sp, stream, large_.RoundSize(size), -1);
      if (block.ok()) ++stats_.num_tier_fallbacks;
    }
    slow_path_capturing_ = false;
    if (absl::IsFailedPrecondition(block.status())) return CaptureMiss(size, stream);
    return block;
  }
  if (!pending_.empty()) RetirePending(RetireMode::kPollAll);
  // A cached block or a new segment; at the cap, with stitching, the granules of free blocks.
  auto serve = [&](std::size_t bytes, int t) -> absl::StatusOr<Block*> {
    absl::StatusOr<Block*> block = ServeLarge(sp, stream, bytes, t);
    if (!absl::IsResourceExhausted(block.status()) || !options_.Stitching()) return block;
    absl::StatusOr<Block*> stitched = large_.Stitch(sp.large, stream, bytes, t);
    if (stitched.ok()) {
      ++stats_.num_cache_misses;
      return stitched;
    }
    // A failed stitch changed nothing a caller can see (even a backend fault): release-and-retry
    // and the OOM report follow, which names both failures.
    return absl::ResourceExhaustedError(
        absl::StrCat(block.status().message(), "; stitching: ", stitched.status().message()));
  };
  absl::StatusOr<Block*> block = serve(rounded, tier);
  if (!absl::IsResourceExhausted(block.status())) return block;
  // Release the cache (after synchronizing pending stream events) and try once more.
  SyncAndReleaseAll();
  ++stats_.num_alloc_retries;
  block = serve(rounded, tier);
  if (!absl::IsResourceExhausted(block.status())) return block;
  std::size_t needed = rounded;
  if (tier >= 0) {
    // Rounding to the tier is a preference: fall back to the exact rounded size.
    needed = large_.RoundSize(size);
    block = serve(needed, -1);
    if (block.ok()) ++stats_.num_tier_fallbacks;
    if (!absl::IsResourceExhausted(block.status())) return block;
  }
  return OutOfMemory(kLargePool, size, needed, RoundUp(needed, backend_->Granularity()), block.status());
}

absl::StatusOr<std::uintptr_t> DeviceAllocator::AllocateSegment(std::size_t bytes, PoolIndex pool) {
  if (slow_path_capturing_) {
    // The caller turns this into CaptureMiss; no backend call (not even a release) is legal now.
    return absl::FailedPreconditionError("bucketalloc: no device allocation during stream capture");
  }
  CollectGarbage(bytes);
  if (absl::Status s = CheckHeadroom(bytes); !s.ok()) return s;
  absl::StatusOr<void*> p = backend_->Allocate(bytes);
  if (!p.ok()) return p.status();
  const auto base = reinterpret_cast<std::uintptr_t>(*p);
  registry_.emplace(base, SegmentInfo{bytes, pool});
  StatAdd(stats_.reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  StatAdd(stats_.segment, pool, 1);
  ++stats_.num_device_alloc;
  Trace(TraceAction::kSegmentAlloc, base, bytes, slow_path_stream_);
  return base;
}

bool DeviceAllocator::ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) {
  if (absl::Status s = backend_->Free(reinterpret_cast<void*>(base), bytes); !s.ok()) {
    ++stats_.num_device_free_failures;
    return false;
  }
  registry_.erase(base);
  StatAdd(stats_.reserved_bytes, pool, -static_cast<std::int64_t>(bytes));
  StatAdd(stats_.segment, pool, -1);
  ++stats_.num_device_free;
  Trace(TraceAction::kSegmentFree, base, bytes, nullptr);
  return true;
}

absl::StatusOr<std::uintptr_t> DeviceAllocator::ReserveRange(std::size_t bytes, std::size_t to_map) {
  if (slow_path_capturing_) {
    return absl::FailedPreconditionError("bucketalloc: no device allocation during stream capture");
  }
  if (to_map > 0) CollectGarbage(to_map);
  absl::StatusOr<std::uintptr_t> va = backend_->ReserveAddressRange(bytes, backend_->Granularity());
  if (!va.ok()) return va.status();
  registry_.emplace(*va, SegmentInfo{bytes, kLargePool, /*vmm=*/true, /*mapped=*/0});
  StatAdd(stats_.segment, kLargePool, 1);
  Trace(TraceAction::kSegmentAlloc, *va, bytes, slow_path_stream_);
  return *va;
}

void DeviceAllocator::ReleaseRange(std::uintptr_t va, std::size_t bytes) {
  auto it = registry_.find(va);
  BA_CHECK(it != registry_.end() && it->second.vmm && it->second.mapped == 0, "releasing a range still mapped");
  if (!backend_->ReleaseAddressRange(va, bytes).ok()) ++stats_.num_device_free_failures;  // only address space
  registry_.erase(it);
  StatAdd(stats_.segment, kLargePool, -1);
  Trace(TraceAction::kSegmentFree, va, bytes, nullptr);
}

absl::StatusOr<PhysicalHandle> DeviceAllocator::CreateGranule() {
  const std::size_t g = backend_->Granularity();
  if (absl::Status s = CheckHeadroom(g); !s.ok()) return s;
  absl::StatusOr<PhysicalHandle> h = backend_->CreatePhysical(g);
  if (!h.ok()) return h.status();
  StatAdd(stats_.reserved_bytes, kLargePool, static_cast<std::int64_t>(g));
  return *h;
}

bool DeviceAllocator::ReleaseGranule(PhysicalHandle handle) {
  if (!backend_->ReleasePhysical(handle).ok()) {
    ++stats_.num_device_free_failures;
    return false;
  }
  StatAdd(stats_.reserved_bytes, kLargePool, -static_cast<std::int64_t>(backend_->Granularity()));
  return true;
}

absl::Status DeviceAllocator::MapGranule(std::uintptr_t va, PhysicalHandle handle) {
  const std::size_t g = backend_->Granularity();
  if (absl::Status s = backend_->Map(va, g, handle); !s.ok()) return s;
  std::prev(registry_.upper_bound(va))->second.mapped += g;  // inside a registered range (Map checked)
  Trace(TraceAction::kSegmentMap, va, g, slow_path_stream_);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::UnmapGranule(std::uintptr_t va) {
  const std::size_t g = backend_->Granularity();
  if (absl::Status s = backend_->Unmap(va, g); !s.ok()) return s;
  std::prev(registry_.upper_bound(va))->second.mapped -= g;
  Trace(TraceAction::kSegmentUnmap, va, g, slow_path_stream_);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SynchronizeStream(Stream stream) {
  absl::StatusOr<Event> e = backend_->RecordEvent(stream);
  if (!e.ok()) return e.status();
  absl::Status s = backend_->SynchronizeEvent(*e);
  backend_->DestroyEvent(*e);
  return s;
}

absl::Status DeviceAllocator::CheckHeadroom(std::size_t bytes) const {
  if (Headroom() >= bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: reserving ", bytes, " more bytes would exceed the cap of ",
                                                   cap_, " bytes (", stats_.reserved_bytes[kAllPools].current,
                                                   " reserved)"));
}

std::size_t DeviceAllocator::Headroom() const {
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  return cap_ > reserved ? cap_ - reserved : 0;
}

bool DeviceAllocator::CaptureRestricts(Stream stream) {
  if (!captures_.empty()) return true;
  if (!options_.probe_stream_capture) return false;
  absl::StatusOr<bool> capturing = backend_->IsCapturing(stream);
  return capturing.ok() && *capturing;  // an error here is reported by the backend call that follows
}

std::uint16_t DeviceAllocator::GraphTagFor(Stream stream) {
  for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
    if (it->filter(stream)) return it->tag;
  }
  return 0;
}

void DeviceAllocator::UntagBlock(std::uint16_t tag) {
  BA_DCHECK(graph_pools_[tag].blocks > 0, "a graph pool's block count went negative");
  --graph_pools_[tag].blocks;
}

absl::StatusOr<std::uint16_t> DeviceAllocator::FindPool(GraphPoolId id, absl::string_view what) {
  for (std::size_t tag = 1; tag < graph_pools_.size(); ++tag) {
    if (!graph_pools_[tag].released && graph_pools_[tag].id == id) return static_cast<std::uint16_t>(tag);
  }
  return absl::NotFoundError(absl::StrCat("bucketalloc: ", what, " graph pool (", id.first, ", ", id.second,
                                          ") on device ", device_, ": no such pool is open (no BeginCapture for it)"));
}

absl::Status DeviceAllocator::BeginCapture(GraphPoolId id, CaptureFilter filter) {
  if (!filter) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: BeginCapture on device ", device_,
                                                   " needs a stream filter; accepted: a callable that is true for "
                                                   "the capturing stream(s)"));
  }
  MutexLock lock(mu_);
  absl::StatusOr<std::uint16_t> tag = FindPool(id, "begin capture into");
  if (!tag.ok()) {
    // A new pool: reuse a forgotten slot (released, no blocks), else append one.
    std::size_t slot = 1;
    while (slot < graph_pools_.size() && !(graph_pools_[slot].released && graph_pools_[slot].blocks == 0)) ++slot;
    if (slot == graph_pools_.size()) {
      if (slot > std::numeric_limits<std::uint16_t>::max()) {
        return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: device ", device_, " already has ", slot - 1,
                                                         " open graph pools; release some (graph reset) first"));
      }
      graph_pools_.emplace_back();
    }
    graph_pools_[slot] = GraphPool{id, 0, false, 0};
    tag = static_cast<std::uint16_t>(slot);
  }
  ++graph_pools_[*tag].captures;
  captures_.push_back(ActiveCapture{*tag, std::move(filter)});
  return absl::OkStatus();
}

absl::Status DeviceAllocator::EndCapture(GraphPoolId id) {
  MutexLock lock(mu_);
  absl::StatusOr<std::uint16_t> tag = FindPool(id, "end capture into");
  if (!tag.ok()) return tag.status();
  auto it = std::find_if(captures_.rbegin(), captures_.rend(), [&](const ActiveCapture& c) { return c.tag == *tag; });
  if (it == captures_.rend()) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: end capture into graph pool (", id.first, ", ",
                                                      id.second, ") on device ", device_,
                                                      ": no capture into it is running"));
  }
  captures_.erase(std::next(it).base());
  --graph_pools_[*tag].captures;
  return absl::OkStatus();
}

absl::Status DeviceAllocator::ReleasePool(GraphPoolId id) {
  MutexLock lock(mu_);
  absl::StatusOr<std::uint16_t> tag = FindPool(id, "release");
  if (!tag.ok()) return absl::OkStatus();  // a pool that never captured on this device
  GraphPool& pool = graph_pools_[*tag];
  if (pool.captures > 0) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: release of graph pool (", id.first, ", ", id.second,
                                                      ") on device ", device_, ": a capture into it is running"));
  }
  pool.released = true;
  // Its held blocks become reusable (retired now, unless another capture forbids the event calls).
  if (captures_.empty() && !pending_.empty()) RetirePending(RetireMode::kPollAll);
  MaybeCheckInvariants();
  return absl::OkStatus();
}

absl::Status DeviceAllocator::CaptureMiss(std::size_t size, Stream stream) {
  ++stats_.num_capture_refusals;
  return absl::FailedPreconditionError(absl::StrCat(
      "bucketalloc: cannot allocate ", size, " bytes on device ", device_, " for stream ", PtrStr(stream),
      " during CUDA graph capture: no cached block fits, and CUDA forbids cudaMalloc while a capture runs. "
      "Run the captured work once on the capturing stream before capturing (so that its blocks are cached on "
      "that stream), and do not empty the cache between that warm-up and the capture"));
}

absl::Status DeviceAllocator::RecordUseEvents(absl::Span<const Stream> uses, absl::InlinedVector<Event, 2>* events) {
  for (Stream s : uses) {
    absl::StatusOr<Event> e = backend_->RecordEvent(s);
    if (!e.ok()) {
      for (Event done : *events) backend_->DestroyEvent(done);
      events->clear();
      return e.status();
    }
    events->push_back(*e);
  }
  return absl::OkStatus();
}

void DeviceAllocator::AppendTrace(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream,
                                  std::size_t device_free) {
  TraceEntry& e = trace_[trace_next_];
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stream = reinterpret_cast<std::uintptr_t>(stream);
  e.time_us = absl::GetCurrentTimeNanos() / 1000;
  e.device_free = device_free;
  trace_next_ = trace_next_ + 1 == trace_.size() ? 0 : trace_next_ + 1;
  trace_count_ = std::min(trace_count_ + 1, trace_.size());
}

void DeviceAllocator::CollectGarbage(std::size_t incoming) {
  if (options_.garbage_collection_threshold <= 0.0) return;
  const auto limit = static_cast<std::size_t>(options_.garbage_collection_threshold * static_cast<double>(cap_));
  auto reserved = [&] { return static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current); };
  while (reserved() + incoming > limit) {
    // Oldest first across both pools.
    const std::size_t released = small_.OldestEmpty() <= large_.OldestFree() ? small_.ReleaseOldest()
                                                                             : large_.ReleaseOldest();
    if (released == 0) break;
    ++stats_.num_gc_releases;
  }
}

void DeviceAllocator::ReturnEntry(const LiveEntry& entry) {
  if (entry.small) {
    small_.Return(static_cast<Slab*>(entry.owner), entry.slot);
  } else {
    large_.Return(static_cast<Block*>(entry.owner));
  }
}

absl::Status DeviceAllocator::InvalidFree(void* ptr, absl::string_view what) {
  ++stats_.num_invalid_frees;
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: invalid free of ", PtrStr(ptr), " on device ", device_, ": ", what));
}

bool DeviceAllocator::OwnsLive(void* ptr) const {
  MutexLock lock(mu_);
  return live_.contains(reinterpret_cast<std::uintptr_t>(ptr));
}

absl::Status DeviceAllocator::Free(void* ptr, std::optional<std::size_t> size) {
  if (ptr == nullptr) return absl::OkStatus();
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  LiveEntry* found = live_.Find(addr);
  if (found == nullptr) {
    for (const PendingFree& p : pending_) {
      if (p.ptr == addr) return InvalidFree(ptr, "double free (it is already freed and awaiting stream events)");
    }
    auto seg = registry_.upper_bound(addr);
    if (seg != registry_.begin() && addr < std::prev(seg)->first + std::prev(seg)->second.bytes) {
      return InvalidFree(ptr, "double free, or a pointer into a block rather than its start: no live "
                              "allocation starts at this address inside bucketalloc's memory");
    }
    return InvalidFree(ptr, "the pointer was not allocated by bucketalloc on this device");
  }
  const LiveEntry entry = *found;
  if (size.has_value() && *size != entry.requested) {
    return InvalidFree(ptr, absl::StrCat("size mismatch: allocated with ", entry.requested, " bytes, freed with ",
                                         *size, " bytes"));
  }
  // Streams other than the allocation stream that used the block (RecordStream): its reuse waits for
  // an event on each. The events are recorded now, or later when a capture runs (an event recorded
  // during capture is a graph node and would report completion at once) or recording fails: the
  // block then waits without events (deferred) and is armed on a later free or slow path. A block of
  // an open graph pool waits for the pool's release first.
  absl::InlinedVector<Stream, 2> uses;
  absl::InlinedVector<Event, 2> events;
  if (!stream_uses_.empty()) {
    if (auto it = stream_uses_.find(addr); it != stream_uses_.end()) {
      uses = std::move(it->second);
      stream_uses_.erase(it);
    }
  }
  const bool held = entry.graph != 0 && !graph_pools_[entry.graph].released;
  if (!uses.empty() && !held && (!captures_.empty() || !RecordUseEvents(uses, &events).ok())) {
    ++stats_.num_deferred_frees;
  }
  live_.Erase(found);
  const PoolIndex pool = entry.small ? kSmallPool : kLargePool;
  StatAdd(stats_.requested_bytes, pool, -static_cast<std::int64_t>(entry.requested));
  StatAdd(stats_.allocated_bytes, pool, -static_cast<std::int64_t>(entry.allocated_size()));
  StatAdd(stats_.allocation, pool, -1);
  if (!entry.small && entry.allocated_size() > options_.max_split_size) stats_.oversize_allocations.Add(-1);
  ++clock_;
  Trace(TraceAction::kFreeRequested, addr, entry.requested, entry.stream());
  if (!uses.empty() || held) {
    if (!entry.small) static_cast<Block*>(entry.owner)->state = BlockState::kPendingFree;
    pending_.push_back(PendingFree{addr, entry, std::move(events), std::move(uses)});
  } else {
    if (entry.graph != 0) UntagBlock(entry.graph);
    // Traced before ReturnEntry, which may merge the block (its stream is read from its segment).
    Trace(TraceAction::kFreeCompleted, addr, entry.requested, entry.stream());
    ReturnEntry(entry);
  }
  // Blocks awaiting stream events are polled on every free and every slow path, never on a hit, and
  // never during a capture (CUDA forbids event queries then).
  if (!pending_.empty() && captures_.empty()) RetirePending(RetireMode::kPollUntilBusy);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::RecordStream(void* ptr, Stream stream) {
  MutexLock lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const LiveEntry* found = live_.Find(addr);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: record_stream(", PtrStr(ptr), ") on device ", device_,
                                                   ": no live allocation starts at this address"));
  }
  if (stream == found->stream()) return absl::OkStatus();  // uses on the allocation stream are ordered
  auto& uses = stream_uses_[addr];
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  return absl::OkStatus();
}

void DeviceAllocator::RetirePending(RetireMode mode) {
  std::size_t kept = 0;
  bool stopped = false;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (stopped && kept == i) {  // nothing removed so far: the rest stays where it is
      kept = pending_.size();
      break;
    }
    PendingFree& p = pending_[i];
    bool done = !stopped;
    // A block that waits for something other than its streams' work (its graph pool's release, or
    // events not recorded yet) does not stop the polling of the blocks after it.
    bool waits_for_other = false;
    if (done && HeldByGraph(p)) {
      done = false;
      waits_for_other = true;
    } else if (done && p.events.empty() && !p.uses.empty()) {
      done = captures_.empty() && RecordUseEvents(p.uses, &p.events).ok();  // arm a deferred free
      waits_for_other = !done;
    }
    for (std::size_t k = 0; done && k < p.events.size(); ++k) {
      if (mode == RetireMode::kSynchronize) {
        done = backend_->SynchronizeEvent(p.events[k]).ok();
      } else {
        absl::StatusOr<bool> q = backend_->QueryEvent(p.events[k]);
        done = q.ok() && *q;
      }
    }
    // Later frees are (mostly) later in stream order.
    if (!done && !waits_for_other && mode == RetireMode::kPollUntilBusy) stopped = true;
    if (done) {
      for (Event e : p.events) backend_->DestroyEvent(e);
      if (p.entry.graph != 0) UntagBlock(p.entry.graph);
      Trace(TraceAction::kFreeCompleted, p.ptr, p.entry.requested, p.entry.stream());
      ReturnEntry(p.entry);
    } else {
      if (kept != i) pending_[kept] = std::move(p);
      ++kept;
    }
  }
  pending_.resize(kept);
}

void DeviceAllocator::SyncAndReleaseAll() {
  if (!pending_.empty()) {
    ++stats_.num_sync_all_streams;
    RetirePending(RetireMode::kSynchronize);
  }
  small_.ReleaseEmpty(std::numeric_limits<std::size_t>::max());
  large_.ReleaseFree(std::numeric_limits<std::size_t>::max());
}

absl::Status DeviceAllocator::OutOfMemory(PoolIndex pool, std::size_t size, std::size_t rounded,
                                          std::size_t minimal_segment, const absl::Status& cause) {
  ++stats_.num_ooms;
  OomReport r;
  r.device = device_;
  r.requested = size;
  r.rounded = rounded;
  r.capacity = cap_;
  r.reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  r.allocated = static_cast<std::size_t>(stats_.allocated_bytes[kAllPools].current);
  r.active = static_cast<std::size_t>(stats_.active_bytes[kAllPools].current);
  r.cached = r.reserved - r.active;  // invariant: reserved >= active >= allocated
  r.fragmentation = FragmentationLocked();
  const PoolFragmentation& own = r.fragmentation.pools[pool];
  r.largest_free = static_cast<std::size_t>(own.largest_free);
  if (absl::StatusOr<DeviceMemInfo> info = backend_->GetMemInfo(); info.ok()) r.device_free = info->free_bytes;
  const std::size_t headroom = cap_ > r.reserved ? cap_ - r.reserved : 0;
  const std::size_t pending = r.active - r.allocated;
  const auto pool_cached = static_cast<std::size_t>(stats_.cached_bytes[pool].current);
  const char* pool_name = pool == kSmallPool ? "small" : "large";
  if (r.allocated + rounded > cap_) {
    r.cause = OomCause::kCapacity;
    r.diagnosis = absl::StrFormat(
        "capacity: live allocations (%s) plus this request (%s) exceed the cap (%s); the working set "
        "needs more memory than the device allows (reduce batch, context or concurrency, or raise the cap)",
        FormatBytes(r.allocated), FormatBytes(rounded), FormatBytes(cap_));
  } else if (headroom >= minimal_segment) {
    r.cause = OomCause::kDeviceExhausted;
    r.diagnosis = absl::StrFormat(
        "device exhausted: the cap leaves %s for this request but the device refused %s (device free %s): "
        "memory is used outside this allocator (%s)",
        FormatBytes(headroom), FormatBytes(minimal_segment), FormatBytes(r.device_free), cause.message());
  } else if (pending > 0 && headroom + pool_cached < rounded) {
    r.cause = OomCause::kCacheHeld;
    r.diagnosis = absl::StrFormat(
        "cache held: %s is held by freed blocks awaiting stream events that could not be synchronized "
        "(reserved %s, allocated %s); release did not help",
        FormatBytes(pending), FormatBytes(r.reserved), FormatBytes(r.allocated));
  } else {
    r.cause = OomCause::kFragmentation;
    r.diagnosis = absl::StrFormat(
        "fragmentation: %s is free in total (%s cached in pieces of partly used %s-pool memory, the largest "
        "%s; %s in the other pool; %s under the cap) but no free block fits %s",
        FormatBytes(headroom + r.cached), FormatBytes(pool_cached), pool_name, FormatBytes(r.largest_free),
        FormatBytes(r.cached - pool_cached), FormatBytes(headroom), FormatBytes(rounded));
    if (options_.Stitching() && pool == kLargePool) {
      const std::size_t movable = large_.free_granules() * backend_->Granularity();
      absl::StrAppend(&r.diagnosis, absl::StrFormat(
          "; stitching could move %s of whole free granules, and %s of the free large-pool memory lies in "
          "granules shared with live blocks", FormatBytes(movable), FormatBytes(pool_cached - std::min(pool_cached, movable))));
    }
  }
  Trace(TraceAction::kOom, 0, size, slow_path_stream_, r.device_free);
  std::string message = r.ToString();
  last_oom_ = std::move(r);
  MaybeCheckInvariants();
  return absl::ResourceExhaustedError(message);
}

absl::Status DeviceAllocator::EmptyCache() {
  MutexLock lock(mu_);
  if (!captures_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: empty_cache on device ", device_, " during CUDA graph capture: CUDA forbids the "
        "synchronization and cudaFree it needs; nothing was released. Call it after the capture ends"));
  }
  SyncAndReleaseAll();
  MaybeCheckInvariants();
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: memory fraction ", fraction, " for device ", device_,
                                                   " is invalid; accepted: a number in (0, 1]"));
  }
  MutexLock lock(mu_);
  cap_ = ComputeCap(options_.capacity, fraction, device_total_, backend_->Granularity());
  stats_.capacity_bytes = static_cast<std::int64_t>(cap_);
  return absl::OkStatus();
}

DeviceStats DeviceAllocator::GetStats() const {
  MutexLock lock(mu_);
  return stats_;
}

void DeviceAllocator::ResetPeakStats() {
  MutexLock lock(mu_);
  stats_.ResetPeaks();
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
  small_.Fragmentation(&r.pools[kSmallPool]);
  large_.Fragmentation(&r.pools[kLargePool], &r.tiers);
  for (auto [pool, out] : {std::pair{kSmallPool, &r.pools[kSmallPool]}, std::pair{kLargePool, &r.pools[kLargePool]}}) {
    out->requested = stats_.requested_bytes[pool].current;
    out->allocated = stats_.allocated_bytes[pool].current;
    out->reserved = stats_.reserved_bytes[pool].current;
  }
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) r.all().Merge(r.pools[p]);
  return r;
}

void DeviceAllocator::SetHistory(bool enabled, std::size_t max_entries) {
  std::vector<TraceEntry> ring(enabled ? std::max<std::size_t>(max_entries, 1) : 0);
  MutexLock lock(mu_);
  trace_.swap(ring);
  trace_next_ = 0;
  trace_count_ = 0;
}

std::vector<TraceEntry> DeviceAllocator::AppendSnapshot(std::vector<SegmentSnapshot>* segments) const {
  MutexLock lock(mu_);
  const std::size_t first = segments->size();
  auto add_block = [](SegmentSnapshot& seg, std::uintptr_t address, std::size_t size, std::size_t requested,
                      BlockSnapshotState state) {
    if (state == BlockSnapshotState::kInactive && !seg.blocks.empty() &&
        seg.blocks.back().state == BlockSnapshotState::kInactive) {
      seg.blocks.back().size += size;  // adjacent free slots read as one free range
      return;
    }
    seg.blocks.push_back(BlockSnapshot{address, size, requested, state});
    if (state == BlockSnapshotState::kInactive) return;
    seg.active_size += size;
    seg.requested_size += requested;
    if (state == BlockSnapshotState::kActiveAllocated) seg.allocated_size += size;
  };
  large_.ForEachSegment([&](const Segment& s) {
    // A stitched segment's holes are not memory: each mapped run is a segment of its own.
    SegmentSnapshot* seg = nullptr;
    for (const Block* b = s.first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kUnmapped) {
        seg = nullptr;
        continue;
      }
      if (seg == nullptr) {
        seg = &segments->emplace_back();
        seg->device = device_;
        seg->address = b->ptr;
        seg->stream = reinterpret_cast<std::uintptr_t>(s.stream);
        seg->tier = s.tier;
        seg->expandable = options_.Stitching();
      }
      seg->total_size += b->size;
      const BlockSnapshotState state = b->state == BlockState::kFree        ? BlockSnapshotState::kInactive
                                       : b->state == BlockState::kAllocated ? BlockSnapshotState::kActiveAllocated
                                                                            : BlockSnapshotState::kActivePendingFree;
      add_block(*seg, b->ptr, b->size, state == BlockSnapshotState::kInactive ? 0 : b->requested, state);
    }
  });
  // Small slots: which are taken, and by what, is known from the live and pending entries.
  struct Taken {
    std::size_t requested;
    BlockSnapshotState state;
  };
  absl::flat_hash_map<const Slab*, absl::flat_hash_map<std::uint32_t, Taken>> slots;
  live_.ForEach([&](std::uintptr_t, const LiveEntry& e) {
    if (e.small) slots[static_cast<const Slab*>(e.owner)][e.slot] = {e.requested, BlockSnapshotState::kActiveAllocated};
  });
  for (const PendingFree& p : pending_) {
    if (p.entry.small) {
      slots[static_cast<const Slab*>(p.entry.owner)][p.entry.slot] = {p.entry.requested,
                                                                      BlockSnapshotState::kActivePendingFree};
    }
  }
  small_.ForEachSlab([&](const Slab& slab) {
    SegmentSnapshot& seg = segments->emplace_back();
    seg.device = device_;
    seg.address = slab.base;
    seg.total_size = kSlabBytes;
    seg.stream = reinterpret_cast<std::uintptr_t>(slab.stream);
    seg.small = true;
    const auto taken = slots.find(&slab);
    for (std::uint32_t i = 0; i < slab.capacity; ++i) {
      const Taken* t = nullptr;
      if (taken != slots.end()) {
        if (auto it = taken->second.find(i); it != taken->second.end()) t = &it->second;
      }
      if (t != nullptr) {
        add_block(seg, slab.SlotAddress(i), slab.slot_size, t->requested, t->state);
      } else {
        add_block(seg, slab.SlotAddress(i), slab.slot_size, 0, BlockSnapshotState::kInactive);
      }
    }
    const std::size_t used = std::size_t{slab.capacity} * slab.slot_size;
    if (used < kSlabBytes) add_block(seg, slab.base + used, kSlabBytes - used, 0, BlockSnapshotState::kInactive);
  });
  std::sort(segments->begin() + static_cast<std::ptrdiff_t>(first), segments->end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  std::vector<TraceEntry> history;
  history.reserve(trace_count_);
  const std::size_t start = (trace_next_ + trace_.size() - trace_count_) % std::max<std::size_t>(trace_.size(), 1);
  for (std::size_t i = 0; i < trace_count_; ++i) history.push_back(trace_[(start + i) % trace_.size()]);
  return history;
}

bool DeviceAllocator::InReservedMemory(void* ptr) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  auto seg = registry_.upper_bound(addr);
  return seg != registry_.begin() && addr < std::prev(seg)->first + std::prev(seg)->second.bytes;
}

absl::StatusOr<std::pair<void*, std::size_t>> DeviceAllocator::BaseAllocation(void* ptr) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(mu_);
  if (!live_.contains(addr)) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: base allocation of ", PtrStr(ptr), " on device ",
                                                   device_, ": no live allocation starts at this address"));
  }
  auto seg = std::prev(registry_.upper_bound(addr));  // invariant: a live block lies in one registered range
  return std::pair<void*, std::size_t>{reinterpret_cast<void*>(seg->first), seg->second.bytes};
}

void DeviceAllocator::MaybeCheckInvariants() const {
#ifdef NDEBUG
  if (!options_.debug_check_invariants) return;
#endif
  absl::Status s = CheckInvariantsLocked();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    BA_CHECK(false, "bucketalloc invariant violated (debug_check_invariants)");
  }
}

absl::Status DeviceAllocator::CheckInvariants() const {
  MutexLock lock(mu_);
  return CheckInvariantsLocked();
}

absl::Status DeviceAllocator::CheckInvariantsLocked() const {
  auto fail = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("bucketalloc invariant violated on device ", device_, ": ", what));
  };
  // Stat gauges are self-consistent.
#define BUCKETALLOC_CHECK_GAUGE(name, doc)                                                         \
  for (int p = 0; p < kNumPoolIndices; ++p) {                                                      \
    const Stat& st = stats_.name[p];                                                               \
    if (st.current != st.allocated - st.freed || st.peak < st.current || st.current < 0)           \
      return fail(absl::StrCat(#name, "[", p, "] is inconsistent: current ", st.current, ", peak ", \
                               st.peak, ", allocated ", st.allocated, ", freed ", st.freed));      \
  }                                                                                                \
  if (stats_.name[kAllPools].current !=                                                            \
      stats_.name[kSmallPool].current + stats_.name[kLargePool].current)                          \
    return fail(absl::StrCat(#name, ".all is not the sum of the pools"));
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_CHECK_GAUGE)
#undef BUCKETALLOC_CHECK_GAUGE
#define BUCKETALLOC_CHECK_DEVICE_GAUGE(name, doc)                                         \
  if (stats_.name.current != stats_.name.allocated - stats_.name.freed ||                 \
      stats_.name.peak < stats_.name.current || stats_.name.current < 0)                  \
    return fail(absl::StrCat(#name, " is inconsistent: current ", stats_.name.current));
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_CHECK_DEVICE_GAUGE)
#undef BUCKETALLOC_CHECK_DEVICE_GAUGE

  // Live and pending blocks: sums per pool, no overlap, each inside one registered segment.
  std::int64_t requested[kNumPoolIndices] = {}, allocated[kNumPoolIndices] = {}, count[kNumPoolIndices] = {};
  std::int64_t active_bytes[kNumPoolIndices] = {}, active_count[kNumPoolIndices] = {};
  std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
  ranges.reserve(live_.size() + pending_.size());
  auto visit = [&](std::uintptr_t ptr, const LiveEntry& e, bool live) -> absl::Status {
    const int pool = e.small ? kSmallPool : kLargePool;
    const std::size_t size = e.allocated_size();
    if (live) {
      requested[pool] += static_cast<std::int64_t>(e.requested);
      allocated[pool] += static_cast<std::int64_t>(size);
      count[pool] += 1;
    }
    active_bytes[pool] += static_cast<std::int64_t>(size);
    active_count[pool] += 1;
    if (!e.small) {
      const Block* b = static_cast<const Block*>(e.owner);
      if (b->ptr != ptr) return fail("a live entry's block starts elsewhere");
      if (b->state != (live ? BlockState::kAllocated : BlockState::kPendingFree)) {
        return fail(absl::StrCat("block ", absl::Hex(ptr), " has the wrong state"));
      }
      if (e.requested > size) return fail("a block is smaller than its request");
    }
    ranges.emplace_back(ptr, size);
    return absl::OkStatus();
  };
  absl::Status live_status;
  live_.ForEach([&](std::uintptr_t ptr, const LiveEntry& e) {
    if (live_status.ok()) live_status = visit(ptr, e, true);
  });
  if (!live_status.ok()) return live_status;
  for (const PendingFree& p : pending_) {
    if (absl::Status s = visit(p.ptr, p.entry, false); !s.ok()) return s;
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto [ptr, size] = ranges[i];
    if (i + 1 < ranges.size() && ptr + size > ranges[i + 1].first) {
      return fail(absl::StrCat("live blocks overlap at ", absl::Hex(ptr), " and ", absl::Hex(ranges[i + 1].first)));
    }
    auto seg = registry_.upper_bound(ptr);
    if (seg == registry_.begin()) return fail(absl::StrCat("block ", absl::Hex(ptr), " lies in no segment"));
    --seg;
    if (ptr + size > seg->first + seg->second.bytes) {
      return fail(absl::StrCat("block ", absl::Hex(ptr), " is not inside one segment"));
    }
  }
  std::int64_t reserved[kNumPoolIndices] = {}, segments[kNumPoolIndices] = {};
  std::int64_t oversize_segments = 0;
  std::uintptr_t end = 0;
  std::size_t backend_allocs = 0, granules = 0;
  for (const auto& [base, info] : registry_) {
    if (base < end) return fail("registered segments overlap");
    end = base + info.bytes;
    reserved[info.pool] += static_cast<std::int64_t>(info.vmm ? info.mapped : info.bytes);
    segments[info.pool] += 1;
    oversize_segments += info.pool == kLargePool && info.bytes > options_.max_split_size;
    backend_allocs += !info.vmm;
    granules += info.mapped;
  }
  // Spare granules are reserved too.
  reserved[kLargePool] += static_cast<std::int64_t>(large_.spare_bytes());
  granules += large_.spare_bytes();
  absl::Status mapped_status;
  large_.ForEachSegment([&](const Segment& s) {
    auto it = registry_.find(s.base);
    if (mapped_status.ok() && (it == registry_.end() || it->second.bytes != s.size ||
                               (it->second.vmm ? it->second.mapped : it->second.bytes) != large_.MappedBytes(s))) {
      mapped_status = fail(absl::StrCat("segment ", absl::Hex(s.base), " does not match its registered range"));
    }
  });
  if (!mapped_status.ok()) return mapped_status;
  std::size_t vmm_ranges = 0, large_segments = 0;
  for (const auto& [base, info] : registry_) vmm_ranges += info.vmm;
  large_.ForEachSegment([&](const Segment&) { ++large_segments; });
  if (vmm_ranges != (options_.Stitching() ? large_segments : 0)) {
    return fail(absl::StrCat(vmm_ranges, " address ranges are registered for ", large_segments,
                             " large-pool segments"));
  }
  std::int64_t oversize_allocations = 0;
  live_.ForEach([&](std::uintptr_t, const LiveEntry& e) {
    oversize_allocations += !e.small && e.allocated_size() > options_.max_split_size;
  });
  if (stats_.oversize_segments.current != oversize_segments ||
      stats_.oversize_allocations.current != oversize_allocations) {
    return fail("oversize_segments or oversize_allocations does not match the blocks");
  }
  if (absl::Status s = live_.CheckInvariants(); !s.ok()) return fail(s.message());
  if (const SimBackend* sim = AsSim(backend_.get()); sim != nullptr) {
    std::size_t registered = granules;
    for (const auto& [base, info] : registry_) registered += info.vmm ? 0 : info.bytes;
    if (sim->used_bytes() != registered) {
      return fail(absl::StrCat("the sim device has ", sim->used_bytes(), " bytes allocated but ", registered,
                               " are registered"));
    }
  }
  const BackendCounters bc = backend_->counters();
  if (bc.allocs - bc.frees != static_cast<std::int64_t>(backend_allocs)) {
    return fail(absl::StrCat("the backend holds ", bc.allocs - bc.frees, " allocations but ", backend_allocs,
                             " segments are registered"));
  }
  if (bc.physical_creates - bc.physical_releases !=
      static_cast<std::int64_t>(granules / backend_->Granularity())) {
    return fail(absl::StrCat("the backend holds ", bc.physical_creates - bc.physical_releases,
                             " physical granules but ", granules / backend_->Granularity(),
                             " are mapped or spare"));
  }
  for (int p : {kSmallPool, kLargePool}) {
    auto check = [&](const char* name, const StatArray& stat, std::int64_t want) -> absl::Status {
      if (stat[p].current != want) {
        return fail(absl::StrCat(name, "[", p, "] is ", stat[p].current, " but the blocks sum to ", want));
      }
      return absl::OkStatus();
    };
    for (absl::Status s : {check("requested_bytes", stats_.requested_bytes, requested[p]),
                           check("allocated_bytes", stats_.allocated_bytes, allocated[p]),
                           check("allocation", stats_.allocation, count[p]),
                           check("active_bytes", stats_.active_bytes, active_bytes[p]),
                           check("active", stats_.active, active_count[p]),
                           check("reserved_bytes", stats_.reserved_bytes, reserved[p]),
                           check("segment", stats_.segment, segments[p]),
                           check("cached_bytes", stats_.cached_bytes, reserved[p] - active_bytes[p])}) {
      if (!s.ok()) return s;
    }
  }
  // inactive_split from the pools' pieces.
  std::int64_t split_bytes[kNumPoolIndices] = {}, split_count[kNumPoolIndices] = {};
  small_.ForEachSlab([&](const Slab& s) {
    if (s.live == 0) return;
    split_bytes[kSmallPool] += static_cast<std::int64_t>(s.free_slots()) * s.slot_size;
    split_count[kSmallPool] += s.free_slots();
  });
  large_.ForEachSegment([&](const Segment& s) {
    if (s.active_blocks == 0) return;
    split_bytes[kLargePool] += static_cast<std::int64_t>(s.free_bytes);
    split_count[kLargePool] += s.free_blocks;
  });
  for (int p : {kSmallPool, kLargePool}) {
    if (stats_.inactive_split_bytes[p].current != split_bytes[p] ||
        stats_.inactive_split[p].current != split_count[p]) {
      return fail(absl::StrCat("inactive_split[", p, "] does not match the free pieces of partly used memory"));
    }
  }
  if (absl::Status s = small_.CheckInvariants(active_count[kSmallPool]); !s.ok()) return s;
  if (absl::Status s = large_.CheckInvariants(active_count[kLargePool]); !s.ok()) return s;
  for (const auto& [stream, pools] : streams_) {
    if (absl::Status s = CheckStreamFreeLists(pools->large, large_.num_tiers()); !s.ok()) return s;
  }
  for (const auto& [ptr, uses] : stream_uses_) {
    if (!live_.contains(ptr)) return fail("a recorded stream use belongs to no live allocation");
  }
  std::vector<std::int64_t> graph_blocks(graph_pools_.size());
  live_.ForEach([&](std::uintptr_t, const LiveEntry& e) { ++graph_blocks[e.graph]; });
  for (const PendingFree& p : pending_) {
    if (p.uses.empty() && p.entry.graph == 0) return fail("a pending free waits for nothing");
    if (!p.events.empty() && p.events.size() != p.uses.size()) return fail("a pending free lacks an event per stream");
    ++graph_blocks[p.entry.graph];
  }
  for (std::size_t tag = 1; tag < graph_pools_.size(); ++tag) {
    const GraphPool& g = graph_pools_[tag];
    if (g.blocks != graph_blocks[tag]) {
      return fail(absl::StrCat("graph pool ", tag, " counts ", g.blocks, " blocks but ", graph_blocks[tag], " carry it"));
    }
    if (g.captures < 0 || (g.released && g.captures != 0)) return fail("a released graph pool is capturing");
  }
  std::vector<int> running(graph_pools_.size());
  for (const ActiveCapture& c : captures_) {
    if (c.tag == 0 || c.tag >= graph_pools_.size()) return fail("a capture has no graph pool");
    ++running[c.tag];
  }
  for (std::size_t tag = 1; tag < graph_pools_.size(); ++tag) {
    if (running[tag] != graph_pools_[tag].captures) return fail("a graph pool's capture count is wrong");
  }
  if (trace_count_ > trace_.size() || (!trace_.empty() && trace_next_ >= trace_.size())) {
    return fail(absl::StrCat("the history ring holds ", trace_count_, " entries at slot ", trace_next_, " of ",
                             trace_.size()));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
