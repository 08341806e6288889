// tools/measure_driver_costs.cc — bucketalloc-measure-driver-costs: what each CUDA call the replay
// harness prices costs on this GPU, measured, written as the cost file that `bucketalloc-bench ...
// --costs FILE` reads (src/harness/replay/driver_costs.h, ParseCostModel).
//
// Owns: the measurement (every call timed alone with std::chrono::steady_clock, after one untimed
// warm-up, on an otherwise idle device), its budget, the JSON cost file and the table on stderr.
// The calls and sizes:
//   cudaMalloc, cudaFree         2 MiB, 20 MiB, 128 MiB, 1 GiB: those that fit in half the free memory
//   cuMemCreate, cuMemMap,       the same sizes rounded up to the granularity: one handle, mapped whole
//   cuMemSetAccess, cuMemUnmap,    into one reserved address range reused for every size
//   cuMemRelease
//   cuMemAddressReserve,         2 MiB, 1 GiB, 64 GiB, 1 TiB (a size the driver refuses is left out)
//   cuMemAddressFree
//   synchronize                  cudaDeviceSynchronize of an idle device (bytes 0)
// Each (call, size) gets up to 200 repetitions (fewer for large physical sizes), at least 3; the
// budget (--budget-s) is shared out over the series still to run, and a series stops adding
// repetitions once its share is spent. A point is {"bytes", "us" (the mean), "p99_us" (nearest rank)}.
// The driver is linked nowhere: its functions come from the runtime's cudaGetDriverEntryPointByVersion
// (the same driver the runtime loaded), each at the oldest CUDA version with its ABI, as
// cuda/driver_api.h asks for them. A missing driver or device is a message naming the CUDA error
// and exit status 1.
//
// Example (scripts/gpu_check.sh's driver_costs step):
//   bucketalloc-measure-driver-costs -o driver_costs.json --budget-s 60
//   bucketalloc-bench replay TRACE --capacity 80GiB --allocator bucketalloc:backend:vmm --costs driver_costs.json
#include <cuda.h>  // the driver API's types only: its functions come from cudaGetDriverEntryPointByVersion
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kTiB = std::size_t{1} << 40;

// The sizes measured (bytes; strictly increasing).
constexpr std::array<std::size_t, 4> kAllocationSizes = {2 * kMiB, 20 * kMiB, 128 * kMiB, 1 * kGiB};
constexpr std::array<std::size_t, 4> kReserveSizes = {2 * kMiB, 1 * kGiB, 64 * kGiB, 1 * kTiB};

// Repetitions of one (call, size): at most kMaxRepetitions, fewer above the physical sizes below,
// and never fewer than kMinRepetitions, even with the budget spent (the reader needs every call).
constexpr int kMaxRepetitions = 200;
constexpr int kMinRepetitions = 3;
constexpr std::size_t kMediumBytes = 32 * kMiB;  // above: kMediumRepetitions
constexpr int kMediumRepetitions = 100;
constexpr std::size_t kLargeBytes = 256 * kMiB;  // above: kLargeRepetitions
constexpr int kLargeRepetitions = 40;
static_assert(kMinRepetitions <= kLargeRepetitions && kLargeRepetitions <= kMediumRepetitions &&
              kMediumRepetitions <= kMaxRepetitions);

// What the cost file's reader accepts (src/harness/replay/driver_costs.h): prices from 0 to a
// second, sizes up to 1 PiB.
constexpr double kMaxCallMicroseconds = 1e6;
constexpr std::size_t kMaxProfileBytes = std::size_t{1} << 50;
static_assert(kReserveSizes.back() <= kMaxProfileBytes);

// --budget-s's accepted range (a day at most, so that the deadline cannot overflow the clock).
constexpr double kMinBudgetSeconds = 0.001;
constexpr double kMaxBudgetSeconds = 86400.0;

constexpr const char* kProgram = "bucketalloc-measure-driver-costs";

