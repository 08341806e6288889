// src/frontend/observability/oom_diagnosis.cc — the cause of an OOM, and its report
// (frontend/observability/oom_diagnosis.h).
#include "frontend/observability/oom_diagnosis.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bucketalloc::internal {

OomReport DiagnoseOom(const OomSituation& s) {
  OomReport r;
  static_cast<MemoryFigures&>(r) = s.figures;
  r.largest_free = static_cast<std::size_t>(s.fragmentation.pools[s.pool].largest_free);
  r.device = s.device;
  r.requested = s.requested;
  r.rounded = s.rounded;
  r.capacity = s.capacity;
  r.fragmentation = s.fragmentation;
  r.device_free = s.device_free;
  r.segment = s.segment;
  r.device_total = s.device_total;
  const MemoryFigures& m = s.figures;
  const std::size_t headroom = s.capacity > m.reserved ? s.capacity - m.reserved : 0;
  const std::size_t pending = m.active - m.allocated;
  std::string pool_name = kPoolNames[s.pool].key;  // "small_pool" -> "small-pool"
  std::replace(pool_name.begin(), pool_name.end(), '_', '-');
  if (WorkingSetExceedsCap(m.requested, s.requested, s.capacity)) {
    r.cause = OomCause::kCapacity;
    r.diagnosis = absl::StrFormat(
        "capacity: live allocations (%s requested) plus this request (%s) exceed the cap (%s); the working "
        "set needs more memory than the device allows (reduce batch, context or concurrency, or raise the cap)",
        FormatBytes(m.requested), FormatBytes(s.requested), FormatBytes(s.capacity));
  } else if (headroom >= s.segment) {
    r.cause = OomCause::kDeviceExhausted;
    r.diagnosis = absl::StrFormat(
        "device exhausted: the cap leaves %s for this request but the device refused %s (device free %s): "
        "memory is used outside this allocator (%s)",
        FormatBytes(headroom), FormatBytes(s.segment), FormatBytes(s.device_free), s.failure);
  } else if (pending > 0 && headroom + s.pool_cached < s.rounded) {
    r.cause = OomCause::kCacheHeld;
    r.diagnosis = absl::StrFormat(
        "cache held: %s is held by freed blocks awaiting stream events that could not be synchronized "
        "(reserved %s, allocated %s); release did not help",
        FormatBytes(pending), FormatBytes(m.reserved), FormatBytes(m.allocated));
  } else {
    r.cause = OomCause::kFragmentation;
    r.diagnosis = absl::StrFormat(
        "fragmentation: %s is free in total (%s cached in pieces of partly used %s memory, the largest "
        "%s; %s in the other pool; %s under the cap) but no free block fits %s",
        FormatBytes(headroom + r.cached), FormatBytes(s.pool_cached), pool_name, FormatBytes(r.largest_free),
        FormatBytes(r.cached - s.pool_cached), FormatBytes(headroom), FormatBytes(s.rounded));
    if (m.allocated + s.rounded > s.capacity) {
      absl::StrAppend(&r.diagnosis,
                      absl::StrFormat("; rounding alone exceeds the cap: the live blocks (%s for %s requested) and "
                                      "this request (%s for %s) round up past %s",
                                      FormatBytes(m.allocated), FormatBytes(m.requested), FormatBytes(s.rounded),
                                      FormatBytes(s.requested), FormatBytes(s.capacity)));
    }
    if (s.stitching) {
      absl::StrAppend(
          &r.diagnosis,
          absl::StrFormat("; stitching could move %s of whole free pieces, and %s of the free "
                          "large-pool memory lies in pieces shared with live blocks",
                          FormatBytes(s.movable), FormatBytes(s.pool_cached - std::min(s.pool_cached, s.movable))));
    }
  }
  return r;
}

}  // namespace bucketalloc::internal
