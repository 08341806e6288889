// cuda/driver_api.cc — libcuda.so.1 loaded at run time, its entry points, primary contexts and
// CUresult statuses (cuda/driver_api.h).
#include "cuda/driver_api.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace bucketalloc::internal {
namespace {

// The driver library's name: its SONAME on every Linux driver install (the toolkit's libcuda.so is
// a link-time stub and is never loaded).
constexpr const char* kDriverLibrary = "libcuda.so.1";

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

std::string VersionText(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

// Resolves `symbol` at `version` into `*function`.
template <typename Function>
absl::Status Resolve(GetProcAddressFn get, int driver_version, const char* symbol, int version, Function* function) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult error = get(symbol, &address, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
  if (error != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || address == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver (", kDriverLibrary, ", version ", VersionText(driver_version), ") has no ", symbol,
        " with the CUDA ", VersionText(version), " ABI (cuGetProcAddress: CUresult ", static_cast<int>(error), ", ",
        found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? "version not sufficient" : "symbol not found", ")"));
  }
  *function = reinterpret_cast<Function>(address);
  return absl::OkStatus();
}

// Opens the driver library once; the handle stays open for the life of the process (the table
// points into it). A failure is not kept: a later call tries again.
absl::StatusOr<void*> OpenDriver() {
  static std::atomic<void*> opened{nullptr};
  if (void* lib = opened.load(std::memory_order_acquire); lib != nullptr) return lib;
  void* lib = dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver: cannot load ", kDriverLibrary, " (", why != nullptr ? why : "dlopen failed",
                     "); bucketalloc needs an NVIDIA driver for CUDA ", VersionText(kMinDriverVersion), " or newer"));
  }
  void* expected = nullptr;
  if (!opened.compare_exchange_strong(expected, lib, std::memory_order_acq_rel)) {
    dlclose(lib);  // another thread opened it first: keep one reference
    return expected;
  }
  return lib;
}

// cuDriverGetVersion of the opened library (it needs no cuInit).
absl::StatusOr<int> QueryVersion(void* lib) {
  auto version_fn = reinterpret_cast<CUresult (*)(int*)>(dlsym(lib, "cuDriverGetVersion"));
  int version = 0;
  if (version_fn == nullptr || version_fn(&version) != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat(kDriverLibrary, " has no working cuDriverGetVersion: not a CUDA driver library"));
  }
  return version;
}

absl::Status Load(DriverApi* api) {
  absl::StatusOr<void*> lib = OpenDriver();
  if (!lib.ok()) return lib.status();
  absl::StatusOr<int> queried = QueryVersion(*lib);
  if (!queried.ok()) return queried.status();
  const int version = *queried;
  auto get = reinterpret_cast<GetProcAddressFn>(dlsym(*lib, "cuGetProcAddress_v2"));
  if (version < kMinDriverVersion || get == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the CUDA driver is version ", VersionText(version),
                                                      "; bucketalloc needs CUDA ", VersionText(kMinDriverVersion),
                                                      " or newer (driver r525+): update the NVIDIA driver"));
  }
  DriverApi found;
  found.version = version;
#define BUCKETALLOC_RESOLVE(field, symbol, symbol_version)                                      \
  if (absl::Status s = Resolve(get, version, #symbol, symbol_version, &found.field); !s.ok()) { \
    return s;                                                                                   \
  }
  BUCKETALLOC_DRIVER_FUNCTIONS(BUCKETALLOC_RESOLVE)
#undef BUCKETALLOC_RESOLVE
  if (CUresult e = found.Init(0); e != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(CuStatus(found, "cuInit(0)", e).message());
  }
  if (CUresult e = found.DeviceGetCount(&found.device_count); e != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(CuStatus(found, "cuDeviceGetCount", e).message());
  }
  if (found.device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuDeviceGetCount reported ", found.device_count, " CUDA devices: no usable device"));
  }
  *api = found;
  return absl::OkStatus();
}

