// bucketalloc/metrics.h — the stats as Prometheus metrics (text exposition format 0.0.4).
//
// Owns: `DeviceMetrics` (one device's stats, fragmentation report and backend call counts, taken
// together under the device's lock) and `MetricsToPrometheus`, the one rendering that the C ABI's
// bucketalloc_metrics_text, the /metrics endpoint (BUCKETALLOC_METRICS_ADDR) and the Python
// collector for prometheus_client serve. Names follow Prometheus's conventions: a `bucketalloc_`
// prefix, base units in the name (`_bytes`, `_ratio`), `_total` for counters, labels `device`,
// `pool` ("all", "small_pool", "large_pool"), `cause`, `call`, `tier`, `state`. docs/operations.md
// lists every metric.
// Layer: L4 (front end). Rendering never touches an allocator: it formats copies.
// Thread-safety: pure functions of their arguments.
//
// Example:
//   std::vector<bucketalloc::DeviceMetrics> m = allocator->Metrics();
//   std::string text = bucketalloc::MetricsToPrometheus(m);   // what GET /metrics returns
#ifndef BUCKETALLOC_METRICS_H_
#define BUCKETALLOC_METRICS_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/stat_types.h"
#include "bucketalloc/stats.h"

namespace bucketalloc {

struct DeviceMetrics {
  int device = 0;
  DeviceStats stats;
  FragmentationReport fragmentation;
  BackendCounters backend_calls;
  // The device's last out-of-memory failures (at most kRecentOoms, oldest first), for the timeline.
  std::vector<OomEvent> recent_ooms;
  static constexpr std::size_t kRecentOoms = 64;
  // With tenants: each tenant's figures (the default tenant first); empty without.
  std::vector<TenantStats> tenants;
};

// The metrics of `devices` (in the order given) in Prometheus's text exposition format: every
// family once, with its HELP and TYPE lines, its samples for every device.
std::string MetricsToPrometheus(absl::Span<const DeviceMetrics> devices);

// The content type of that text, for an HTTP response.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace bucketalloc

#endif  // BUCKETALLOC_METRICS_H_
