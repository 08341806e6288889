// src/frontend/bookkeeping/address_arena.h — the device's virtual address space for stitching (layer L4).
//
// Owns: the address reservations (cuMemAddressReserve) a device's virtual-memory segments are
// carved from, and their free ranges. A segment's range is carved from a reservation, not reserved
// on its own: one reservation serves thousands of grows and stitches, as PyTorch's expandable
// segments reserve one range per stream and pool. A carved range lies inside one reservation
// (cuda.h: cuMemMap "This range must be an address reservation previously reserved with
// cuMemAddressReserve"), granule-aligned; free neighbours coalesce, never across reservations.
// Reservations are of `chunk` bytes (the cap), or the request's size when larger; one wholly free
// is given back by Trim (empty_cache, the allocator's end).
// Invariants (CheckInvariants): free ranges lie inside their reservation, are ordered, do not
// touch or overlap, and a reservation's free plus carved bytes are its size.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   AddressArena arena(backend, 2 << 20);
//   absl::StatusOr<std::uintptr_t> va = arena.Carve(20 << 20, 80ull << 30);
//   arena.Return(*va, 20 << 20);
//   arena.Trim();
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_ADDRESS_ARENA_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_ADDRESS_ARENA_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"

namespace bucketalloc::internal {

class AddressArena {
 public:
  AddressArena(Backend* backend, std::size_t granularity) : backend_(backend), granularity_(granularity) {}
  AddressArena(const AddressArena&) = delete;
  AddressArena& operator=(const AddressArena&) = delete;

  // A range of `bytes` (whole granules): the top of the highest free range that fits, or of a new
  // reservation of max(bytes, chunk) when none does (of `bytes` alone when the backend refuses the
  // larger one).
  absl::StatusOr<std::uintptr_t> Carve(std::size_t bytes, std::size_t chunk);
  // Gives back a carved range (nothing may be mapped in it).
  void Return(std::uintptr_t va, std::size_t bytes);
  // Releases every wholly free reservation; returns false when the backend refused one (it stays).
  bool Trim();
  std::size_t reservations() const { return chunks_.size(); }
  absl::Status CheckInvariants() const;

 private:
  struct Chunk {
    std::size_t bytes = 0;
    std::size_t carved = 0;
    absl::btree_map<std::uintptr_t, std::size_t> free;  // address -> bytes, coalesced
  };

  Backend* const backend_;
  const std::size_t granularity_;
  absl::btree_map<std::uintptr_t, Chunk> chunks_;  // by base
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_ADDRESS_ARENA_H_