// CUresults that mean "no usable driver or device" rather than a failed operation.
bool IsMissingDriverOrDevice(CUresult error) {
  switch (error) {
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return true;
    default:
      return false;
  }
}

// CUresults of a call CUDA refuses while a stream capture runs.
bool IsCaptureError(CUresult error) {
  switch (error) {
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return true;
    default:
      return false;
  }
}

constexpr int kMaxDevices = 64;

}  // namespace

absl::StatusOr<int> CudaDriverVersion() {
  absl::StatusOr<void*> lib = OpenDriver();
  if (!lib.ok()) return lib.status();
  return QueryVersion(*lib);
}

int CudaHeadersVersion() { return CUDA_VERSION; }

absl::StatusOr<const DriverApi*> Driver() {
  static std::mutex mu;
  static DriverApi api;  // written once under mu, before `resolved` is set
  static std::atomic<bool> resolved{false};
  if (resolved.load(std::memory_order_acquire)) [[likely]]
    return &api;
  std::lock_guard<std::mutex> lock(mu);
  if (resolved.load(std::memory_order_relaxed)) return &api;
  if (absl::Status s = Load(&api); !s.ok()) return s;
  resolved.store(true, std::memory_order_release);
  return &api;
}

absl::StatusOr<CUcontext> PrimaryContext(const DriverApi& driver, int device) {
  static std::mutex mu;
  static std::array<std::atomic<CUcontext>, kMaxDevices> contexts{};
  if (device < 0 || device >= driver.device_count || device >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " is out of range: ", driver.device_count, " CUDA device(s) present"));
  }
  if (CUcontext c = contexts[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) [[likely]]
    return c;
  std::lock_guard<std::mutex> lock(mu);
  if (CUcontext c = contexts[static_cast<std::size_t>(device)].load(std::memory_order_relaxed)) return c;
  CUcontext c = nullptr;
  if (CUresult e = driver.DevicePrimaryCtxRetain(&c, device); e != CUDA_SUCCESS) {
    return CuStatus(driver, absl::StrCat("cuDevicePrimaryCtxRetain(", device, ")"), e);
  }
  contexts[static_cast<std::size_t>(device)].store(c, std::memory_order_release);
  return c;
}

absl::Status ScopedContext::Enter(absl::string_view call) {
  absl::StatusOr<CUcontext> ctx = PrimaryContext(driver_, device_);
  if (!ctx.ok()) {
    return absl::Status(ctx.status().code(), absl::StrCat(call, " on device ", device_, ": ", ctx.status().message()));
  }
  return EnterContext(*ctx, call);
}

absl::Status ScopedContext::EnterContext(CUcontext ctx, absl::string_view call) {
  CUcontext current = nullptr;
  if (CUresult e = driver_.CtxGetCurrent(&current); e != CUDA_SUCCESS) {
    return CuStatus(driver_, absl::StrCat("cuCtxGetCurrent for ", call, " on device ", device_), e);
  }
  if (current == ctx) return absl::OkStatus();
  if (CUresult e = driver_.CtxPushCurrent(ctx); e != CUDA_SUCCESS) {
    return CuStatus(driver_, absl::StrCat("cuCtxPushCurrent(device ", device_, ") for ", call), e);
  }
  pushed_ = true;
  return absl::OkStatus();
}

absl::Status CuStatus(const DriverApi& driver, absl::string_view what, CUresult error) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.GetErrorName == nullptr || driver.GetErrorName(error, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "CUDA_ERROR_?";
  }
  if (driver.GetErrorString == nullptr || driver.GetErrorString(error, &text) != CUDA_SUCCESS || text == nullptr) {
    text = "unknown error";
  }
  return TypedStatus(error == CUDA_ERROR_OUT_OF_MEMORY, IsMissingDriverOrDevice(error) || IsCaptureError(error),
                     ErrorMessage(what, name, static_cast<int>(error), text));
}

}  // namespace bucketalloc::internal
