// tools/measure_driver_costs.cc — bucketalloc-measure-driver-costs: what each CUDA call the replay
// harness prices costs on this GPU, measured as the backends make the calls (cuda/cuda_backend.cc,
// cuda/vmm_backend.cc), written as the cost file that `bucketalloc-bench ... --costs FILE` reads
// (src/harness/replay/driver_costs.h, ParseCostModel).
//
// Needs a driver for CUDA 13 or newer: the program links the toolkit's libcudart.so.13, which
// refuses an older driver (a CUDA 12.x driver is cudaErrorInsufficientDriver, a message and exit 1).
//
// Owns: the measurement (every call timed alone with std::chrono::steady_clock, after one untimed
// warm-up), its budget, the JSON cost file and the table on stderr. The calls and sizes:
//   cudaMalloc, cudaFree         the cost file's names for what backend:cuda calls, cuMemAlloc and
//                                cuMemFree, at 2 MiB, 20 MiB, 128 MiB, 1 GiB (those that fit in half
//                                the free memory), in batches as a pool grows and shrinks: N
//                                cuMemAlloc in a row, then the N cuMemFree
//   cuMemCreate, cuMemMap,       the same sizes rounded up to the granularity, in batches as backend:vmm
//   cuMemSetAccess, cuMemUnmap,    grows a pool: N cuMemCreate in a row (backend:vmm's properties:
//   cuMemRelease                   pinned, GPUDirect RDMA capable where the device has it with VMM,
//                                  requestedHandleTypes a POSIX file descriptor unless the driver
//                                  refuses that type, then without it, as the backend falls back);
//                                  N cuMemMap side by side into one reserved range; cuMemSetAccess of
//                                  each handle's range (read-write for the device and each peer that
//                                  can access it, the backend's descriptors); the range touched (an
//                                  untimed cudaMemset and cudaDeviceSynchronize) so that unmapping and
//                                  releasing free used memory; N cuMemUnmap, one per handle; N
//                                  cuMemRelease
//   cuMemAddressReserve,         2 MiB, 1 GiB, 64 GiB, 1 TiB (a size the driver refuses is left out)
//   cuMemAddressFree
//   synchronize                  cudaDeviceSynchronize of an idle device (bytes 0): the idle round
//                                trip only, not a wait on queued work (that costs what the work costs)
// N: at most the size's repetitions, with N x size at most half the free memory; batches repeat
// until the size's repetitions are done or its share of the budget is spent (a batch also ends
// early then). Each (call, size) gets up to 200 repetitions (fewer for large physical sizes), at
// least 3; the budget (--budget-s) is shared out over the series still to run. The first VMM batch
// of each size grants access over the whole run in one cuMemSetAccess, as backend:vmm's MapRun does;
// the cuMemSetAccess point is the per-handle series of the batches after it (so that batch adds up
// to N repetitions to the other four VMM calls). A point is {"bytes", "us" (the mean), "p99_us"
// (nearest rank)}.
// On stderr only (the cost file's reader refuses other keys): that one cuMemSetAccess over a whole
// run, per size, and cuMemFree of 2 MiB after a cudaMemsetAsync over the largest size measured,
// queued on the default stream: the stall a free can cost (a free waits for the device's work).
// The driver is linked nowhere: its functions come from the runtime's cudaGetDriverEntryPointByVersion
// (the same driver the runtime loaded), each at the oldest CUDA version with its ABI, as
// cuda/driver_api.h asks for them. A missing driver or device is a message naming the CUDA error
// and exit status 1; a --device out of range (the message gives 0 to count - 1) and a -o path that
// cannot be written (checked before measuring, with the reason) are a message and exit status 1 too.
//
// Example (scripts/gpu_check.sh's driver_costs step):
//   bucketalloc-measure-driver-costs -o driver_costs.json --budget-s 60
//   bucketalloc-bench replay TRACE --capacity 80GiB --allocator bucketalloc:backend:vmm --costs driver_costs.json
#include <cuda.h>  // the driver API's types only: its functions come from cudaGetDriverEntryPointByVersion
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// printf's `format` of `args`, as a string.
template <typename... Args>
std::string Format(const char* format, Args... args) {
  std::array<char, 512> text = {};
  std::snprintf(text.data(), text.size(), format, args...);
  return text.data();
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
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceCanAccessPeer_v4000 device_can_access_peer = nullptr;
  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
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
           Resolve("cuDeviceGetAttribute", 2000, &d.device_get_attribute),
           Resolve("cuDeviceCanAccessPeer", 4000, &d.device_can_access_peer),
           Resolve("cuMemAlloc", 3020, &d.mem_alloc),
           Resolve("cuMemFree", 3020, &d.mem_free),
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
  std::vector<std::string> notes;        // sizes left out and why, the properties measured with
  std::vector<std::string> stderr_only;  // series shown on stderr, never written to the cost file
};

