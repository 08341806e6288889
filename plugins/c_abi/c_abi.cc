// plugins/c_abi/c_abi.cc — the C ABI of libbucketalloc.so (layer L5): one process-wide Allocator
// behind the extern "C" functions of bucketalloc/bucketalloc.h.
//
// The allocator (plugins/common/process_allocator.h) is created on first use from
// bucketalloc_configure()'s text, else BUCKETALLOC_CONF, and is never destroyed.
// Every function catches every exception (a host allocation failure inside the allocator is the
// only source) and turns it into an error; only bucketalloc_malloc_or_throw throws, by design.
// The allocation path adds one atomic load to the C++ call it wraps.
#include "bucketalloc/bucketalloc.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/options.h"
#include "bucketalloc/snapshot.h"
#include "bucketalloc/stats.h"
#include "bucketalloc/testing/sim_backend.h"
#include "plugins/common/metrics_server.h"
#include "plugins/common/process_allocator.h"
#include "plugins/common/timeline_writer.h"

namespace bucketalloc {
namespace {

// Constant-initialized, so usable from any static constructor of the host; never destroyed.
constinit plugins::ProcessAllocator g_process;
std::string* g_conf = nullptr;  // bucketalloc_configure's text (guarded by g_process's lock; leaked)

// Trivially destructible, so that a call from a host's thread-exit or static destructor is safe;
// a longer message (an OOM report with large histograms) is truncated.
constexpr std::size_t kErrorCapacity = 16384;
thread_local char t_last_error[kErrorCapacity];

void SetErrorText(absl::string_view text) {
  const std::size_t n = std::min(text.size(), kErrorCapacity - 1);
  std::memmove(t_last_error, text.data(), n);
  t_last_error[n] = '\0';
}
void SetError(const absl::Status& status) { SetErrorText(status.message()); }

// For the hooks that return void: the error is also printed, as the host has no way to see it.
void ReportError(const absl::Status& status) {
  SetError(status);
  std::fprintf(stderr, "%s\n", t_last_error);
}
void ReportIfFailed(int rc) {
  if (rc != 0) std::fprintf(stderr, "%s\n", t_last_error);
}

// Runs `f` and turns an escaping exception into an error and `on_error`.
template <typename R, typename F>
R Guarded(R on_error, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    SetError(absl::InternalError(absl::StrCat("bucketalloc: internal error: ", e.what())));
  } catch (...) {
    SetError(absl::InternalError("bucketalloc: internal error: unknown exception"));
  }
  return on_error;
}

// The options the allocator is created with.
absl::StatusOr<Options> ConfiguredOptions() {
  if (g_conf != nullptr) return ParseOptions(*g_conf);
  return OptionsFromEnv();
}

// Creates the allocator from the configured options; a failure sets the last error, and the next
// call tries again (bucketalloc_configure may have fixed the options meanwhile).
Allocator* CreateAllocator() {
  return g_process.CreateOnce([]() -> std::unique_ptr<Allocator> {
    absl::StatusOr<Options> options = ConfiguredOptions();
    if (!options.ok()) {
      SetError(options.status());
      return nullptr;
    }
    absl::StatusOr<std::unique_ptr<Allocator>> created = Allocator::Create(*options);
    if (!created.ok()) {
      SetError(absl::Status(created.status().code(),
                            absl::StrCat("bucketalloc: cannot create the allocator: ", created.status().message())));
      return nullptr;
    }
    return std::move(*created);
  });
}

// Creates the allocator, then (after it is published) the observers the environment asks for:
// BUCKETALLOC_METRICS_ADDR, BUCKETALLOC_TIMELINE, each started once per process and reading the
// allocator from its own thread; one that cannot start is reported and changes nothing else.
Allocator* CreateAllocatorAndObservers() {
  Allocator* a = CreateAllocator();
  plugins::StartMetricsServerFromEnv(a, "bucketalloc");
  plugins::StartTimelineFromEnv(a, "bucketalloc");
  return a;
}

// Threads inside a private pool's segment allocator now (bucketalloc_pool_set_segment_allocator's
// alloc, free or release, which the library calls under the device's lock), and whether this thread
// is one: a call into the library from there would wait for that lock forever, so every call that
// reaches the allocator is refused (Get). The allocation path reads the count alone (one load; the
// thread's flag only while some thread is inside one), so the library needs no static TLS and still
// loads with dlopen wherever it did.
std::atomic<int> g_threads_in_segment_callbacks{0};
thread_local bool t_in_segment_callback = false;

// Marks the thread inside a segment allocator's callback for its scope.
class SegmentCallbackScope {
 public:
  SegmentCallbackScope() : outer_(t_in_segment_callback) {
    if (!outer_) {
      t_in_segment_callback = true;
      g_threads_in_segment_callbacks.fetch_add(1, std::memory_order_relaxed);
    }
  }
  ~SegmentCallbackScope() {
    if (!outer_) {
      g_threads_in_segment_callbacks.fetch_sub(1, std::memory_order_relaxed);
      t_in_segment_callback = false;
    }
  }
  SegmentCallbackScope(const SegmentCallbackScope&) = delete;
  SegmentCallbackScope& operator=(const SegmentCallbackScope&) = delete;

