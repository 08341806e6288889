// src/frontend/bookkeeping/address_arena.cc — carving segments' ranges from address reservations
// (frontend/bookkeeping/address_arena.h).
#include "frontend/bookkeeping/address_arena.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "internal/bits.h"
#include "internal/check.h"

namespace bucketalloc::internal {

absl::StatusOr<std::uintptr_t> AddressArena::Carve(std::size_t bytes, std::size_t chunk) {
  BA_DCHECK(bytes > 0 && bytes % granularity_ == 0, "carving a range that is not whole granules");
  // The highest free range that fits, carved from its top: newer segments lie below older ones
  // (as the simulated device's reservations do), which PyTorch's lowest-address tie-break then
  // prefers; on the harness traces this needs less memory than the other order (docs/vmm.md).
  for (auto ch = chunks_.rbegin(); ch != chunks_.rend(); ++ch) {
    Chunk& c = ch->second;
    for (auto it = c.free.rbegin(); it != c.free.rend(); ++it) {
      if (it->second < bytes) continue;
      const std::uintptr_t start = it->first;
      const std::size_t len = it->second;
      if (len > bytes) {
        it->second = len - bytes;
      } else {
        c.free.erase(start);
      }
      c.carved += bytes;
      return start + len - bytes;
    }
  }
  std::size_t size = std::max(bytes, RoundUp(chunk, granularity_));
  absl::StatusOr<std::uintptr_t> va = backend_->ReserveAddressRange(size, granularity_);
  if (!va.ok() && size > bytes) {
    size = bytes;
    va = backend_->ReserveAddressRange(size, granularity_);
  }
  if (!va.ok()) return va.status();
  Chunk& c = chunks_[*va];
  c.bytes = size;
  c.carved = bytes;
  if (size > bytes) c.free.emplace(*va, size - bytes);
  return *va + size - bytes;
}

void AddressArena::Return(std::uintptr_t va, std::size_t bytes) {
  auto chunk = chunks_.upper_bound(va);
  BA_CHECK(chunk != chunks_.begin(), "returning a range of no reservation");
  Chunk& c = std::prev(chunk)->second;
  auto next = c.free.lower_bound(va);
  std::uintptr_t start = va;
  std::size_t len = bytes;
  if (next != c.free.end() && next->first == va + bytes) {
    len += next->second;
    next = c.free.erase(next);
  }
  if (next != c.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == va) {
      start = prev->first;
      len += prev->second;
      c.free.erase(prev);
    }
  }
  c.free.emplace(start, len);
  c.carved -= bytes;
}

bool AddressArena::Trim() {
  bool all = true;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (it->second.carved != 0) {
      ++it;
    } else if (backend_->ReleaseAddressRange(it->first, it->second.bytes).ok()) {
      it = chunks_.erase(it);
    } else {
      all = false;
      ++it;
    }
  }
  return all;
}

absl::Status AddressArena::CheckInvariants() const {
  for (const auto& [base, c] : chunks_) {
    std::uintptr_t end = base;
    std::size_t free = 0;
    for (const auto& [va, len] : c.free) {
      if (va < end || (va == end && va != base) || len == 0 || va + len > base + c.bytes ||
          (va - base) % granularity_ != 0 || len % granularity_ != 0) {
        return absl::InternalError(absl::StrCat("address arena: the free ranges of the reservation at ",
                                                absl::Hex(base), " overlap, touch or leave it"));
      }
      end = va + len;
      free += len;
    }
    if (free + c.carved != c.bytes) {
      return absl::InternalError(absl::StrCat("address arena: the reservation at ", absl::Hex(base), " of ", c.bytes,
                                              " bytes has ", free, " free and ", c.carved, " carved"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
