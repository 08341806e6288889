// src/harness/replay/policies.cc — the table of replay policies (harness/replay/policies.h).
#include "harness/replay/policies.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/options.h"
#include "bucketalloc/units.h"

namespace bucketalloc::harness {

// The factories, one per policy file.
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeBucketallocPolicy(absl::string_view conf, std::size_t capacity,
                                                                       ReplayDeviceKind kind, DriverMeter* meter);
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchPolicy(absl::string_view conf, std::size_t capacity,
                                                                   ReplayDeviceKind kind, DriverMeter* meter);
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakePyTorchExpandablePolicy(absl::string_view conf,
                                                                             std::size_t capacity,
                                                                             ReplayDeviceKind kind, DriverMeter* meter);
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeNoCachePolicy(absl::string_view conf, std::size_t capacity,
                                                                   ReplayDeviceKind kind, DriverMeter* meter);

namespace {

constexpr PolicyEntry kPolicies[] = {
    {"bucketalloc", true,
     "bucketalloc itself; a CONF is a BUCKETALLOC_CONF of its policy options (docs/configuration.md) and "
     "backend:vmm (stitching)",
     MakeBucketallocPolicy},
    {"pytorch-policy", true,
     "a model of PyTorch's native CUDA caching allocator; a CONF is PyTorch's own, of the keys modelled: "
     "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, large_segment_size_mb",
     MakePyTorchPolicy},
    {"pytorch-expandable", true,
     "a model of PyTorch's caching allocator with expandable_segments:True (pages of 2 MiB in the small pool, 20 MiB "
     "in the large); a CONF of large_page_mb=N sets the large pool's page (an even number of MiB)",
     MakePyTorchExpandablePolicy},
    {"nocache", false, "one backend call per request (cudaMalloc/cudaFree), memory rounded to 2 MiB",
     MakeNoCachePolicy},
};

// The row `spec` names and its CONF ("" when none), or nullptr.
const PolicyEntry* FindPolicy(absl::string_view spec, absl::string_view* conf) {
  for (const PolicyEntry& p : kPolicies) {
    if (spec == p.name) {
      *conf = {};
      return &p;
    }
    if (absl::StartsWith(spec, p.name) && spec.size() > std::strlen(p.name) && spec[std::strlen(p.name)] == ':') {
      *conf = spec.substr(std::strlen(p.name) + 1);
      return &p;
    }
  }
  return nullptr;
}

}  // namespace

std::string PolicySpecsText() {
  std::vector<std::string> specs;
  for (const PolicyEntry& p : kPolicies) {
    specs.push_back(p.name);
    if (p.takes_conf) specs.push_back(absl::StrCat(p.name, ":CONF"));
  }
  return absl::StrJoin(specs, ", ");
}

std::string PolicyHelpText() {
  std::string out;
  for (const PolicyEntry& p : kPolicies)
    absl::StrAppend(&out, "\n  ", p.name, p.takes_conf ? "[:CONF]" : "", ": ", p.help);
  return out;
}

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeReplayAllocator(absl::string_view spec, std::size_t capacity,
                                                                     ReplayDeviceKind kind, DriverMeter* meter) {
  if (capacity < kReplayGranularity) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity ", capacity, " bytes is too small; accepted: 2 MiB or more"));
  }
  if (kind == ReplayDeviceKind::kSim && capacity > kMaxSimReplayCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("capacity ", SizeText(capacity),
                                                   " is more than the simulated device can hold; accepted: 2MiB to ",
                                                   SizeText(kMaxSimReplayCapacity)));
  }
  capacity = ReplayCapacity(capacity);
  absl::string_view conf;
  const PolicyEntry* policy = FindPolicy(spec, &conf);
  if (policy == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocator \"", spec, "\" is unknown; accepted: ", PolicySpecsText()));
  }
  if (!conf.empty() && !policy->takes_conf) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocator \"", spec, "\": ", policy->name, " takes no CONF; accepted: ", PolicySpecsText()));
  }
  return policy->make(conf, capacity, kind, meter);
}

absl::StatusOr<std::vector<std::string>> SplitAllocatorList(absl::string_view list) {
  absl::StatusOr<std::vector<std::string>> pieces = SplitOptionList(list);
  if (!pieces.ok()) return pieces.status();
  std::vector<std::string> out;
  if (pieces->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the allocator list is empty; accepted: a comma-separated list of ", PolicySpecsText()));
  }
  for (std::string& p : *pieces) {
    absl::string_view conf;
    const PolicyEntry* named = FindPolicy(p, &conf);
    absl::string_view last_conf;
    const PolicyEntry* last = out.empty() ? nullptr : FindPolicy(out.back(), &last_conf);
    if (named == nullptr && last != nullptr && last->takes_conf && !last_conf.empty()) {
      absl::StrAppend(&out.back(), ",", p);
    } else {
      out.push_back(std::move(p));
    }
  }
  return out;
}

absl::Status CheckAllocators(const std::vector<std::string>& specs, std::size_t capacity, ReplayDeviceKind kind) {
  for (const std::string& spec : specs) {
    absl::StatusOr<std::unique_ptr<ReplayAllocator>> made = MakeReplayAllocator(spec, capacity, kind);
    if (!made.ok()) return made.status();
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::harness
