// src/harness/replay/policy_bucketalloc.cc — the "bucketalloc[:CONF]" replay policy: bucketalloc itself,
// on a device of the replay's capacity (harness/replay/policies.h).
//
// The device and its size come from the replay (--capacity, --device), never from the CONF: the
// option table splits the CONF, and a key that chooses or sizes the device (IsDeviceOption) is
// refused, except backend:vmm, which turns stitching on for the replay's device (on the simulated
// device its virtual memory, on CUDA the vmm backend).
//
// With tenants (tenants:[...] in the CONF), requests are routed by the trace's stream as generate
// serving --tenant-split writes it: stream 2 (its long requests) to the last tenant listed; with
// two or more tenants every other stream to the first, else to the default tenant.
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/units.h"
#include "harness/replay/replay_allocator.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {
namespace {

class BucketallocReplay final : public ReplayAllocator {
 public:
  explicit BucketallocReplay(std::unique_ptr<Allocator> a) : a_(std::move(a)) {
    const std::vector<TenantSpec>& t = a_->options().tenants;
    if (!t.empty()) {
      long_tenant_ = t.back().name;
      other_tenant_ = t.size() >= 2 ? t.front().name : "default";
    }
  }
  void SetTraceStream(std::uint64_t stream) override {
    if (long_tenant_.empty()) return;
    const std::string& tenant = stream == kLongRequestStream ? long_tenant_ : other_tenant_;
    if (&tenant == current_) return;
    current_ = &tenant;
    a_->SetThreadTenant(tenant).IgnoreError();  // a tenant of the allocator's own options
  }
  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) override { return a_->Allocate(size, 0, stream); }
  absl::Status Free(void* ptr, std::size_t size) override { return a_->Free(ptr, 0, size); }
  std::optional<TenantCapOom> LastOomAtTenantCap() const override {
    if (long_tenant_.empty()) return std::nullopt;
    absl::StatusOr<std::optional<OomReport>> r = a_->LastOomReport(0);
    if (!r.ok() || !r->has_value() || !(*r)->at_tenant_cap) return std::nullopt;
    return TenantCapOom{(*r)->tenant, (*r)->tenant_cap};
  }
  std::size_t reserved_bytes() const override { return Reserved().current; }
  std::size_t peak_reserved_bytes() const override { return Reserved().peak; }
  void ResetPeak() override { a_->ResetPeakStats(0).IgnoreError(); }
  BackendCounters backend_counters() const override {
    absl::StatusOr<Backend*> b = a_->backend(0);  // made with the policy (MakeBucketallocPolicy)
    return b.ok() ? (*b)->counters() : BackendCounters{};
  }
  std::uint64_t granules_stitched() const override {
    absl::StatusOr<DeviceStats> stats = a_->GetStats(0);
    return stats.ok() ? static_cast<std::uint64_t>(stats->num_granules_stitched) : 0;
  }
  std::optional<DeviceMetrics> Metrics() const override {
    std::vector<DeviceMetrics> m = a_->Metrics();
    if (m.empty()) return std::nullopt;
    return std::move(m.front());
  }
  PoolFragmentation Fragmentation() const override {
    absl::StatusOr<FragmentationReport> f = a_->GetFragmentation(0);  // device 0 exists, as in Reserved()
    return f.ok() ? f->all() : PoolFragmentation{};
  }
  // Its snapshot's segments: a slab or a cudaMalloc segment is its own unit, a stitched range's
  // mapped run is granule pieces (a tier segment's one piece holds its one block, so counting it by
  // granules gives the same figures). Spare pieces are `other`.
  MemoryBreakdown Breakdown() const override {
    absl::StatusOr<MemorySnapshot> snapshot = a_->Snapshot(0);
    absl::StatusOr<Backend*> device = a_->backend(0);
    if (!snapshot.ok() || !device.ok()) return BreakDown({}, reserved_bytes());
    const std::size_t granule = (*device)->Granularity();
    std::vector<MemorySpan> spans;
    spans.reserve(snapshot->segments.size());
    for (const SegmentSnapshot& seg : snapshot->segments) {
      MemorySpan& span = spans.emplace_back();
      span.base = seg.address;
      span.size = seg.total_size;
      span.small_pool = seg.small;
      span.unit = seg.expandable ? granule : 0;
      span.blocks.reserve(seg.blocks.size());
      for (const BlockSnapshot& b : seg.blocks) {
        span.blocks.push_back({b.address, b.size, b.requested_size, b.state != BlockSnapshotState::kInactive});
      }
    }
    return BreakDown(spans, reserved_bytes());
  }