// The repetitions so far of a series, as Budget::Another counts them.
int Count(const std::vector<double>& samples) { return static_cast<int>(samples.size()); }

// cuMemAlloc and cuMemFree of `bytes` (what backend:cuda calls; the cost file's cudaMalloc and
// cudaFree), in batches of at most `batch`: the allocations in a row, then their frees in the same
// order.
absl::Status MeasureMalloc(const DriverCalls& d, std::size_t bytes, std::size_t batch, Budget& budget, Measurement* m) {
  const std::string size = SizeText(bytes);
  const int max = RepetitionsFor(bytes);
  std::vector<double> alloc_us, free_us;
  std::vector<CUdeviceptr> ptrs;
  std::size_t freed = 0;  // ptrs[freed...] are still allocated
  auto fail = [&](const std::string& call, CUresult e) {
    for (std::size_t i = freed; i < ptrs.size(); ++i) d.mem_free(ptrs[i]);
    return d.Error(absl::StrCat(call, "(", size, ")"), e);
  };
  budget.StartSeries();
  // The warm-up, untimed.
  CUdeviceptr warm = 0;
  if (CUresult e = d.mem_alloc(&warm, bytes); e != CUDA_SUCCESS) return fail("cuMemAlloc", e);
  if (CUresult e = d.mem_free(warm); e != CUDA_SUCCESS) return fail("cuMemFree", e);
  while (budget.Another(Count(alloc_us), max)) {
    ptrs.clear();
    freed = 0;
    const std::size_t n = std::min(batch, static_cast<std::size_t>(max - Count(alloc_us)));
    while (ptrs.size() < n && (ptrs.empty() || budget.Another(Count(alloc_us), max))) {
      CUdeviceptr p = 0;
      if (CUresult e = Timed(&alloc_us, [&] { return d.mem_alloc(&p, bytes); }); e != CUDA_SUCCESS) {
        return fail("cuMemAlloc", e);
      }
      ptrs.push_back(p);
    }
    while (freed < ptrs.size()) {
      const CUdeviceptr p = ptrs[freed++];
      if (CUresult e = Timed(&free_us, [&] { return d.mem_free(p); }); e != CUDA_SUCCESS) return fail("cuMemFree", e);
    }
  }
  m->points[kMalloc].push_back(Summarize(bytes, std::move(alloc_us)));
  m->points[kFree].push_back(Summarize(bytes, std::move(free_us)));
  return absl::OkStatus();
}

// cuMemFree of a 2 MiB allocation right after a cudaMemsetAsync over `work_bytes` queued on the
// default stream: the free waits for the device, so it costs what the queued work has left to do.
// Shown on stderr only (its price depends on the work, which the cost file cannot say).
absl::Status MeasureFreeAfterWork(const DriverCalls& d, std::size_t work_bytes, Budget& budget, Measurement* m) {
  const std::size_t bytes = kAllocationSizes.front();
  CUdeviceptr work = 0;
  if (CUresult e = d.mem_alloc(&work, work_bytes); e != CUDA_SUCCESS) {
    return d.Error(absl::StrCat("cuMemAlloc(", SizeText(work_bytes), ")"), e);
  }
  std::vector<double> us;
  absl::Status status;
  budget.StartSeries();
  for (int done = -1; status.ok() && (done < 0 || budget.Another(done, kLargeRepetitions)); ++done) {
    CUdeviceptr p = 0;
    if (CUresult e = d.mem_alloc(&p, bytes); e != CUDA_SUCCESS) {
      status = d.Error(absl::StrCat("cuMemAlloc(", SizeText(bytes), ")"), e);
      break;
    }
    const cudaError_t queued = cudaMemsetAsync(reinterpret_cast<void*>(work), done & 0xff, work_bytes, nullptr);
    if (CUresult e = Timed(done >= 0 ? &us : nullptr, [&] { return d.mem_free(p); }); e != CUDA_SUCCESS) {
      status = d.Error(absl::StrCat("cuMemFree(", SizeText(bytes), ") after queued work"), e);
    } else if (queued != cudaSuccess) {
      status = CudaError(absl::StrCat("cudaMemsetAsync(", SizeText(work_bytes), ", the default stream)"), queued);
    }
  }
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess && status.ok()) {
    status = CudaError("cudaDeviceSynchronize after the queued work", e);
  }
  if (CUresult e = d.mem_free(work); e != CUDA_SUCCESS && status.ok()) {
    status = d.Error(absl::StrCat("cuMemFree(", SizeText(work_bytes), ")"), e);
  }
  if (!status.ok()) return status;
  const Point p = Summarize(bytes, std::move(us));
  m->stderr_only.push_back(
      Format("cuMemFree of %s after a cudaMemsetAsync of %s queued on the default stream: mean %.3f us, p99 %.3f us "
             "(%d reps); the free waits for the device, so this stall depends on the work queued",
             SizeText(bytes).c_str(), SizeText(work_bytes).c_str(), p.mean_us, p.p99_us, p.repetitions));
  return absl::OkStatus();
}

