// bucketalloc/options.h — runtime options (BUCKETALLOC_CONF and the C++ API).
//
// Owns: the `Options` struct, its parser for the `key:value,key:value` syntax of PyTorch's
// PYTORCH_ALLOC_CONF, and the one option table (src/frontend/core/options.cc) whose rows each carry
// their key, accepted values, meaning, parsing, validation and formatting, from which parsing,
// validation, docs/configuration.md and the debug dump are generated. The keys a backend owns (the
// simulated device's sim_*) are rows of that backend's registry entry (src/backend/registry.h),
// read into `backend_settings`. Beside it, the table of PyTorch 2.15's allocator keys that are not
// options (each refused by name with the reason, or accepted only at PyTorch's default), and the
// environment: BUCKETALLOC_CONF, else PyTorch's own variables (docs/configuration.md, "PyTorch's
// variables").
// Layer: L4 (front end); plain data, no allocation decisions.
// Thread-safety: Options is a value type; the functions are pure, except that OptionsFromEnv
// prints its notice (stderr) once per process.
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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/units.h"

namespace bucketalloc {

// A tenant: a name and the cap on what its own pools reserve (docs/configuration.md, "Tenants").
struct TenantSpec {
  std::string name;
  std::size_t cap = 0;
  friend bool operator==(const TenantSpec&, const TenantSpec&) = default;
};
inline constexpr int kMaxTenants = 64;
inline constexpr std::size_t kMinTenantCap = std::size_t{2} << 20;  // one segment
inline constexpr std::size_t kMaxTenantCap = std::size_t{1} << 44;  // 16 TiB
inline constexpr bool TenantCapInRange(std::size_t cap) { return cap >= kMinTenantCap && cap <= kMaxTenantCap; }

// Every field is one row of the option table; see docs/configuration.md for the meaning of each.
struct Options {
  // A registered backend: "sim", "cuda" or "vmm" (the vmm backend stitches, see docs/vmm.md).
  std::string backend = "cuda";
  // The keys the backends own (sim_total_memory, ...), canonical text; an unset key takes its
  // default. Set by ParseOptions; a key or value set by hand is checked by ValidateOptions.
  BackendSettings backend_settings;

  // Capacity: the cap is the smaller of `capacity` (0 = none) and memory_fraction x device memory.
  std::size_t capacity = 0;
  double memory_fraction = 1.0;               // also PyTorch's per_process_memory_fraction
  double garbage_collection_threshold = 0.0;  // 0 = off; else in (0, 1)
  // PyTorch's key, read and kept (its row in options.cc says what each value does here).
  bool throw_on_cudamalloc_oom = false;

  // Pools.
  std::size_t small_pool_limit = kMiB;
  // Small requests up to this go to slabs, the others are packed in split 2 MiB segments (PyTorch's
  // small pool); 0: no slabs. Above small_pool_limit it changes nothing.
  std::size_t slab_limit = 0;
  std::size_t max_split_size = kUnlimited;
  std::size_t max_non_split_rounding = 20 * kMiB;
  std::size_t large_segment_size = 20 * kMiB;
  // roundup_power2_divisions per power-of-two interval from 1 MiB (index 0) to 32 GiB+ (15).
  std::vector<std::uint32_t> roundup_power2_divisions = std::vector<std::uint32_t>(16, 0);

  // Virtual-memory stitching of the large pool (docs/vmm.md). PyTorch's key: with backend:cuda it
  // selects the vmm backend; with backend:sim the simulated device's VMM twin. backend:vmm implies it.
  bool expandable_segments = false;
  // With stitching, a grow that is not at the cap creates physical pieces of this many bytes (the
  // last one of a grow smaller), one create, map and release each; at the cap, granules, which a
  // stitch can move one by one (docs/vmm.md, "What a piece is"). The default, a granule, keeps every
  // piece movable; larger pieces trade memory at the cap for driver calls on the request's path.
  std::size_t grow_piece = 2 * kMiB;

  // Tiers for the large pool, in bytes (ascending, already multiplied out). Empty = off.
  std::vector<std::size_t> tiers;
  // Tiers given as token counts; multiplied by bytes_per_token when the options are resolved.
  std::vector<std::uint64_t> tiers_tokens;
  std::size_t bytes_per_token = 0;
  // A request is rounded to tier t only when request >= tier_min_fill x t.
  double tier_min_fill = 0.5;

