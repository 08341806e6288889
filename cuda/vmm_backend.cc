// cuda/vmm_backend.cc — the virtual-memory backend (layer L1): CudaBackend's Allocate, Free and
// events, plus the Reserve/Create/Map family over the driver's VMM API (cuda/driver_api.h);
// MakeVmmBackend() and its registry row.
#include <cuda.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "backend/registry.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_status.h"
#include "cuda/driver_api.h"
#include "internal/bits.h"

namespace bucketalloc {
namespace internal {
namespace {

// The physical memory the vmm backend creates: pinned memory of `device`.
CUmemAllocationProp PinnedDeviceMemory(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// The virtual-memory backend: CudaBackend's Allocate, Free and events, plus the Reserve/Create/Map
// family over the driver's VMM API. Before any driver call it refuses (InvalidArgument, as the sim
// backend does) a size that is not a positive multiple of the granularity and an alignment that is
// neither 0 (the granularity) nor a power of two. Other misuse (an unknown handle, a range that is
// not reserved or is already mapped, an unmap of nothing) is left to the driver, whose error is
// mapped like any other. Unlike the sim backend, the driver accepts two things the allocator never
// does: ReleasePhysical of a granule that is still mapped (its memory goes with the last mapping)
// and a Map of fewer bytes than the granule (its prefix is mapped). Unmap is one cuMemUnmap, which
// takes a range made of whole mappings and refuses one that cuts a mapping.
class VmmBackend final : public CudaBackend {
 public:
  VmmBackend(int device, const DriverApi& driver, std::size_t granularity)
      : CudaBackend(device), driver_(driver), granularity_(granularity) {}

  absl::string_view Name() const override { return "vmm"; }
  std::size_t Granularity() const override { return granularity_; }
  bool SupportsVirtualMemory() const override { return true; }

  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes, std::size_t alignment) override {
    const std::string call = absl::StrCat("cuMemAddressReserve(", bytes, " bytes, alignment ", alignment, ")");
    if (!IsGranuleMultiple(bytes) || (alignment != 0 && !internal::IsPowerOfTwo(alignment))) {
      return Refuse(call, "a positive multiple of the granularity and an alignment of 0 or a power of two");
    }
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemAddressReserve"); !status.ok()) return status;
    CUdeviceptr va = 0;
    if (CUresult error = driver_.MemAddressReserve(&va, bytes, alignment, /*addr=*/0, /*flags=*/0);
        error != CUDA_SUCCESS) {
      return CuError(call, error);
    }
    return static_cast<std::uintptr_t>(va);
  }

  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemAddressFree"); !status.ok()) return status;
    if (CUresult error = driver_.MemAddressFree(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemAddressFree(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes) override {
    const std::string call = absl::StrCat("cuMemCreate(", bytes, " bytes, pinned on device ", device(), ")");
    if (!IsGranuleMultiple(bytes)) {
      Count(&BackendCounters::failed_physical_creates);
      return Refuse(call, "a positive multiple of the granularity");
    }
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemCreate"); !status.ok()) {
      Count(&BackendCounters::failed_physical_creates);
      return status;
    }
    const CUmemAllocationProp prop = PinnedDeviceMemory(device());
    CUmemGenericAllocationHandle handle = 0;
    if (CUresult error = driver_.MemCreate(&handle, bytes, &prop, /*flags=*/0); error != CUDA_SUCCESS) {
      Count(&BackendCounters::failed_physical_creates);
      return CuError(call, error);
    }
    Count(&BackendCounters::physical_creates);
    return static_cast<PhysicalHandle>(handle);
  }

  absl::Status ReleasePhysical(PhysicalHandle handle) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemRelease"); !status.ok()) return status;
    if (CUresult error = driver_.MemRelease(handle); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemRelease(handle ", Hex(handle), ")"), error);
    }
    Count(&BackendCounters::physical_releases);
    return absl::OkStatus();
  }

  // cuMemMap, then cuMemSetAccess (a new mapping is inaccessible until then); a failed
  // cuMemSetAccess undoes the mapping.
  absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemMap"); !status.ok()) return status;
    if (CUresult error = driver_.MemMap(va, bytes, /*offset=*/0, handle, /*flags=*/0); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemMap(", Hex(va), ", ", bytes, " bytes, handle ", Hex(handle), ")"), error);
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device();
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult error = driver_.MemSetAccess(va, bytes, &access, 1); error != CUDA_SUCCESS) {
      const CUresult undo = driver_.MemUnmap(va, bytes);
      return CuError(
          absl::StrCat("cuMemSetAccess(", Hex(va), ", ", bytes, " bytes, read-write for device ", device(),
                       ") after cuMemMap (", undo == CUDA_SUCCESS ? "unmapped again" : "cuMemUnmap also failed", ")"),
          error);
    }
    Count(&BackendCounters::maps);
    return absl::OkStatus();
  }

  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    ScopedDevice guard(device());
    if (absl::Status status = guard.Enter("cuMemUnmap"); !status.ok()) return status;
    if (CUresult error = driver_.MemUnmap(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemUnmap(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::unmaps);
    return absl::OkStatus();
  }

 private:
  bool IsGranuleMultiple(std::size_t bytes) const { return bytes != 0 && bytes % granularity_ == 0; }

  // The InvalidArgument of a `call` refused before reaching the driver.
  absl::Status Refuse(absl::string_view call, absl::string_view accepted) const {
    return absl::InvalidArgumentError(
        absl::StrCat(call, " on device ", device(), ": accepted ", accepted, " (granularity ", granularity_, ")"));
  }

  // The typed status of a failed driver `call` (with its arguments) on this device.
  absl::Status CuError(absl::string_view call, CUresult error) const {
    return CuStatus(driver_, absl::StrCat(call, " on device ", device()), error);
  }

  const DriverApi& driver_;  // resolved by Driver(); lives as long as the process
  const std::size_t granularity_;
};

absl::StatusOr<std::unique_ptr<Backend>> MakeVmm(const BackendSettings&, int device) { return MakeVmmBackend(device); }

}  // namespace

constinit const BackendEntry kVmmBackendEntry = {
    "vmm",
    {},
    /*stitching_backend=*/"vmm",
    /*always_stitches=*/true,
    CudaDevicesOf,
    MakeVmm,
};

}  // namespace internal

absl::StatusOr<std::unique_ptr<Backend>> MakeVmmBackend(int device) {
  using internal::CuStatus;
  using internal::DriverApi;
  using internal::PinnedDeviceMemory;
  using internal::ScopedDevice;
  constexpr std::size_t kGranularity = internal::CudaBackend::kGranularity;
  if (absl::Status status = internal::InitDevice("vmm", device); !status.ok()) return status;
  absl::StatusOr<const DriverApi*> driver = internal::Driver();
  if (!driver.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the vmm backend for device ", device, ": ", driver.status().message()));
  }
  const DriverApi& api = **driver;
  ScopedDevice guard(device);
  if (absl::Status status = guard.Enter("vmm backend init"); !status.ok()) return status;
  CUdevice cu_device = 0;
  if (CUresult error = api.DeviceGet(&cu_device, device); error != CUDA_SUCCESS) {
    return CuStatus(api, absl::StrCat("cuDeviceGet(", device, ")"), error);
  }
  int supported = 0;
  if (CUresult error =
          api.DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
      error != CUDA_SUCCESS) {
    return CuStatus(api,
                    absl::StrCat("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) "
                                 "on device ",
                                 device),
                    error);
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the vmm backend for device ", device,
                     ": the device does not support virtual memory management "
                     "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); backend:cuda works without it"));
  }
  const CUmemAllocationProp prop = PinnedDeviceMemory(device);
  std::size_t granularity = 0;
  if (CUresult error = api.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      error != CUDA_SUCCESS) {
    return CuStatus(api,
                    absl::StrCat("cuMemGetAllocationGranularity(pinned on device ", device,
                                 ", CU_MEM_ALLOC_GRANULARITY_MINIMUM) on device ", device),
                    error);
  }
  // The allocator's sizes (2 MiB slabs, segments rounded to 2 MiB) must be whole numbers of
  // granules.
  if (!internal::IsPowerOfTwo(granularity) || kGranularity % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create the vmm backend for device ", device,
                                                   ": its minimum allocation granularity is ", granularity,
                                                   " bytes; the allocator needs a power of two that divides ",
                                                   kGranularity, " (backend:cuda works on this device)"));
  }
  return std::unique_ptr<Backend>(std::make_unique<internal::VmmBackend>(device, api, granularity));
}

}  // namespace bucketalloc