 private:
  struct Gauge {
    std::size_t current;
    std::size_t peak;
  };
  Gauge Reserved() const {
    absl::StatusOr<DeviceStats> stats = a_->GetStats(0);  // device 0 exists: it was created with the allocator
    if (!stats.ok()) return {0, 0};
    const Stat s = stats->reserved_bytes[kAllPools];
    return {static_cast<std::size_t>(s.current), static_cast<std::size_t>(s.peak)};
  }
  std::unique_ptr<Allocator> a_;
  std::string long_tenant_, other_tenant_;  // empty without tenants
  const std::string* current_ = nullptr;    // the tenant this thread is set to
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeBucketallocPolicy(absl::string_view conf, std::size_t capacity,
                                                                       ReplayDeviceKind kind, DriverMeter* meter) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocator \"bucketalloc", conf.empty() ? "" : ":", conf, "\": ", why));
  };
  absl::StatusOr<std::vector<OptionSetting>> settings = SplitOptions(conf);
  if (!settings.ok()) return bad(settings.status().message());
  bool stitching = false;
  std::vector<std::string> policy;
  for (const OptionSetting& s : *settings) {
    if (s.key == "backend" && s.value == "vmm") {
      stitching = true;
      continue;
    }
    if (IsDeviceOption(s.key)) {
      return bad(absl::StrCat("the harness sets '", s.key,
                              "' from --capacity and --device; accepted in a CONF: backend:vmm (stitching on the "
                              "replay device) and the allocator's policy options (docs/configuration.md)"));
    }
    policy.push_back(absl::StrCat(s.key, ":", s.value));
  }
  // The replay device (the backend and settings MakeReplayDevice uses; the cap on CUDA), then the
  // policy options, parsed as one CONF. Stitching is the vmm backend on CUDA and the simulated
  // device's own virtual memory.
  std::vector<std::string> keys;
  if (kind == ReplayDeviceKind::kCuda) {
    keys = {stitching ? "backend:vmm" : "backend:cuda", absl::StrCat("capacity:", capacity)};
  } else {
    keys = {"backend:sim"};
    for (const auto& [key, value] : ReplayDeviceSettings(capacity, kind)) keys.push_back(absl::StrCat(key, ":", value));
    if (stitching) keys.push_back("expandable_segments:true");
  }
  keys.insert(keys.end(), policy.begin(), policy.end());
  absl::StatusOr<Options> options = ParseOptions(absl::StrJoin(keys, ","));
  if (!options.ok()) return bad(options.status().message());
  // Its device 0 is the replay device's backend (metered when asked), made as the CONF names it.
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeReplayBackend(capacity, kind, stitching, meter);
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::CreateWithBackend(*options, std::move(*backend));
  if (!a.ok()) {
    if (absl::IsInvalidArgument(a.status())) return bad(a.status().message());
    return ReplayDeviceError(a.status(), capacity, kind);
  }
  // The allocator makes its device on first use; made now, a device that cannot be made (an
  // address space the process may not reserve) is this error, not an OOM of every request.
  if (absl::StatusOr<Backend*> device = (*a)->backend(0); !device.ok()) {
    return ReplayDeviceError(device.status(), capacity, kind);
  }
  return std::unique_ptr<ReplayAllocator>(std::make_unique<BucketallocReplay>(std::move(*a)));
}

}  // namespace bucketalloc::harness
