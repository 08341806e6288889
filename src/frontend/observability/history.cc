// src/frontend/observability/history.cc — the history ring (frontend/observability/history.h).
#include "frontend/observability/history.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace bucketalloc::internal {

absl::Status HistoryRing::Reset(std::size_t capacity) {
  std::vector<TraceEntry>().swap(ring_);
  max_ = 0;
  next_ = 0;
  count_ = 0;
  on_ = hook_.fn != nullptr;
  if (capacity == 0) return absl::OkStatus();
  try {
    ring_.reserve(std::min(capacity, kFirstEntries));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: cannot allocate the history ring's first ",
                                                     std::min(capacity, kFirstEntries), " entries"));
  }
  max_ = capacity;
  on_ = true;
  return absl::OkStatus();
}

bool HistoryRing::Grow() {
  // Called only while next_ == ring_.size(), which implies ring_.size() < max_ (next_ < max_).
  if (ring_.size() == ring_.capacity()) {
    try {
      ring_.reserve(std::min(max_, 2 * ring_.capacity()));
    } catch (const std::bad_alloc&) {
      max_ = ring_.size();  // the ring stops growing here: this is its capacity from now on
      return false;
    }
  }
  ring_.emplace_back();
  return true;
}

void HistoryRing::Append(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream,
                         std::size_t device_free, std::uint16_t pool) {
  TraceEntry event{action,
                   addr,
                   size,
                   reinterpret_cast<std::uintptr_t>(stream),
                   absl::GetCurrentTimeNanos() / 1000,
                   device_free,
                   pool != 0 && pool_id_ ? pool_id_(pool) : GraphPoolId{}};
  if (max_ != 0) {
    if (next_ == ring_.size() && !Grow()) next_ = 0;  // still growing, and it could not: the oldest goes
    ring_[next_] = event;
    next_ = next_ + 1 == max_ ? 0 : next_ + 1;
    count_ = std::min(count_ + 1, ring_.size());
  }
  if (hook_.fn != nullptr) hook_.fn(device_, event, hook_.ctx);
}

std::vector<TraceEntry> HistoryRing::Entries() const {
  std::vector<TraceEntry> history;
  history.reserve(count_);
  const std::size_t start = (next_ + ring_.size() - count_) % std::max<std::size_t>(ring_.size(), 1);
  for (std::size_t i = 0; i < count_; ++i) history.push_back(ring_[(start + i) % ring_.size()]);
  return history;
}

absl::Status HistoryRing::CheckInvariants() const {
  if (count_ > ring_.size() || ring_.size() > max_ || next_ > ring_.size() || (max_ != 0 && next_ >= max_)) {
    return absl::InternalError(absl::StrCat("the history ring holds ", count_, " entries at slot ", next_, " of ",
                                            ring_.size(), " (capacity ", max_, ")"));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