// The cost file's calls, in its order (DriverCallName of each DriverCall).
enum Call : std::size_t {
  kMalloc,
  kFree,
  kCreate,
  kRelease,
  kMap,
  kSetAccess,
  kUnmap,
  kAddressReserve,
  kAddressFree,
  kSynchronize,
  kCalls,
};
constexpr std::array<const char*, kCalls> kCallNames = {
    "cudaMalloc",     "cudaFree",   "cuMemCreate",         "cuMemRelease",     "cuMemMap",
    "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree", "synchronize"};

std::string VersionText(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

std::string SizeText(std::size_t bytes) {
  if (bytes >= kTiB && bytes % kTiB == 0) return absl::StrCat(bytes / kTiB, " TiB");
  if (bytes >= kGiB && bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, " GiB");
  if (bytes >= kMiB && bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, " MiB");
  return absl::StrCat(bytes, " B");
}

// A runtime error as "what: CUDA error 35 (cudaErrorInsufficientDriver: ...)".
absl::Status CudaError(absl::string_view what, cudaError_t error) {
  const std::string text = absl::StrCat(what, ": CUDA error ", static_cast<int>(error), " (", cudaGetErrorName(error),
                                        ": ", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(text);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(text);
    default:
      return absl::InternalError(text);
  }
}

// The driver functions measured or needed around them; `device_get_name` may be null (a driver
// double without it).
struct DriverCalls {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetName_v2000 device_get_name = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;

  // A driver error as "what: CUresult 2 (CUDA_ERROR_OUT_OF_MEMORY)".
  absl::Status Error(absl::string_view what, CUresult error) const {
    const char* name = nullptr;
    if (get_error_name == nullptr || get_error_name(error, &name) != CUDA_SUCCESS || name == nullptr) {
      name = "unknown";
    }
    const std::string text = absl::StrCat(what, ": CUresult ", static_cast<int>(error), " (", name, ")");
    return error == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(text) : absl::InternalError(text);
  }
};

// Resolves `symbol` at the ABI of CUDA `version` into `*function`; a symbol the driver lacks is
// FailedPrecondition unless `optional` (then `*function` stays null).
template <typename Function>
absl::Status Resolve(const char* symbol, unsigned int version, Function* function, bool optional = false) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
      e != cudaSuccess) {
    return CudaError(absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ", ", version, ")"), e);
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    if (optional) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("the CUDA driver has no ", symbol, " with the CUDA ",
                                                      VersionText(static_cast<int>(version)), " ABI"));
  }
  *function = reinterpret_cast<Function>(address);
  return absl::OkStatus();
}

absl::StatusOr<DriverCalls> ResolveDriver() {
  DriverCalls d;
  for (absl::Status s : {
           Resolve("cuGetErrorName", 6000, &d.get_error_name),
           Resolve("cuDeviceGet", 2000, &d.device_get),
           Resolve("cuDeviceGetName", 2000, &d.device_get_name, /*optional=*/true),
           Resolve("cuMemGetAllocationGranularity", 10020, &d.mem_get_allocation_granularity),
           Resolve("cuMemAddressReserve", 10020, &d.mem_address_reserve),
           Resolve("cuMemAddressFree", 10020, &d.mem_address_free),
           Resolve("cuMemCreate", 10020, &d.mem_create),
           Resolve("cuMemRelease", 10020, &d.mem_release),
           Resolve("cuMemMap", 10020, &d.mem_map),
           Resolve("cuMemSetAccess", 10020, &d.mem_set_access),
           Resolve("cuMemUnmap", 10020, &d.mem_unmap),
       }) {
    if (!s.ok()) return s;
  }
  return d;
}

// One measured point of a call.
struct Point {
  std::size_t bytes = 0;
  double mean_us = 0.0;
  double p99_us = 0.0;
  int repetitions = 0;
};

// Mean and nearest-rank 99th percentile of `samples` (not empty; sorted here).
Point Summarize(std::size_t bytes, std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  double sum = 0.0;
  for (double s : samples) sum += s;
  const std::size_t n = samples.size();
  const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(n)));  // 1..n
  return {bytes, sum / static_cast<double>(n), samples[std::max<std::size_t>(rank, 1) - 1], static_cast<int>(n)};
}

