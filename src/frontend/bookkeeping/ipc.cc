// src/frontend/bookkeeping/ipc.cc — CUDA IPC on one device: sharing a block (ShareRange), and opening and
// closing memory other processes shared (IpcImports) (frontend/bookkeeping/ipc.h).
#include "frontend/bookkeeping/ipc.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "backend/registry.h"

namespace bucketalloc::internal {
namespace {

// A descriptor of this process made from descriptor `fd` of process `pidfd` (pidfd_getfd, Linux
// 5.6), or FailedPrecondition naming why not.
absl::StatusOr<int> FdOfProcess(int pidfd, int pid, int fd) {
  const long local = syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  if (local >= 0) return static_cast<int>(local);
  const int e = errno;
  std::string why = std::strerror(e);
  if (e == ENOSYS) why = "this kernel has no pidfd_getfd (Linux 5.6 or later is needed)";
  if (e == EPERM) {
    why =
        "ptrace rules forbid reading another process's descriptors (kernel.yama.ptrace_scope; the processes must "
        "run as the same user, or the sender must allow it)";
  }
  if (e == EBADF) why = "the sender no longer has that descriptor (it released the memory)";
  return absl::FailedPreconditionError(
      absl::StrCat("bucketalloc: cannot read descriptor ", fd, " of process ", pid, ": ", why));
}

}  // namespace

absl::StatusOr<SharedMemory> ShareRange(
    Backend* backend, const SegmentRegistry::Range& range, std::uintptr_t addr,
    absl::FunctionRef<absl::Status(std::uintptr_t* base, std::vector<PhysicalPiece>* pieces)> pieces_under,
    int device) {
  SharedMemory shared;
  if (!range.virtual_memory) {
    shared.base = range.base;
    shared.bytes = range.bytes;
    shared.offset = addr - range.base;
    return shared;
  }
  // A stitched segment: the physical pieces under the block, each exported by the backend.
  std::vector<PhysicalPiece> pieces;
  if (absl::Status s = pieces_under(&shared.base, &pieces); !s.ok()) return s;
  for (const PhysicalPiece& piece : pieces) {
    absl::StatusOr<int> fd = backend->ExportPhysical(piece.handle);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(), absl::StrCat("bucketalloc: sharing 0x", absl::Hex(addr), " on device ",
                                                           device, ": ", fd.status().message()));
    }
    shared.pieces.push_back(SharedPiece{*fd, piece.bytes});
    shared.bytes += piece.bytes;
  }
  shared.virtual_memory = true;
  shared.offset = addr - shared.base;
  return shared;
}

absl::StatusOr<Backend*> IpcImports::Mapper(int device) {
  if (backend_->SupportsVirtualMemory()) return backend_;
  if (own_mapper_ != nullptr) return own_mapper_.get();
  const BackendEntry* entry = FindBackend(backend_->Name());
  const BackendEntry* mapper =
      entry == nullptr || entry->stitching_backend == nullptr ? nullptr : FindBackend(entry->stitching_backend);
  if (mapper == nullptr || mapper == entry) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: device ", device, "'s backend '", backend_->Name(),
                                                      "' cannot map memory another process shared; accepted: "
                                                      "backend:cuda or backend:vmm on a GPU"));
  }
  absl::StatusOr<std::unique_ptr<Backend>> made = mapper->make(BackendSettings{}, device);
  if (!made.ok()) return made.status();
  own_mapper_ = *std::move(made);
  return own_mapper_.get();
}

