// src/frontend/history.cc — the history ring (frontend/history.h).
#include "frontend/history.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace bucketalloc::internal {

void HistoryRing::Reset(std::size_t capacity) {
  std::vector<TraceEntry> ring(capacity);
  ring_.swap(ring);
  next_ = 0;
  count_ = 0;
}

void HistoryRing::Append(TraceAction action, std::uintptr_t addr, std::size_t size, Stream stream,
                         std::size_t device_free) {
  TraceEntry& e = ring_[next_];
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stream = reinterpret_cast<std::uintptr_t>(stream);
  e.time_us = absl::GetCurrentTimeNanos() / 1000;
  e.device_free = device_free;
  next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
  count_ = std::min(count_ + 1, ring_.size());
}

std::vector<TraceEntry> HistoryRing::Entries() const {
  std::vector<TraceEntry> history;
  history.reserve(count_);
  const std::size_t start = (next_ + ring_.size() - count_) % std::max<std::size_t>(ring_.size(), 1);
  for (std::size_t i = 0; i < count_; ++i) history.push_back(ring_[(start + i) % ring_.size()]);
  return history;
}

absl::Status HistoryRing::CheckInvariants() const {
  if (count_ > ring_.size() || (!ring_.empty() && next_ >= ring_.size())) {
    return absl::InternalError(
        absl::StrCat("the history ring holds ", count_, " entries at slot ", next_, " of ", ring_.size()));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
