// bucketalloc/options.h — runtime options (BUCKETALLOC_CONF and the C++ API).
//
// Owns: the `Options` struct, its parser for the `key:value,key:value` syntax of PyTorch's
// PYTORCH_CUDA_ALLOC_CONF, and the one option table from which parsing, docs/configuration.md and
// the debug dump are generated (src/frontend/options.cc).
// Layer: L4 (front end); plain data, no allocation decisions.
// Thread-safety: Options is a value type; the functions are pure.
//
// Example:
//   absl::StatusOr<bucketalloc::Options> o = bucketalloc::ParseOptions(
//       "backend:sim,capacity:8GiB,tiers_tokens:[512,1024,2048,4096],bytes_per_token:131072");
//   if (!o.ok()) std::cerr << o.status();   // names the key, the value and what is accepted
#ifndef BUCKETALLOC_OPTIONS_H_
#define BUCKETALLOC_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace bucketalloc {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;
// "No limit" for size options (PyTorch's SIZE_MAX default of max_split_size).
inline constexpr std::size_t kUnlimited = ~std::size_t{0};

// kVmm: the CUDA device through the driver's virtual memory management API, with stitching.
enum class BackendKind { kSim, kCuda, kVmm };

// Every field is one row of the option table; see docs/configuration.md for the meaning of each.
struct Options {
  BackendKind backend = BackendKind::kCuda;

  // Capacity: the cap is the smaller of `capacity` (0 = none) and memory_fraction x device memory.
  std::size_t capacity = 0;
  double memory_fraction = 1.0;
  double garbage_collection_threshold = 0.0;  // 0 = off; else in (0, 1)

  // Pools.
  std::size_t small_pool_limit = kMiB;
  std::size_t max_split_size = kUnlimited;
  std::size_t max_non_split_rounding = 20 * kMiB;
  std::size_t large_segment_size = 20 * kMiB;
  // roundup_power2_divisions per power-of-two interval from 1 MiB (index 0) to 32 GiB+ (15).
  std::vector<std::uint32_t> roundup_power2_divisions = std::vector<std::uint32_t>(16, 0);

  // Virtual-memory stitching of the large pool (docs/vmm.md). PyTorch's key: with backend:cuda it
  // selects the vmm backend; with backend:sim the simulated device's VMM twin. backend:vmm implies it.
  bool expandable_segments = false;

  // Tiers for the large pool, in bytes (ascending, already multiplied out). Empty = off.
  std::vector<std::size_t> tiers;
  // Tiers given as token counts; multiplied by bytes_per_token when the options are resolved.
  std::vector<std::uint64_t> tiers_tokens;
  std::size_t bytes_per_token = 0;
  // A request is rounded to tier t only when request >= tier_min_fill x t.
  double tier_min_fill = 0.5;

  // The simulated device.
  std::size_t sim_total_memory = 16 * kGiB;
  bool sim_unbacked = false;
  int sim_devices = 1;
  std::int64_t sim_fail_nth_alloc = 0;
  double sim_fail_fraction = 0.0;
  std::uint64_t sim_seed = 1;

  // Before a slow path, ask the backend whether the allocating stream is capturing a CUDA graph
  // (for hosts that do not announce captures). Hosts whose stream arguments are not CUDA stream
  // handles (the LD_PRELOAD shim's pool keys) turn it off and handle capture themselves.
  bool probe_stream_capture = true;

  // Debugging: run CheckInvariants() after every slow-path event. A debug build of the library
  // (compiled without NDEBUG) always does.
  bool debug_check_invariants = false;

  // Returns the tier sizes in bytes (from `tiers` or `tiers_tokens` x `bytes_per_token`), each
  // rounded up to `granularity`, ascending and unique.
  std::vector<std::size_t> ResolvedTiers(std::size_t granularity) const;
  // True when the large pool stitches: backend:vmm, or expandable_segments.
  bool Stitching() const { return backend == BackendKind::kVmm || expandable_segments; }
};

// Parses `conf` ("key:value,key:value", lists as "[a,b,c]") on top of `base`. An unknown key, a
// bad value or an inconsistent combination is InvalidArgumentError naming the key, the value and
// what is accepted. Empty `conf` returns `base`.
absl::StatusOr<Options> ParseOptions(absl::string_view conf, const Options& base = Options());

// Parses the BUCKETALLOC_CONF environment variable (unset = defaults).
absl::StatusOr<Options> OptionsFromEnv();

// Checks the combination of fields (ranges, tiers); ParseOptions calls it too.
absl::Status ValidateOptions(const Options& options);

// Returns every option as "key:value" joined by ',' (parseable by ParseOptions).
std::string FormatOptions(const Options& options);

// Returns the Markdown table of all options (name, accepted values, default, meaning) that
// docs/configuration.md embeds; a test keeps the two equal.
std::string OptionsMarkdownTable();

// Returns "sim", "cuda" or "vmm".
absl::string_view BackendName(BackendKind kind);

// Parses a size: "123", "64KiB", "20MiB", "1.5GiB" (also KB/MB/GB as binary units, case-insensitive).
absl::StatusOr<std::size_t> ParseSize(absl::string_view text);
// Formats bytes as e.g. "20.00 MiB".
std::string FormatBytes(std::size_t bytes);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_OPTIONS_H_