// The repetitions of one (call, size) whose call holds `physical_bytes` of device memory.
int RepetitionsFor(std::size_t physical_bytes) {
  if (physical_bytes > kLargeBytes) return kLargeRepetitions;
  if (physical_bytes > kMediumBytes) return kMediumRepetitions;
  return kMaxRepetitions;
}

// The budget, shared out over the series (one (call group, size) each) still to run.
class Budget {
 public:
  Budget(double seconds, int series)
      : deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))),
        series_left_(series) {}

  // Starts the next series: its deadline is an equal share of what is left.
  void StartSeries() {
    const Clock::time_point now = Clock::now();
    const Clock::duration left = deadline_ > now ? deadline_ - now : Clock::duration::zero();
    series_deadline_ = now + left / std::max(series_left_, 1);
    series_left_ = std::max(series_left_ - 1, 0);
  }
  // Whether repetition `done` (0-based count done so far) of at most `max` may run.
  bool Another(int done, int max) const {
    if (done >= max) return false;
    return done < kMinRepetitions || Clock::now() < series_deadline_;
  }

 private:
  Clock::time_point deadline_;
  Clock::time_point series_deadline_;
  int series_left_;
};

// Runs `call` once and adds its duration in microseconds to `*samples` when `samples` is not null.
template <typename F>
auto Timed(std::vector<double>* samples, F&& call) {
  const Clock::time_point t0 = Clock::now();
  auto result = call();
  const Clock::time_point t1 = Clock::now();
  if (samples != nullptr) samples->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  return result;
}

// The device under measurement and what the measurement found.
struct Measurement {
  std::string gpu_name;
  int driver_version = 0;
  int runtime_version = 0;
  std::size_t granularity = 0;
  std::size_t free_bytes = 0;
  std::array<std::vector<Point>, kCalls> points;
  std::vector<std::string> notes;  // sizes left out and why
};

// cudaMalloc and cudaFree of `bytes`, paired.
absl::Status MeasureMalloc(std::size_t bytes, Budget& budget, Measurement* m) {
  const int max = RepetitionsFor(bytes);
  std::vector<double> malloc_us, free_us;
  budget.StartSeries();
  for (int done = -1; done < 0 || budget.Another(done, max); ++done) {  // done == -1: the warm-up
    const bool timed = done >= 0;
    void* p = nullptr;
    if (cudaError_t e = Timed(timed ? &malloc_us : nullptr, [&] { return cudaMalloc(&p, bytes); }); e != cudaSuccess) {
      return CudaError(absl::StrCat("cudaMalloc(", SizeText(bytes), ")"), e);
    }
    if (cudaError_t e = Timed(timed ? &free_us : nullptr, [&] { return cudaFree(p); }); e != cudaSuccess) {
      return CudaError(absl::StrCat("cudaFree(", SizeText(bytes), ")"), e);
    }
  }
  m->points[kMalloc].push_back(Summarize(bytes, std::move(malloc_us)));
  m->points[kFree].push_back(Summarize(bytes, std::move(free_us)));
  return absl::OkStatus();
}

// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and cuMemRelease of one `bytes` handle mapped
// at `va` (a reservation of at least `bytes`).
absl::Status MeasureVmm(const DriverCalls& d, CUdevice device, CUdeviceptr va, std::size_t bytes, Budget& budget,
                        Measurement* m) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const int max = RepetitionsFor(bytes);
  std::array<std::vector<double>, 5> us;  // create, map, set access, unmap, release
  budget.StartSeries();
  for (int done = -1; done < 0 || budget.Another(done, max); ++done) {
    const bool timed = done >= 0;
    auto into = [&](std::size_t i) { return timed ? &us[i] : nullptr; };
    const std::string size = SizeText(bytes);
    CUmemGenericAllocationHandle h = 0;
    if (CUresult e = Timed(into(0), [&] { return d.mem_create(&h, bytes, &prop, 0); }); e != CUDA_SUCCESS) {
      return d.Error(absl::StrCat("cuMemCreate(", size, ")"), e);
    }
    if (CUresult e = Timed(into(1), [&] { return d.mem_map(va, bytes, 0, h, 0); }); e != CUDA_SUCCESS) {
      d.mem_release(h);
      return d.Error(absl::StrCat("cuMemMap(", size, ")"), e);
    }
    CUresult e = Timed(into(2), [&] { return d.mem_set_access(va, bytes, &access, 1); });
    const CUresult unmapped = Timed(into(3), [&] { return d.mem_unmap(va, bytes); });
    const CUresult released = Timed(into(4), [&] { return d.mem_release(h); });
    if (e != CUDA_SUCCESS) return d.Error(absl::StrCat("cuMemSetAccess(", size, ")"), e);
    if (unmapped != CUDA_SUCCESS) return d.Error(absl::StrCat("cuMemUnmap(", size, ")"), unmapped);
    if (released != CUDA_SUCCESS) return d.Error(absl::StrCat("cuMemRelease(", size, ")"), released);
  }
  const std::array<Call, 5> calls = {kCreate, kMap, kSetAccess, kUnmap, kRelease};
  for (std::size_t i = 0; i < calls.size(); ++i) m->points[calls[i]].push_back(Summarize(bytes, std::move(us[i])));
  return absl::OkStatus();
}

