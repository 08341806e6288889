// src/frontend/core/allocator.cc — the public Allocator: one DeviceAllocator per device, created on
// first use, and the backend factory.
#include "bucketalloc/allocator.h"

#include <atomic>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "backend/registry.h"
#include "backend/stream_keys.h"
#include "frontend/bookkeeping/tenants.h"
#include "frontend/core/device_allocator.h"
#include "frontend/core/fork_registry.h"
#include "internal/check.h"

namespace bucketalloc {

using internal::DeviceAllocator;

// The device states, and their part in fork(2) (frontend/core/fork_registry.h): creation's lock, then
// every created device's (in device order), then the tenants'.
struct Allocator::Devices final : internal::ForkParticipant {
  Devices(int n, std::shared_ptr<internal::Tenants> t) : ptrs(n), owned(n), tenants(std::move(t)) {
    internal::RegisterForFork(this);
  }
  ~Devices() { internal::UnregisterForFork(this); }
  void PrepareFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    create_mu.lock();
    for (const auto& d : owned) {
      if (d != nullptr) d->PrepareFork();
    }
    tenants->PrepareFork();  // last: a device takes it under its own lock
  }
  void ParentAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    tenants->AfterFork();
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) {
      if (*it != nullptr) (*it)->ParentAfterFork();
    }
    create_mu.unlock();
  }
  void ChildAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    tenants->AfterFork();
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) {
      if (*it != nullptr) (*it)->ChildAfterFork();
    }
    create_mu.unlock();
  }

  std::vector<std::atomic<DeviceAllocator*>> ptrs;  // published once, read without a lock
  std::mutex create_mu;
  std::vector<std::unique_ptr<DeviceAllocator>> owned;
  // The tenants' names, bindings, thread tenants and caps (frontend/bookkeeping/tenants.h), shared by the devices.
  const std::shared_ptr<internal::Tenants> tenants;
  std::unique_ptr<Backend> preset_backend;  // CreateWithBackend: device 0's backend
  // History recording, applied to each device when it is created (guarded by create_mu).
  bool history = false;
  std::size_t history_entries = 0;
  TraceHook trace_hook;  // SetTraceHook's, given to each device when it is created
};

namespace {

// The backend registry's row of the backend that serves the devices (ValidateOptions checked it).
const internal::BackendEntry& DeviceBackendEntry(const Options& o) {
  const internal::BackendEntry* entry = internal::FindBackend(o.DeviceBackend());
  BA_CHECK(entry != nullptr, "validated options name an unregistered backend");
  return *entry;
}

}  // namespace

Allocator::Allocator(const Options& options, int device_count)
    : options_(options),
      devices_(std::make_unique<Devices>(device_count, std::make_shared<internal::Tenants>(options.tenants))) {}

Allocator::~Allocator() = default;

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::Create(const Options& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  const internal::BackendEntry& backend = DeviceBackendEntry(options);
  absl::StatusOr<int> count = backend.device_count(options.backend_settings);
  if (!count.ok()) return count.status();
  if (*count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: backend:", options.backend, " but no device is present"));
  }
  return std::unique_ptr<Allocator>(new Allocator(options, *count));
}

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::CreateWithBackend(const Options& options,
                                                                        std::unique_ptr<Backend> backend) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  if (backend == nullptr) return absl::InvalidArgumentError("bucketalloc: CreateWithBackend needs a backend");
  std::unique_ptr<Allocator> a(new Allocator(options, 1));
  a->devices_->preset_backend = std::move(backend);
  return a;
}

int Allocator::device_count() const { return static_cast<int>(devices_->ptrs.size()); }

// The device state when it already exists (the fast path: one bounds check and one load).
inline DeviceAllocator* Published(const std::vector<std::atomic<DeviceAllocator*>>& ptrs, int device) {
  return static_cast<std::size_t>(device) < ptrs.size() ? ptrs[device].load(std::memory_order_acquire) : nullptr;
}

