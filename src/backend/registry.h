// src/backend/registry.h — the backends by name (layer L1).
//
// Owns: `BackendEntry`, one row per backend (its name, the BUCKETALLOC_CONF keys it owns with their
// accepted values and defaults, whether and through which backend it stitches, its device count
// and its factory), and the lookup of a row by name. The rows are defined in their backends' files;
// the table of all of them (registry.cc) is its own CMake target, above the simulated device and
// cuda/. The option table takes the
// backend names and their keys from here, the front end makes its devices' backends through it,
// and the conformance suite (tests/backend/backend_conformance.h) runs on every row.
// Adding a backend: its file (which defines its row), the row's line in kRegistry
// (registry.cc), and an instantiation of the conformance suite.
// Thread-safety: constant tables, constant-initialized (usable from static constructors).
//
// Example:
//   const BackendEntry* sim = FindBackend("sim");
//   absl::StatusOr<std::unique_ptr<Backend>> b = sim->make(BackendSettings{{"sim_memory", "unbacked"}}, 0);
#ifndef BUCKETALLOC_BACKEND_REGISTRY_H_
#define BUCKETALLOC_BACKEND_REGISTRY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bucketalloc/backend.h"
#include "internal/check.h"

namespace bucketalloc::internal {

// One BUCKETALLOC_CONF key a backend owns.
struct BackendOptionSpec {
  const char* name;
  const char* accepted;  // the accepted values, for errors and docs
  const char* meaning;
  const char* default_value;  // canonical text
  // Reads `value` (its syntax: a size, an integer, a word) into canonical text (e.g. "134217728"
  // -> "128MiB"), or an error when it cannot be read; the option table then reports `accepted`.
  absl::StatusOr<std::string> (*parse)(absl::string_view value);
  // True when a parsed value is in range (nullptr: every parsed value is). The option table checks
  // it once all keys are parsed, as it checks its own rows. A backend's factory may assume that its
  // settings passed both.
  bool (*valid)(absl::string_view canonical);
};

struct BackendEntry {
  const char* name;
  absl::Span<const BackendOptionSpec> options;
  // The backend that serves this one's devices when stitching is asked for
  // (expandable_segments:true): this one's own name when it has virtual memory, another's (cuda ->
  // vmm), or nullptr when none can.
  const char* stitching_backend;
  // True when this backend always stitches (vmm: its large pool is virtual memory).
  bool always_stitches;
  // The number of devices `settings` describe (or the CUDA error as FailedPrecondition).
  absl::StatusOr<int> (*device_count)(const BackendSettings& settings);
  absl::StatusOr<std::unique_ptr<Backend>> (*make)(const BackendSettings& settings, int device);
};

// Every registered backend, in the order of the docs.
absl::Span<const BackendEntry* const> Backends();
// The row named `name`, or nullptr.
const BackendEntry* FindBackend(absl::string_view name);
// The accepted backend names for messages: "sim, cuda or vmm".
std::string BackendNamesText();
// The row of the key `key` among every backend's options, or nullptr.
const BackendOptionSpec* FindBackendOption(absl::string_view key);
// The value of `key` in `settings`, else the key's default; `key` must be one of `entry`'s (a
// backend reads its own settings with it, so it needs no table).
inline absl::string_view SettingOf(const BackendEntry& entry, const BackendSettings& settings, absl::string_view key) {
  if (auto it = settings.find(key); it != settings.end()) return it->second;
  for (const BackendOptionSpec& spec : entry.options) {
    if (key == spec.name) return spec.default_value;
  }
  BA_CHECK(false, "a backend read a setting it does not own");
}

// The rows, each defined in its backend's file.
extern const BackendEntry kSimBackendEntry;   // src/backend/sim_backend.cc
extern const BackendEntry kCudaBackendEntry;  // cuda/cuda_backend.cc
extern const BackendEntry kVmmBackendEntry;   // cuda/vmm_backend.cc

// The CUDA versions behind the cuda and vmm rows, for version reports; defined in
// cuda/driver_api.cc (see there): the installed driver's, read through libcuda.so.1 loaded at run
// time (FailedPrecondition naming why when there is none), and the toolkit headers' of this build.
absl::StatusOr<int> CudaDriverVersion();
int CudaHeadersVersion();

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_BACKEND_REGISTRY_H_
