// tools/bench_common.cc — what the replay subcommands of bucketalloc-bench share.
#include "bench_common.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/options.h"
#include "harness/replay/policies.h"
#include "harness/replay/trace.h"

namespace bucketalloc::bench {

int Fail(const absl::Status& s, const std::string& prefix) {
  std::fprintf(stderr, "%s: %s\n", prefix.c_str(), std::string(s.message()).c_str());
  return 1;
}

bool WriteText(const std::string& path, const std::string& text, const std::string& prefix) {
  if (path.empty()) return true;
  if (absl::Status s = harness::WriteWholeFile(path, text + "\n", "the output"); !s.ok()) return Fail(s, prefix) == 0;
  return true;
}

CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!absl::SimpleAtod(text, &v)) return absl::StrCat("Value ", text, " is not a number");
        if (std::isnan(v)) return absl::StrCat("Value ", text, " is not a number; accepted: ", lo, " to ", hi);
        if (!(v >= lo && v <= hi)) return absl::StrCat("Value ", text, " not in range [", lo, " - ", hi, "]");
        return std::string();
      },
      absl::StrCat("FLOAT in [", lo, " - ", hi, "]"));
}

bool CheckOutputs(std::initializer_list<std::string> paths, const std::string& prefix) {
  for (const std::string& path : paths) {
    if (path.empty()) continue;
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(path, error);
    if (std::filesystem::is_directory(status)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(path, " is a directory; accepted: a file to write")),
                  prefix) == 0;
    }
    const bool existed = std::filesystem::exists(status);
    // A regular file, or one to create, is opened (neither truncated nor written) and closed; anything
    // else (a FIFO, whose reader an open and close would end; a device) is only asked about.
    bool writable = true;
    if (!existed || std::filesystem::is_regular_file(status)) {
      std::FILE* f = std::fopen(path.c_str(), "a");
      writable = f != nullptr;
      if (f != nullptr) std::fclose(f);
      if (writable && !existed) std::filesystem::remove(path, error);
    } else {
      writable = access(path.c_str(), W_OK) == 0;
    }
    if (!writable) {
      const absl::Status s =
          absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open it for writing (checked before any work)"));
      return Fail(s, prefix) == 0;
    }
  }
  return true;
}

int FinishOutput(int rc, const std::string& prefix) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "%s: writing the standard output failed: %s\n", prefix.c_str(), std::strerror(errno));
    return rc == 0 ? 1 : rc;
  }
  return rc;
}

absl::StatusOr<std::size_t> ParseCapacity(const std::string& text) {
  absl::StatusOr<std::size_t> c = ParseSize(text);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--capacity ", text, ": ", c.status().message()));
  }
  return c;
}

std::string AllocatorHelp() { return absl::StrCat("one of: ", harness::PolicySpecsText(), harness::PolicyHelpText()); }

void DeviceFlags::AddTo(CLI::App* sub, bool with_device) {
  if (with_device) {
    sub->add_option("--device", device_name_,
                    "sim (the simulated device) or cuda (GPU 0, capped at --capacity); min-capacity always bisects "
                    "on the simulated device")
        ->capture_default_str();
  }
  sub->add_option("--costs", costs_,
                  absl::StrCat("the driver calls' prices by call and size: a built-in profile (",
                               absl::StrJoin(harness::CostProfileNames(), ", "),
                               ") or the path of a JSON cost file, such as scripts/gpu_check.sh writes "
                               "(docs/harness.md, \"Driver time\")"))
      ->capture_default_str();
  malloc_flag_ = sub->add_option("--malloc-us", malloc_us_, "one price for every cudaMalloc (us), over --costs'");
  free_flag_ = sub->add_option("--free-us", free_us_, "one price for every cudaFree (us), over --costs'");
  vmm_flag_ = sub->add_option("--vmm-call-us", vmm_call_us_,
                              "one price for every virtual-memory call (create, release, map, set-access, unmap, "
                              "address reserve and free; us), over --costs'");
}

absl::StatusOr<harness::CostModel> DeviceFlags::Costs() const {
  absl::StatusOr<harness::CostModel> c = harness::LoadCostModel(costs_);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--costs ", costs_, ": ", c.status().message()));
  using harness::DriverCall;
  const struct {
    const CLI::Option* flag;
    double us;
    const char* note;
    std::initializer_list<DriverCall> calls;
  } overrides[] = {
      {malloc_flag_, malloc_us_, "malloc-us", {DriverCall::kMalloc}},
      {free_flag_, free_us_, "free-us", {DriverCall::kFree}},
      {vmm_flag_,
       vmm_call_us_,
       "vmm-call-us",
       {DriverCall::kCreate, DriverCall::kRelease, DriverCall::kMap, DriverCall::kSetAccess, DriverCall::kUnmap,
        DriverCall::kAddressReserve, DriverCall::kAddressFree}},
  };
  for (const auto& o : overrides) {
    if (o.flag == nullptr || o.flag->count() == 0) continue;
    for (DriverCall call : o.calls) {
      if (absl::Status s = c->Override(call, o.us, o.note); !s.ok()) return s;
    }
  }
  return c;
}

absl::StatusOr<harness::ReplayDeviceKind> DeviceFlags::Device() const {
  return harness::ParseReplayDeviceKind(device_name_);
}

absl::StatusOr<harness::ReplayOptions> DeviceFlags::Options(const std::string& allocator, std::size_t capacity,
                                                            harness::ReplayDeviceKind device) const {
  absl::StatusOr<harness::CostModel> costs = Costs();
  if (!costs.ok()) return costs.status();
  harness::ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.cost = *std::move(costs);
  o.device = device;
  return o;
}

}  // namespace bucketalloc::bench
