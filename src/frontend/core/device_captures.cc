// src/frontend/core/device_captures.cc — the coordinator's CUDA graph captures and PyTorch's
// private pools (MemPools): a capture's routing and end, a pool's release, use counts, settings,
// use_on_oom and cache (DeviceAllocator's methods; frontend/core/device_allocator.h).
#include "frontend/core/device_allocator.h"

#include "absl/strings/str_cat.h"
#include "backend/stream_keys.h"

namespace bucketalloc::internal {

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
  private_.SetUseOnOom(pool, use_on_oom);
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

}  // namespace bucketalloc::internal
