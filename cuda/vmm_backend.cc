// cuda/vmm_backend.cc — the virtual-memory backend (layer L1): CudaBackend's Allocate, Free and
// events, plus the Reserve/Create/Map family over the driver's VMM API (cuda/driver_api.h) and the
// IPC of its physical allocations (POSIX file descriptors); MakeVmmBackend() and its registry row.
#include <cuda.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "backend/registry.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_status.h"
#include "cuda/driver_api.h"
#include "internal/bits.h"
#include "internal/mutex.h"

namespace bucketalloc {
namespace internal {
namespace {

// The physical memory the vmm backend creates: pinned memory of `device`, usable for GPUDirect RDMA
// (NCCL, InfiniBand) when the device supports it with VMM, as PyTorch's expandable segments ask.
CUmemAllocationProp PinnedDeviceMemory(int device, bool rdma) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (rdma) prop.allocFlags.gpuDirectRDMACapable = 1;
  return prop;
}

// The same, exportable as a POSIX file descriptor (cuMemExportToShareableHandle), as PyTorch's
// expandable segments create theirs by default so that CUDA IPC can share them.
CUmemAllocationProp Shareable(CUmemAllocationProp prop) {
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Whether cuMemCreate's `error`, with a handle type requested, can be the refusal of that handle
// type (a device or driver without POSIX file descriptor handles, a container that forbids them)
// rather than a failed allocation. Out of memory never is.
bool MayRefuseHandleType(CUresult error) {
  return error == CUDA_ERROR_NOT_SUPPORTED || error == CUDA_ERROR_INVALID_VALUE || error == CUDA_ERROR_NOT_PERMITTED;
}

// The virtual-memory backend: CudaBackend's Allocate, Free and events, plus the Reserve/Create/Map
// family over the driver's VMM API. Before any driver call it refuses (InvalidArgument, as the sim
// backend does) a size that is not a positive multiple of the granularity and an alignment that is
// neither 0 (the granularity) nor a power of two: cuMemCreate and cuMemMap take only multiples of
// the granularity (cuda.h: cuMemMap "Both ptr, size, and offset must be a multiple of the value
// given via cuMemGetAllocationGranularity"). Other misuse (an unknown handle, a range that is not
// reserved or is already mapped, an unmap of nothing) is left to the driver, whose error is mapped
// like any other. Unlike the sim backend, the driver accepts ReleasePhysical of a granule that is
// still mapped (its memory goes with the last mapping); the allocator never does it. Unmap is one
// cuMemUnmap, which takes a range made of whole mappings and refuses one that cuts a mapping.
// Access: a mapping is readable and writable by the device and by every peer that can access it
// (cuDeviceCanAccessPeer), so P2P kernels and NCCL's P2P transport work on its memory, as on
// cudaMalloc memory with peer access enabled and on PyTorch's expandable segments.
// IPC: physical allocations are created exportable as POSIX file descriptors; when cuMemCreate
// refuses that handle type and succeeds without it, the device is taken to have no shareable
// handles for the rest of the backend's life (one refused call, not one per create), and its
// handles cannot be exported. An exported descriptor is kept per handle and closed with the handle;
// imported handles are remembered so that their release is counted as one.
// Thread-safety: as CudaBackend (callers hold the device lock; every method is safe from any
// thread): the IPC state is guarded by ipc_mu_, taken before CudaBackend's own lock (Count).
class VmmBackend final : public CudaBackend {
 public:
  VmmBackend(int device, const DriverApi& driver, std::size_t granularity, CUmemAllocationProp prop,
             std::vector<CUmemAccessDesc> access)
      : CudaBackend(device, driver),
        granularity_(granularity),
        prop_(prop),
        shareable_prop_(Shareable(prop)),
        access_(std::move(access)) {}
  // Closes the descriptors of handles exported and never released (the driver keeps the memory of
  // an open one alive).
  ~VmmBackend() override {
    MutexLock lock(ipc_mu_);
    for (const auto& [handle, fd] : exported_) close(fd);
  }

  absl::string_view Name() const override { return "vmm"; }
  std::size_t Granularity() const override { return granularity_; }
  bool SupportsVirtualMemory() const override { return true; }

  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes, std::size_t alignment) override {
    const std::string call = absl::StrCat("cuMemAddressReserve(", bytes, " bytes, alignment ", alignment, ")");
    if (!IsGranuleMultiple(bytes) || (alignment != 0 && !internal::IsPowerOfTwo(alignment))) {
      return Refuse(call, "a positive multiple of the granularity and an alignment of 0 or a power of two");
    }
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemAddressReserve"); !status.ok()) return status;
    RelaxedCaptureMode relaxed(driver_);  // growth during a capture, as PyTorch grows
    CUdeviceptr va = 0;
    if (CUresult error = driver_.MemAddressReserve(&va, bytes, alignment, /*addr=*/0, /*flags=*/0);
        error != CUDA_SUCCESS) {
      return CuError(call, error);
    }
    Count(&BackendCounters::address_reserves);
    return static_cast<std::uintptr_t>(va);
  }

  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) override {
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemAddressFree"); !status.ok()) return status;
    if (CUresult error = driver_.MemAddressFree(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemAddressFree(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::address_releases);
    return absl::OkStatus();
  }

  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes) override {
    const std::string call = absl::StrCat("cuMemCreate(", bytes, " bytes, pinned on device ", device(), ")");
    if (!IsGranuleMultiple(bytes)) {
      Count(&BackendCounters::failed_physical_creates);
      return Refuse(call, "a positive multiple of the granularity");
    }
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemCreate"); !status.ok()) {
      Count(&BackendCounters::failed_physical_creates);
      return status;
    }
    RelaxedCaptureMode relaxed(driver_);  // growth during a capture, as PyTorch grows
    CUmemGenericAllocationHandle handle = 0;
    MutexLock lock(ipc_mu_);
    bool shareable = handle_type_refusal_ == CUDA_SUCCESS;
    CUresult error = driver_.MemCreate(&handle, bytes, shareable ? &shareable_prop_ : &prop_, /*flags=*/0);
    if (shareable && MayRefuseHandleType(error)) {
      // Once more without the handle type: when that succeeds, the type was what was refused. (Not
      // counted as a failed create: the caller's request succeeded.)
      if (driver_.MemCreate(&handle, bytes, &prop_, /*flags=*/0) == CUDA_SUCCESS) {
        handle_type_refusal_ = error;
        shareable = false;
        error = CUDA_SUCCESS;
      }
    }
    if (error != CUDA_SUCCESS) {
      Count(&BackendCounters::failed_physical_creates);
      return CuError(call, error);
    }
    if (!shareable) unshareable_.insert(handle);
    Count(&BackendCounters::physical_creates);
    return static_cast<PhysicalHandle>(handle);
  }