absl::StatusOr<DeviceAllocator*> Allocator::Device(int device) const {
  if (device < 0 || device >= device_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketalloc: device ", device, " is invalid; accepted: 0 to ", device_count() - 1));
  }
  if (DeviceAllocator* d = Published(devices_->ptrs, device)) return d;
  std::lock_guard<std::mutex> lock(devices_->create_mu);
  DeviceAllocator* d = devices_->ptrs[device].load(std::memory_order_relaxed);
  if (d != nullptr) return d;
  std::unique_ptr<Backend> backend;
  if (devices_->preset_backend != nullptr) {
    backend = std::move(devices_->preset_backend);
  } else {
    absl::StatusOr<std::unique_ptr<Backend>> b = DeviceBackendEntry(options_).make(options_.backend_settings, device);
    if (!b.ok()) return b.status();
    backend = std::move(*b);
  }
  absl::StatusOr<std::unique_ptr<DeviceAllocator>> created =
      DeviceAllocator::Create(options_, std::move(backend), device, devices_->tenants);  // with the caps set so far
  if (!created.ok()) return created.status();
  if (devices_->history) {
    if (absl::Status s = (*created)->SetHistory(true, devices_->history_entries); !s.ok()) return s;
  }
  if (devices_->trace_hook.fn != nullptr) (*created)->SetTraceHook(devices_->trace_hook);
  (*created)->SetLiveElsewhere([devices = devices_.get()](void* ptr, int device) {
    for (std::size_t other = 0; other < devices->ptrs.size(); ++other) {
      DeviceAllocator* o = Published(devices->ptrs, static_cast<int>(other));
      if (static_cast<int>(other) != device && o != nullptr && o->OwnsLive(ptr)) return static_cast<int>(other);
    }
    return -1;
  });
  devices_->owned[device] = std::move(*created);
  d = devices_->owned[device].get();
  devices_->ptrs[device].store(d, std::memory_order_release);
  return d;
}

// The fast paths are a published device and an OK result; the rest is out of line (a first call on
// a device, an error to explain), so that the fast paths keep a small frame.
absl::StatusOr<void*> Allocator::Allocate(std::size_t size, int device, Stream stream) {
  // cudaStreamPerThread goes out of line, so that the fast path stays two tail calls with no frame.
  if (stream == kPerThreadStream) [[unlikely]]
    return AllocateOnNewDevice(size, device, PerThreadKey());
  if (DeviceAllocator* d = Published(devices_->ptrs, device)) [[likely]]
    return d->Allocate(size, stream);
  return AllocateOnNewDevice(size, device, stream);
}

Stream Allocator::PerThreadKey() { return internal::PerThreadKey(); }

absl::StatusOr<void*> Allocator::AllocateOnNewDevice(std::size_t size, int device, Stream stream) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->Allocate(size, stream);
}

absl::StatusOr<void*> Allocator::AllocateAt(int device, GraphPoolId pool, void* addr, std::size_t block_size,
                                            std::size_t requested, Stream stream) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->AllocateAt(pool, addr, block_size, requested, PoolKey(stream));  // cudaStreamPerThread: this thread's
}

absl::Status Allocator::Free(void* ptr, int device, std::optional<std::size_t> size) {
  DeviceAllocator* d = Published(devices_->ptrs, device);
  if (d == nullptr || ptr == nullptr) [[unlikely]]
    return FreeOnNewDevice(ptr, device, size);
  return d->Free(ptr, size);  // a refusal names another device that holds ptr (SetLiveElsewhere)
}

absl::Status Allocator::FreeOnNewDevice(void* ptr, int device, std::optional<std::size_t> size) {
  if (ptr == nullptr) return absl::OkStatus();
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->Free(ptr, size);
}

absl::Status Allocator::RecordStream(void* ptr, int device, Stream stream) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->RecordStream(ptr, PoolKey(stream));  // cudaStreamPerThread: this thread's
}

absl::Status Allocator::RecordStream(void* ptr, Stream stream) {
  absl::StatusOr<int> device = DeviceOf(ptr);
  if (!device.ok()) return device.status();
  return RecordStream(ptr, *device, stream);
}

// The first created device for which `pred(device state)` holds, or -1.
template <typename Pred>
int FirstDevice(const std::vector<std::atomic<DeviceAllocator*>>& ptrs, Pred pred) {
  for (std::size_t device = 0; device < ptrs.size(); ++device) {
    DeviceAllocator* d = ptrs[device].load(std::memory_order_acquire);
    if (d != nullptr && pred(*d)) return static_cast<int>(device);
  }
  return -1;
}

absl::StatusOr<int> Allocator::DeviceOf(void* ptr) const {
  const int device = FirstDevice(devices_->ptrs, [ptr](const DeviceAllocator& d) { return d.OwnsLive(ptr); });
  if (device >= 0) return device;
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: 0x", absl::Hex(reinterpret_cast<std::uintptr_t>(ptr)),
                                                 " is not a live allocation of bucketalloc on any device"));
}

absl::StatusOr<int> Allocator::DeviceHolding(void* ptr) const {
  const int device = FirstDevice(devices_->ptrs, [ptr](const DeviceAllocator& d) { return d.InReservedMemory(ptr); });
  if (device >= 0) return device;
  return absl::NotFoundError(absl::StrCat("bucketalloc: 0x", absl::Hex(reinterpret_cast<std::uintptr_t>(ptr)),
                                          " lies in no memory bucketalloc reserved"));
}