 private:
  const bool outer_;
};

// A call from inside a segment allocator's callback: the error (a void function prints it too).
[[gnu::cold, gnu::noinline]] void RefuseReentry() {
  SetError(absl::FailedPreconditionError(
      "bucketalloc: called from inside a private pool's segment allocator (the alloc, free or release given to "
      "bucketalloc_pool_set_segment_allocator), which runs under the device's lock: refused, as it would wait for "
      "that lock forever; a segment allocator must not call into bucketalloc (free or allocate after it returns)"));
}

// True, with the last error set, on a thread inside a segment allocator's callback: every function
// that reaches the allocator asks first (through Get, or itself where it never creates it).
inline bool Reentered() {
  if (g_threads_in_segment_callbacks.load(std::memory_order_relaxed) != 0 && t_in_segment_callback) [[unlikely]] {
    RefuseReentry();
    return true;
  }
  return false;
}

// The allocator, created on first use; nullptr with the last error set when it cannot be created
// or when called from inside a segment allocator's callback.
inline Allocator* Get() {
  if (Reentered()) [[unlikely]]
    return nullptr;
  if (Allocator* a = g_process.get()) [[likely]]
    return a;
  return CreateAllocatorAndObservers();
}

// Writes `text` as snprintf does; see "Inspection" in bucketalloc.h.
ssize_t WriteText(const std::string& text, char* buf, std::size_t len) {
  if (buf == nullptr && len > 0) {
    SetError(absl::InvalidArgumentError(
        absl::StrCat("bucketalloc: the output buffer is NULL but its length is ", len,
                     "; accepted: a buffer of at least len bytes, or len 0 to ask for the length")));
    return -1;
  }
  if (len > 0) {
    const std::size_t n = std::min(text.size(), len - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return static_cast<ssize_t>(text.size());
}

// Renders the text of `make(allocator)` (a StatusOr<std::string>) into buf.
template <typename F>
ssize_t TextCall(char* buf, std::size_t len, F&& make) {
  return Guarded<ssize_t>(-1, [&]() -> ssize_t {
    Allocator* a = Get();
    if (a == nullptr) return -1;
    absl::StatusOr<std::string> text = make(*a);
    if (!text.ok()) {
      SetError(text.status());
      return -1;
    }
    return WriteText(*text, buf, len);
  });
}

// Runs `f(allocator)` (an absl::Status) and returns 0, or -1 with the last error set.
template <typename F>
int StatusCall(F&& f) {
  return Guarded<int>(-1, [&]() -> int {
    Allocator* a = Get();
    if (a == nullptr) return -1;
    absl::Status s = f(*a);
    if (s.ok()) return 0;
    SetError(s);
    return -1;
  });
}

absl::StatusOr<void*> Malloc(ssize_t size, int device, cudaStream_t stream) {
  if (size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc_malloc: size ", size, " on device ", device,
                                                   " is negative; accepted: 0 to ", kMaxRequestBytes, " bytes"));
  }
  Allocator* a = Get();
  if (a == nullptr) return absl::FailedPreconditionError(absl::string_view(t_last_error));
  return a->Allocate(static_cast<std::size_t>(size), device, stream);
}

// Runs `f(sim backend of device)`: 0, or -1 with the last error set (also for another backend).
template <typename F>
int SimCall(int device, F&& f) {
  return StatusCall([&](Allocator& a) -> absl::Status {
    absl::StatusOr<Backend*> backend = a.backend(device);
    if (!backend.ok()) return backend.status();
    SimBackend* sim = AsSim(*backend);
    if (sim == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("bucketalloc: device ", device, " uses the '",
                                                        (*backend)->Name(),
                                                        "' backend; the simulated-device controls need backend:sim"));
    }
    f(*sim);
    return absl::OkStatus();
  });
}

// Refuses a struct of another size than this header's (a host built against another version).
absl::Status CheckStructSize(const char* function, const char* type, std::size_t given, std::size_t expected) {
  if (given == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("bucketalloc: ", function, ": struct ", type, " of ", given, " bytes; accepted: ", expected,
                   " bytes (this library's bucketalloc.h; rebuild the caller against it)"));
}

bucketalloc_stat ToC(const Stat& s) { return bucketalloc_stat{s.current, s.peak, s.allocated, s.freed}; }

bucketalloc_device_stats ToC(const DeviceStats& s) {
  bucketalloc_device_stats out{};
#define BUCKETALLOC_COPY_POOL_STAT(name, doc) \
  for (int p = 0; p < kNumPoolIndices; ++p) out.name[p] = ToC(s.name[p]);
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_COPY_POOL_STAT)
#undef BUCKETALLOC_COPY_POOL_STAT
#define BUCKETALLOC_COPY_COUNTER(name, doc) out.name = s.name;
  BUCKETALLOC_COUNTERS(BUCKETALLOC_COPY_COUNTER)
