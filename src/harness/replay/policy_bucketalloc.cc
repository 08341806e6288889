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
//
// reserve_ahead_mb:N (the harness's key, with stitching; not a BUCKETALLOC_CONF key): spare
// physical memory kept ahead of need, topped up to N MiB with Allocator::Prefetch in the time
// between the trace's events, as many granules as that time pays for at the cost profile's price of
// a create (its Time column gives the gaps): the work of a host's loop between steps, or of a thread
// of the allocator's own that creates without holding the device's lock, off every request's path.
// A grow then maps spares instead of creating.
#include <cmath>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/units.h"
#include "harness/replay/driver_meter.h"
#include "harness/replay/policies.h"
#include "harness/replay/replay_allocator.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {
namespace {

// The most reserve_ahead_mb may ask: the simulated device's largest capacity.
constexpr std::size_t kMaxReserveAheadBytes = kMaxSimReplayCapacity;

class BucketallocReplay final : public ReplayAllocator {
 public:
  // `reserve_ahead` bytes of spares topped up when idle on a device of `capacity` bytes, a create of
  // a granule priced `create_us`.
  BucketallocReplay(std::unique_ptr<Allocator> a, std::size_t capacity, std::size_t reserve_ahead, double create_us)
      : a_(std::move(a)), capacity_(capacity), reserve_ahead_(reserve_ahead), create_us_(create_us) {
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
  bool WorksWhenIdle() const override { return reserve_ahead_ > 0; }
  bool Idle(double seconds) override {
    if (reserve_ahead_ == 0 || !(seconds > 0.0)) return false;
    // Within the reserve of the cap the top-up stops: there requests stitch (moving free granules,
    // no create), and a spare would be given back by the next release-and-retry, then made again.
    if (reserved_bytes() + reserve_ahead_ > capacity_) return false;
    // The granules this gap pays for (all it needs when a create costs nothing).
    const double affordable = create_us_ > 0.0 ? std::floor(seconds * 1e6 / create_us_) : 1e18;
    if (affordable < 1.0) return false;
    const std::size_t granules = affordable >= static_cast<double>(reserve_ahead_ / kReplayGranularity)
                                     ? reserve_ahead_ / kReplayGranularity
                                     : static_cast<std::size_t>(affordable);
    absl::StatusOr<std::size_t> created = a_->Prefetch(0, reserve_ahead_, granules * kReplayGranularity);
    return created.ok() && *created > 0;  // at the cap it makes none: requests stitch then
  }
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
  const std::size_t capacity_;
  const std::size_t reserve_ahead_;  // 0: none
  const double create_us_;
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
  std::size_t reserve_ahead = 0;
  std::vector<std::string> policy;
  for (const OptionSetting& s : *settings) {
    if (s.key == "backend" && s.value == "vmm") {
      stitching = true;
      continue;
    }
    if (s.key == "reserve_ahead_mb") {
      std::uint64_t mb = 0;
      if (!absl::SimpleAtoi(s.value, &mb) || mb == 0 || mb > (kMaxReserveAheadBytes >> 20)) {
        return bad(absl::StrCat("reserve_ahead_mb:", s.value,
                                " is not a size; accepted: a whole number of MiB from 1 to ",
                                kMaxReserveAheadBytes >> 20));
      }
      reserve_ahead = static_cast<std::size_t>(mb) << 20;
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
  if (reserve_ahead > 0 && !options->tenants.empty()) {
    return bad(
        "reserve_ahead_mb keeps spares in the device's own pool, which tenants' pools do not take; accepted "
        "without tenants");
  }
  if (reserve_ahead > 0 && !options->Stitching()) {
    return bad(
        "reserve_ahead_mb keeps spare memory for virtual-memory segments; accepted with backend:vmm (or "
        "expandable_segments:true)");
  }
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
  const double create_us =
      (meter != nullptr ? meter->costs() : CostModel()).Price(DriverCall::kCreate, kReplayGranularity);
  return std::unique_ptr<ReplayAllocator>(
      std::make_unique<BucketallocReplay>(std::move(*a), capacity, reserve_ahead, create_us));
}

}  // namespace bucketalloc::harness
