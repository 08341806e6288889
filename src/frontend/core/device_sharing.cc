// src/frontend/core/device_sharing.cc — the coordinator's CUDA IPC: a live block shared with
// another process, memory other processes shared mapped here, and which device memory holds a
// pointer (DeviceAllocator's methods; frontend/core/device_allocator.h).
#include "frontend/core/device_allocator.h"

#include "absl/strings/str_cat.h"

namespace bucketalloc::internal {

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
          } else if constexpr (std::is_same_v<PoolType<decltype(pool)>, PackedPool>) {
            return pool.PiecesUnder(h, base, pieces);
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

}  // namespace bucketalloc::internal