#undef BUCKETALLOC_COPY_COUNTER
#define BUCKETALLOC_COPY_DEVICE_STAT(name, doc) out.name = ToC(s.name);
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_COPY_DEVICE_STAT)
#undef BUCKETALLOC_COPY_DEVICE_STAT
  out.max_split_size = s.max_split_size;
  out.capacity_bytes = s.capacity_bytes;
  return out;
}

// The C ABI's action number of a history entry: PyTorch's TraceEntry::Action.
int TraceActionNumber(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return BUCKETALLOC_TRACE_ALLOC;
    case TraceAction::kFreeRequested:
      return BUCKETALLOC_TRACE_FREE_REQUESTED;
    case TraceAction::kFreeCompleted:
      return BUCKETALLOC_TRACE_FREE_COMPLETED;
    case TraceAction::kSegmentAlloc:
      return BUCKETALLOC_TRACE_SEGMENT_ALLOC;
    case TraceAction::kSegmentFree:
      return BUCKETALLOC_TRACE_SEGMENT_FREE;
    case TraceAction::kSegmentMap:
      return BUCKETALLOC_TRACE_SEGMENT_MAP;
    case TraceAction::kSegmentUnmap:
      return BUCKETALLOC_TRACE_SEGMENT_UNMAP;
    case TraceAction::kOom:
      return BUCKETALLOC_TRACE_OOM;
  }
  return -1;
}

// The C hook bucketalloc_set_trace_hook installed (read under the device locks that call it).
struct CTraceHook {
  std::atomic<bucketalloc_trace_fn> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
};
CTraceHook g_trace_hook;

void CallCTraceHook(int device, const TraceEntry& e, void*) {
  bucketalloc_trace_fn fn = g_trace_hook.fn.load(std::memory_order_acquire);
  if (fn == nullptr) return;
  const bucketalloc_trace_event event{device,        TraceActionNumber(e.action),  e.addr, e.size, e.stream, e.time_us,
                                      e.device_free, {e.pool.first, e.pool.second}};
  fn(&event, g_trace_hook.ctx.load(std::memory_order_acquire));
}

GraphPoolId ToPool(bucketalloc_pool_id id) { return GraphPoolId{id.first, id.second}; }

// Thrown by bucketalloc_malloc_or_throw: a std::bad_alloc that carries the allocator's message.
class AllocationError final : public std::bad_alloc {
 public:
  explicit AllocationError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace
}  // namespace bucketalloc

using bucketalloc::Allocator;
using bucketalloc::Get;
using bucketalloc::Guarded;
using bucketalloc::SetError;

extern "C" {

void* bucketalloc_malloc(ssize_t size, int device, cudaStream_t stream) {
  return Guarded<void*>(nullptr, [&]() -> void* {
    absl::StatusOr<void*> p = bucketalloc::Malloc(size, device, stream);
    if (p.ok()) [[likely]]
      return *p;
    if (absl::IsResourceExhausted(p.status())) {
      bucketalloc::ReportError(p.status());  // the OOM report: the host sees only a NULL
    } else {
      SetError(p.status());
    }
    return nullptr;
  });
}

void* bucketalloc_malloc_or_throw(ssize_t size, int device, cudaStream_t stream) {
  std::optional<absl::StatusOr<void*>> p;
  Guarded<int>(0, [&]() -> int {
    p.emplace(bucketalloc::Malloc(size, device, stream));
    return 0;
  });
  if (p.has_value() && p->ok()) [[likely]]
    return **p;
  // Either the allocation failed (its status) or an exception was caught (the last error).
  std::string message = p.has_value() ? std::string(p->status().message()) : std::string(bucketalloc::t_last_error);
  if (p.has_value()) SetError(p->status());
  throw bucketalloc::AllocationError(std::move(message));
}

int bucketalloc_try_malloc(ssize_t size, int device, cudaStream_t stream, void** out) {
  return Guarded<int>(-1, [&]() -> int {
    if (out == nullptr) {
      SetError(absl::InvalidArgumentError("bucketalloc_try_malloc: out is NULL; accepted: a void* to set"));
      return -1;
    }
    *out = nullptr;
    absl::StatusOr<void*> p = bucketalloc::Malloc(size, device, stream);
    if (p.ok()) [[likely]] {
      *out = *p;
      return 0;
    }
    if (!absl::IsResourceExhausted(p.status())) {
      SetError(p.status());
      return -1;
    }
    std::string message(p.status().message());
    if (Allocator* a = bucketalloc::g_process.get()) {
      absl::StatusOr<std::optional<bucketalloc::OomReport>> report = a->LastOomReport(device);
      if (report.ok() && report->has_value()) message = absl::StrCat((*report)->TorchHeader(), "\n", message);
    }
    bucketalloc::SetErrorText(message);
    return 1;
  });
}

void bucketalloc_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr) return;
  Guarded<int>(0, [&]() -> int {
    Allocator* a = Get();
    if (a == nullptr) {  // the host sees nothing of a void function's failure but this
      bucketalloc::ReportIfFailed(-1);
      return 0;
    }
    std::optional<std::size_t> checked;
    if (size >= 0) checked = static_cast<std::size_t>(size);
    if (absl::Status s = a->Free(ptr, device, checked); !s.ok()) bucketalloc::ReportError(s);
    return 0;
  });
}