absl::StatusOr<std::uintptr_t> IpcImports::Open(int pid, absl::Span<const SharedPiece> pieces, int device) {
  absl::StatusOr<Backend*> mapper = Mapper(device);
  if (!mapper.ok()) return mapper.status();
  Backend* const backend = *mapper;
  const std::size_t granularity = backend->Granularity();
  std::size_t bytes = 0;
  for (const SharedPiece& p : pieces) {
    if (p.bytes == 0 || p.bytes % granularity != 0 || p.bytes > (std::size_t{1} << 48) - bytes) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc: a shared piece of ", p.bytes, " bytes on device ",
                                                     device, "; accepted: positive multiples of the granularity, ",
                                                     granularity, " bytes, 256 TiB in all at most"));
    }
    bytes += p.bytes;
  }
  if (pieces.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketalloc: opening shared memory on device ", device, " with no pieces; accepted: 1 or more"));
  }
  const long pidfd = syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) {
    const int e = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: cannot open process ", pid, " to read the descriptors it shared: ",
        e == ESRCH
            ? "it has exited"
            : (e == ENOSYS ? "this kernel has no pidfd_open (Linux 5.3 or later is needed)" : std::strerror(e))));
  }
  absl::StatusOr<std::uintptr_t> va = backend->ReserveAddressRange(bytes, 0);
  if (!va.ok()) {
    close(static_cast<int>(pidfd));
    return va.status();
  }
  Import import{bytes, {}};
  absl::Status status;
  for (const SharedPiece& p : pieces) {
    absl::StatusOr<int> local = FdOfProcess(static_cast<int>(pidfd), pid, p.fd);
    if (!local.ok()) {
      status = local.status();
      break;
    }
    absl::StatusOr<PhysicalHandle> handle = backend->ImportPhysical(*local);
    close(*local);  // the import holds the memory; the descriptor is no longer needed
    if (!handle.ok()) {
      status = handle.status();
      break;
    }
    import.pieces.push_back(PhysicalPiece{*handle, p.bytes});
  }
  close(static_cast<int>(pidfd));
  std::size_t mapped = 0;
  if (status.ok()) status = backend->MapRun(*va, import.pieces, &mapped);
  if (!status.ok()) {
    std::size_t mapped_bytes = 0;
    for (std::size_t i = 0; i < mapped; ++i) mapped_bytes += import.pieces[i].bytes;
    Undo(*va, bytes, mapped_bytes, import.pieces);
    return status;
  }
  imports_.emplace(*va, std::move(import));
  return *va;
}

void IpcImports::Undo(std::uintptr_t va, std::size_t bytes, std::size_t mapped,
                      const std::vector<PhysicalPiece>& pieces) {
  Backend* const backend = own_mapper_ != nullptr ? own_mapper_.get() : backend_;
  bool range_free = true;
  if (mapped > 0 && !backend->Unmap(va, mapped).ok()) range_free = false;  // keep the range: still mapped
  for (const PhysicalPiece& p : pieces) backend->ReleasePhysical(p.handle).IgnoreError();
  if (range_free) backend->ReleaseAddressRange(va, bytes).IgnoreError();
}

absl::Status IpcImports::Close(std::uintptr_t base, int device) {
  auto it = imports_.find(base);
  if (it == imports_.end()) {
    return absl::NotFoundError(absl::StrCat("bucketalloc: closing shared memory at 0x", absl::Hex(base), " on device ",
                                            device, ": no opening starts at this address"));
  }
  Backend* const backend = own_mapper_ != nullptr ? own_mapper_.get() : backend_;
  if (absl::Status s = backend->Unmap(base, it->second.bytes); !s.ok()) return s;
  Undo(base, it->second.bytes, 0, it->second.pieces);
  imports_.erase(it);
  return absl::OkStatus();
}

void IpcImports::CloseAll(int device) {
  if (imports_.empty()) return;
  // The receiver's kernels may still read them: wait for the device (there is no stream to wait for).
  if (absl::Status s = backend_->SynchronizeDevice(); !s.ok()) {
    std::fprintf(stderr, "bucketalloc: device %d: synchronizing before closing shared memory failed: %s\n", device,
                 std::string(s.message()).c_str());
  }
  while (!imports_.empty()) {
    const std::uintptr_t base = imports_.begin()->first;
    if (absl::Status s = Close(base, device); !s.ok()) {
      std::fprintf(stderr, "bucketalloc: device %d: closing shared memory at 0x%jx failed: %s\n", device,
                   static_cast<std::uintmax_t>(base), std::string(s.message()).c_str());
      imports_.erase(base);  // left mapped: the process is ending its use of the device
    }
  }
}

absl::Status IpcImports::CheckInvariants() const {
  for (const auto& [base, import] : imports_) {
    std::size_t bytes = 0;
    for (const PhysicalPiece& p : import.pieces) {
      if (p.handle == 0 || p.bytes == 0) return absl::InternalError("ipc imports: an empty imported piece");
      bytes += p.bytes;
    }
    if (import.pieces.empty() || bytes != import.bytes) {
      return absl::InternalError(absl::StrCat("ipc imports: the opening at 0x", absl::Hex(base), " maps ", bytes,
                                              " bytes of pieces but holds ", import.bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
