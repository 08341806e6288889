// src/frontend/observability/history.h — the allocation history of one device (layer L4).
//
// Owns: `HistoryRing`, a ring of the last `capacity` TraceEntry events (alloc, free_requested,
// free_completed, segment_alloc/free/map/unmap, oom) in the layout of PyTorch's memory snapshot
// (bucketalloc/snapshot.h). The ring grows with the history, doubling from 1024 entries up to its
// capacity, so a large capacity costs memory only once that many events happened (2^24 entries
// are 768 MiB); recording costs one predictable branch and one clock read per event, and a heap
// allocation only at a doubling (24 in all). If a doubling cannot be allocated, the ring keeps the
// size it has as its capacity (it never throws). While recording is off, Record is one branch.
// Invariants (CheckInvariants): entries held <= ring size <= capacity; the next slot lies inside
// the ring, or just past it while it still grows.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   history.Reset(100000);   // on, a ring of 100000 events
//   history.Record(TraceAction::kAlloc, addr, size, stream);
//   std::vector<TraceEntry> oldest_first = history.Entries();
#ifndef BUCKETALLOC_FRONTEND_OBSERVABILITY_HISTORY_H_
#define BUCKETALLOC_FRONTEND_OBSERVABILITY_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/snapshot.h"

namespace bucketalloc::internal {

class HistoryRing {
 public:
  // Turns recording on with a ring of at most `capacity` (>= 1) entries, forgetting the old
  // history; or off (capacity 0), freeing the ring. ResourceExhausted, with recording off, when
  // even the first 1024 entries cannot be allocated.
  absl::Status Reset(std::size_t capacity);
  bool enabled() const { return max_ != 0; }
  // The hook given every event from now on, whether the ring records or not (fn nullptr: none), as
  // device `device`'s.
  void SetHook(TraceHook hook, int device) {
    hook_ = hook;
    device_ = device;
    on_ = max_ != 0 || hook_.fn != nullptr;
  }
  // How an event's private pool tag (0: the device's own pools) becomes the pool's id.
  void set_pool_ids(std::function<GraphPoolId(std::uint16_t)> pool_id) { pool_id_ = std::move(pool_id); }
  // Appends an event while recording; `pool`: the tag of the private pool it happened in.
  void Record(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream, std::size_t device_free = 0,
              std::uint16_t pool = 0) {
    if (on_) [[unlikely]]
      Append(action, addr, size, stream, device_free, pool);
  }
  // The entries the ring has memory for now (it grows to its capacity as events come).
  std::size_t allocated_entries() const { return ring_.capacity(); }
  // The events held, oldest first.
  std::vector<TraceEntry> Entries() const;
  absl::Status CheckInvariants() const;

 private:
  void Append(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream, std::size_t device_free,
              std::uint16_t pool);

  static constexpr std::size_t kFirstEntries = 1024;
  // Makes room for one more entry at the end of a ring below its capacity: false when the doubling
  // failed (the ring then stops growing at the size it has).
  bool Grow();

  std::vector<TraceEntry> ring_;                       // grows by doubling up to max_ entries
  std::size_t max_ = 0;                                // the capacity; 0 while recording is off
  std::size_t next_ = 0;                               // the slot written next
  std::size_t count_ = 0;                              // entries held, <= ring_.size()
  TraceHook hook_;                                     // called with each event
  bool on_ = false;                                    // max_ != 0 || hook_.fn: Record has something to do
  int device_ = 0;                                     // the device the hook is told
  std::function<GraphPoolId(std::uint16_t)> pool_id_;  // a tag's pool id
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_OBSERVABILITY_HISTORY_H_
