// src/harness/replay/driver_meter.cc — the driver calls of a replay, priced and attributed
// (harness/replay/driver_meter.h).
#include "harness/replay/driver_meter.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"

namespace bucketalloc::harness {

nlohmann::ordered_json DriverTime::ToJson() const {
  return {{"profile", profile},
          {"total_ms", total_ms},
          {"request_path_ms", request_path_ms},
          {"background_ms", background_ms},
          {"warmup_ms", warmup_ms},
          {"steady_ms", steady_ms},
          {"p99_request_us", p99_request_us},
          {"max_request_us", max_request_us},
          {"requests_calling_driver", requests_calling_driver},
          {"synchronizations", synchronizations},
          {"steady_synchronizations", steady_synchronizations}};
}

void DriverMeter::Charge(DriverCall call, std::size_t bytes, bool synchronizes) {
  const double us = costs_.Price(call, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  if (synchronizes) ++totals_.synchronizations;
  if (in_request_ && std::this_thread::get_id() == request_thread_) {
    request_us_ += us;
    ++request_calls_;
    totals_.request_us += us;
  } else {
    totals_.background_us += us;
  }
}

void DriverMeter::BeginRequest() {
  std::lock_guard<std::mutex> lock(mu_);
  in_request_ = true;
  request_thread_ = std::this_thread::get_id();
  request_us_ = 0.0;
  request_calls_ = 0;
}

bool DriverMeter::EndRequest() {
  std::lock_guard<std::mutex> lock(mu_);
  in_request_ = false;
  if (request_calls_ == 0) return false;
  request_costs_.push_back(request_us_);
  return true;
}

void DriverMeter::NoteReserved(std::size_t reserved) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || reserved <= peak_reserved_) return;
  peak_reserved_ = reserved;
  at_peak_ = totals_;
}

void DriverMeter::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

DriverTime DriverMeter::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  DriverTime t;
  t.profile = costs_.profile();
  t.request_path_ms = totals_.request_us / 1000.0;
  t.background_ms = totals_.background_us / 1000.0;
  t.total_ms = t.request_path_ms + t.background_ms;
  t.warmup_ms = (at_peak_.request_us + at_peak_.background_us) / 1000.0;
  t.steady_ms = t.total_ms - t.warmup_ms;
  t.synchronizations = totals_.synchronizations;
  t.steady_synchronizations = totals_.synchronizations - at_peak_.synchronizations;
  t.requests_calling_driver = request_costs_.size();
  if (!request_costs_.empty()) {
    std::vector<double> costs = request_costs_;
    // The nearest rank: the smallest cost at least 99% of the requests do not exceed.
    const std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(costs.size()))) - 1;
    std::nth_element(costs.begin(), costs.begin() + static_cast<std::ptrdiff_t>(rank), costs.end());
    t.p99_request_us = costs[rank];
    t.max_request_us = *std::max_element(request_costs_.begin(), request_costs_.end());
  }
  return t;
}

namespace {

// Forwards every call to `inner_`, and reports the memory calls and synchronizations to the meter
// with their sizes (a release by the size of the handle's create).
class MeteredBackend final : public Backend {
 public:
  MeteredBackend(std::unique_ptr<Backend> inner, DriverMeter* meter) : inner_(std::move(inner)), meter_(meter) {}

