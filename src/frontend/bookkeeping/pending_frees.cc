// src/frontend/bookkeeping/pending_frees.cc — stream uses and pending frees (frontend/bookkeeping/pending_frees.h).
#include "frontend/bookkeeping/pending_frees.h"

#include <algorithm>
#include <utility>

#include "backend/stream_keys.h"

namespace bucketalloc::internal {

void PendingFrees::AddUse(std::uintptr_t ptr, Stream stream) {
  Uses& uses = uses_[ptr];
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

PendingFrees::Uses PendingFrees::TakeRecordedUses(std::uintptr_t ptr) {
  auto it = uses_.find(ptr);
  if (it == uses_.end()) return {};
  Uses uses = std::move(it->second);
  uses_.erase(it);
  return uses;
}

bool PendingFrees::NamesUse(Stream stream) const {
  auto names = [stream](const PendingFrees::Uses& uses) {
    return std::find(uses.begin(), uses.end(), stream) != uses.end();
  };
  for (const auto& [ptr, uses] : uses_) {
    if (names(uses)) return true;
  }
  for (const Pending& p : pending_) {
    if (p.events.empty() && names(p.uses)) return true;
  }
  return false;
}

void PendingFrees::ForgetStream(Stream stream) {
  auto drop = [stream](PendingFrees::Uses& uses) {
    uses.erase(std::remove(uses.begin(), uses.end(), stream), uses.end());
  };
  for (auto it = uses_.begin(); it != uses_.end();) {
    drop(it->second);
    if (it->second.empty()) {
      uses_.erase(it++);
    } else {
      ++it;
    }
  }
  for (Pending& p : pending_) {
    if (p.events.empty()) drop(p.uses);  // deferred: not armed yet
  }
}

absl::Status PendingFrees::RecordEvents(absl::Span<const Stream> uses, Events* events) {
  for (Stream s : uses) {
    s = StreamOfKey(s);
    if (IsPseudoStream(s)) {
      if (absl::Status sync = backend_->SynchronizeDevice(); !sync.ok()) {
        for (Event done : *events) backend_->DestroyEvent(done);
        events->clear();
        return sync;
      }
      continue;
    }
    absl::StatusOr<Event> e = backend_->RecordEvent(s);
    if (!e.ok()) {
      for (Event done : *events) backend_->DestroyEvent(done);
      events->clear();
      return e.status();
    }
    events->push_back(*e);
  }
  return absl::OkStatus();
}

bool PendingFrees::Contains(std::uintptr_t ptr) const {
  return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.ptr == ptr; });
}

void PendingFrees::Retire(Mode mode, bool may_arm, absl::FunctionRef<void(std::uintptr_t, const LiveEntry&)> done) {
  std::size_t kept = 0;
  bool stopped = false;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (stopped && kept == i) {  // nothing removed so far: the rest stays where it is
      kept = pending_.size();
      break;
    }
    Pending& p = pending_[i];
    bool complete = !stopped;
    // A block that waits for something other than its streams' work (events not recorded yet) does
    // not stop the polling of the blocks after it.
    bool waits_for_other = false;
    if (complete && p.events.empty() && !p.uses.empty()) {
      complete = may_arm && RecordEvents(p.uses, &p.events).ok();  // arm a deferred free
      waits_for_other = !complete;
    }
    for (std::size_t k = 0; complete && k < p.events.size(); ++k) {
      if (mode == Mode::kSynchronize) {
        complete = backend_->SynchronizeEvent(p.events[k]).ok();
      } else {
        absl::StatusOr<bool> q = backend_->QueryEvent(p.events[k]);
        complete = q.ok() && *q;
      }
    }
    // Later frees are (mostly) later in stream order.
    if (!complete && !waits_for_other && mode == Mode::kPollUntilBusy) stopped = true;
    if (complete) {
      for (Event e : p.events) backend_->DestroyEvent(e);
      done(p.ptr, p.entry);
    } else {
      if (kept != i) pending_[kept] = std::move(p);
      ++kept;
    }
  }
  pending_.resize(kept);
}

void PendingFrees::DestroyEvents() {
  for (Pending& p : pending_) {
    for (Event e : p.events) backend_->DestroyEvent(e);
    p.events.clear();
  }
}

absl::Status PendingFrees::CheckInvariants(absl::FunctionRef<bool(std::uintptr_t)> is_live) const {
  for (const auto& [ptr, uses] : uses_) {
    if (!is_live(ptr)) return absl::InternalError("a recorded stream use belongs to no live allocation");
  }
  for (const Pending& p : pending_) {
    if (p.uses.empty()) return absl::InternalError("a pending free waits for nothing");
    if (!p.events.empty() && p.events.size() != p.uses.size()) {
      return absl::InternalError("a pending free lacks an event per stream");
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