// What backend:vmm creates and grants (cuda/vmm_backend.cc, MakeVmmBackend): pinned memory of the
// device, GPUDirect RDMA capable where the device has it with VMM, requestedHandleTypes a POSIX file
// descriptor unless the driver refused that type (then `plain`, as the backend falls back), and
// read-write access for the device and each peer that can access it.
struct VmmProps {
  CUmemAllocationProp plain = {};
  CUmemAllocationProp shareable = {};
  bool use_shareable = true;
  std::vector<CUmemAccessDesc> access;

  const CUmemAllocationProp* Prop() const { return use_shareable ? &shareable : &plain; }
};

// Whether cuMemCreate's `error` with a handle type requested can be the refusal of that type
// (cuda/vmm_backend.cc's MayRefuseHandleType).
bool MayRefuseHandleType(CUresult error) {
  return error == CUDA_ERROR_NOT_SUPPORTED || error == CUDA_ERROR_INVALID_VALUE || error == CUDA_ERROR_NOT_PERMITTED;
}

// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and cuMemRelease of `bytes` handles, in batches
// of at most `batch` mapped side by side from `va` (a reservation of at least batch x bytes).
absl::Status MeasureVmm(const DriverCalls& d, const VmmProps& props, CUdeviceptr va, std::size_t bytes,
                        std::size_t batch, Budget& budget, Measurement* m) {
  const std::string size = SizeText(bytes);
  const int max = RepetitionsFor(bytes);
  std::array<std::vector<double>, 5> us;  // create, map, set access (per handle), unmap, release
  std::vector<double> run_us;             // set access over the whole first batch (stderr only)
  std::size_t run_handles = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::size_t mapped = 0, unmapped = 0, released = 0;  // handles[unmapped, mapped) mapped, [released...) live
  auto fail = [&](absl::Status s) {
    for (std::size_t i = unmapped; i < mapped; ++i) d.mem_unmap(va + i * bytes, bytes);
    for (std::size_t i = released; i < handles.size(); ++i) d.mem_release(handles[i]);
    return s;
  };
  enum class Mode { kWarmUp, kRun, kPerHandle };
  auto one_batch = [&](std::size_t n, Mode mode) -> absl::Status {
    const bool timed = mode != Mode::kWarmUp;
    auto into = [&](std::size_t i) { return timed ? &us[i] : nullptr; };
    handles.clear();
    mapped = unmapped = released = 0;
    // Whether the batch may take another handle: n at most, and fewer once the budget share is spent.
    auto another = [&] {
      if (handles.size() >= n) return false;
      if (mode == Mode::kPerHandle) return budget.Another(Count(us[2]) + static_cast<int>(handles.size()), max);
      return mode == Mode::kWarmUp || budget.Another(static_cast<int>(handles.size()), static_cast<int>(n));
    };
    while (another()) {
      CUmemGenericAllocationHandle h = 0;
      if (CUresult e = Timed(into(0), [&] { return d.mem_create(&h, bytes, props.Prop(), 0); }); e != CUDA_SUCCESS) {
        return fail(d.Error(absl::StrCat("cuMemCreate(", size, ")"), e));
      }
      handles.push_back(h);
    }
    const std::size_t count = handles.size();
    for (; mapped < count; ++mapped) {
      const CUdeviceptr at = va + mapped * bytes;
      if (CUresult e = Timed(into(1), [&] { return d.mem_map(at, bytes, 0, handles[mapped], 0); }); e != CUDA_SUCCESS) {
        return fail(d.Error(absl::StrCat("cuMemMap(", size, ")"), e));
      }
    }
    if (mode == Mode::kRun) {
      if (CUresult e = Timed(
              &run_us, [&] { return d.mem_set_access(va, count * bytes, props.access.data(), props.access.size()); });
          e != CUDA_SUCCESS) {
        return fail(d.Error(absl::StrCat("cuMemSetAccess(", count, " x ", size, ")"), e));
      }
      run_handles = count;
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        const CUdeviceptr at = va + i * bytes;
        if (CUresult e =
                Timed(into(2), [&] { return d.mem_set_access(at, bytes, props.access.data(), props.access.size()); });
            e != CUDA_SUCCESS) {
          return fail(d.Error(absl::StrCat("cuMemSetAccess(", size, ")"), e));
        }
      }
    }
    // Touched, untimed: unmapping and releasing then free memory that was used.
    if (cudaError_t e = cudaMemset(reinterpret_cast<void*>(va), 0, count * bytes); e != cudaSuccess) {
      return fail(CudaError(absl::StrCat("cudaMemset(", count, " x ", size, ")"), e));
    }
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
      return fail(CudaError(absl::StrCat("cudaDeviceSynchronize after cudaMemset(", count, " x ", size, ")"), e));
    }
    while (unmapped < count) {
      const CUdeviceptr at = va + unmapped * bytes;
      if (CUresult e = Timed(into(3), [&] { return d.mem_unmap(at, bytes); }); e != CUDA_SUCCESS) {
        ++unmapped;  // not retried
        return fail(d.Error(absl::StrCat("cuMemUnmap(", size, ")"), e));
      }
      ++unmapped;
    }
    while (released < count) {
      const CUmemGenericAllocationHandle h = handles[released++];
      if (CUresult e = Timed(into(4), [&] { return d.mem_release(h); }); e != CUDA_SUCCESS) {
        return fail(d.Error(absl::StrCat("cuMemRelease(", size, ")"), e));
      }
    }
    return absl::OkStatus();
  };
  budget.StartSeries();
  if (absl::Status s = one_batch(1, Mode::kWarmUp); !s.ok()) return s;
  if (absl::Status s = one_batch(batch, Mode::kRun); !s.ok()) return s;
  while (budget.Another(Count(us[2]), max)) {
    if (absl::Status s = one_batch(std::min(batch, static_cast<std::size_t>(max - Count(us[2]))), Mode::kPerHandle);
        !s.ok()) {
      return s;
    }
  }
  const Point run = Summarize(bytes * run_handles, std::move(run_us));
  const Point per_handle = Summarize(bytes, us[2]);
  m->stderr_only.push_back(
      Format("cuMemSetAccess over one run of %d x %s (as backend:vmm grants a run): %.3f us, %.3f us a handle; "
             "one call per %s handle: mean %.3f us",
             static_cast<int>(run_handles), size.c_str(), run.mean_us, run.mean_us / static_cast<double>(run_handles),
             size.c_str(), per_handle.mean_us));
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
  if (devices <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("--device ", device_index, ": no CUDA device is present"));
  }
  if (device_index < 0 || device_index >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", device_index, " is out of range: accepted 0 to ",
                                                   devices - 1, " (", devices, " CUDA device(s) present)"));
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
  auto attribute = [&](CUdevice_attribute attr, const char* name, int* value) -> absl::Status {
    if (CUresult e = d.device_get_attribute(value, attr, device); e != CUDA_SUCCESS) {
      return d.Error(absl::StrCat("cuDeviceGetAttribute(", name, ")"), e);
    }
    return absl::OkStatus();
  };
  int vmm = 0, rdma = 0;
  if (absl::Status s = attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", &vmm);
      !s.ok()) {
    return s;
  }
  if (vmm == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device_index,
        " does not support virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)"));
  }
  if (absl::Status s = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                 "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", &rdma);
      !s.ok()) {
    return s;
  }
  // backend:vmm's allocation properties and access descriptors (cuda/vmm_backend.cc).
  VmmProps props;
  props.plain.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.plain.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.plain.location.id = device;
  if (rdma != 0) props.plain.allocFlags.gpuDirectRDMACapable = 1;
  props.shareable = props.plain;
  props.shareable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  auto grant = [&](CUdevice to) {
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = to;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    props.access.push_back(desc);
  };
  grant(device);
  for (int peer = 0; peer < devices; ++peer) {
    if (peer == device_index) continue;
    CUdevice other = 0;
    if (CUresult e = d.device_get(&other, peer); e != CUDA_SUCCESS) {
      return d.Error(absl::StrCat("cuDeviceGet(", peer, ")"), e);
    }
    int can = 0;
    if (CUresult e = d.device_can_access_peer(&can, other, device); e != CUDA_SUCCESS) {
      return d.Error(absl::StrCat("cuDeviceCanAccessPeer(", peer, ", ", device_index, ")"), e);
    }
    if (can != 0) grant(other);
  }
  if (CUresult e = d.mem_get_allocation_granularity(&m.granularity, &props.plain, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      e != CUDA_SUCCESS || m.granularity == 0) {
    return d.Error("cuMemGetAllocationGranularity", e != CUDA_SUCCESS ? e : CUDA_ERROR_INVALID_VALUE);
  }
  // The handle type, as backend:vmm's first cuMemCreate decides it (untimed): a POSIX file
  // descriptor, unless the driver refuses that type and creates without it.
  {
    CUmemGenericAllocationHandle h = 0;
    CUresult e = d.mem_create(&h, m.granularity, &props.shareable, 0);
    if (e != CUDA_SUCCESS && MayRefuseHandleType(e) &&
        d.mem_create(&h, m.granularity, &props.plain, 0) == CUDA_SUCCESS) {
      props.use_shareable = false;
      m.notes.push_back(absl::StrCat("cuMemCreate measured without requestedHandleTypes (",
                                     d.Error("a POSIX file descriptor", e).message(), "), as backend:vmm falls back"));
      e = CUDA_SUCCESS;
    }
    if (e != CUDA_SUCCESS) return d.Error(absl::StrCat("cuMemCreate(", SizeText(m.granularity), ")"), e);
    if (CUresult r = d.mem_release(h); r != CUDA_SUCCESS) return d.Error("cuMemRelease", r);
  }
  m.notes.push_back(absl::StrCat("cuMemCreate: pinned", rdma != 0 ? ", GPUDirect RDMA capable" : "",
                                 props.use_shareable ? ", requestedHandleTypes POSIX file descriptor" : "",
                                 "; cuMemSetAccess read-write for ", props.access.size(), " device(s)"));

  // The sizes that fit in half the free memory, the VMM sizes rounded to the granularity, and the
  // batch of each: its repetitions at most, and batch x size at most half the free memory.
  const std::size_t half_free = m.free_bytes / 2;
  auto batch_of = [&](std::size_t bytes) {
    return std::max<std::size_t>(
        1, std::min(static_cast<std::size_t>(RepetitionsFor(bytes)), half_free / std::max<std::size_t>(bytes, 1)));
  };
  std::vector<std::size_t> malloc_sizes, vmm_sizes, reserve_sizes;
  for (std::size_t bytes : kAllocationSizes) {
    if (bytes > half_free) {
      m.notes.push_back(absl::StrCat(SizeText(bytes), " left out of cudaMalloc and cuMemCreate: more than half of the ",
                                     SizeText(m.free_bytes), " free"));
      continue;
    }
    malloc_sizes.push_back(bytes);
    const std::size_t rounded = RoundUp(bytes, m.granularity);
    if (rounded <= half_free && (vmm_sizes.empty() || rounded > vmm_sizes.back())) vmm_sizes.push_back(rounded);
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

  Budget budget(budget_s, static_cast<int>(malloc_sizes.size() + vmm_sizes.size() + reserve_sizes.size() + 2));
  if (absl::Status s = MeasureSynchronize(budget, &m); !s.ok()) return s;
  for (std::size_t bytes : malloc_sizes) {
    if (absl::Status s = MeasureMalloc(d, bytes, batch_of(bytes), budget, &m); !s.ok()) return s;
  }
  // One address range for every VMM batch, reserved outside the timed calls.
  std::size_t range = 0;
  for (std::size_t bytes : vmm_sizes) range = std::max(range, batch_of(bytes) * bytes);
  CUdeviceptr va = 0;
  if (CUresult e = d.mem_address_reserve(&va, range, 0, 0, 0); e != CUDA_SUCCESS) {
    return d.Error(absl::StrCat("cuMemAddressReserve(", SizeText(range), ")"), e);
  }
  for (std::size_t bytes : vmm_sizes) {
    if (absl::Status s = MeasureVmm(d, props, va, bytes, batch_of(bytes), budget, &m); !s.ok()) {
      d.mem_address_free(va, range);
      return s;
    }
  }
  if (CUresult e = d.mem_address_free(va, range); e != CUDA_SUCCESS) {
    return d.Error("cuMemAddressFree of the VMM range", e);
  }
  for (std::size_t bytes : reserve_sizes) {
    if (absl::Status s = MeasureReserve(d, bytes, budget, &m); !s.ok()) return s;
  }
  if (m.points[kAddressReserve].empty()) {
    return absl::FailedPreconditionError("cuMemAddressReserve refused every size measured");
  }
  // Last: its repetitions take as long as the work queued, whatever the budget.
  if (absl::Status s = MeasureFreeAfterWork(d, malloc_sizes.back(), budget, &m); !s.ok()) return s;
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
  std::fprintf(stderr,
               "cudaMalloc, cudaFree: cuMemAlloc and cuMemFree (what backend:cuda calls), in batches\n"
               "synchronize: an idle cudaDeviceSynchronize, the round trip only; not a wait on queued work (that "
               "costs what the work costs)\n");
  for (const std::string& note : m.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  for (const std::string& line : m.stderr_only) std::fprintf(stderr, "not in the cost file: %s\n", line.c_str());
}

// Whether `path` can be opened for writing, checked before measuring: an existing file is opened
// for appending (nothing written), a new one created and removed again.
absl::Status CheckWritable(const std::string& path) {
  auto error = [&](int errno_value) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write -o ", path, ": ", std::strerror(errno_value), " (checked before measuring)"));
  };
  if (int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC); fd >= 0) {
    ::close(fd);
    return absl::OkStatus();
  }
  if (errno != ENOENT) return error(errno);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return error(errno);
  ::close(fd);
  if (::unlink(path.c_str()) != 0) return error(errno);
  return absl::OkStatus();
}

