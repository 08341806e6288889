// src/harness/replay/replay_allocator.cc — the replay device and the allocator interface's default.
#include "harness/replay/replay_allocator.h"

#include "absl/strings/str_cat.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/testing/sim_backend.h"
#include "bucketalloc/units.h"

namespace bucketalloc::harness {

PoolFragmentation ReplayAllocator::Fragmentation() const {
  PoolFragmentation f;
  f.reserved = static_cast<std::int64_t>(reserved_bytes());
  f.allocated = f.reserved;
  f.requested = f.reserved;
  return f;
}

absl::StatusOr<ReplayDeviceKind> ParseReplayDeviceKind(absl::string_view name) {
  if (name == "sim") return ReplayDeviceKind::kSim;
  if (name == "cuda") return ReplayDeviceKind::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("--device ", name, ": accepted sim or cuda"));
}

absl::string_view ReplayDeviceName(ReplayDeviceKind kind) { return kind == ReplayDeviceKind::kCuda ? "cuda" : "sim"; }

bool ReplayDevice::Refuse(std::size_t bytes, std::int64_t* refusals) {
  if (!enforce_capacity_ || used_ + bytes <= capacity_) return false;
  ++*refusals;
  return true;
}

absl::StatusOr<void*> ReplayDevice::Allocate(std::size_t bytes) {
  if (Refuse(bytes, &refused_allocs_)) {
    return absl::ResourceExhaustedError(absl::StrCat("the replay's capacity of ", capacity_, " bytes is reached (",
                                                     used_, " used, ", bytes, " asked)"));
  }
  absl::StatusOr<void*> p = backend_->Allocate(bytes);
  if (p.ok()) used_ += bytes;
  return p;
}

absl::Status ReplayDevice::Free(void* ptr, std::size_t bytes) {
  absl::Status s = backend_->Free(ptr, bytes);
  if (s.ok()) used_ -= bytes;
  return s;
}

absl::StatusOr<PhysicalHandle> ReplayDevice::CreatePhysical(std::size_t bytes) {
  if (Refuse(bytes, &refused_creates_)) {
    return absl::ResourceExhaustedError(absl::StrCat("the replay's capacity of ", capacity_, " bytes is reached (",
                                                     used_, " used, ", bytes, " asked)"));
  }
  absl::StatusOr<PhysicalHandle> h = backend_->CreatePhysical(bytes);
  if (h.ok()) used_ += bytes;
  return h;
}

absl::Status ReplayDevice::ReleasePhysical(PhysicalHandle handle, std::size_t bytes) {
  absl::Status s = backend_->ReleasePhysical(handle);
  if (s.ok()) used_ -= bytes;
  return s;
}

BackendCounters ReplayDevice::counters() const {
  BackendCounters c = backend_->counters();
  c.failed_allocs += refused_allocs_;
  c.failed_physical_creates += refused_creates_;
  return c;
}

BackendSettings ReplayDeviceSettings(std::size_t capacity, ReplayDeviceKind kind) {
  if (kind != ReplayDeviceKind::kSim) return {};
  return {{"sim_memory", "unbacked"}, {"sim_total_memory", SizeText(capacity)}};
}

absl::Status ReplayDeviceError(const absl::Status& cause, std::size_t capacity, ReplayDeviceKind kind) {
  if (kind == ReplayDeviceKind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat("the replay device (CUDA device 0, capped at ",
                                                      SizeText(capacity), ") cannot be used: ", cause.message(),
                                                      "; accepted: --device cuda with a usable GPU, or --device sim"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the simulated replay device of ", SizeText(capacity), " cannot be made: ", cause.message(),
      "; accepted: a --capacity whose address space this process may reserve (the simulated device reserves "
      "several times its capacity; an address-space limit, ulimit -v, may be lower)"));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeReplayBackend(std::size_t capacity, ReplayDeviceKind kind,
                                                           bool virtual_memory, DriverMeter* meter) {
  absl::StatusOr<std::unique_ptr<Backend>> made;
  if (kind == ReplayDeviceKind::kCuda) {
    made = virtual_memory ? MakeVmmBackend(/*device=*/0) : MakeCudaBackend(/*device=*/0);
  } else {
    SimBackendOptions options;
    options.device = 0;
    options.total_memory = capacity;
    options.memory = SimMemoryMode::kUnbacked;
    absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend(options);
    if (sim.ok()) {
      made = std::unique_ptr<Backend>(std::move(*sim));
    } else {
      made = sim.status();
    }
  }
  if (!made.ok()) return ReplayDeviceError(made.status(), capacity, kind);
  if (meter != nullptr) return MeterBackend(std::move(*made), meter);
  return made;
}

absl::StatusOr<std::unique_ptr<ReplayDevice>> MakeReplayDevice(std::size_t capacity, ReplayDeviceKind kind,
                                                               bool virtual_memory, DriverMeter* meter) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeReplayBackend(capacity, kind, virtual_memory, meter);
  if (!backend.ok()) return backend.status();
  return std::make_unique<ReplayDevice>(std::move(*backend), capacity,
                                        /*enforce_capacity=*/kind != ReplayDeviceKind::kSim);
}

}  // namespace bucketalloc::harness
