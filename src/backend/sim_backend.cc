// src/backend/sim_backend.cc — the simulated device (layer L1).
//
// Owns: a reserved address range four times the simulated memory, carved first-fit into
// allocations (so address-space fragmentation never causes a failure the real driver would not
// have); a capacity check on the bytes in use; simulated streams and events; fault injection.
// Backed mode makes the carved pages readable and writable (real host memory, touched lazily);
// unbacked mode leaves them PROT_NONE, so a 141 GB card can be simulated on a 24 GB machine.
// Virtual memory (the twin of CUDA's VMM API, see backend.h): reserved ranges are PROT_NONE
// mappings of their own; a physical allocation is a list of ranges of one memfd, taken first-fit by
// offset (backed mode: like a GPU's memory, physical memory never fragments, whatever the sizes of
// the handles; unbacked, it is a byte count only); Map is mmap(MAP_SHARED | MAP_FIXED) of each of
// its memfd ranges over the reservation, side by side (backed mode), Unmap maps PROT_NONE anonymous
// memory back over it, and ReleasePhysical punches the pages out of the memfd.
// Thread-safety: every method takes the backend's own mutex.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backend/registry.h"
#include "bucketalloc/testing/sim_backend.h"
#include "bucketalloc/units.h"
#include "internal/bits.h"

namespace bucketalloc {
using internal::BackendEntry;
using internal::BackendOptionSpec;
using internal::SettingOf;
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
  bool synchronize_fails = false;  // SetStreamSynchronizeFails: waiting for this stream fails
};

class SimBackendImpl final : public SimBackend {
 public:
  explicit SimBackendImpl(const SimBackendOptions& o) : options_(o), fail_nth_(o.fail_nth_alloc), rng_(o.seed) {}

  ~SimBackendImpl() override {
    if (base_ != nullptr) munmap(base_, reserved_);
    for (const auto& [va, bytes] : va_ranges_) munmap(reinterpret_cast<void*>(va), bytes);
    if (memfd_ >= 0) close(memfd_);
  }

  absl::Status Init() {
    reserved_ = options_.total_memory * kAddressSpaceFactor + options_.granularity;
    void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sim backend: cannot reserve ", reserved_, " bytes of address space: ", std::strerror(errno)));
    }
    base_ = p;
    const std::uintptr_t start = internal::RoundUp(reinterpret_cast<std::uintptr_t>(p), options_.granularity);
    const std::size_t usable = options_.total_memory * kAddressSpaceFactor;
    free_ranges_.emplace(start, usable);
    physical_free_.emplace(0, options_.total_memory);
    return absl::OkStatus();
  }

  absl::string_view Name() const override { return "sim"; }
  int device() const override { return options_.device; }
  std::size_t Granularity() const override { return options_.granularity; }

  absl::StatusOr<void*> Allocate(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckGrowth("Allocate", bytes); !s.ok()) {
      ++counters_.failed_allocs;
      return s;
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
        return absl::ResourceExhaustedError(absl::StrCat("sim backend: mprotect failed: ", std::strerror(errno)));
      }
      used_ += bytes;
      live_.emplace(addr, bytes);
      ++counters_.allocs;
      counters_.alloc_bytes += static_cast<std::int64_t>(bytes);
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
      return absl::InvalidArgumentError(
          absl::StrCat("sim backend: Free(", absl::Hex(addr), ", ", bytes, ") does not match a live allocation"));
    }
    live_.erase(it);
    if (options_.memory == SimMemoryMode::kBacked) {
      madvise(ptr, bytes, MADV_DONTNEED);
      mprotect(ptr, bytes, PROT_NONE);
    }
    InsertFreeRange(addr, bytes);
    used_ -= bytes;
    ++counters_.frees;
    counters_.free_bytes += static_cast<std::int64_t>(bytes);
    return absl::OkStatus();
  }

  bool SupportsVirtualMemory() const override { return true; }

  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t bytes, std::size_t alignment) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes == 0 || bytes % options_.granularity != 0 || (alignment != 0 && !internal::IsPowerOfTwo(alignment))) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: ReserveAddressRange(", bytes, ", ", alignment,
                                                     "): accepted a positive multiple of the granularity ",
                                                     options_.granularity, " and an alignment of 0 or a power of two"));
    }
    const std::size_t align = std::max(alignment, options_.granularity);
    void* p = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sim backend: cannot reserve ", bytes, " bytes of address space: ", std::strerror(errno)));
    }
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t va = internal::RoundUp(raw, align);
    if (va > raw) munmap(p, va - raw);
    if (const std::size_t tail = raw + bytes + align - (va + bytes); tail > 0) {
      munmap(reinterpret_cast<void*>(va + bytes), tail);
    }
    va_ranges_.emplace(va, bytes);
    ++counters_.address_reserves;
    return va;
  }

  absl::Status ReleaseAddressRange(std::uintptr_t va, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = va_ranges_.find(va);
    if (it == va_ranges_.end() || it->second != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: ReleaseAddressRange(", absl::Hex(va), ", ", bytes,
                                                     ") does not match a reserved range"));
    }
    if (auto m = mappings_.lower_bound(va); m != mappings_.end() && m->first < va + bytes) {
      return absl::FailedPreconditionError(absl::StrCat("sim backend: ReleaseAddressRange(", absl::Hex(va), ", ", bytes,
                                                        "): ", absl::Hex(m->first), " is still mapped"));
    }
    munmap(reinterpret_cast<void*>(va), bytes);
    va_ranges_.erase(it);
    ++counters_.address_releases;
    return absl::OkStatus();
  }

  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckGrowth("CreatePhysical", bytes); !s.ok()) {
      ++counters_.failed_physical_creates;
      return s;
    }
    if (options_.memory == SimMemoryMode::kBacked && memfd_ < 0) {
      memfd_ = MakePhysicalMemfd();
      if (memfd_ < 0) {
        ++counters_.failed_physical_creates;
        return absl::ResourceExhaustedError(
            absl::StrCat("sim backend: cannot create the physical memory: ", std::strerror(errno)));
      }
    }
    // Unbacked, there is no memfd and an offset means nothing: like a GPU's, the device's memory
    // serves any physical allocation that fits in what is free, whatever the sizes before it.
    if (options_.memory == SimMemoryMode::kUnbacked) {
      const PhysicalHandle handle = next_handle_++;
      physical_.emplace(handle, Physical{{}, bytes, 0});
      used_ += bytes;
      ++counters_.physical_creates;
      return handle;
    }
    // Backed, physical memory is ranges of the memfd (of the device's size), the lowest offsets
    // first: CheckGrowth kept `bytes` within the free bytes, which the free ranges hold in all.
    Physical p{{}, bytes, 0};
    for (std::size_t need = bytes; need > 0;) {
      if (physical_free_.empty()) {  // unreachable: the free ranges hold every byte not created
        for (const Extent& e : p.extents) InsertRange(physical_free_, e.offset, e.bytes);
        ++counters_.failed_physical_creates;
        return absl::InternalError("sim backend: the physical memory's free ranges are short of its free bytes");
      }
      auto it = physical_free_.begin();
      const std::size_t offset = it->first, take = std::min(it->second, need);
      if (take < it->second) physical_free_.emplace(offset + take, it->second - take);
      physical_free_.erase(it);
      if (!p.extents.empty() && p.extents.back().offset + p.extents.back().bytes == offset) {
        p.extents.back().bytes += take;
      } else {
        p.extents.push_back({offset, take});
      }
      need -= take;
    }
    const PhysicalHandle handle = next_handle_++;
    physical_.emplace(handle, std::move(p));
    used_ += bytes;
    ++counters_.physical_creates;
    return handle;
  }

  absl::Status ReleasePhysical(PhysicalHandle handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = physical_.find(handle);
    if (it == physical_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: ReleasePhysical(", handle, "): no such handle"));
    }
    if (it->second.mappings > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("sim backend: ReleasePhysical(", handle, "): still mapped ", it->second.mappings, " time(s)"));
    }
    const Physical p = std::move(it->second);
    physical_.erase(it);
    for (const Extent& e : p.extents) {
      if (memfd_ >= 0) {  // the pages go back to the host; a later CreatePhysical reads zeros
        fallocate(memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(e.offset),
                  static_cast<off_t>(e.bytes));
      }
      InsertRange(physical_free_, e.offset, e.bytes);
    }
    used_ -= p.bytes;
    ++counters_.physical_releases;
    return absl::OkStatus();
  }

  // A Map is a cuMemMap and a cuMemSetAccess; a MapRun is one cuMemMap per handle and one
  // cuMemSetAccess for the run (as the vmm backend calls them).
  absl::Status Map(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status s = MapLocked(va, bytes, handle);
    if (s.ok()) ++counters_.access_grants;
    return s;
  }

  absl::Status MapRun(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status s;
    for (*mapped = 0; *mapped < pieces.size(); ++*mapped) {
      s = MapLocked(va, pieces[*mapped].bytes, pieces[*mapped].handle);
      if (!s.ok()) break;
      va += pieces[*mapped].bytes;
    }
    if (*mapped > 0) ++counters_.access_grants;
    return s;
  }

  // Map with mu_ held.
  absl::Status MapLocked(std::uintptr_t va, std::size_t bytes, PhysicalHandle handle) {
    // Allowed during a capture: the vmm backend maps in relaxed capture mode, as CUDA allows.
    auto p = physical_.find(handle);
    if (p == physical_.end() || p->second.bytes != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: Map(", absl::Hex(va), ", ", bytes, ", ", handle,
                                                     "): accepted a live handle mapped whole"));
    }
    if (va % options_.granularity != 0 || !InsideReservation(va, bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("sim backend: Map(", absl::Hex(va), ", ", bytes,
                                                     "): accepted a granularity-aligned range inside one reserved "
                                                     "range"));
    }
    if (OverlapsMapping(va, bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat("sim backend: Map(", absl::Hex(va), ", ", bytes, "): the range is already mapped"));
    }
    ++map_calls_;
    if (fail_nth_map_ != 0 && map_calls_ == fail_nth_map_) {
      return absl::ResourceExhaustedError(absl::StrCat("sim backend: injected Map failure (call ", map_calls_, ")"));
    }
    if (options_.memory == SimMemoryMode::kBacked && !MapExtents(va, p->second, memfd_)) {
      const int error = errno;
      mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0);
      return absl::ResourceExhaustedError(absl::StrCat("sim backend: mmap failed: ", std::strerror(error)));
    }
    mappings_.emplace(va, Mapping{bytes, handle});
    ++p->second.mappings;
    ++counters_.maps;
    return absl::OkStatus();
  }

  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("Unmap"); !s.ok()) return s;
    // Every mapping the range touches must lie wholly inside it, and it must touch at least one.
    auto first = mappings_.lower_bound(va);
    if (first != mappings_.begin()) {
      if (auto prev = std::prev(first); prev->first + prev->second.bytes > va) first = prev;
    }
    auto last = first;
    for (; last != mappings_.end() && last->first < va + bytes; ++last) {
      if (last->first < va || last->first + last->second.bytes > va + bytes) {
        return absl::InvalidArgumentError(absl::StrCat("sim backend: Unmap(", absl::Hex(va), ", ", bytes,
                                                       ") cuts the mapping at ", absl::Hex(last->first),
                                                       "; accepted a range of whole mappings"));
      }
    }
    if (first == last) {
      return absl::InvalidArgumentError(
          absl::StrCat("sim backend: Unmap(", absl::Hex(va), ", ", bytes, "): nothing is mapped there"));
    }
    ++unmap_calls_;
    if (fail_nth_unmap_ != 0 && unmap_calls_ == fail_nth_unmap_) {
      return absl::InternalError(absl::StrCat("sim backend: injected Unmap failure (call ", unmap_calls_, ")"));
    }
    for (auto it = first; it != last; ++it) {
      if (options_.memory == SimMemoryMode::kBacked) {
        // Back to a reservation: the range can be mapped again, and reads of stale data fault.
        mmap(reinterpret_cast<void*>(it->first), it->second.bytes, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      }
      --physical_[it->second.handle].mappings;
    }
    mappings_.erase(first, last);
    ++counters_.unmaps;
    return absl::OkStatus();
  }

  // fork(2): the allocator holds the device lock; this holds the backend's. In the child, carved
  // memory is the kernel's copy-on-write copy already, but the physical memory of the VMM twin is a
  // MAP_SHARED memfd the parent still writes: the child copies every live physical range into a
  // memfd of its own and maps that at the same addresses, so that neither process sees the other's
  // writes and aliases stay aliases. The copy is taken as fork returns in the child (a parent thread
  // writing device memory without the allocator meanwhile may be seen partly, as with any copy).
  void PrepareFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.lock(); }
  void ParentAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }
  absl::Status ChildAfterFork() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::Status s = memfd_ >= 0 ? PrivatizePhysicalMemory() : absl::OkStatus();
    mu_.unlock();
    return s;
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
    if (s.synchronize_fails) {
      return absl::InternalError(
          absl::StrCat("sim backend: injected SynchronizeEvent failure on stream ", absl::Hex(e->stream)));
    }
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
  absl::Status SynchronizeDevice() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = RefuseDuringCapture("SynchronizeDevice"); !s.ok()) return s;
    ++counters_.device_syncs;
    for (auto& [stream, st] : streams_) st.completed = st.queued;  // every stream's work is done
    return absl::OkStatus();
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
  void SetStreamSynchronizeFails(Stream stream, bool fails) override {
    std::lock_guard<std::mutex> lock(mu_);
    streams_[stream].synchronize_fails = fails;
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
  void FailNthUnmap(std::int64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    fail_nth_unmap_ = n == 0 ? 0 : unmap_calls_ + n;
  }
  void FailNthMap(std::int64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    fail_nth_map_ = n == 0 ? 0 : map_calls_ + n;
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
    return absl::FailedPreconditionError(
        absl::StrCat("sim backend: ", call, " while a stream capture is running (cudaErrorStreamCaptureUnsupported)"));
  }

  // What Allocate and CreatePhysical refuse, in order: a size that is not a positive multiple of the
  // granularity, an injected fault, and more than the free memory. Both are allowed during a capture:
  // the cuda and vmm backends allocate in relaxed capture mode, which CUDA allows (cuda.h,
  // cuThreadExchangeStreamCaptureMode) and PyTorch's allocator does (cudaMallocMaybeCapturing).
  absl::Status CheckGrowth(absl::string_view call, std::size_t bytes) {
    if (bytes == 0 || bytes % options_.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sim backend: ", call, "(", bytes, ") is not a positive multiple of the granularity ", options_.granularity));
    }
    if (InjectFault()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sim backend: injected allocation failure (", call, ", call ", alloc_calls_, ")"));
    }
    if (bytes > FreeBytes()) {
      return absl::ResourceExhaustedError(absl::StrCat("sim backend: out of memory: ", bytes, " bytes requested by ",
                                                       call, ", ", FreeBytes(), " of ", options_.total_memory,
                                                       " free"));
    }
    return absl::OkStatus();
  }

  bool InjectFault() {
    ++alloc_calls_;
    if (fail_nth_ != 0 && alloc_calls_ == fail_nth_) return true;
    if (options_.fail_fraction > 0.0) {
      return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < options_.fail_fraction;
    }
    return false;
  }

  void InsertFreeRange(std::uintptr_t addr, std::size_t len) { InsertRange(free_ranges_, addr, len); }

  // Inserts [addr, addr + len) into a map of free ranges, coalescing with its neighbours.
  template <typename Key>
  static void InsertRange(std::map<Key, std::size_t>& ranges, Key addr, std::size_t len) {
    auto next = ranges.lower_bound(addr);
    if (next != ranges.end() && addr + len == next->first) {
      len += next->second;
      next = ranges.erase(next);
    }
    if (next != ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == addr) {
        prev->second += len;
        return;
      }
    }
    ranges.emplace(addr, len);
  }

  bool InsideReservation(std::uintptr_t va, std::size_t bytes) const {
    auto it = va_ranges_.upper_bound(va);
    if (it == va_ranges_.begin()) return false;
    --it;
    return va + bytes <= it->first + it->second;
  }

  bool OverlapsMapping(std::uintptr_t va, std::size_t bytes) const {
    auto next = mappings_.lower_bound(va);
    if (next != mappings_.end() && next->first < va + bytes) return true;
    if (next == mappings_.begin()) return false;
    auto prev = std::prev(next);
    return prev->first + prev->second.bytes > va;
  }

  // A memfd of the device's size (the VMM twin's physical memory), or -1 with errno set.
  int MakePhysicalMemfd() const {
    const int fd = memfd_create("bucketalloc-sim-physical", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(options_.total_memory)) != 0) {
      const int error = errno;
      close(fd);
      errno = error;
      return -1;
    }
    return fd;
  }

  // The fork child's half of ChildAfterFork (mu_ held): a new memfd with the live physical
  // ranges' bytes, mapped over every mapping of the old one, which is then closed.
  absl::Status PrivatizePhysicalMemory() {
    auto failed = [](absl::string_view what) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sim backend: in the child of fork, cannot ", what,
                       " to copy the simulated physical memory: ", std::strerror(errno)));
    };
    const int fd = MakePhysicalMemfd();
    if (fd < 0) return failed("create a memfd");
    std::vector<char> buffer(std::size_t{1} << 20);
    for (const auto& [handle, p] : physical_) {
      for (const Extent& e : p.extents) {
        for (std::size_t done = 0; done < e.bytes;) {
          const std::size_t n = std::min(buffer.size(), e.bytes - done);
          const auto at = static_cast<off_t>(e.offset + done);
          if (pread(memfd_, buffer.data(), n, at) != static_cast<ssize_t>(n) ||
              pwrite(fd, buffer.data(), n, at) != static_cast<ssize_t>(n)) {
            close(fd);
            return failed("read and write the memfd");
          }
          done += n;
        }
      }
    }
    for (const auto& [va, m] : mappings_) {
      if (!MapExtents(va, physical_.at(m.handle), fd)) {
        close(fd);
        return failed("map the copy");
      }
    }
    close(memfd_);
    memfd_ = fd;
    return absl::OkStatus();
  }

  // A physical allocation: its memfd ranges in order (backed mode), its size, its mappings.
  struct Extent {
    std::size_t offset = 0;
    std::size_t bytes = 0;
  };
  struct Physical {
    absl::InlinedVector<Extent, 1> extents;
    std::size_t bytes = 0;
    int mappings = 0;
  };

  // Maps `p`'s memfd ranges of `fd` side by side from `va`, read-write; false (errno set) when an
  // mmap fails.
  static bool MapExtents(std::uintptr_t va, const Physical& p, int fd) {
    for (const Extent& e : p.extents) {
      if (mmap(reinterpret_cast<void*>(va), e.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
               static_cast<off_t>(e.offset)) == MAP_FAILED) {
        return false;
      }
      va += e.bytes;
    }
    return true;
  }
  struct Mapping {
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
  };

  const SimBackendOptions options_;
  mutable std::mutex mu_;
  void* base_ = nullptr;
  std::size_t reserved_ = 0;
  std::size_t used_ = 0;
  std::size_t external_ = 0;                           // simulated use by others
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
  // Virtual memory.
  int memfd_ = -1;                                    // backed mode: the physical memory
  std::map<std::size_t, std::size_t> physical_free_;  // free memfd offsets -> length, coalesced
  absl::flat_hash_map<PhysicalHandle, Physical> physical_;
  PhysicalHandle next_handle_ = 1;
  std::map<std::uintptr_t, std::size_t> va_ranges_;  // reserved ranges
  std::map<std::uintptr_t, Mapping> mappings_;       // by start address
  std::int64_t map_calls_ = 0;
  std::int64_t fail_nth_map_ = 0;  // absolute Map call number to fail; 0 = none
  std::int64_t unmap_calls_ = 0;
  std::int64_t fail_nth_unmap_ = 0;  // absolute Unmap call number to fail; 0 = none
};

}  // namespace

