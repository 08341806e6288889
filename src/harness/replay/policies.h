// src/harness/replay/policies.h — the allocator policies a replay can run, by name (layer L5).
//
// Owns: `PolicyEntry`, one row per policy (its name, whether it takes a BUCKETALLOC_CONF, its help
// text, its factory), MakeReplayAllocator, which makes the policy a spec names, and
// SplitAllocatorList, which splits compare's --allocators list.
//   bucketalloc            bucketalloc with its defaults            (harness/replay/policy_bucketalloc.cc)
//   bucketalloc:CONF       bucketalloc with a BUCKETALLOC_CONF string, e.g. bucketalloc:max_split_size_mb:256
//   pytorch-policy[:CONF]  a model of PyTorch's native caching allocator, a CONF of PyTorch's keys it
//                          follows (harness/replay/policy_pytorch.cc), e.g. pytorch-policy:max_split_size_mb:256
//   pytorch-expandable[:large_page_mb=N]
//                          the same with expandable_segments:True (harness/replay/policy_pytorch_expandable.cc)
//   nocache                one backend call per request (cudaMalloc/cudaFree) (harness/replay/policy_nocache.cc)
// Each runs on a device of exactly the capacity (harness/replay/replay_allocator.h), so a request that the
// policy cannot place fails as it would on a card of that size.
// Adding a policy: its file (defining its factory), its row in policies.cc, and its test.
// Thread-safety: a constant table.
//
// Example:
//   absl::StatusOr<std::unique_ptr<ReplayAllocator>> a = MakeReplayAllocator("bucketalloc:tiers:[64MiB]", 80ull << 30);
#ifndef BUCKETALLOC_HARNESS_REPLAY_POLICIES_H_
#define BUCKETALLOC_HARNESS_REPLAY_POLICIES_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "harness/replay/replay_allocator.h"

namespace bucketalloc::harness {

struct PolicyEntry {
  const char* name;
  // True when the policy takes "name:CONF" (a BUCKETALLOC_CONF of its options).
  bool takes_conf;
  const char* help;
  // Makes the policy over a device of `capacity` bytes (a positive multiple of 2 MiB) of `kind`.
  // `conf` is empty unless takes_conf. InvalidArgument names a bad CONF and what is accepted. Its
  // device's calls go through MeterBackend when `meter` is not null.
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> (*make)(absl::string_view conf, std::size_t capacity,
                                                           ReplayDeviceKind kind, DriverMeter* meter);
};

// "bucketalloc, bucketalloc:CONF, pytorch-policy, pytorch-policy:CONF, pytorch-expandable,
// pytorch-expandable:CONF, nocache": what a spec may be.
std::string PolicySpecsText();
// One line per policy, "\n  name[:CONF]: its help", for a command line's help.
std::string PolicyHelpText();

// Creates the allocator named by `spec` ("name" or "name:CONF") on a device of `capacity` bytes
// (rounded down to 2 MiB), the device made now. InvalidArgument names a bad spec, capacity or
// configuration and what is accepted; a device that cannot be made (CUDA without a usable device,
// a simulated device whose address space this process may not reserve) is FailedPrecondition
// (ReplayDeviceError), for every policy alike. With a `meter` (which must outlive the allocator),
// every driver call of the allocator's device is priced and attributed there (driver_meter.h).
absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeReplayAllocator(absl::string_view spec, std::size_t capacity,
                                                                     ReplayDeviceKind kind = ReplayDeviceKind::kSim,
                                                                     DriverMeter* meter = nullptr);
// The most a simulated replay device holds (the sim backend's sim_total_memory limit).
inline constexpr std::size_t kMaxSimReplayCapacity = std::size_t{4} << 40;

// Makes (and drops) each allocator of `specs`, so that a bad name, CONF or capacity is reported
// before anything is replayed; the first error.
absl::Status CheckAllocators(const std::vector<std::string>& specs, std::size_t capacity,
                             ReplayDeviceKind kind = ReplayDeviceKind::kSim);

// Splits compare's --allocators list. A BUCKETALLOC_CONF has commas of its own, so the list splits
// as the option table splits a CONF (at commas outside brackets), and a piece that does not start
// with a policy's name continues the previous one's CONF:
//   "bucketalloc,bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048,nocache"
//   -> {"bucketalloc", "bucketalloc:tiers_tokens:[1024,2048],bytes_per_token:2048", "nocache"}
// InvalidArgument names unbalanced brackets, and an empty list.
absl::StatusOr<std::vector<std::string>> SplitAllocatorList(absl::string_view list);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_POLICIES_H_
