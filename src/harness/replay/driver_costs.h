// src/harness/replay/driver_costs.h — what each driver call costs a replay, by call and size (layer L5).
//
// Owns: `DriverCall` (the calls a replay prices: cudaMalloc, cudaFree, the virtual-memory family and
// synchronizations), `CostModel` (a profile: each call's price at one or more sizes), the built-in
// profiles and the JSON of a measured one (`--costs FILE`, which scripts/gpu_check.sh writes).
//
// A price is microseconds per call. A call of a size between two measured sizes is priced on the
// line between them; below the smallest, at the smallest's price; above the largest, at the
// largest's (a call, not a byte: no profile says how a call scales past what it measured). A
// synchronization (an explicit one; a cudaFree's own is part of cudaFree's price) is priced at its
// profile's `synchronize` entry: the round trip of an idle device, the least it stalls a request (the
// wait for queued work depends on the work; DriverTime counts synchronizations for that reason).
//
// Built-in profiles (docs/harness.md, "Driver time", gives the sources):
//   a100-published   the A100 run of a public VMM benchmark (2 MiB pages, 4,096 pages, one thread)
//   gpu2-published   the same benchmark's second, unnamed GPU
//   flat             the harness's old model: every VMM call 10 us, cudaMalloc 50, cudaFree 10, no stall
// Thread-safety: a CostModel is a value; Price is const.
//
// Example:
//   absl::StatusOr<CostModel> c = LoadCostModel("a100-published");  // or a file's path
//   double us = c->Price(DriverCall::kCreate, 2 << 20);             // 193.3
#ifndef BUCKETALLOC_HARNESS_REPLAY_DRIVER_COSTS_H_
#define BUCKETALLOC_HARNESS_REPLAY_DRIVER_COSTS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::harness {

enum class DriverCall : std::uint8_t {
  kMalloc,          // cudaMalloc (a failed one too)
  kFree,            // cudaFree, its implicit device synchronization included in its price
  kCreate,          // cuMemCreate (a failed one too)
  kRelease,         // cuMemRelease
  kMap,             // cuMemMap of one handle
  kSetAccess,       // cuMemSetAccess of a run (its bytes)
  kUnmap,           // cuMemUnmap of a run (its bytes)
  kAddressReserve,  // cuMemAddressReserve
  kAddressFree,     // cuMemAddressFree
  kSynchronize,     // a stream, event or device synchronization: the stall of waiting for queued work
};
inline constexpr std::size_t kDriverCalls = 10;
// The JSON key of a call ("cudaMalloc", "cuMemCreate", ..., "synchronize").
absl::string_view DriverCallName(DriverCall call);

// A call's price at one size.
struct CostPoint {
  std::size_t bytes = 0;
  double us = 0.0;
};

// The price of every driver call (the profile's points, sizes strictly increasing, at least one
// each), and the profile's name (what the JSON's driver_time.profile says).
class CostModel {
 public:
  // The a100-published profile.
  CostModel();
  const std::string& profile() const { return profile_; }
  // Microseconds for one `call` of `bytes` (a synchronization's bytes do not matter).
  double Price(DriverCall call, std::size_t bytes) const;
  const std::vector<CostPoint>& points(DriverCall call) const { return points_[static_cast<std::size_t>(call)]; }
  // Sets every size of `call` to one price (--malloc-us, --free-us, --vmm-call-us), and notes it in
  // the profile's name ("a100-published+vmm-call-us=10").
  // A price outside [0, kMaxCallMicroseconds] is InvalidArgument naming `note` as a flag.
  absl::Status Override(DriverCall call, double us, absl::string_view note);
  // The model as the JSON LoadCostModel reads.
  std::string ToJson() const;

 private:
  friend absl::StatusOr<CostModel> ParseCostModel(absl::string_view json, absl::string_view origin);
  friend CostModel BuiltInCostModel(int index);
  std::string profile_;
  std::array<std::vector<CostPoint>, kDriverCalls> points_;
};

// The built-in profiles' names, and one by name (InvalidArgument naming the accepted ones).
std::vector<std::string> CostProfileNames();
absl::StatusOr<CostModel> CostProfile(absl::string_view name);
// A cost model from JSON: {"profile": NAME, "source": TEXT (optional), "calls": {CALL: [{"bytes": N,
// "us": X, "p99_us": Y (optional, not priced)}, ...], ...}} with every DriverCallName as a CALL.
// InvalidArgument names `origin`, the field and what is accepted.
absl::StatusOr<CostModel> ParseCostModel(absl::string_view json, absl::string_view origin);
// `spec`: a built-in profile's name, or the path of a JSON file (ParseCostModel).
absl::StatusOr<CostModel> LoadCostModel(absl::string_view spec);

// The most one call may cost: a second. Prices outside [0, kMaxCallMicroseconds], or NaN, are refused.
inline constexpr double kMaxCallMicroseconds = 1e6;

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_DRIVER_COSTS_H_
