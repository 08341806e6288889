// bucketalloc/testing/sim_backend.h — the simulated device and its test controls (layer L1).
//
// Owns: `SimBackend`, a Backend on the CPU with a finite capacity, real or unbacked memory,
// simulated streams and events, fault injection, simulated CUDA stream capture, and CUDA's virtual
// memory family with real page mapping; `MakeSimBackend`; `AsSim`. Tests, the harness and the C
// ABI's bucketalloc_sim_* functions drive it; production code never needs this header (the backend
// registry makes the sim backend by name: backend:sim).
// Thread-safety: every method takes the backend's own mutex, so the test controls may be called
// from any thread while the allocator uses the backend.
//
// Example:
//   auto backend = bucketalloc::MakeSimBackend({.total_memory = 1ull << 30});
//   (*backend)->EnqueueWork(stream);   // an event recorded on `stream` now waits ...
//   (*backend)->CompleteWork(stream);  // ... until this
#ifndef BUCKETALLOC_TESTING_SIM_BACKEND_H_
#define BUCKETALLOC_TESTING_SIM_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "bucketalloc/backend.h"

namespace bucketalloc {

// The simulated device.
//
// It also implements the virtual-memory family with real page mapping: physical memory is a memfd
// (one per device, sized to the device's memory, pages allocated on first touch), so in backed mode
// a physical allocation mapped at two addresses shows the same bytes at both, and an unmapped range
// goes back to PROT_NONE (nothing stale can be read through it). Physical bytes count against the
// device's memory together with Allocate's. In unbacked mode the same bookkeeping runs without
// touching pages.

enum class SimMemoryMode {
  kBacked,    // real host memory: the caller may write and read every allocated byte
  kUnbacked,  // addresses from a reserved, never-touched range: simulates an 80-141 GB card
};

struct SimBackendOptions {
  int device = 0;
  std::size_t total_memory = std::size_t{16} << 30;  // the simulated card's memory
  std::size_t granularity = std::size_t{2} << 20;    // the driver's allocation granularity
  SimMemoryMode memory = SimMemoryMode::kBacked;
  // Fault injection: fail the Nth Allocate call (1-based; 0 = never) ...
  std::int64_t fail_nth_alloc = 0;
  // ... and/or a seeded fraction of Allocate calls (0 = never).
  double fail_fraction = 0.0;
  std::uint64_t seed = 1;
};

// The sim backend's test controls, reached through `AsSim(backend)`.
// Streams are simulated: work "queued" on a stream completes only when a test says so, so that
// stream-ordered reuse and RecordStream are testable without a GPU.
class SimBackend : public Backend {
 public:
  // Queues one unit of simulated work on `stream` (an event recorded now waits for it).
  virtual void EnqueueWork(Stream stream) = 0;
  // Completes all work queued on `stream` so far.
  virtual void CompleteWork(Stream stream) = 0;
  // Makes SynchronizeEvent fail (simulates a lost context) until called with false.
  virtual void SetSynchronizeFails(bool fails) = 0;
  // Makes SynchronizeEvent fail for the events of `stream` only (a hung stream) until called with
  // false; its work does not complete by waiting.
  virtual void SetStreamSynchronizeFails(Stream stream, bool fails) = 0;
  // Makes RecordEvent fail until called with false.
  virtual void SetRecordEventFails(bool fails) = 0;
  // Fails the Nth Allocate call from now on (1 = the next one; 0 = never). CreatePhysical calls
  // count as Allocate calls here, as they do for fail_nth_alloc and fail_fraction.
  virtual void FailNthAlloc(std::int64_t n) = 0;
  // Fails the Nth Map call from now on (1 = the next one; 0 = never).
  virtual void FailNthMap(std::int64_t n) = 0;
  // Fails the Nth Unmap call from now on (1 = the next one; 0 = never); the range stays mapped.
  virtual void FailNthUnmap(std::int64_t n) = 0;
  // Simulates `bytes` of the device used outside this backend (another process or library): the
  // device's free memory shrinks by that much. 0 ends it.
  virtual void SetExternalUsage(std::size_t bytes) = 0;
  // Starts (true) or ends a simulated CUDA stream capture on `stream`. While any stream captures,
  // Free, Unmap, QueryEvent, SynchronizeEvent and SynchronizeDevice fail with FailedPrecondition (as
  // CUDA's global capture mode does) and count a capture violation; Allocate, CreatePhysical and Map
  // succeed (the real backends call them in relaxed capture mode); an event recorded on a capturing stream is
  // a graph node: it reports completion at once, which is what makes it unsafe to rely on.
  virtual void SetCapturing(Stream stream, bool capturing) = 0;
  // Returns the bytes currently allocated from the simulated device through this backend.
  virtual std::size_t used_bytes() const = 0;
  virtual SimMemoryMode memory_mode() const = 0;
};

// Creates a simulated device. Fails with InvalidArgument on a bad option (zero memory, a
// granularity that is not a power of two, a fraction outside [0, 1]).
absl::StatusOr<std::unique_ptr<SimBackend>> MakeSimBackend(const SimBackendOptions& options);

// Returns `backend` as a SimBackend, or nullptr when it is not one.
SimBackend* AsSim(Backend* backend);

}  // namespace bucketalloc

#endif  // BUCKETALLOC_TESTING_SIM_BACKEND_H_