// cuMemAddressReserve and cuMemAddressFree of `bytes`, paired. A size whose warm-up reservation
// the driver refuses is left out with a note (the address space is the driver's to give).
absl::Status MeasureReserve(const DriverCalls& d, std::size_t bytes, Budget& budget, Measurement* m) {
  std::vector<double> reserve_us, free_us;
  budget.StartSeries();
  for (int done = -1; done < 0 || budget.Another(done, kMaxRepetitions); ++done) {
    const bool timed = done >= 0;
    CUdeviceptr p = 0;
    if (CUresult e = Timed(timed ? &reserve_us : nullptr, [&] { return d.mem_address_reserve(&p, bytes, 0, 0, 0); });
        e != CUDA_SUCCESS) {
      const absl::Status s = d.Error(absl::StrCat("cuMemAddressReserve(", SizeText(bytes), ")"), e);
      if (timed) return s;
      m->notes.push_back(
          absl::StrCat("cuMemAddressReserve/cuMemAddressFree at ", SizeText(bytes), " left out: ", s.message()));
      return absl::OkStatus();
    }
    if (CUresult e = Timed(timed ? &free_us : nullptr, [&] { return d.mem_address_free(p, bytes); });
        e != CUDA_SUCCESS) {
      return d.Error(absl::StrCat("cuMemAddressFree(", SizeText(bytes), ")"), e);
    }
  }
  m->points[kAddressReserve].push_back(Summarize(bytes, std::move(reserve_us)));
  m->points[kAddressFree].push_back(Summarize(bytes, std::move(free_us)));
  return absl::OkStatus();
}

absl::Status MeasureSynchronize(Budget& budget, Measurement* m) {
  std::vector<double> us;
  budget.StartSeries();
  for (int done = -1; done < 0 || budget.Another(done, kMaxRepetitions); ++done) {
    if (cudaError_t e = Timed(done >= 0 ? &us : nullptr, [] { return cudaDeviceSynchronize(); }); e != cudaSuccess) {
      return CudaError("cudaDeviceSynchronize", e);
    }
  }
  m->points[kSynchronize].push_back(Summarize(0, std::move(us)));
  return absl::OkStatus();
}

// Rounds `bytes` up to a multiple of `granularity` (> 0).
std::size_t RoundUp(std::size_t bytes, std::size_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}

