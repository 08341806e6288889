// src/backend/backend.cc — the defaults of the optional (virtual-memory and its IPC) part of the Backend
// interface.
#include "bucketalloc/backend.h"

#include "absl/strings/str_cat.h"

namespace bucketalloc {
namespace {

absl::Status NoVirtualMemory(const Backend& backend, const char* call) {
  return absl::UnimplementedError(
      absl::StrCat(call, ": backend '", backend.Name(), "' does not support virtual memory"));
}

absl::Status NoVirtualMemoryIpc(const Backend& backend, const char* call) {
  return absl::UnimplementedError(absl::StrCat(call, ": backend '", backend.Name(),
                                               "' does not share virtual memory between processes (only backend "
                                               "'vmm' exports and imports physical allocations)"));
}

}  // namespace

absl::StatusOr<std::uintptr_t> Backend::ReserveAddressRange(std::size_t, std::size_t) {
  return NoVirtualMemory(*this, "ReserveAddressRange");
}
absl::Status Backend::ReleaseAddressRange(std::uintptr_t, std::size_t) {
  return NoVirtualMemory(*this, "ReleaseAddressRange");
}
absl::StatusOr<PhysicalHandle> Backend::CreatePhysical(std::size_t) { return NoVirtualMemory(*this, "CreatePhysical"); }
absl::Status Backend::ReleasePhysical(PhysicalHandle) { return NoVirtualMemory(*this, "ReleasePhysical"); }
absl::Status Backend::Map(std::uintptr_t, std::size_t, PhysicalHandle) { return NoVirtualMemory(*this, "Map"); }
absl::Status Backend::Unmap(std::uintptr_t, std::size_t) { return NoVirtualMemory(*this, "Unmap"); }
absl::StatusOr<int> Backend::ExportPhysical(PhysicalHandle) { return NoVirtualMemoryIpc(*this, "ExportPhysical"); }
absl::StatusOr<PhysicalHandle> Backend::ImportPhysical(int) { return NoVirtualMemoryIpc(*this, "ImportPhysical"); }

absl::Status Backend::MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) {
  for (*mapped = 0; *mapped < pieces.size(); ++*mapped) {
    if (absl::Status s = Map(va, pieces[*mapped].bytes, pieces[*mapped].handle); !s.ok()) return s;
    va += pieces[*mapped].bytes;
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc
