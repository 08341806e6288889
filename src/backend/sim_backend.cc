// src/backend/sim_backend.cc — the simulated device (layer L1).
//
// Owns: a reserved address range four times the simulated memory, carved first-fit into
// allocations (so address-space fragmentation never causes a failure the real driver would not
// have); a capacity check on the bytes in use; simulated streams and events; fault injection.
// Backed mode makes the carved pages readable and writable (real host memory, touched lazily);
// unbacked mode leaves them PROT_NONE, so a 141 GB card can be simulated on a 24 GB machine.
// Thread-safety: every method takes the backend's own mutex.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/backend.h"
#include "bucketalloc/options.h"
#include "internal/bits.h"

namespace bucketalloc {
namespace {

// How much address space to reserve per byte of simulated memory.
constexpr std::size_t kAddressSpaceFactor = 4;

struct SimEvent {
  Stream stream = nullptr;
  std::uint64_t ticket = 0;
};

struct SimStream {
  std::uint64_t queued = 0;     // units of work enqueued so far
  std::uint64_t completed = 0;  // units completed so far; completed <= queued
  bool capturing = false;
};

class SimBackendImpl final : public SimBackend {
 public:
  explicit SimBackendImpl(const SimBackendOptions& o)
      : options_(o), fail_nth_(o.fail_nth_alloc), rng_(o.seed) {}

  ~SimBackendImpl() override {
    if (base_ != nullptr) munmap(base_, reserved_);
  }

  absl::Status Init() {
    reserved_ = options_.total_memory * kAddressSpaceFactor + options_.granularity;
    void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sim backend: cannot reserve ", reserved_, " bytes of address space: ", std::strerror(errno)));
    }
    base_ = p;
    const std::uintptr_t start =
        internal::RoundUp(reinterpret_cast<std::uintptr_t>(p), options_.granularity);
    const std::size_t usable = options_.total_memory * kAddressSpaceFactor;
    free_ranges_.emplace(start, usable);
    return absl::OkStatus();
  }

  absl::string_view Name() const override { return "sim"; }
  int device() const override { return options_.device; }
  std::size_t Granularity() const override { return options_.granularity; }

