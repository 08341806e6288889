// src/frontend/observability/oom_log.h — what a device remembers of its OOMs (layer L4,
// observability).
//
// Owns: `OomLog`, the last OOM report whole (Allocator::LastOom, PyTorch's OOM message) and the
// last DeviceMetrics::kRecentOoms OOMs as events (the metrics' and the timeline's "ooms"), each
// numbered by the device's OOM count.
// Invariants: at most kRecentOoms events, oldest first, their numbers rising; the last report is
// the last event's.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   log.Record(std::move(report), /*seq=*/stats.num_ooms, size);
//   std::optional<OomReport> last = log.last();
#ifndef BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_LOG_H_
#define BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/stats.h"

namespace bucketalloc::internal {

class OomLog {
 public:
  // Remembers `report`, the OOM numbered `seq` (the device's OOM count since it was made) of a
  // request of `size` bytes, stamped with the time now.
  void Record(OomReport report, std::uint64_t seq, std::size_t size) {
    if (recent_.size() == DeviceMetrics::kRecentOoms) recent_.pop_front();
    recent_.push_back(OomEvent{seq, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), size, report.cause,
                               report.at_tenant_cap ? report.tenant : std::string(),
                               report.at_tenant_cap ? report.tenant_cap : 0});
    last_ = std::move(report);
  }
  const std::optional<OomReport>& last() const { return last_; }
  std::vector<OomEvent> recent() const { return {recent_.begin(), recent_.end()}; }

 private:
  std::optional<OomReport> last_;
  std::deque<OomEvent> recent_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_LOG_H_