  // Tenants with their own pools, caps and stats; an allocation no tenant is bound to goes to the
  // default tenant (the device's own pools, under the device's cap). Empty: none.
  std::vector<TenantSpec> tenants;
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
  // True when the large pool stitches: a backend that always does (vmm), or expandable_segments.
  bool Stitching() const;
  // The backend that serves the devices: `backend`, or the one that stitches in its place when
  // expandable_segments asks for stitching (cuda -> vmm).
  std::string DeviceBackend() const;
};

// Parses `conf` ("key:value,key:value", lists as "[a,b,c]") on top of `base`. An unknown key, a
// bad value or an inconsistent combination is InvalidArgumentError naming the key, the value and
// what is accepted; a key of PyTorch 2.15 that is not an option is refused by name with the reason
// (one bucketalloc does at PyTorch's default is accepted at that value). Empty `conf` returns
// `base`.
absl::StatusOr<Options> ParseOptions(absl::string_view conf, const Options& base = Options());

// The environment variables OptionsFromEnv reads, first set first: bucketalloc's own, then
// PyTorch 2.15's in the order torch itself reads them (PYTORCH_CUDA_ALLOC_CONF wins over
// PYTORCH_ALLOC_CONF when both are set, although torch documents the other order).
inline constexpr const char* kConfVariable = "BUCKETALLOC_CONF";
inline constexpr const char* kPyTorchConfVariables[] = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};

// The process environment variables bucketalloc reads, one row each, beside the option table:
// what reads it, the values it accepts and what it does (docs/configuration.md, "Environment
// variables", is EnvVariablesMarkdownTable()). Every read of the environment goes through ReadEnv.
struct EnvVariable {
  const char* name;
  const char* read_by;   // which part reads it, and when
  const char* accepted;  // the values it accepts
  const char* meaning;
};
// The rows, BUCKETALLOC_CONF and PyTorch's variables first (a constant table: reading it allocates
// nothing, as an LD_PRELOAD library must not before the program's allocator is up).
absl::Span<const EnvVariable> EnvVariables();
// The value of environment variable `name`, nullptr when it is unset or not a row of EnvVariables
// (a name outside the table is never read; options_test checks that every name the sources pass is
// a row, and that nothing else reads the environment).
const char* ReadEnv(const char* name);
// The table as Markdown, and the variables set in this process as `NAME=value` lines (a dump for
// diagnostics; values as set).
std::string EnvVariablesMarkdownTable();
std::string DumpEnv();

// Where OptionsFromEnv takes its options from.
struct OptionsSource {
  // The variable read: the first of BUCKETALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF
  // that is set (an empty value counts: BUCKETALLOC_CONF= asks for the defaults and ignores
  // PyTorch's); empty when none is (the defaults apply).
  std::string variable;
  std::string text;  // its value
  // The later ones of the three that are set too, which OptionsFromEnv ignores.
  std::vector<std::string> ignored;
  // True when `variable` is one of PyTorch's (its CONF is read as PyTorch's: see OptionsFromEnv).
  bool FromPyTorch() const { return !variable.empty() && variable != kConfVariable; }
};

// Returns which variable OptionsFromEnv reads and its text (for hosts that say where the
// configuration came from). Reads the environment only.
OptionsSource OptionsSourceFromEnv();

// Parses the variable OptionsSourceFromEnv names (none set = defaults). A PyTorch variable is read
// as PyTorch's CONF: bucketalloc's keys and PyTorch 2.15's are accepted as in BUCKETALLOC_CONF,
// except the pinned_* keys (torch's pinned host-memory allocator), which are skipped there and
// refused in BUCKETALLOC_CONF. When a set variable is ignored or pinned keys are skipped, prints
// one line saying so on stderr, once per process. An error names the key, the value and what is
// accepted, and for a PyTorch variable the variable.
absl::StatusOr<Options> OptionsFromEnv();

// Checks every field against its row's accepted values, and the combinations; ParseOptions calls it.
absl::Status ValidateOptions(const Options& options);

// Returns every option as "key:value" joined by ',' (parseable by ParseOptions).
std::string FormatOptions(const Options& options);

// Returns the Markdown table of all options (name, accepted values, default, meaning) that
// docs/configuration.md embeds; a test keeps the two equal.
std::string OptionsMarkdownTable();

// Returns the Markdown table of PyTorch 2.15's allocator keys (c10/core/AllocatorConfig.cpp,
// c10/cuda/CUDAAllocatorConfig.cpp), each with what bucketalloc does with it (honoured with
// PyTorch's meaning, accepted at PyTorch's default only, or refused, and why), that
// docs/configuration.md embeds; a test keeps the two equal.
std::string PyTorchKeysMarkdownTable();

// Splits a list at the commas outside brackets ("a:[1,2],b:3" -> "a:[1,2]", "b:3"), each piece
// stripped of spaces, empty pieces dropped: how ParseOptions splits a CONF. InvalidArgument names
// unbalanced brackets.
absl::StatusOr<std::vector<std::string>> SplitOptionList(absl::string_view text);

// One "key:value" of a CONF, split as ParseOptions splits it.
struct OptionSetting {
  std::string key;
  std::string value;
};
// Splits `conf` into its settings (keys are not looked up). InvalidArgument names a piece without
// a value or unbalanced brackets.
absl::StatusOr<std::vector<OptionSetting>> SplitOptions(absl::string_view conf);

// True when `key` chooses or sizes the device rather than the allocator's policy: backend,
// capacity, memory_fraction (and its PyTorch name per_process_memory_fraction), and every key a
// backend owns. (The harness sets these itself.)
bool IsDeviceOption(absl::string_view key);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_OPTIONS_H_