absl::StatusOr<Measurement> Measure(int device_index, double budget_s) {
  Measurement m;
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) return CudaError("cudaGetDeviceCount", e);
  if (device_index >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", device_index, " is out of range: ", devices, " CUDA device(s) present"));
  }
  if (cudaError_t e = cudaSetDevice(device_index); e != cudaSuccess) {
    return CudaError(absl::StrCat("cudaSetDevice(", device_index, ")"), e);
  }
  // The primary context, made now so that no measured call pays for it.
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return CudaError("cudaFree(nullptr)", e);
  if (cudaError_t e = cudaDriverGetVersion(&m.driver_version); e != cudaSuccess) {
    return CudaError("cudaDriverGetVersion", e);
  }
  if (cudaError_t e = cudaRuntimeGetVersion(&m.runtime_version); e != cudaSuccess) {
    return CudaError("cudaRuntimeGetVersion", e);
  }
  std::size_t total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&m.free_bytes, &total_bytes); e != cudaSuccess) {
    return CudaError("cudaMemGetInfo", e);
  }
  absl::StatusOr<DriverCalls> resolved = ResolveDriver();
  if (!resolved.ok()) return resolved.status();
  const DriverCalls& d = *resolved;
  CUdevice device = 0;
  if (CUresult e = d.device_get(&device, device_index); e != CUDA_SUCCESS) {
    return d.Error(absl::StrCat("cuDeviceGet(", device_index, ")"), e);
  }
  m.gpu_name = absl::StrCat("CUDA device ", device_index);
  if (d.device_get_name != nullptr) {
    std::array<char, 256> name = {};
    if (d.device_get_name(name.data(), static_cast<int>(name.size()), device) == CUDA_SUCCESS && name[0] != '\0') {
      name.back() = '\0';
      m.gpu_name = name.data();
    }
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (CUresult e = d.mem_get_allocation_granularity(&m.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      e != CUDA_SUCCESS || m.granularity == 0) {
    return d.Error("cuMemGetAllocationGranularity", e != CUDA_SUCCESS ? e : CUDA_ERROR_INVALID_VALUE);
  }

  // The sizes that fit in half the free memory, and the VMM sizes rounded to the granularity.
  std::vector<std::size_t> malloc_sizes, vmm_sizes, reserve_sizes;
  for (std::size_t bytes : kAllocationSizes) {
    if (bytes > m.free_bytes / 2) {
      m.notes.push_back(absl::StrCat(SizeText(bytes), " left out of cudaMalloc and cuMemCreate: more than half of the ",
                                     SizeText(m.free_bytes), " free"));
      continue;
    }
    malloc_sizes.push_back(bytes);
    const std::size_t rounded = RoundUp(bytes, m.granularity);
    if (rounded <= m.free_bytes / 2 && (vmm_sizes.empty() || rounded > vmm_sizes.back())) vmm_sizes.push_back(rounded);
  }
  if (malloc_sizes.empty() || vmm_sizes.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("device ", device_index, " has ", m.free_bytes,
                                                     " bytes free: not enough to measure a ",
                                                     SizeText(kAllocationSizes.front()), " allocation"));
  }
  for (std::size_t bytes : kReserveSizes) {
    const std::size_t rounded = RoundUp(bytes, m.granularity);
    if (reserve_sizes.empty() || rounded > reserve_sizes.back()) reserve_sizes.push_back(rounded);
  }

  Budget budget(budget_s, static_cast<int>(malloc_sizes.size() + vmm_sizes.size() + reserve_sizes.size() + 1));
  if (absl::Status s = MeasureSynchronize(budget, &m); !s.ok()) return s;
  for (std::size_t bytes : malloc_sizes) {
    if (absl::Status s = MeasureMalloc(bytes, budget, &m); !s.ok()) return s;
  }
  // One address range for every VMM size, reserved outside the timed calls.
  CUdeviceptr va = 0;
  if (CUresult e = d.mem_address_reserve(&va, vmm_sizes.back(), 0, 0, 0); e != CUDA_SUCCESS) {
    return d.Error(absl::StrCat("cuMemAddressReserve(", SizeText(vmm_sizes.back()), ")"), e);
  }
  for (std::size_t bytes : vmm_sizes) {
    if (absl::Status s = MeasureVmm(d, device, va, bytes, budget, &m); !s.ok()) {
      d.mem_address_free(va, vmm_sizes.back());
      return s;
    }
  }
  if (CUresult e = d.mem_address_free(va, vmm_sizes.back()); e != CUDA_SUCCESS) {
    return d.Error("cuMemAddressFree of the VMM range", e);
  }
  for (std::size_t bytes : reserve_sizes) {
    if (absl::Status s = MeasureReserve(d, bytes, budget, &m); !s.ok()) return s;
  }
  if (m.points[kAddressReserve].empty()) {
    return absl::FailedPreconditionError("cuMemAddressReserve refused every size measured");
  }
  return m;
}