  absl::string_view Name() const override { return inner_->Name(); }
  int device() const override { return inner_->device(); }
  std::size_t Granularity() const override { return inner_->Granularity(); }
  absl::StatusOr<void*> Allocate(std::size_t bytes) override {
    meter_->Charge(DriverCall::kMalloc, bytes);
    return inner_->Allocate(bytes);
  }
  absl::Status Free(void* ptr, std::size_t bytes) override {
    meter_->Charge(DriverCall::kFree, bytes, /*synchronizes=*/true);
    return inner_->Free(ptr, bytes);
  }
  absl::StatusOr<DeviceMemInfo> GetMemInfo() override { return inner_->GetMemInfo(); }
  absl::StatusOr<Event> RecordEvent(Stream stream) override { return inner_->RecordEvent(stream); }
  absl::StatusOr<bool> QueryEvent(Event event) override { return inner_->QueryEvent(event); }
  absl::Status SynchronizeEvent(Event event) override {
    meter_->Charge(DriverCall::kSynchronize, 0, /*synchronizes=*/true);
    return inner_->SynchronizeEvent(event);
  }
  void DestroyEvent(Event event) override { inner_->DestroyEvent(event); }
  absl::Status SynchronizeDevice() override {
    meter_->Charge(DriverCall::kSynchronize, 0, /*synchronizes=*/true);
    return inner_->SynchronizeDevice();
  }
  absl::StatusOr<bool> IsCapturing(Stream stream) override { return inner_->IsCapturing(stream); }
  bool SupportsVirtualMemory() const override { return inner_->SupportsVirtualMemory(); }
  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes, std::size_t alignment) override {
    meter_->Charge(DriverCall::kAddressReserve, bytes);
    return inner_->ReserveAddressRange(bytes, alignment);
  }
  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) override {
    meter_->Charge(DriverCall::kAddressFree, bytes);
    return inner_->ReleaseAddressRange(va, bytes);
  }
  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes) override {
    meter_->Charge(DriverCall::kCreate, bytes);
    absl::StatusOr<PhysicalHandle> h = inner_->CreatePhysical(bytes);
    if (h.ok()) handle_bytes_[*h] = bytes;
    return h;
  }
  absl::Status ReleasePhysical(PhysicalHandle handle) override {
    std::size_t bytes = 0;
    if (auto it = handle_bytes_.find(handle); it != handle_bytes_.end()) {
      bytes = it->second;
      handle_bytes_.erase(it);
    }
    meter_->Charge(DriverCall::kRelease, bytes);
    return inner_->ReleasePhysical(handle);
  }
  absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) override {
    meter_->Charge(DriverCall::kMap, bytes);
    meter_->Charge(DriverCall::kSetAccess, bytes);
    return inner_->Map(va, bytes, handle);
  }
  // What the inner backend did, from its counters: each cuMemMap (pieces in order), each access
  // grant (one per run for sim and vmm) over the bytes mapped, and the unmaps of a rollback; a
  // failed run also pays the call that failed (priced as a map: which call it was is not known).
  absl::Status MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) override {
    const BackendCounters before = inner_->counters();
    absl::Status s = inner_->MapRun(va, pieces, mapped);
    const BackendCounters after = inner_->counters();
    const std::size_t maps = std::min(pieces.size(), static_cast<std::size_t>(after.maps - before.maps));
    std::size_t mapped_bytes = 0;
    for (std::size_t i = 0; i < maps; ++i) {
      meter_->Charge(DriverCall::kMap, pieces[i].bytes);
      mapped_bytes += pieces[i].bytes;
    }
    const std::int64_t grants = after.access_grants - before.access_grants;
    for (std::int64_t g = 0; g < grants; ++g) {
      meter_->Charge(DriverCall::kSetAccess, mapped_bytes / static_cast<std::size_t>(grants));
    }
    const std::int64_t unmaps = after.unmaps - before.unmaps;
    for (std::int64_t u = 0; u < unmaps; ++u) {
      meter_->Charge(DriverCall::kUnmap, mapped_bytes / static_cast<std::size_t>(unmaps));
    }
    if (!s.ok() && !absl::IsInvalidArgument(s) && maps < pieces.size()) {
      meter_->Charge(DriverCall::kMap, pieces[maps].bytes);  // refused before the driver: no call
    }
    return s;
  }
  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    meter_->Charge(DriverCall::kUnmap, bytes);
    return inner_->Unmap(va, bytes);
  }
  absl::StatusOr<int> ExportPhysical(PhysicalHandle handle) override { return inner_->ExportPhysical(handle); }
  absl::StatusOr<PhysicalHandle> ImportPhysical(int fd) override { return inner_->ImportPhysical(fd); }
  BackendCounters counters() const override { return inner_->counters(); }
  void PrepareFork() override { inner_->PrepareFork(); }
  void ParentAfterFork() override { inner_->ParentAfterFork(); }
  absl::Status ChildAfterFork() override { return inner_->ChildAfterFork(); }

 private:
  std::unique_ptr<Backend> inner_;
  DriverMeter* meter_;
  absl::flat_hash_map<PhysicalHandle, std::size_t> handle_bytes_;  // under the device's lock, as every call
};

}  // namespace

std::unique_ptr<Backend> MeterBackend(std::unique_ptr<Backend> inner, DriverMeter* meter) {
  return std::make_unique<MeteredBackend>(std::move(inner), meter);
}

}  // namespace bucketalloc::harness