// --budget-s's check: a finite number of seconds in [kMinBudgetSeconds, kMaxBudgetSeconds] (NaN and
// infinity are refused: CLI::Range lets NaN through).
std::string CheckBudget(std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < kMinBudgetSeconds ||
      v > kMaxBudgetSeconds) {
    return absl::StrCat("accepted a positive finite number of seconds from ", kMinBudgetSeconds, " to ",
                        kMaxBudgetSeconds, " (e.g. 1 to 3600), got \"", text, "\"");
  }
  return "";
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
  app.add_option("--device", device, "the CUDA device to measure (0 to the device count - 1)");
  app.add_option("--budget-s", budget_s, "seconds the whole measurement may take before it stops adding repetitions")
      ->check(CLI::Validator(CheckBudget, absl::StrCat("SECONDS in [", kMinBudgetSeconds, ", ", kMaxBudgetSeconds, "]"),
                             "BUDGET"));
  app.add_option("--profile", profile,
                 "the profile's name (default: \"measured-\" and the GPU's name, lower-cased, spaces as '-')");
  CLI11_PARSE(app, argc, argv);

  if (!output.empty()) {
    if (absl::Status s = CheckWritable(output); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProgram, std::string(s.message()).c_str());
      return 1;
    }
  }
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
  errno = 0;
  std::ofstream out(output);
  out << json;
  out.close();
  if (!out) {
    const int error = errno;
    std::fprintf(stderr, "%s: cannot write %s%s%s\n", kProgram, output.c_str(), error != 0 ? ": " : "",
                 error != 0 ? std::strerror(error) : "");
    return 1;
  }
  std::fprintf(stderr, "%s: wrote %s\n", kProgram, output.c_str());
  return 0;
}

}  // namespace
}  // namespace bucketalloc::tools

int main(int argc, char** argv) { return bucketalloc::tools::Run(argc, argv); }