  // The handle's exported descriptor (if any) is closed once cuMemRelease succeeds; the bookkeeping
  // is updated under ipc_mu_ before another call can get the same handle value from the driver.
  absl::Status ReleasePhysical(PhysicalHandle handle) override {
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemRelease"); !status.ok()) return status;
    MutexLock lock(ipc_mu_);
    if (CUresult error = driver_.MemRelease(handle); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemRelease(handle ", Hex(handle), ")"), error);
    }
    if (auto it = exported_.find(handle); it != exported_.end()) {
      close(it->second);
      exported_.erase(it);
    }
    unshareable_.erase(handle);
    auto imported = imported_.find(handle);
    if (imported == imported_.end()) {
      Count(&BackendCounters::physical_releases);
      return absl::OkStatus();
    }
    if (--imported->second == 0) imported_.erase(imported);
    Count(&BackendCounters::imported_releases);
    return absl::OkStatus();
  }

  // One cuMemExportToShareableHandle per handle; the descriptor is kept (and returned again) until
  // the handle is released.
  absl::StatusOr<int> ExportPhysical(PhysicalHandle handle) override {
    const std::string call = absl::StrCat("cuMemExportToShareableHandle(handle ", Hex(handle),
                                          ", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    MutexLock lock(ipc_mu_);
    if (auto it = exported_.find(handle); it != exported_.end()) return it->second;
    if (unshareable_.contains(handle)) {
      return absl::FailedPreconditionError(
          absl::StrCat(call, " on device ", device(), ": the handle was created without a shareable handle type (",
                       CuError("cuMemCreate(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)", handle_type_refusal_).message(),
                       "; without the handle type it succeeded): this device's virtual memory cannot be shared with "
                       "other processes"));
    }
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemExportToShareableHandle"); !status.ok()) return status;
    int fd = -1;
    if (CUresult error = driver_.MemExportToShareableHandle(&fd, static_cast<CUmemGenericAllocationHandle>(handle),
                                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, /*flags=*/0);
        error != CUDA_SUCCESS) {
      return CuError(call, error);
    }
    exported_.emplace(handle, fd);
    return fd;
  }

  absl::StatusOr<PhysicalHandle> ImportPhysical(int fd) override {
    const std::string call =
        absl::StrCat("cuMemImportFromShareableHandle(fd ", fd, ", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    if (fd < 0) {
      return absl::InvalidArgumentError(absl::StrCat(call, " on device ", device(), ": accepted a file descriptor"));
    }
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemImportFromShareableHandle"); !status.ok()) return status;
    MutexLock lock(ipc_mu_);
    CUmemGenericAllocationHandle handle = 0;
    // cuda.h passes a POSIX descriptor by value in the pointer-sized osHandle.
    if (CUresult error =
            driver_.MemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        error != CUDA_SUCCESS) {
      return CuError(call, error);
    }
    ++imported_[handle];
    Count(&BackendCounters::physical_imports);
    return static_cast<PhysicalHandle>(handle);
  }

  // cuMemMap of each piece (its handle whole, from offset 0: cuda.h cuMemMap "offset ... Note:
  // currently must be zero"), then one cuMemSetAccess over what was mapped (a new mapping is
  // inaccessible until then: cuda.h, cuMemMap "does not make the address accessible").
  absl::Status MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) override {
    *mapped = 0;
    for (const PhysicalPiece& p : pieces) {
      if (!IsGranuleMultiple(p.bytes)) {
        return Refuse(absl::StrCat("cuMemMap(", Hex(va), ", ", p.bytes, " bytes)"),
                      "handles of a positive multiple of the granularity");
      }
    }
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemMap"); !status.ok()) return status;
    RelaxedCaptureMode relaxed(driver_);  // growth during a capture, as PyTorch grows
    absl::Status map_error;
    std::size_t n = 0, bytes = 0;
    for (; n < pieces.size(); ++n) {
      const std::uintptr_t at = va + bytes;
      if (CUresult error = driver_.MemMap(at, pieces[n].bytes, /*offset=*/0, pieces[n].handle, /*flags=*/0);
          error != CUDA_SUCCESS) {
        map_error = CuError(
            absl::StrCat("cuMemMap(", Hex(at), ", ", pieces[n].bytes, " bytes, handle ", Hex(pieces[n].handle), ")"),
            error);
        break;
      }
      bytes += pieces[n].bytes;
    }
    if (n == 0) return map_error;
    Count(&BackendCounters::maps, static_cast<std::int64_t>(n));
    if (CUresult error = driver_.MemSetAccess(va, bytes, access_.data(), access_.size()); error != CUDA_SUCCESS) {
      const absl::Status access_error =
          CuError(absl::StrCat("cuMemSetAccess(", Hex(va), ", ", bytes, " bytes, read-write for ", access_.size(),
                               " device(s)) after cuMemMap"),
                  error);
      // Unmapped again: one call for the run (cuMemUnmap takes whole mappings side by side), else
      // piece by piece. A piece that stays mapped leaves its range unusable: DataLoss tells the
      // caller not to map there again.
      if (driver_.MemUnmap(va, bytes) == CUDA_SUCCESS) {
        Count(&BackendCounters::unmaps);
        return access_error;
      }
      std::size_t stuck = 0;
      for (std::size_t i = 0, at = va; i < n; at += pieces[i].bytes, ++i) {
        if (driver_.MemUnmap(at, pieces[i].bytes) == CUDA_SUCCESS) {
          Count(&BackendCounters::unmaps);
        } else {
          ++stuck;
        }
      }
      if (stuck == 0) return access_error;
      return absl::DataLossError(absl::StrCat(access_error.message(), "; ", stuck, " of ", n,
                                              " pieces could not be unmapped again: the range stays mapped"));
    }
    *mapped = n;
    Count(&BackendCounters::access_grants);
    return map_error;
  }

  absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) override {
    const PhysicalPiece one[] = {{handle, bytes}};
    std::size_t mapped = 0;
    return MapRun(va, one, &mapped);
  }

  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    ScopedContext ctx(driver_, device());
    if (absl::Status status = ctx.Enter("cuMemUnmap"); !status.ok()) return status;
    if (CUresult error = driver_.MemUnmap(va, bytes); error != CUDA_SUCCESS) {
      return CuError(absl::StrCat("cuMemUnmap(", Hex(va), ", ", bytes, " bytes)"), error);
    }
    Count(&BackendCounters::unmaps);
    return absl::OkStatus();
  }

  // fork(2): ipc_mu_ as well as CudaBackend's lock.
  void PrepareFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    ipc_mu_.Lock();
    CudaBackend::PrepareFork();
  }
  void ParentAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    CudaBackend::ParentAfterFork();
    ipc_mu_.Unlock();
  }
  absl::Status ChildAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::Status status = CudaBackend::ChildAfterFork();
    ipc_mu_.Unlock();
    return status;
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

  const std::size_t granularity_;
  const CUmemAllocationProp prop_;             // no shareable handle type
  const CUmemAllocationProp shareable_prop_;   // prop_ exportable as a POSIX file descriptor
  const std::vector<CUmemAccessDesc> access_;  // the device itself, then its peers

  Mutex ipc_mu_;
  // CUDA_SUCCESS, or the error with which cuMemCreate refused shareable_prop_ (then every handle
  // is created with prop_).
  CUresult handle_type_refusal_ ABSL_GUARDED_BY(ipc_mu_) = CUDA_SUCCESS;
  absl::flat_hash_set<PhysicalHandle> unshareable_ ABSL_GUARDED_BY(ipc_mu_);    // created with prop_
  absl::flat_hash_map<PhysicalHandle, int> exported_ ABSL_GUARDED_BY(ipc_mu_);  // handle -> its descriptor
  // Handles from ImportPhysical -> imports not yet released (cuda.h does not promise a new handle
  // value per import, and each import is paired with its own cuMemRelease).
  absl::flat_hash_map<PhysicalHandle, int> imported_ ABSL_GUARDED_BY(ipc_mu_);
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
  constexpr std::size_t kGranularity = internal::CudaBackend::kGranularity;
  if (absl::Status status = internal::InitDevice("vmm", device); !status.ok()) return status;
  absl::StatusOr<const DriverApi*> driver = internal::Driver();  // loaded by InitDevice
  if (!driver.ok()) return driver.status();
  const DriverApi& api = **driver;
  auto cu_device = [&](int ordinal, CUdevice* out) -> absl::Status {
    if (CUresult error = api.DeviceGet(out, ordinal); error != CUDA_SUCCESS) {
      return CuStatus(api, absl::StrCat("cuDeviceGet(", ordinal, ")"), error);
    }
    return absl::OkStatus();
  };
  CUdevice self = 0;
  if (absl::Status s = cu_device(device, &self); !s.ok()) return s;
  auto attribute = [&](CUdevice_attribute attr, const char* name, int* value) -> absl::Status {
    if (CUresult error = api.DeviceGetAttribute(value, attr, self); error != CUDA_SUCCESS) {
      return CuStatus(api, absl::StrCat("cuDeviceGetAttribute(", name, ") on device ", device), error);
    }
    return absl::OkStatus();
  };
  int supported = 0;
  if (absl::Status s = attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", &supported);
      !s.ok()) {
    return s;
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the vmm backend for device ", device,
                     ": the device does not support virtual memory management "
                     "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); backend:cuda works without it"));
  }
  int rdma = 0;
  if (absl::Status s = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                 "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", &rdma);
      !s.ok()) {
    return s;
  }
  const CUmemAllocationProp prop = internal::PinnedDeviceMemory(device, rdma != 0);
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
  // Read-write for the device and for each peer that can access it.
  std::vector<CUmemAccessDesc> access;
  auto grant = [&](int d) {
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(desc);
  };
  grant(device);
  for (int peer = 0; peer < api.device_count; ++peer) {
    if (peer == device) continue;
    CUdevice other = 0;
    if (absl::Status s = cu_device(peer, &other); !s.ok()) return s;
    int can = 0;
    if (CUresult error = api.DeviceCanAccessPeer(&can, other, self); error != CUDA_SUCCESS) {
      return CuStatus(api, absl::StrCat("cuDeviceCanAccessPeer(", peer, ", ", device, ")"), error);
    }
    if (can != 0) grant(peer);
  }
  return std::unique_ptr<Backend>(
      std::make_unique<internal::VmmBackend>(device, api, granularity, prop, std::move(access)));
}

}  // namespace bucketalloc
