// The Backend contract (tests/backend/backend_conformance.h) on the simulated device, backed and
// unbacked; cuda and vmm instantiate it in tests/cuda/cuda_backend_test.cc.
#include "backend/backend_conformance.h"

namespace bucketalloc::testing {
namespace {

struct SimBacked {
  static constexpr const char* kName = "sim";
  static constexpr bool kNeedsGpu = false;
  static constexpr bool kHostAccessible = true;
  static BackendSettings Settings() { return {{"sim_total_memory", "256MiB"}, {"sim_memory", "backed"}}; }
};

struct SimUnbacked {
  static constexpr const char* kName = "sim";
  static constexpr bool kNeedsGpu = false;
  static constexpr bool kHostAccessible = false;
  static BackendSettings Settings() { return {{"sim_total_memory", "80GiB"}, {"sim_memory", "unbacked"}}; }
};

BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(SimBacked, SimBacked);
BUCKETALLOC_INSTANTIATE_BACKEND_CONFORMANCE(SimUnbacked, SimUnbacked);

}  // namespace
}  // namespace bucketalloc::testing