absl::StatusOr<std::pair<void*, std::size_t>> Allocator::BaseAllocation(void* ptr) const {
  absl::StatusOr<int> device = DeviceOf(ptr);
  if (!device.ok()) return device.status();
  return Published(devices_->ptrs, *device)->BaseAllocation(ptr);
}

absl::StatusOr<SharedMemory> Allocator::ShareBlock(void* ptr) {
  absl::StatusOr<int> device = DeviceOf(ptr);
  if (!device.ok()) return device.status();
  return Published(devices_->ptrs, *device)->ShareBlock(ptr);
}

absl::StatusOr<void*> Allocator::OpenShared(int device, int pid, absl::Span<const SharedPiece> pieces) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->OpenShared(pid, pieces);
}

absl::Status Allocator::CloseShared(void* base) {
  const int device = FirstDevice(devices_->ptrs, [base](const DeviceAllocator& d) { return d.HasOpenShared(base); });
  if (device < 0) {
    return absl::NotFoundError(absl::StrCat("bucketalloc: closing shared memory at 0x",
                                            absl::Hex(reinterpret_cast<std::uintptr_t>(base)),
                                            ": no opening of shared memory starts at this address"));
  }
  return Published(devices_->ptrs, device)->CloseShared(base);
}

absl::StatusOr<MemorySnapshot> Allocator::Snapshot(int device) const {
  if (device != -1) {
    if (absl::StatusOr<DeviceAllocator*> d = Device(device); !d.ok()) return d.status();
  }
  MemorySnapshot snapshot;
  snapshot.device_traces.resize(static_cast<std::size_t>(device_count()));
  for (int i = 0; i < device_count(); ++i) {
    DeviceAllocator* d = Published(devices_->ptrs, i);
    if (d == nullptr || (device != -1 && i != device)) continue;
    snapshot.device_traces[static_cast<std::size_t>(i)] = d->AppendSnapshot(&snapshot.segments);
  }
  snapshot.settings = FormatOptions(options_);
  snapshot.max_split_size = options_.max_split_size;
  snapshot.garbage_collection_threshold = options_.garbage_collection_threshold;
  return snapshot;
}

absl::Status Allocator::RecordHistory(bool enabled, std::size_t max_entries) {
  if (enabled && (max_entries == 0 || max_entries > kMaxHistoryEntries)) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: record_history max_entries ", max_entries,
                                                   " is invalid; accepted: 1 to ", kMaxHistoryEntries,
                                                   " entries per device (the ring grows to it as events come)"));
  }
  std::lock_guard<std::mutex> lock(devices_->create_mu);
  devices_->history = enabled;
  devices_->history_entries = max_entries;
  for (int device = 0; device < device_count(); ++device) {
    DeviceAllocator* d = Published(devices_->ptrs, device);
    if (d == nullptr) continue;
    if (absl::Status s = d->SetHistory(enabled, max_entries); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Allocator::SetTraceHook(TraceHook hook) {
  std::lock_guard<std::mutex> lock(devices_->create_mu);
  devices_->trace_hook = hook;
  for (int device = 0; device < device_count(); ++device) {
    if (DeviceAllocator* d = Published(devices_->ptrs, device)) d->SetTraceHook(hook);
  }
}

absl::Status Allocator::ResetAccumulatedStats(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->ResetAccumulatedStats();
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> Allocator::CacheInfo(int device, bool with_headroom) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->CacheInfo(with_headroom);
}

absl::StatusOr<double> Allocator::MemoryFraction(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->memory_fraction();
}

absl::Status Allocator::IncrefPool(int device, GraphPoolId pool) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->IncrefPool(pool);
}

absl::Status Allocator::SetUseOnOom(int device, GraphPoolId pool, bool use_on_oom) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->SetUseOnOom(pool, use_on_oom);
  return absl::OkStatus();
}

absl::Status Allocator::ConfigurePool(int device, GraphPoolId pool, PrivatePoolSettings settings) {
  return UpdatePoolSettings(device, pool, [&](PrivatePoolSettings& s) { s = std::move(settings); });
}

absl::Status Allocator::UpdatePoolSettings(int device, GraphPoolId pool,
                                           absl::FunctionRef<void(PrivatePoolSettings&)> change) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->ConfigurePool(pool, change);
}

absl::StatusOr<int> Allocator::PoolUseCount(int device, GraphPoolId pool) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->PoolUseCount(pool);
}

