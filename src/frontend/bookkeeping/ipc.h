// src/frontend/bookkeeping/ipc.h — CUDA IPC on one device (layer L4): what sharing a live block gives another
// process (ShareRange: PyTorch's shareIpcHandle), and the memory other processes shared with this
// one, mapped here (IpcImports: the receiving side of CUDA IPC of virtual-memory segments,
// PyTorch's getIpcDevPtr of an expandable segment's handle).
//
// ShareRange owns nothing: it describes the registered range under a block, or exports the
// physical pieces under it (the backend's POSIX descriptors).
// IpcImports owns: each opening of shared pieces: an address range reserved for it, the physical allocations
// imported from the sender's descriptors (read from that process with pidfd_getfd, as PyTorch
// reads them), mapped side by side from the range's start with access for the device and its
// peers; and their release at Close (a device synchronization, the unmap, the handles, the range).
// Nothing here counts as reserved memory or goes through the cap: the memory is the sender's.
// Invariants (CheckInvariants): each opening's pieces add up to its bytes, none is empty.
// Thread-safety: none; the device lock guards it (the backend is used under it).
//
// Example:
//   absl::StatusOr<SharedMemory> shared = ShareRange(backend, *registry.Holding(addr), addr, under, device);
//   absl::StatusOr<std::uintptr_t> base = imports.Open(sender_pid, pieces, device);
//   imports.Close(*base, device);
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_IPC_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_IPC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/sharing.h"
#include "frontend/bookkeeping/segment_registry.h"

namespace bucketalloc::internal {

// What another process needs to map the live block at `addr` in registered `range`: the range
// itself for a plain backend allocation; for a virtual-memory range, the physical pieces under the
// block (`pieces_under(&base, &pieces)`: the pool's, from their first piece's address), each
// exported by `backend` as a POSIX descriptor. The backend's error names the block and device.
absl::StatusOr<SharedMemory> ShareRange(
    Backend* backend, const SegmentRegistry::Range& range, std::uintptr_t addr,
    absl::FunctionRef<absl::Status(std::uintptr_t* base, std::vector<PhysicalPiece>* pieces)> pieces_under, int device);

class IpcImports {
 public:
  explicit IpcImports(Backend* backend) : backend_(backend) {}
  IpcImports(const IpcImports&) = delete;
  IpcImports& operator=(const IpcImports&) = delete;

  // Maps the pieces process `pid` shared (SharedMemory::pieces: its descriptors and their bytes,
  // each a positive multiple of the granularity) side by side in a new range; returns the range's
  // start. InvalidArgument for no pieces or a size that is not whole granules; FailedPrecondition
  // naming why when the sender's descriptors cannot be read (its process is gone, the kernel has no
  // pidfd_getfd, ptrace rules forbid it) or the backend has no virtual memory; the backend's error
  // otherwise. Nothing stays reserved or imported on failure.
  absl::StatusOr<std::uintptr_t> Open(int pid, absl::Span<const SharedPiece> pieces, int device);
  // Unmaps and releases the opening at `base`. The caller has waited for the device (the memory
  // may be in use by queued work) without holding the device lock. NotFound for an address no
  // opening starts at.
  absl::Status Close(std::uintptr_t base, int device);
  // Closes every opening (the device goes away), after a device synchronization; errors are printed.
  void CloseAll(int device);
  bool contains(std::uintptr_t base) const { return imports_.contains(base); }
  std::size_t size() const { return imports_.size(); }
  absl::Status CheckInvariants() const;

 private:
  struct Import {
    std::size_t bytes = 0;
    std::vector<PhysicalPiece> pieces;
  };
  // Releases `pieces` (imported handles) and the range [va, va + bytes); the first `mapped` bytes
  // are mapped.
  void Undo(std::uintptr_t va, std::size_t bytes, std::size_t mapped, const std::vector<PhysicalPiece>& pieces);

  // The backend that imports and maps: the device's, or, when it has no virtual memory (cuda), the
  // virtual-memory backend of its row (vmm), made at the first opening: a receiver opens what an
  // expandable segment shared whatever its own configuration, as PyTorch's does.
  absl::StatusOr<Backend*> Mapper(int device);

  Backend* const backend_;
  std::unique_ptr<Backend> own_mapper_;
  absl::flat_hash_map<std::uintptr_t, Import> imports_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_IPC_H_
