// src/frontend/bookkeeping/pending_frees.h — frees that wait for other streams' work (layer L4).
//
// Owns: the stream uses of live allocations (RecordStream: the streams other than its own that a
// block was used on), and the blocks freed while such uses still hold them, each with one backend
// event per use. A block is reusable once every event has completed. While a capture runs, or when recording an event
// fails, a free is deferred: it waits without events, and is armed (its events recorded) by a later retire. Retiring
// polls oldest first: a free polls until the first block still busy (later frees are mostly later in stream order), a
// slow path polls all, a release waits for each event. Invariants (CheckInvariants): every recorded use belongs to a
// live allocation; every pending free waits for a use; an armed free has one event per use. Thread-safety: none; the
// device lock guards it.
//
// Example:
//   pending.AddUse(ptr, other_stream);                 // RecordStream
//   Uses uses = pending.TakeUses(ptr);                 // at its free
//   pending.Hold(ptr, entry, std::move(events), std::move(uses));
//   pending.Retire(PendingFrees::Mode::kPollAll, /*may_arm=*/true, held, done);
#ifndef BUCKETALLOC_FRONTEND_BOOKKEEPING_PENDING_FREES_H_
#define BUCKETALLOC_FRONTEND_BOOKKEEPING_PENDING_FREES_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "frontend/bookkeeping/pools.h"

namespace bucketalloc::internal {

class PendingFrees {
 public:
  using Uses = absl::InlinedVector<Stream, 2>;
  using Events = absl::InlinedVector<Event, 2>;
  // How Retire waits: kPollAll queries every pending block (the slow path); kPollUntilBusy stops at
  // the first one still in use, so a free costs O(1) backend queries in the common case;
  // kSynchronize waits for each event (release-and-retry, empty_cache).
  enum class Mode { kPollAll, kPollUntilBusy, kSynchronize };

  explicit PendingFrees(Backend* backend) : backend_(backend) {}

  // Remembers that the live allocation at `ptr` was used on `stream` (not its own).
  void AddUse(std::uintptr_t ptr, Stream stream);
  // True when some live allocation has a recorded use (a free must then look for its own).
  bool has_uses() const { return !uses_.empty(); }
  // Takes the uses recorded for `ptr` (empty when none): one branch when no use is recorded.
  Uses TakeUses(std::uintptr_t ptr) {
    if (uses_.empty()) return {};
    return TakeRecordedUses(ptr);
  }
  // Whether any live allocation or deferred free names `stream` as a use.
  bool NamesUse(Stream stream) const;
  // Drops `stream` from every use list (live allocations and deferred frees): its work has been
  // waited for and its handle is about to die (RetireStream).
  void ForgetStream(Stream stream);
  // Records one event per stream of `uses` into `events`; on failure destroys those recorded. The
  // calling thread's per-thread key is recorded on cudaStreamPerThread; another pseudo key (another
  // thread's per-thread stream) cannot be recorded on: the device is synchronized instead.
  absl::Status RecordEvents(absl::Span<const Stream> uses, Events* events);
  // Holds the freed block at `ptr`: it waits for `events` (none yet when deferred) on `uses`.
  void Hold(std::uintptr_t ptr, const LiveEntry& entry, Events events, Uses uses) {
    pending_.push_back(Pending{ptr, entry, std::move(events), std::move(uses)});
  }
  bool empty() const { return pending_.empty(); }
  bool Contains(std::uintptr_t ptr) const;

  // Retires the pending blocks whose events have completed: `done(ptr, entry)` takes each, oldest
  // first. `may_arm` is false while events may not be recorded (a capture runs).
  void Retire(Mode mode, bool may_arm, absl::FunctionRef<void(std::uintptr_t, const LiveEntry&)> done);
  // Destroys the events of the blocks still pending (the device goes away).
  void DestroyEvents();

  std::size_t size() const { return pending_.size(); }
  // Calls f(ptr, entry) for every pending block.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Pending& p : pending_) f(p.ptr, p.entry);
  }
  // `is_live(ptr)`: whether ptr is a live allocation.
  absl::Status CheckInvariants(absl::FunctionRef<bool(std::uintptr_t)> is_live) const;

 private:
  struct Pending {
    std::uintptr_t ptr = 0;
    LiveEntry entry;
    Events events;
    Uses uses;
  };
  Uses TakeRecordedUses(std::uintptr_t ptr);

  Backend* backend_;
  absl::flat_hash_map<std::uintptr_t, Uses> uses_;  // of live allocations
  std::vector<Pending> pending_;                    // oldest first
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_BOOKKEEPING_PENDING_FREES_H_