int bucketalloc_raw_delete(void* ptr) {
  if (ptr == nullptr) return 0;
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (a.device_count() == 1) [[likely]]
      return a.Free(ptr, 0);
    absl::StatusOr<int> device = a.DeviceOf(ptr);
    if (!device.ok()) return device.status();
    return a.Free(ptr, *device);
  });
}

void bucketalloc_init(int device_count) {
  Guarded<int>(0, [&]() -> int {
    Allocator* a = Get();
    if (a == nullptr) {
      bucketalloc::ReportIfFailed(-1);
      return 0;
    }
    if (device_count != a->device_count()) {
      std::fprintf(stderr, "bucketalloc: the host reports %d devices, the '%s' backend serves %d\n", device_count,
                   a->options().backend.c_str(), a->device_count());
    }
    return 0;
  });
}

void bucketalloc_empty_cache(void) {
  Guarded<int>(0, [&]() -> int {
    if (bucketalloc::Reentered()) {
      bucketalloc::ReportIfFailed(-1);
      return 0;
    }
    Allocator* a = bucketalloc::g_process.get();
    if (a == nullptr) return 0;  // nothing cached yet
    if (absl::Status s = a->EmptyCache(); !s.ok()) bucketalloc::ReportError(s);
    return 0;
  });
}

void bucketalloc_set_memory_fraction(double fraction, int device) {
  bucketalloc::ReportIfFailed(
      bucketalloc::StatusCall([&](Allocator& a) { return a.SetMemoryFraction(fraction, device); }));
}

void bucketalloc_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;  // an empty tensor's storage
  bucketalloc::ReportIfFailed(bucketalloc::StatusCall([&](Allocator& a) { return a.RecordStream(ptr, stream); }));
}

int bucketalloc_retire_stream(cudaStream_t stream) {
  return bucketalloc::StatusCall(
      [&](Allocator& a) { return a.RetireStream(static_cast<bucketalloc::Stream>(stream)); });
}

void* bucketalloc_base_alloc(void* ptr, size_t* size) {
  return Guarded<void*>(nullptr, [&]() -> void* {
    Allocator* a = Get();
    if (a == nullptr) return nullptr;
    absl::StatusOr<std::pair<void*, std::size_t>> base = a->BaseAllocation(ptr);
    if (!base.ok()) {
      SetError(base.status());
      return nullptr;
    }
    if (size != nullptr) *size = base->second;
    return base->first;
  });
}

int bucketalloc_capture_begin(int device, unsigned long long pool, cudaStream_t stream) {
  // The pool key of `stream` on this thread (cudaStreamPerThread: this thread's own).
  const bucketalloc::Stream key = Allocator::PoolKey(static_cast<bucketalloc::Stream>(stream));
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.BeginCapture(device, bucketalloc::GraphPoolId{pool, 0}, [key](bucketalloc::Stream s) { return s == key; });
  });
}

int bucketalloc_capture_end(int device, unsigned long long pool) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.EndCapture(device, bucketalloc::GraphPoolId{pool, 0}); });
}

int bucketalloc_release_pool(int device, unsigned long long pool) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.ReleasePool(device, bucketalloc::GraphPoolId{pool, 0});
  });
}

int bucketalloc_begin_allocate_to_pool(int device, bucketalloc_pool_id pool, std::function<bool(cudaStream_t)> filter) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.BeginCapture(
        device, bucketalloc::GraphPoolId{pool.first, pool.second},
        [filter = std::move(filter)](bucketalloc::Stream s) { return filter(static_cast<cudaStream_t>(s)); });
  });
}

int bucketalloc_end_allocate_to_pool(int device, bucketalloc_pool_id pool) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.EndCapture(device, bucketalloc::GraphPoolId{pool.first, pool.second});
  });
}

int bucketalloc_release_pool_id(int device, bucketalloc_pool_id pool) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.ReleasePool(device, bucketalloc::GraphPoolId{pool.first, pool.second});
  });
}

void bucketalloc_torch_begin_allocate_to_pool(int device, bucketalloc_mempool_id pool,
                                              std::function<bool(cudaStream_t)> filter) {
  bucketalloc::ReportIfFailed(bucketalloc_begin_allocate_to_pool(device, {pool.first, pool.second}, std::move(filter)));
}

void bucketalloc_torch_end_allocate_to_pool(int device, bucketalloc_mempool_id pool) {
  bucketalloc::ReportIfFailed(bucketalloc_end_allocate_to_pool(device, {pool.first, pool.second}));
}

void bucketalloc_torch_release_pool(int device, bucketalloc_mempool_id pool) {
  bucketalloc::ReportIfFailed(bucketalloc_release_pool_id(device, {pool.first, pool.second}));
}