absl::Status Allocator::EmptyPoolCache(int device, GraphPoolId pool) {
  if (device == -1) {  // every device created so far (none is created by asking)
    absl::Status status;
    for (int i = 0; i < device_count(); ++i) {
      if (DeviceAllocator* d = Published(devices_->ptrs, i)) status.Update(d->EmptyPoolCache(pool));
    }
    return status;
  }
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->EmptyPoolCache(pool);
}

absl::Status Allocator::BindStream(Stream stream, absl::string_view tenant) {
  absl::StatusOr<int> index = devices_->tenants->Index(tenant);
  if (!index.ok()) return index.status();
  devices_->tenants->Bind(PoolKey(stream), *index);
  return absl::OkStatus();
}

absl::Status Allocator::SetThreadTenant(absl::string_view tenant) {
  absl::StatusOr<int> index = devices_->tenants->Index(tenant);
  if (!index.ok()) return index.status();
  devices_->tenants->SetThreadTenant(*index);
  return absl::OkStatus();
}

std::string Allocator::ThreadTenant() const { return devices_->tenants->Name(devices_->tenants->ThreadTenant()); }

absl::Status Allocator::SetTenantCap(absl::string_view tenant, std::size_t cap) {
  absl::StatusOr<int> index = devices_->tenants->Index(tenant);
  if (!index.ok()) return index.status();
  std::lock_guard<std::mutex> lock(devices_->create_mu);  // a device created meanwhile starts with the new cap
  if (absl::Status s = devices_->tenants->SetCap(*index, cap); !s.ok()) return s;
  absl::Status first;  // every device is asked; the first refusal is reported
  for (int device = 0; device < device_count(); ++device) {
    DeviceAllocator* d = Published(devices_->ptrs, device);
    if (d == nullptr) continue;
    if (absl::Status s = d->SetTenantCap(*index, cap); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::StatusOr<std::vector<TenantStats>> Allocator::GetTenantStats(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetTenantStats();
}

absl::Status Allocator::EmptyCache() {
  absl::Status first;  // every device is emptied; the first failure is reported
  for (int device = 0; device < device_count(); ++device) {
    DeviceAllocator* d = Published(devices_->ptrs, device);
    if (d == nullptr) continue;
    if (absl::Status s = d->EmptyCache(); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status Allocator::RetireStream(Stream stream) {
  devices_->tenants->Forget(stream);  // a new stream with this handle is bound to no tenant
  absl::Status first;                 // every device is asked; the first failure is reported
  for (int device = 0; device < device_count(); ++device) {
    DeviceAllocator* d = Published(devices_->ptrs, device);
    if (d == nullptr) continue;
    if (absl::Status s = d->RetireStream(stream); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status Allocator::BeginCapture(int device, GraphPoolId pool, CaptureFilter filter) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->BeginCapture(pool, std::move(filter));
}

absl::Status Allocator::EndCapture(int device, GraphPoolId pool) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->EndCapture(pool);
}

absl::Status Allocator::MarkCapture(int device, bool begin) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->MarkCapture(begin);
  return absl::OkStatus();
}

absl::Status Allocator::ReleasePool(int device, GraphPoolId pool) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->ReleasePool(pool);
}

absl::StatusOr<std::size_t> Allocator::Prefetch(int device, std::size_t spare_target, std::size_t max_create) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->Prefetch(spare_target, max_create);
}

absl::Status Allocator::SetMemoryFraction(double fraction, int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->SetMemoryFraction(fraction);
}

absl::StatusOr<DeviceStats> Allocator::GetStats(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetStats();
}

absl::Status Allocator::ResetPeakStats(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->ResetPeakStats();
  return absl::OkStatus();
}

absl::StatusOr<FragmentationReport> Allocator::GetFragmentation(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetFragmentation();
}

std::vector<DeviceMetrics> Allocator::Metrics() const {
  std::vector<DeviceMetrics> metrics;
  for (int i = 0; i < device_count(); ++i) {
    if (DeviceAllocator* d = Published(devices_->ptrs, i)) metrics.push_back(d->GetMetrics());
  }
  return metrics;
}

absl::StatusOr<std::string> Allocator::Summary(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return absl::StrCat(StatsSummary((*d)->GetStats(), device), FragmentationToTable((*d)->GetFragmentation()));
}

absl::StatusOr<std::optional<OomReport>> Allocator::LastOomReport(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->LastOom();
}

absl::Status Allocator::CheckInvariants(int device) const {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->CheckInvariants();
}

absl::StatusOr<Backend*> Allocator::backend(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->backend();
}

int CudaHeadersVersion() { return internal::CudaHeadersVersion(); }

absl::StatusOr<int> CudaDriverVersion() { return internal::CudaDriverVersion(); }

}  // namespace bucketalloc