  absl::StatusOr<void*> Allocate(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("Allocate"); !s.ok()) {
      ++counters_.failed_allocs;
      return s;
    }
    if (bytes == 0 || bytes % options_.granularity != 0) {
      ++counters_.failed_allocs;
      return absl::InvalidArgumentError(absl::StrCat("sim backend: Allocate(", bytes,
                                                     ") is not a positive multiple of the granularity ",
                                                     options_.granularity));
    }
    if (InjectFault()) {
      ++counters_.failed_allocs;
      return absl::ResourceExhaustedError(
          absl::StrCat("sim backend: injected allocation failure (Allocate call ", alloc_calls_, ")"));
    }
    if (bytes > FreeBytes()) {
      ++counters_.failed_allocs;
      return absl::ResourceExhaustedError(absl::StrCat("sim backend: out of memory: ", bytes,
                                                       " bytes requested, ", FreeBytes(), " of ",
                                                       options_.total_memory, " free"));
    }
    // First fit by address.
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
      if (it->second < bytes) continue;
      const std::uintptr_t addr = it->first;
      const std::size_t len = it->second;
      free_ranges_.erase(it);
      if (len > bytes) free_ranges_.emplace(addr + bytes, len - bytes);
      if (options_.memory == SimMemoryMode::kBacked &&
          mprotect(reinterpret_cast<void*>(addr), bytes, PROT_READ | PROT_WRITE) != 0) {
        InsertFreeRange(addr, bytes);
        ++counters_.failed_allocs;
        return absl::ResourceExhaustedError(
            absl::StrCat("sim backend: mprotect failed: ", std::strerror(errno)));
      }
      used_ += bytes;
      live_.emplace(addr, bytes);
      ++counters_.allocs;
      return reinterpret_cast<void*>(addr);
    }
    ++counters_.failed_allocs;
    return absl::ResourceExhaustedError("sim backend: address space exhausted");
  }

  absl::Status Free(void* ptr, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("Free"); !s.ok()) return s;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = live_.find(addr);
    if (it == live_.end() || it->second != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: Free(", absl::Hex(addr), ", ", bytes,
                                                     ") does not match a live allocation"));
    }
    live_.erase(it);
    if (options_.memory == SimMemoryMode::kBacked) {
      madvise(ptr, bytes, MADV_DONTNEED);
      mprotect(ptr, bytes, PROT_NONE);
    }
    InsertFreeRange(addr, bytes);
    used_ -= bytes;
    ++counters_.frees;
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceMemInfo> GetMemInfo() override {
    std::lock_guard<std::mutex> lock(mu_);
    return DeviceMemInfo{FreeBytes(), options_.total_memory};
  }

  absl::StatusOr<Event> RecordEvent(Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (record_event_fails_) return absl::InternalError("sim backend: injected RecordEvent failure");
    SimEvent* e;
    if (!event_pool_.empty()) {
      e = event_pool_.back().release();
      event_pool_.pop_back();
    } else {
      e = new SimEvent;
    }
    e->stream = stream;
    // An event recorded during capture is a graph node: nothing is recorded eagerly.
    e->ticket = streams_[stream].capturing ? 0 : streams_[stream].queued;
    ++counters_.events_recorded;
    return static_cast<Event>(e);
  }

  absl::StatusOr<bool> QueryEvent(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("QueryEvent"); !s.ok()) return s;
    auto* e = static_cast<SimEvent*>(event);
    return streams_[e->stream].completed >= e->ticket;
  }

  absl::Status SynchronizeEvent(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("SynchronizeEvent"); !s.ok()) return s;
    if (synchronize_fails_) {
      return absl::InternalError("sim backend: injected SynchronizeEvent failure");
    }
    auto* e = static_cast<SimEvent*>(event);
    SimStream& s = streams_[e->stream];
    if (s.completed < e->ticket) s.completed = e->ticket;  // waiting completes the work before it
    return absl::OkStatus();
  }

  void DestroyEvent(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    event_pool_.emplace_back(static_cast<SimEvent*>(event));
  }

  absl::StatusOr<bool> IsCapturing(Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(stream);
    return it != streams_.end() && it->second.capturing;
  }

  BackendCounters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

  void EnqueueWork(Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++streams_[stream].queued;
  }
  void CompleteWork(Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    SimStream& s = streams_[stream];
    s.completed = s.queued;
  }
  void SetCapturing(Stream stream, bool capturing) override {
    std::lock_guard<std::mutex> lock(mu_);
    SimStream& s = streams_[stream];
    if (s.capturing != capturing) capturing_streams_ += capturing ? 1 : -1;
    s.capturing = capturing;
  }
  void SetSynchronizeFails(bool fails) override {
    std::lock_guard<std::mutex> lock(mu_);
    synchronize_fails_ = fails;
  }
  void SetRecordEventFails(bool fails) override {
    std::lock_guard<std::mutex> lock(mu_);
    record_event_fails_ = fails;
  }
  void FailNthAlloc(std::int64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    fail_nth_ = n == 0 ? 0 : alloc_calls_ + n;
  }
  void SetExternalUsage(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    external_ = bytes;
  }
  std::size_t used_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  SimMemoryMode memory_mode() const override { return options_.memory; }

 private:
  std::size_t FreeBytes() const {
    const std::size_t taken = used_ + external_;
    return taken >= options_.total_memory ? 0 : options_.total_memory - taken;
  }

  absl::Status RefuseDuringCapture(absl::string_view call) {
    if (capturing_streams_ == 0) return absl::OkStatus();
    ++counters_.capture_violations;
    return absl::FailedPreconditionError(absl::StrCat(
        "sim backend: ", call, " while a stream capture is running (cudaErrorStreamCaptureUnsupported)"));
  }

  bool InjectFault() {
    ++alloc_calls_;
    if (fail_nth_ != 0 && alloc_calls_ == fail_nth_) return true;
    if (options_.fail_fraction > 0.0) {
      return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < options_.fail_fraction;
    }
    return false;
  }

  void InsertFreeRange(std::uintptr_t addr, std::size_t len) {
    auto next = free_ranges_.lower_bound(addr);
    if (next != free_ranges_.end() && addr + len == next->first) {
      len += next->second;
      next = free_ranges_.erase(next);
    }
    if (next != free_ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == addr) {
        prev->second += len;
        return;
      }
    }
    free_ranges_.emplace(addr, len);
  }

  const SimBackendOptions options_;
  mutable std::mutex mu_;
  void* base_ = nullptr;
  std::size_t reserved_ = 0;
  std::size_t used_ = 0;
  std::size_t external_ = 0;  // simulated use by others
  std::map<std::uintptr_t, std::size_t> free_ranges_;  // address -> length, coalesced
  absl::flat_hash_map<std::uintptr_t, std::size_t> live_;
  absl::flat_hash_map<Stream, SimStream> streams_;
  std::vector<std::unique_ptr<SimEvent>> event_pool_;
  BackendCounters counters_;
  std::int64_t alloc_calls_ = 0;
  std::int64_t fail_nth_ = 0;  // absolute Allocate call number to fail; 0 = none
  int capturing_streams_ = 0;
  bool synchronize_fails_ = false;
  bool record_event_fails_ = false;
  std::mt19937_64 rng_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SimBackend>> MakeSimBackend(const SimBackendOptions& options) {
  if (options.total_memory == 0) {
    return absl::InvalidArgumentError("sim backend: total_memory must be positive");
  }
  if (!internal::IsPowerOfTwo(options.granularity) || options.granularity < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("sim backend: granularity ", options.granularity,
                                                   " must be a power of two >= 4096"));
  }
  if (options.total_memory % options.granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("sim backend: total_memory ", options.total_memory,
                                                   " must be a multiple of the granularity ",
                                                   options.granularity));
  }
  if (!(options.fail_fraction >= 0.0 && options.fail_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("sim backend: fail_fraction ", options.fail_fraction,
                                                   " must be in [0, 1]"));
  }
  if (options.fail_nth_alloc < 0) {
    return absl::InvalidArgumentError("sim backend: fail_nth_alloc must be >= 0");
  }
  auto backend = std::make_unique<SimBackendImpl>(options);
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return std::unique_ptr<SimBackend>(std::move(backend));
}

}  // namespace bucketalloc