int bucketalloc_get_device_stats(int device, bucketalloc_device_stats* out, size_t size) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (out == nullptr)
      return absl::InvalidArgumentError("bucketalloc_get_device_stats: out is NULL; accepted: a struct");
    if (absl::Status s =
            bucketalloc::CheckStructSize(__func__, "bucketalloc_device_stats", size, sizeof(bucketalloc_device_stats));
        !s.ok()) {
      return s;
    }
    absl::StatusOr<bucketalloc::DeviceStats> stats = a.GetStats(device);
    if (!stats.ok()) return stats.status();
    *out = bucketalloc::ToC(*stats);
    return absl::OkStatus();
  });
}

int bucketalloc_visit_private_pool_stats(int device, bucketalloc_pool_stat_fn fn, void* ctx) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (fn == nullptr) return absl::InvalidArgumentError("bucketalloc_visit_private_pool_stats: fn is NULL");
    absl::StatusOr<bucketalloc::DeviceStats> stats = a.GetStats(device);
    if (!stats.ok()) return stats.status();
    for (const bucketalloc::PrivatePoolStats& pool : stats->reserved_bytes_by_private_pools) {
      bucketalloc_stat reserved[bucketalloc::kNumPoolIndices];
      for (int p = 0; p < bucketalloc::kNumPoolIndices; ++p) reserved[p] = bucketalloc::ToC(pool.reserved_bytes[p]);
      fn(bucketalloc_pool_id{pool.id_first, pool.id_second}, reserved, ctx);
    }
    return absl::OkStatus();
  });
}

int bucketalloc_reset_accumulated_stats(int device) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.ResetAccumulatedStats(device); });
}

int bucketalloc_visit_segments(int device, bucketalloc_segment_fn fn, void* ctx) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (fn == nullptr) return absl::InvalidArgumentError("bucketalloc_visit_segments: fn is NULL");
    absl::StatusOr<bucketalloc::MemorySnapshot> snapshot = a.Snapshot(device);
    if (!snapshot.ok()) return snapshot.status();
    std::vector<bucketalloc_block_info> blocks;
    for (const bucketalloc::SegmentSnapshot& s : snapshot->segments) {
      blocks.clear();
      for (const bucketalloc::BlockSnapshot& b : s.blocks) {
        blocks.push_back(bucketalloc_block_info{b.address, b.size, b.requested_size, static_cast<int>(b.state)});
      }
      const bucketalloc_segment_info info{s.device,
                                          s.address,
                                          s.total_size,
                                          s.allocated_size,
                                          s.active_size,
                                          s.requested_size,
                                          s.stream,
                                          s.small ? 1 : 0,
                                          s.expandable ? 1 : 0,
                                          bucketalloc_pool_id{s.pool_id.first, s.pool_id.second},
                                          blocks.data(),
                                          blocks.size()};
      fn(&info, ctx);
    }
    return absl::OkStatus();
  });
}

int bucketalloc_set_trace_hook(bucketalloc_trace_fn fn, void* ctx) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    bucketalloc::g_trace_hook.ctx.store(ctx, std::memory_order_release);
    bucketalloc::g_trace_hook.fn.store(fn, std::memory_order_release);
    a.SetTraceHook(bucketalloc::TraceHook{fn == nullptr ? nullptr : &bucketalloc::CallCTraceHook, nullptr});
    return absl::OkStatus();
  });
}

int bucketalloc_cache_info(int device, size_t* largest_block) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (largest_block == nullptr) return absl::InvalidArgumentError("bucketalloc_cache_info: largest_block is NULL");
    absl::StatusOr<std::size_t> largest = a.CacheInfo(device, /*with_headroom=*/*largest_block == 0);
    if (!largest.ok()) return largest.status();
    *largest_block = std::max<std::size_t>(*largest_block, *largest);
    return absl::OkStatus();
  });
}

int bucketalloc_prefetch(int device, size_t spare_target, size_t max_create, size_t* created) {
  if (created != nullptr) *created = 0;
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    absl::StatusOr<std::size_t> made =
        a.Prefetch(device, spare_target, max_create == 0 ? bucketalloc::kUnlimited : max_create);
    if (!made.ok()) return made.status();
    if (created != nullptr) *created = *made;
    return absl::OkStatus();
  });
}

double bucketalloc_memory_fraction(int device) {
  double fraction = -1.0;
  const int rc = bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    absl::StatusOr<double> f = a.MemoryFraction(device);
    if (!f.ok()) return f.status();
    fraction = *f;
    return absl::OkStatus();
  });
  return rc == 0 ? fraction : -1.0;
}

int bucketalloc_pool_incref(int device, bucketalloc_pool_id pool) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.IncrefPool(device, bucketalloc::ToPool(pool)); });
}

int bucketalloc_pool_set_use_on_oom(int device, bucketalloc_pool_id pool, int use_on_oom) {
  return bucketalloc::StatusCall(
      [&](Allocator& a) { return a.SetUseOnOom(device, bucketalloc::ToPool(pool), use_on_oom != 0); });
}

int bucketalloc_pool_set_no_split(int device, bucketalloc_pool_id pool) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.UpdatePoolSettings(device, bucketalloc::ToPool(pool),
                                [](bucketalloc::PrivatePoolSettings& s) { s.no_split = true; });
  });
}

namespace bucketalloc {
namespace {
// A C caller's segment allocator (bucketalloc_pool_set_segment_allocator): its functions, its
// context, and the release of the context when the pool drops it.
class CSegmentAllocator final : public SegmentAllocator {
 public:
  CSegmentAllocator(int device, bucketalloc_segment_alloc_fn alloc, bucketalloc_segment_free_fn free,
                    void (*release)(void*), void* ctx)
      : device_(device), alloc_(alloc), free_(free), release_(release), ctx_(ctx) {}
  ~CSegmentAllocator() override {
    SegmentCallbackScope scope;
    if (release_ != nullptr) release_(ctx_);
  }
  absl::StatusOr<void*> Allocate(std::size_t bytes, Stream stream) override {
    void* p = nullptr;
    {
      SegmentCallbackScope scope;
      p = alloc_(bytes, device_, static_cast<cudaStream_t>(stream), ctx_);
    }
    if (p != nullptr) return p;
    return absl::ResourceExhaustedError(
        absl::StrCat("bucketalloc: the private pool's segment allocator has no ", bytes, " bytes"));
  }
  void Free(void* ptr, std::size_t bytes) override {
    SegmentCallbackScope scope;
    free_(ptr, bytes, device_, ctx_);
  }

 private:
  const int device_;
  const bucketalloc_segment_alloc_fn alloc_;
  const bucketalloc_segment_free_fn free_;
  void (*const release_)(void*);
  void* const ctx_;
};
}  // namespace
}  // namespace bucketalloc

int bucketalloc_pool_set_segment_allocator(int device, bucketalloc_pool_id pool, bucketalloc_segment_alloc_fn alloc,
                                           bucketalloc_segment_free_fn free, void (*release)(void* ctx), void* ctx) {
  if (alloc == nullptr || free == nullptr) {
    if (release != nullptr) release(ctx);
    return bucketalloc::StatusCall([&](Allocator&) {
      return absl::InvalidArgumentError(
          "bucketalloc_pool_set_segment_allocator: alloc and free must both be functions (one is NULL)");
    });
  }
  std::shared_ptr<bucketalloc::SegmentAllocator> segments;
  try {
    segments = std::make_shared<bucketalloc::CSegmentAllocator>(device, alloc, free, release, ctx);
  } catch (...) {
    if (release != nullptr) release(ctx);
    return bucketalloc::StatusCall(
        [&](Allocator&) { return absl::ResourceExhaustedError("bucketalloc_pool_set_segment_allocator: no memory"); });
  }
  return bucketalloc::StatusCall([&](Allocator& a) {
    return a.UpdatePoolSettings(device, bucketalloc::ToPool(pool),
                                [&](bucketalloc::PrivatePoolSettings& s) { s.segment_allocator = segments; });
  });  // on failure the last reference to `segments` goes here: the context is released
}

int bucketalloc_mark_capture(int device, int begin) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.MarkCapture(device, begin != 0); });
}

int bucketalloc_pool_use_count(int device, bucketalloc_pool_id pool) {
  int count = -1;
  const int rc = bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    absl::StatusOr<int> c = a.PoolUseCount(device, bucketalloc::ToPool(pool));
    if (!c.ok()) return c.status();
    count = *c;
    return absl::OkStatus();
  });
  return rc == 0 ? count : -1;
}

int bucketalloc_pool_empty_cache(int device, bucketalloc_pool_id pool) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.EmptyPoolCache(device, bucketalloc::ToPool(pool)); });
}

int bucketalloc_share_block(void* ptr, bucketalloc_shared_memory* out, size_t size, bucketalloc_shared_piece* pieces,
                            size_t capacity) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (out == nullptr || size != sizeof(bucketalloc_shared_memory)) {
      return absl::InvalidArgumentError(absl::StrCat("bucketalloc_share_block: out is NULL or of ", size,
                                                     " bytes; accepted: a bucketalloc_shared_memory of ",
                                                     sizeof(bucketalloc_shared_memory), " bytes"));
    }
    absl::StatusOr<bucketalloc::SharedMemory> shared = a.ShareBlock(ptr);
    if (!shared.ok()) return shared.status();
    *out = bucketalloc_shared_memory{shared->virtual_memory ? 1 : 0, shared->base, shared->bytes, shared->offset,
                                     shared->pieces.size()};
    if (shared->pieces.size() > capacity || (capacity > 0 && pieces == nullptr)) {
      return absl::OutOfRangeError(absl::StrCat("bucketalloc_share_block: ", shared->pieces.size(),
                                                " pieces do not fit in a capacity of ", capacity));
    }
    for (std::size_t i = 0; i < shared->pieces.size(); ++i) {
      pieces[i] = bucketalloc_shared_piece{shared->pieces[i].fd, shared->pieces[i].bytes};
    }
    return absl::OkStatus();
  });
}

void* bucketalloc_open_shared(int device, int pid, const bucketalloc_shared_piece* pieces, size_t n) {
  void* base = nullptr;
  bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (pieces == nullptr && n > 0) return absl::InvalidArgumentError("bucketalloc_open_shared: pieces is NULL");
    std::vector<bucketalloc::SharedPiece> list;
    list.reserve(n);
    for (size_t i = 0; i < n; ++i) list.push_back(bucketalloc::SharedPiece{pieces[i].fd, pieces[i].bytes});
    absl::StatusOr<void*> opened = a.OpenShared(device, pid, list);
    if (!opened.ok()) return opened.status();
    base = *opened;
    return absl::OkStatus();
  });
  return base;
}

int bucketalloc_close_shared(void* base) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.CloseShared(base); });
}

int bucketalloc_allocate_at(int device, bucketalloc_pool_id pool, void* addr, size_t block_size, size_t requested,
                            cudaStream_t stream) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    return a
        .AllocateAt(device, bucketalloc::ToPool(pool), addr, block_size, requested,
                    static_cast<bucketalloc::Stream>(stream))
        .status();
  });
}

int bucketalloc_last_oom_info(int device, bucketalloc_oom_info* out, size_t size) {
  return bucketalloc::StatusCall([&](Allocator& a) -> absl::Status {
    if (out == nullptr) return absl::InvalidArgumentError("bucketalloc_last_oom_info: out is NULL; accepted: a struct");
    if (absl::Status s =
            bucketalloc::CheckStructSize(__func__, "bucketalloc_oom_info", size, sizeof(bucketalloc_oom_info));
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::optional<bucketalloc::OomReport>> report = a.LastOomReport(device);
    if (!report.ok()) return report.status();
    *out = bucketalloc_oom_info{};
    if (!report->has_value()) return absl::OkStatus();
    const bucketalloc::OomReport& r = **report;
    out->present = 1;
    out->requested = r.requested;
    out->segment = r.segment;
    out->allocated = r.allocated;
    out->reserved = r.reserved;
    out->capacity = r.at_tenant_cap ? r.tenant_cap : r.capacity;
    out->device_total = r.device_total;
    out->device_free = r.device_free;
    out->cause = static_cast<int>(r.cause);
    out->rejected = r.rejected ? 1 : 0;
    return absl::OkStatus();
  });
}

ssize_t bucketalloc_stats_json(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> {
    absl::StatusOr<bucketalloc::DeviceStats> stats = a.GetStats(device);
    if (!stats.ok()) return stats.status();
    return bucketalloc::StatsToJson(*stats);
  });
}

ssize_t bucketalloc_tenant_stats_json(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::vector<bucketalloc::TenantStats>> tenants = a.GetTenantStats(device);
    if (!tenants.ok()) return tenants.status();
    return bucketalloc::TenantStatsToJson(*tenants);
  });
}

ssize_t bucketalloc_thread_tenant(char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> { return a.ThreadTenant(); });
}

ssize_t bucketalloc_fragmentation_json(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> {
    absl::StatusOr<bucketalloc::FragmentationReport> report = a.GetFragmentation(device);
    if (!report.ok()) return report.status();
    return bucketalloc::FragmentationToJson(*report);
  });
}

ssize_t bucketalloc_metrics_text(char* buf, size_t len) {
  return Guarded<ssize_t>(-1, [&]() -> ssize_t {
    // Never creates the allocator: before it exists there is nothing to report.
    if (bucketalloc::Reentered()) return ssize_t{-1};
    const Allocator* a = bucketalloc::g_process.get();
    return bucketalloc::WriteText(a == nullptr ? std::string() : bucketalloc::MetricsToPrometheus(a->Metrics()), buf,
                                  len);
  });
}

int bucketalloc_metrics_port(void) {
  return Guarded<int>(-1, [&]() -> int {
    // Never creates the allocator (nor the server, which starts with it).
    absl::StatusOr<int> port = bucketalloc::plugins::ProcessMetricsPort();
    if (!port.ok()) {
      SetError(port.status());
      return -1;
    }
    return *port;
  });
}

int bucketalloc_timeline_start(const char* path, int interval_ms) {
  return Guarded<int>(-1, [&]() -> int {
    if (path == nullptr || *path == '\0') {
      SetError(
          absl::InvalidArgumentError("bucketalloc: bucketalloc_timeline_start needs a file path; accepted: a "
                                     "non-empty path and an interval from 1 to 3600000 ms"));
      return -1;
    }
    Allocator* a = Get();
    if (a == nullptr) return -1;
    if (absl::Status s = bucketalloc::plugins::StartTimeline(path, interval_ms, a); !s.ok()) {
      SetError(s);
      return -1;
    }
    return 0;
  });
}

int bucketalloc_timeline_stop(void) {
  return Guarded<int>(-1, [&]() -> int {
    bucketalloc::plugins::StopTimeline();
    return 0;
  });
}

ssize_t bucketalloc_summary(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) { return a.Summary(device); });
}

ssize_t bucketalloc_snapshot_json(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> {
    absl::StatusOr<bucketalloc::MemorySnapshot> snapshot = a.Snapshot(device);
    if (!snapshot.ok()) return snapshot.status();
    return bucketalloc::SnapshotToJson(*snapshot);
  });
}

ssize_t bucketalloc_last_oom_report(int device, char* buf, size_t len) {
  return bucketalloc::TextCall(buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::optional<bucketalloc::OomReport>> report = a.LastOomReport(device);
    if (!report.ok()) return report.status();
    return report->has_value() ? (*report)->ToString() : std::string();
  });
}