// The profile's default name: "measured-" and the GPU's name, lower-cased, spaces as '-'.
std::string DefaultProfile(const std::string& gpu_name) {
  std::string name = "measured-";
  for (char c : gpu_name) {
    name += c == ' ' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc = {};
  gmtime_r(&now, &utc);
  std::array<char, 32> text = {};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text.data();
}

// A price as the reader accepts it: within [0, kMaxCallMicroseconds], to the nanosecond.
double Price(double us) { return std::round(std::clamp(us, 0.0, kMaxCallMicroseconds) * 1000.0) / 1000.0; }

// The cost file (ParseCostModel's format).
std::string ToJson(const Measurement& m, const std::string& profile) {
  nlohmann::ordered_json j;
  j["profile"] = profile;
  j["source"] = absl::StrCat(kProgram, " on ", m.gpu_name, ", driver ", VersionText(m.driver_version),
                             ", CUDA runtime ", VersionText(m.runtime_version), ", ", UtcNow());
  j["calls"] = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < kCalls; ++i) {
    nlohmann::ordered_json points = nlohmann::ordered_json::array();
    for (const Point& p : m.points[i]) {
      points.push_back(
          {{"bytes", static_cast<std::uint64_t>(p.bytes)}, {"us", Price(p.mean_us)}, {"p99_us", Price(p.p99_us)}});
    }
    j["calls"][kCallNames[i]] = std::move(points);
  }
  return j.dump(2) + "\n";
}

void PrintTable(const Measurement& m, const std::string& profile) {
  std::fprintf(stderr, "%s: %s (driver %s, CUDA runtime %s), granularity %s, %s free; profile %s\n", kProgram,
               m.gpu_name.c_str(), VersionText(m.driver_version).c_str(), VersionText(m.runtime_version).c_str(),
               SizeText(m.granularity).c_str(), SizeText(m.free_bytes / kMiB * kMiB).c_str(), profile.c_str());
  std::fprintf(stderr, "%-20s %10s %6s %12s %12s\n", "call", "bytes", "reps", "mean us", "p99 us");
  for (std::size_t i = 0; i < kCalls; ++i) {
    for (const Point& p : m.points[i]) {
      std::fprintf(stderr, "%-20s %10s %6d %12.3f %12.3f\n", kCallNames[i], SizeText(p.bytes).c_str(), p.repetitions,
                   p.mean_us, p.p99_us);
    }
  }
  for (const std::string& note : m.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
}

int Run(int argc, char** argv) {
  CLI::App app{absl::StrCat(kProgram,
                            ": measure what each CUDA driver call costs on this GPU and write the cost file "
                            "`bucketalloc-bench ... --costs FILE` reads")};
  std::string output;
  int device = 0;
  double budget_s = 60.0;
  std::string profile;
  app.add_option("-o,--output", output, "where the JSON cost file goes (default: stdout)");
  app.add_option("--device", device, "the CUDA device to measure")->check(CLI::Range(0, 1023));
  app.add_option("--budget-s", budget_s, "seconds the whole measurement may take before it stops adding repetitions")
      ->check(CLI::Range(kMinBudgetSeconds, kMaxBudgetSeconds));
  app.add_option("--profile", profile,
                 "the profile's name (default: \"measured-\" and the GPU's name, lower-cased, spaces as '-')");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<Measurement> m = Measure(device, budget_s);
  if (!m.ok()) {
    std::fprintf(stderr, "%s: %s\n", kProgram, std::string(m.status().message()).c_str());
    return 1;
  }
  if (profile.empty()) profile = DefaultProfile(m->gpu_name);
  PrintTable(*m, profile);
  const std::string json = ToJson(*m, profile);
  if (output.empty()) {
    std::cout << json << std::flush;
    return std::cout ? 0 : 1;
  }
  std::ofstream out(output);
  out << json;
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s: cannot write %s\n", kProgram, output.c_str());
    return 1;
  }
  std::fprintf(stderr, "%s: wrote %s\n", kProgram, output.c_str());
  return 0;
}

}  // namespace
}  // namespace bucketalloc::tools

int main(int argc, char** argv) { return bucketalloc::tools::Run(argc, argv); }
