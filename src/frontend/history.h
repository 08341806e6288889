// src/frontend/history.h — the allocation history of one device (layer L4).
//
// Owns: `HistoryRing`, a ring of the last `capacity` TraceEntry events (alloc, free_requested,
// free_completed, segment_alloc/free/map/unmap, oom) in the layout of PyTorch's memory snapshot
// (bucketalloc/snapshot.h). The ring is allocated when recording is turned on, so recording costs
// one predictable branch and one clock read per event and no heap allocation; while it is off,
// Record is one branch.
// Invariants (CheckInvariants): it holds at most its capacity of entries, and the next slot lies
// inside the ring.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   history.Reset(100000);   // on, a ring of 100000 events
//   history.Record(TraceAction::kAlloc, addr, size, stream);
//   std::vector<TraceEntry> oldest_first = history.Entries();
#ifndef BUCKETALLOC_FRONTEND_HISTORY_H_
#define BUCKETALLOC_FRONTEND_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/snapshot.h"

namespace bucketalloc::internal {

class HistoryRing {
 public:
  // Turns recording on with a ring of `capacity` (>= 1) entries, forgetting the old history; or off
  // (capacity 0), freeing the ring.
  void Reset(std::size_t capacity);
  bool enabled() const { return !ring_.empty(); }
  // Appends an event while recording.
  void Record(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream, std::size_t device_free = 0) {
    if (!ring_.empty()) [[unlikely]]
      Append(action, addr, size, stream, device_free);
  }
  // The events held, oldest first.
  std::vector<TraceEntry> Entries() const;
  absl::Status CheckInvariants() const;

 private:
  void Append(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream, std::size_t device_free);

  std::vector<TraceEntry> ring_;  // empty while recording is off
  std::size_t next_ = 0;          // the slot written next
  std::size_t count_ = 0;         // entries held, <= ring_.size()
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_HISTORY_H_