absl::StatusOr<std::unique_ptr<SimBackend>> MakeSimBackend(const SimBackendOptions& options) {
  if (options.total_memory == 0) {
    return absl::InvalidArgumentError("sim backend: total_memory must be positive");
  }
  if (!internal::IsPowerOfTwo(options.granularity) || options.granularity < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("sim backend: granularity ", options.granularity, " must be a power of two >= 4096"));
  }
  if (options.total_memory % options.granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("sim backend: total_memory ", options.total_memory,
                                                   " must be a multiple of the granularity ", options.granularity));
  }
  if (!(options.fail_fraction >= 0.0 && options.fail_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sim backend: fail_fraction ", options.fail_fraction, " must be in [0, 1]"));
  }
  if (options.fail_nth_alloc < 0) {
    return absl::InvalidArgumentError("sim backend: fail_nth_alloc must be >= 0");
  }
  auto backend = std::make_unique<SimBackendImpl>(options);
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return std::unique_ptr<SimBackend>(std::move(backend));
}

SimBackend* AsSim(Backend* backend) { return dynamic_cast<SimBackend*>(backend); }

// ---------------------------------------------------------------------------------------------
// The registry row: the simulated device's BUCKETALLOC_CONF keys and its factory.

namespace {

absl::Status NotAccepted() { return absl::InvalidArgumentError("not accepted"); }

// The syntax of each key (its parse) and its range (valid), as the option table checks them.
absl::StatusOr<std::string> ParseSizeText(absl::string_view v) {
  absl::StatusOr<std::size_t> s = ParseSize(v);
  if (!s.ok()) return NotAccepted();
  return SizeText(*s);
}
bool ValidTotalMemory(absl::string_view canonical) {
  absl::StatusOr<std::size_t> s = ParseSize(canonical);
  return s.ok() && *s > 0 && *s % (2 * kMiB) == 0 && *s <= (std::size_t{1} << 42);
}
absl::StatusOr<std::string> ParseMemoryMode(absl::string_view v) {
  if (v == "backed" || v == "unbacked") return std::string(v);
  return NotAccepted();
}
absl::StatusOr<std::string> ParseNonNegative(absl::string_view v) {
  std::int64_t i;
  if (!absl::SimpleAtoi(v, &i) || i < 0) return NotAccepted();
  return absl::StrCat(i);
}
bool ValidDevices(absl::string_view canonical) {
  int n = 0;
  return absl::SimpleAtoi(canonical, &n) && n >= 1 && n <= 64;
}
// A number, kept as the shortest text that reads back as the same double.
absl::StatusOr<std::string> ParseNumber(absl::string_view v) {
  double d;
  if (!absl::SimpleAtod(v, &d) || !std::isfinite(d)) return NotAccepted();
  return NumberText(d);
}
bool ValidFraction(absl::string_view canonical) {
  double d;
  return absl::SimpleAtod(canonical, &d) && d >= 0.0 && d <= 1.0;
}

constexpr BackendOptionSpec kSimOptions[] = {
    {"sim_total_memory", "a positive multiple of 2MiB up to 4TiB", "memory of each simulated device", "16GiB",
     ParseSizeText, ValidTotalMemory},
    {"sim_memory", "backed or unbacked",
     "backed: real host memory that tests can write; unbacked: reserved addresses never touched", "backed",
     ParseMemoryMode, nullptr},
    {"sim_devices", "an integer from 1 to 64", "number of simulated devices", "1", ParseNonNegative, ValidDevices},
    {"sim_fail_nth_alloc", "an integer >= 0", "fault injection: fail the Nth backend allocation (0 = never)", "0",
     ParseNonNegative, nullptr},
    {"sim_fail_fraction", "a number in [0, 1]", "fault injection: fail this fraction of backend allocations", "0",
     ParseNumber, ValidFraction},
    {"sim_seed", "an integer >= 0", "seed of the fault injection", "1", ParseNonNegative, nullptr},
};

// The settings as SimBackendOptions for `device`; they passed their specs' parse.
absl::StatusOr<SimBackendOptions> SimOptionsOf(const BackendSettings& settings, int device) {
  auto get = [&](absl::string_view key) { return SettingOf(internal::kSimBackendEntry, settings, key); };
  SimBackendOptions o;
  o.device = device;
  absl::StatusOr<std::size_t> total = ParseSize(get("sim_total_memory"));
  std::int64_t nth = 0, seed = 0;
  double fraction = 0;
  if (!total.ok() || !absl::SimpleAtoi(get("sim_fail_nth_alloc"), &nth) ||
      !absl::SimpleAtod(get("sim_fail_fraction"), &fraction) || !absl::SimpleAtoi(get("sim_seed"), &seed)) {
    return absl::InvalidArgumentError("sim backend: a setting is not valid (ParseOptions checks them)");
  }
  o.total_memory = *total;
  o.memory = get("sim_memory") == "unbacked" ? SimMemoryMode::kUnbacked : SimMemoryMode::kBacked;
  o.fail_nth_alloc = nth;
  o.fail_fraction = fraction;
  o.seed = static_cast<std::uint64_t>(seed) + static_cast<std::uint64_t>(device);
  return o;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeSimFromSettings(const BackendSettings& settings, int device) {
  absl::StatusOr<SimBackendOptions> o = SimOptionsOf(settings, device);
  if (!o.ok()) return o.status();
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend(*o);
  if (!sim.ok()) return sim.status();
  return std::unique_ptr<Backend>(std::move(*sim));
}

absl::StatusOr<int> SimDeviceCount(const BackendSettings& settings) {
  int n = 0;
  if (!absl::SimpleAtoi(SettingOf(internal::kSimBackendEntry, settings, "sim_devices"), &n)) {
    return absl::InvalidArgumentError("sim backend: sim_devices is not valid (ParseOptions checks it)");
  }
  return n;
}

}  // namespace

constinit const BackendEntry internal::kSimBackendEntry = {
    "sim",
    kSimOptions,
    /*stitching_backend=*/"sim",
    /*always_stitches=*/false,
    SimDeviceCount,
    MakeSimFromSettings,
};

}  // namespace bucketalloc