ssize_t bucketalloc_env_config_string(char* buf, size_t len) {
  return Guarded<ssize_t>(-1, [&]() -> ssize_t {
    absl::StatusOr<bucketalloc::Options> options = bucketalloc::OptionsFromEnv();
    if (!options.ok()) {
      SetError(options.status());
      return -1;
    }
    return bucketalloc::WriteText(bucketalloc::FormatOptions(*options), buf, len);
  });
}

ssize_t bucketalloc_config_string(char* buf, size_t len) {
  return bucketalloc::TextCall(
      buf, len, [&](Allocator& a) -> absl::StatusOr<std::string> { return bucketalloc::FormatOptions(a.options()); });
}

namespace {
// A tenant name argument: InvalidArgument for NULL.
absl::StatusOr<absl::string_view> TenantArg(const char* tenant) {
  if (tenant == nullptr) {
    return absl::InvalidArgumentError("bucketalloc: the tenant name is NULL; accepted: a tenant's name or \"default\"");
  }
  return absl::string_view(tenant);
}
}  // namespace

int bucketalloc_bind_stream(cudaStream_t stream, const char* tenant) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    absl::StatusOr<absl::string_view> name = TenantArg(tenant);
    return name.ok() ? a.BindStream(static_cast<bucketalloc::Stream>(stream), *name) : name.status();
  });
}

int bucketalloc_set_thread_tenant(const char* tenant) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    absl::StatusOr<absl::string_view> name = TenantArg(tenant);
    return name.ok() ? a.SetThreadTenant(*name) : name.status();
  });
}

int bucketalloc_set_tenant_cap(const char* tenant, size_t cap) {
  return bucketalloc::StatusCall([&](Allocator& a) {
    absl::StatusOr<absl::string_view> name = TenantArg(tenant);
    return name.ok() ? a.SetTenantCap(*name, cap) : name.status();
  });
}

int bucketalloc_reset_peak_stats(int device) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.ResetPeakStats(device); });
}

int bucketalloc_configure(const char* conf) {
  return Guarded<int>(-1, [&]() -> int {
    const absl::string_view text = conf == nullptr ? absl::string_view() : absl::string_view(conf);
    absl::StatusOr<bucketalloc::Options> options = bucketalloc::ParseOptions(text);
    if (!options.ok()) {
      SetError(options.status());
      return -1;
    }
    return bucketalloc::g_process.Locked([&](Allocator* a) -> int {
      if (a != nullptr) {
        const std::string current = bucketalloc::FormatOptions(a->options());
        if (bucketalloc::FormatOptions(*options) == current) return 0;  // the same configuration again
        SetError(absl::FailedPreconditionError(absl::StrCat(
            "bucketalloc_configure: the allocator already exists (it is created on first use) with \"", current,
            "\"; configure must be called before the first allocation, or set BUCKETALLOC_CONF before the process "
            "starts")));
        return -1;
      }
      if (bucketalloc::g_conf == nullptr) bucketalloc::g_conf = new std::string;
      bucketalloc::g_conf->assign(text.data(), text.size());
      return 0;
    });
  });
}

int bucketalloc_record_history(int enabled, size_t max_entries) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.RecordHistory(enabled != 0, max_entries); });
}

int bucketalloc_check_invariants(int device) {
  return bucketalloc::StatusCall([&](Allocator& a) { return a.CheckInvariants(device); });
}

const char* bucketalloc_last_error(void) { return bucketalloc::t_last_error; }

int bucketalloc_is_initialized(void) { return bucketalloc::g_process.get() != nullptr ? 1 : 0; }

int bucketalloc_device_count(void) {
  return Guarded<int>(-1, [&]() -> int {
    Allocator* a = Get();
    return a == nullptr ? -1 : a->device_count();
  });
}

const char* bucketalloc_version(void) { return BUCKETALLOC_VERSION_STRING; }

int bucketalloc_cuda_driver_version(void) {
  return Guarded<int>(-1, [&]() -> int {
    absl::StatusOr<int> version = bucketalloc::CudaDriverVersion();
    if (!version.ok()) {
      bucketalloc::SetError(version.status());
      return -1;
    }
    return *version;
  });
}

int bucketalloc_cuda_headers_version(void) { return bucketalloc::CudaHeadersVersion(); }

int bucketalloc_sim_enqueue_work(int device, cudaStream_t stream) {
  return bucketalloc::SimCall(device, [&](bucketalloc::SimBackend& sim) { sim.EnqueueWork(stream); });
}

int bucketalloc_sim_complete_work(int device, cudaStream_t stream) {
  return bucketalloc::SimCall(device, [&](bucketalloc::SimBackend& sim) { sim.CompleteWork(stream); });
}

int bucketalloc_sim_set_capturing(int device, cudaStream_t stream, int capturing) {
  return bucketalloc::SimCall(device, [&](bucketalloc::SimBackend& sim) { sim.SetCapturing(stream, capturing != 0); });
}

}  // extern "C"
