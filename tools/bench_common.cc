// tools/bench_common.cc — what the replay subcommands of bucketalloc-bench share.
#include "bench_common.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "bucketalloc/options.h"
#include "harness/replay/policies.h"

namespace bucketalloc::bench {

int Fail(const absl::Status& s, const std::string& prefix) {
  std::fprintf(stderr, "%s: %s\n", prefix.c_str(), std::string(s.message()).c_str());
  return 1;
}

bool WriteText(const std::string& path, const std::string& text, const std::string& prefix) {
  if (path.empty()) return true;
  std::ofstream out(path);
  out << text << "\n";
  if (!out) {
    std::fprintf(stderr, "%s: cannot write %s\n", prefix.c_str(), path.c_str());
    return false;
  }
  return true;
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
  sub->add_option("--malloc-us", cost_.malloc_us, "simulated cost of a backend allocation (us)")->capture_default_str();
  sub->add_option("--free-us", cost_.free_us, "simulated cost of a backend free (us)")->capture_default_str();
  sub->add_option("--vmm-call-us", cost_.vmm_call_us,
                  "simulated cost of one virtual-memory call: create, release, map or unmap of a granule (us)")
      ->capture_default_str();
}

absl::StatusOr<harness::ReplayDeviceKind> DeviceFlags::Device() const {
  return harness::ParseReplayDeviceKind(device_name_);
}

harness::ReplayOptions DeviceFlags::Options(const std::string& allocator, std::size_t capacity,
                                            harness::ReplayDeviceKind device) const {
  harness::ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.cost = cost_;
  o.device = device;
  return o;
}

}  // namespace bucketalloc::bench
