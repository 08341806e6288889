// tests/cuda_double/cuda_double.cc — a CUDA driver and runtime in host memory that enforces CUDA's
// documented rules (tests/cuda_double/cuda_double.h).
//
// Owns: N emulated devices (memory from one memfd each, so that a physical allocation can be mapped
// at any reserved address), their primary contexts, streams, events, stream captures and VMM
// reservations and mappings; the driver functions (exported under their ABI names and served by
// cuGetProcAddress_v2 by base name and version) and the runtime functions over them; the rule table
// and the violations; fake kernels.
// Thread-safety: one mutex guards everything; the API may be called from any thread.
// IPC of virtual memory: cuMemExportToShareableHandle to a POSIX file descriptor (a memfd of its
// own, whose inode names the allocation) and cuMemImportFromShareableHandle of that descriptor or
// of any duplicate of it (dup, pidfd_getfd), within one process only: the double's devices are
// one process's memory.
// Not modelled: kernels other than the fake ones, graphs beyond "a capture produced one", memory
// pools (cudaMallocAsync is the runtime's own pool: here it allocates like cuMemAlloc), IPC between
// processes (cudaIpc*, and any import in a process other than the exporter's), an exported
// descriptor as a reference that keeps the memory alive (the double cannot see it closed), shareable
// handle types other than POSIX file descriptors, host NUMA, multicast, compute modes, sticky errors.
#include "cuda_double.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// The rules. Each names where CUDA documents it (CUDA 13.0 headers under /usr/local/cuda/include,
// or the CUDA C++ Programming Guide).
enum Rule {
  kInitFirst,
  kContextCurrent,
  kLiveStream,
  kLiveEvent,
  kEventStreamSameContext,
  kCaptureUnsafeCall,
  kCaptureSyncOrQuery,
  kCaptureCapturedEvent,
  kCaptureLegacyStream,
  kCaptureLegacyBegin,
  kCaptureEndThread,
  kFreeUnknown,
  kVmmReserveSize,
  kVmmFreeWhole,
  kVmmFreeMapped,
  kVmmCreateGranularity,
  kVmmMapGranularity,
  kVmmMapOffset,
  kVmmMapReserved,
  kVmmMapUnmapped,
  kVmmLiveHandle,
  kVmmAccessMapped,
  kVmmUnmapWhole,
  kVmmExportRequested,
  kVmmImportExported,
  kKernelAccess,
  kPeerAccess,
  kDriverVersion,
  kRuleCount
};

struct RuleText {
  const char* name;
  const char* source;
};

constexpr RuleText kRules[kRuleCount] = {
    {"init-first", "cuda.h:5188 cuInit \"must be called before any other function from the driver API\""},
    {"context-current",
     "cuda.h:2617 CUDA_ERROR_INVALID_CONTEXT \"most frequently indicates that there is no context bound to the "
     "current thread\": calls that need one fail without it"},
    {"live-stream", "cuda.h:15825 cuStreamDestroy: the handle is released; later use is CUDA_ERROR_INVALID_HANDLE"},
    {"live-event", "cuda.h:16131 cuEventDestroy: the handle is destroyed; later use is CUDA_ERROR_INVALID_HANDLE"},
    {"event-stream-same-context",
     "cuda.h:15952 cuEventRecord \"hEvent and hStream must be from the same context otherwise "
     "CUDA_ERROR_INVALID_HANDLE is returned\""},
    {"capture-unsafe-call",
     "cuda.h:15454-15465 / cuda_runtime_api.h:2524-2547 cuThreadExchangeStreamCaptureMode: a thread with an "
     "ongoing non-relaxed capture, or (global mode) while another thread captures in global mode, \"is "
     "prohibited from potentially unsafe API calls\" such as cudaMalloc"},
    {"capture-sync-or-query",
     "CUDA Programming Guide, Stream Capture, Prohibited and Unhandled Operations: \"It is invalid to "
     "synchronize or query the execution status of a stream which is being captured ... or a device or "
     "context handle when any associated stream is in capture mode\""},
    {"capture-captured-event",
     "cuda.h:15463 \"prohibited from API calls which necessarily conflict with stream capture, for example, "
     "attempting cuEventQuery on an event that was last recorded inside a capture sequence\""},
    {"capture-legacy-stream",
     "cuda_runtime_api.h:2608 \"When a blocking stream is capturing, the legacy stream is in an unusable state "
     "until the blocking stream capture is terminated\""},
    {"capture-legacy-begin", "cuda_runtime_api.h:2477 \"Capture may not be initiated if stream is cudaStreamLegacy\""},
    {"capture-end-thread",
     "cuda.h:15491 cuStreamEndCapture: unless begun in CU_STREAM_CAPTURE_MODE_RELAXED, \"this call must be from "
     "the same thread as cuStreamBeginCapture\" (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)"},
    {"free-unknown", "cuda.h:8708 cuMemFree: dptr must be memory returned by cuMemAlloc (CUDA_ERROR_INVALID_VALUE)"},
    {"vmm-reserve-size",
     "cuda.h:12735 cuMemAddressReserve \"The size and address parameters must be a multiple of the host page "
     "size and the alignment must be a power of two or zero\""},
    {"vmm-free-whole",
     "cuda.h:12757 cuMemAddressFree \"The size must match what was given to memAddressReserve and the ptr given "
     "must match what was returned from memAddressReserve\""},
    {"vmm-free-mapped", "cuda.h:12757 cuMemAddressFree: a reservation is freed after its mappings are unmapped"},
    {"vmm-create-granularity",
     "cuda.h:12792 cuMemCreate: size must be a multiple of cuMemGetAllocationGranularity(MINIMUM)"},
    {"vmm-map-granularity",
     "cuda.h:12870 cuMemMap \"Both ptr, size, and offset must be a multiple of the value given via "
     "cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag\""},
    {"vmm-map-offset",
     "cuda.h:12899-12901 cuMemMap \"offset - Offset into the memory represented by handle from which to start "
     "mapping - Note: currently must be zero\": a handle maps from its start only (so a part of it cannot be "
     "mapped on its own, nor moved)"},
    {"vmm-map-reserved",
     "cuda.h:12867 cuMemMap \"This range must be an address reservation previously reserved with "
     "cuMemAddressReserve, and offset + size must be less than the size of the memory allocation\""},
    {"vmm-map-unmapped",
     "cuda.h:12894 \"cuMemMap can only create mappings on VA range reservations that are not currently mapped\""},
    {"vmm-live-handle", "cuda.h:12845 cuMemRelease: a released handle (all references gone) is invalid"},
    {"vmm-access-mapped", "cuda.h:13089 cuMemSetAccess \"The range must be a fully mapped address range\""},
    {"vmm-unmap-whole",
     "cuda.h:13058 cuMemUnmap \"The range must be the entire contiguous address range that was mapped to\""},
    {"vmm-export-requested",
     "cuda.h:4136 CU_MEM_HANDLE_TYPE_NONE \"Does not allow any export mechanism\"; cuda.h:832 "
     "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: exporting to a posix file descriptor with "
     "cuMemExportToShareableHandle \"if requested via ::cuMemCreate\" (CUmemAllocationProp::requestedHandleTypes, "
     "cuda.h:4309): another type is CUDA_ERROR_INVALID_VALUE"},
    {"vmm-import-exported",
     "cuda.h:13187 cuMemImportFromShareableHandle \"osHandle - Shareable Handle representing the memory allocation "
     "that is to be imported\": a descriptor cuMemExportToShareableHandle made (else CUDA_ERROR_INVALID_VALUE)"},
    {"kernel-access",
     "cuda.h:12885 \"calling cuMemMap does not make the address accessible, the caller needs to update "
     "accessibility of a contiguous mapped VA range by calling cuMemSetAccess\"; cuda.h:13086 cuMemSetAccess "
     "sets access per location (device): another device's kernel needs its own; memory not allocated or "
     "mapped may not be accessed"},
    {"peer-access",
     "cuda_runtime_api.h:8492 cudaDeviceEnablePeerAccess: \"all allocations from peerDevice will immediately be "
     "accessible by the current device\" (access is unidirectional, and only after this call)"},
    {"driver-version",
     "cuda.h:24296 cuGetProcAddress: \"If the specified CUDA version is greater than the driver version, the "
     "API will return CUDA_ERROR_INVALID_VALUE\"; an ABI the double does not serve is asked for"},
};

// ---------------------------------------------------------------------------------------------
// Configuration.

int EnvInt(const char* name, long long fallback, long long* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    *out = fallback;
    return 0;
  }
  char* end = nullptr;
  *out = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || *out < 0) {
    std::fprintf(stderr, "cuda double: %s=%s is not a non-negative integer\n", name, v);
    std::abort();
  }
  return 1;
}

constexpr std::size_t kGranularity = std::size_t{2} << 20;
constexpr std::size_t kAllocAlign = 512;  // cuMemAlloc's alignment here (CUDA guarantees at least 256)

struct Context;
struct Stream;

// A queued piece of work; runs after its dependencies and everything before it on its stream.
struct Op {
  std::uint64_t id = 0;
  bool host = false;  // a host function (cudaLaunchHostFunc): may block, so queries do not run it
  std::function<void()> run;
  std::vector<std::pair<Stream*, std::uint64_t>> deps;
};

struct Stream {
  Context* ctx = nullptr;
  bool blocking = true;  // synchronizes with the legacy stream (not cudaStreamNonBlocking)
  bool legacy = false;
  bool destroyed = false;
  std::deque<Op> queue;
  std::uint64_t next_id = 1;
  std::uint64_t done = 0;  // every op with id <= done has run
  // Capture.
  bool capturing = false;
  bool invalidated = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id capture_thread;
  unsigned long long capture_id = 0;
};

struct Context {
  int device = 0;
  Stream legacy;
  // Every per-thread default stream ever made in this context: a thread's outlives the thread, as
  // its queued work does (a thread's id may be reused by a later thread; its stream is not).
  std::vector<std::unique_ptr<Stream>> per_thread;
};

struct Event {
  Context* ctx = nullptr;
  Stream* stream = nullptr;  // the stream of the last record outside a capture (or nullptr)
  std::uint64_t id = 0;
  bool captured = false;  // last recorded inside a capture
  Stream* capture_stream = nullptr;
  bool warned_not_ready = false;
};

// A handle of physical memory (cuMemCreate'd or imported): a range of the device's memfd. Every
// handle of one allocation (its creator's and each import's, all with `memory` = the creator's
// handle) is a reference to it; the range is freed when every one is released and unmapped
// (cuda.h:12841-12846, cuMemRelease).
struct Physical {
  int device = 0;
  std::size_t offset = 0;
  std::size_t bytes = 0;
  int mappings = 0;       // of this handle
  bool released = false;  // cuMemRelease was called; the record goes with its last mapping
  unsigned long long memory = 0;
  int handle_types = CU_MEM_HANDLE_TYPE_NONE;  // requestedHandleTypes of the allocation's cuMemCreate
};

struct Mapping {  // one cuMemMap
  std::uintptr_t va = 0;
  std::size_t bytes = 0;
  unsigned long long handle = 0;
  std::uint64_t access = 0;  // bit d: device d has read-write access
};

struct Reservation {
  std::uintptr_t va = 0;
  std::size_t bytes = 0;
  std::map<std::uintptr_t, Mapping> mappings;  // by va
};

struct LinearAlloc {  // cuMemAlloc
  std::size_t bytes = 0;
  std::size_t charged = 0;
  int device = 0;
  std::size_t offset = 0;
};

struct Device {
  int fd = -1;
  std::size_t capacity = 0;
  std::map<std::size_t, std::size_t> free;  // offset -> bytes, coalesced
  std::size_t used = 0;
  std::unique_ptr<Context> primary;
  int retains = 0;
  int contexts_created = 0;
};

struct State {
  std::mutex mu;
  bool configured = false;
  int driver_version = 13000;
  bool peer_access = true;
  bool initialized = false;  // cuInit
  std::vector<Device> devices;
  std::vector<std::unique_ptr<Stream>> streams;  // handle index -> stream (nullptr: free slot)
  std::vector<std::unique_ptr<Stream>> retired;  // destroyed streams whose work may still run
  std::vector<std::unique_ptr<Event>> events;
  std::map<unsigned long long, Physical> physical;
  std::map<unsigned long long, int> memory_handles;  // allocation (creator's handle) -> handle records
  // Exported descriptors by (st_dev, st_ino) -> the allocation; a dup of one names the same. Kept
  // after the allocation is freed (handle values are never reused), to tell such a descriptor from
  // one never exported.
  std::map<std::pair<dev_t, ino_t>, unsigned long long> exports;
  bool posix_fd_handles = true;  // cudadouble_set_posix_fd_handles
  unsigned long long next_handle = 0x100000;
  std::map<std::uintptr_t, Reservation> reservations;  // by va
  std::map<std::uintptr_t, LinearAlloc> linear;        // by address
  std::vector<std::string> violations;
  std::string label;
  std::string joined;
  std::uint64_t corruptions = 0;
  std::string first_corruption;
  unsigned long long next_capture_id = 1;
  std::map<void*, int> graphs;
  std::map<std::string, std::uint64_t> calls;        // driver calls by name (cudadouble_calls)
  std::map<std::pair<int, int>, bool> peer_enabled;  // (accessing device, owner device)
};

State& S() {
  static State* s = new State;  // never destroyed: programs call CUDA from atexit handlers
  return *s;
}

thread_local std::vector<Context*> t_ctx_stack;  // top is the current context
thread_local int t_runtime_device = 0;           // cudaSetDevice's device when no context is current
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local std::map<Context*, Stream*> t_per_thread;  // this thread's per-thread default streams

void ReportAtExit();

void Configure(State& s) {
  if (s.configured) return;
  s.configured = true;
  long long devices = 0, memory = 0, version = 0, peer = 0;
  EnvInt("CUDA_DOUBLE_DEVICES", 2, &devices);
  EnvInt("CUDA_DOUBLE_DEVICE_MEMORY", 4LL << 30, &memory);
  EnvInt("CUDA_DOUBLE_DRIVER_VERSION", 13000, &version);
  EnvInt("CUDA_DOUBLE_PEER_ACCESS", 1, &peer);
  s.driver_version = static_cast<int>(version);
  s.peer_access = peer != 0;
  s.devices.resize(static_cast<std::size_t>(devices));
  for (std::size_t d = 0; d < s.devices.size(); ++d) {
    Device& dev = s.devices[d];
    dev.capacity = static_cast<std::size_t>(memory) / kGranularity * kGranularity;
    dev.fd = memfd_create("cuda_double_device", MFD_CLOEXEC);
    if (dev.fd < 0 || ftruncate(dev.fd, static_cast<off_t>(dev.capacity)) != 0) {
      std::perror("cuda double: memfd");
      std::abort();
    }
    if (dev.capacity > 0) dev.free[0] = dev.capacity;
  }
  const char* report = std::getenv("CUDA_DOUBLE_REPORT");
  if (report != nullptr && std::strcmp(report, "stderr") == 0) std::atexit(&ReportAtExit);
}

// Locks the state and configures it on first use.
struct Locked {
  std::unique_lock<std::mutex> lock;
  State& s;
  Locked() : lock(S().mu), s(S()) { Configure(s); }
};

void Violate(State& s, Rule rule, const char* call, const std::string& detail) {
  s.violations.push_back((s.label.empty() ? "" : "[" + s.label + "] ") + kRules[rule].name + ": " + call + ": " +
                         detail + " [" + kRules[rule].source + "]");
}

// ---------------------------------------------------------------------------------------------
// Physical memory of a device.

bool Carve(Device& dev, std::size_t bytes, std::size_t* offset) {
  for (auto it = dev.free.begin(); it != dev.free.end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const std::size_t rest = it->second - bytes;
    const std::size_t at = it->first + bytes;
    dev.free.erase(it);
    if (rest > 0) dev.free[at] = rest;
    dev.used += bytes;
    return true;
  }
  return false;
}

void Uncarve(Device& dev, std::size_t offset, std::size_t bytes) {
  dev.used -= bytes;
  auto [it, inserted] = dev.free.emplace(offset, bytes);
  (void)inserted;
  auto next = std::next(it);
  if (next != dev.free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    dev.free.erase(next);
  }
  if (it != dev.free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      dev.free.erase(it);
    }
  }
  // Zero the pages, so that stale data never passes for a correct reuse.
  fallocate(dev.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(bytes));
}

// ---------------------------------------------------------------------------------------------
// Contexts, streams, events.

Context* Current() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

Context* RetainPrimary(State& s, int device) {
  Device& dev = s.devices[static_cast<std::size_t>(device)];
  if (dev.retains++ == 0 && dev.primary == nullptr) {
    dev.primary = std::make_unique<Context>();
    dev.primary->device = device;
    dev.primary->legacy.ctx = dev.primary.get();
    dev.primary->legacy.legacy = true;
    ++dev.contexts_created;
  }
  return dev.primary.get();
}

constexpr std::uintptr_t kStreamBase = 0xd0000000;
constexpr std::uintptr_t kEventBase = 0xe0000000;
constexpr std::uintptr_t kHandleStride = 0x10;

// The stream a handle names, or nullptr (not a live stream; `legacy_or_per_thread` handles resolve
// in the current context, which must exist).
Stream* StreamOf(State& s, CUstream handle, bool* bad_context = nullptr) {
  const auto v = reinterpret_cast<std::uintptr_t>(handle);
  if (v == 0 || v == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY) ||
      v == reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) {
    Context* ctx = Current();
    if (ctx == nullptr) {
      if (bad_context != nullptr) *bad_context = true;
      return nullptr;
    }
    if (v != reinterpret_cast<std::uintptr_t>(CU_STREAM_PER_THREAD)) return &ctx->legacy;
    Stream*& pt = t_per_thread[ctx];
    if (pt == nullptr) {
      ctx->per_thread.push_back(std::make_unique<Stream>());
      pt = ctx->per_thread.back().get();
      pt->ctx = ctx;
    }
    return pt;
  }
  if (v < kStreamBase || (v - kStreamBase) % kHandleStride != 0) return nullptr;
  const std::size_t index = (v - kStreamBase) / kHandleStride;
  if (index >= s.streams.size()) return nullptr;
  return s.streams[index].get();
}

Event* EventOf(State& s, CUevent handle) {
  const auto v = reinterpret_cast<std::uintptr_t>(handle);
  if (v < kEventBase || (v - kEventBase) % kHandleStride != 0) return nullptr;
  const std::size_t index = (v - kEventBase) / kHandleStride;
  if (index >= s.events.size()) return nullptr;
  return s.events[index].get();
}

// Runs `stream`'s work up to and including op `id`. `progress` (a query: the device moves on by
// itself) stops before a host function, which may block until the program does something; a
// synchronization runs everything. Returns whether op `id` has run.
bool RunThrough(Stream* stream, std::uint64_t id, bool progress = false) {
  while (!stream->queue.empty() && stream->queue.front().id <= id) {
    Op& front = stream->queue.front();
    if (progress && front.host) return false;
    for (auto& [dep, dep_id] : front.deps) {
      if (!RunThrough(dep, dep_id, progress)) return false;
    }
    Op op = std::move(front);
    stream->queue.pop_front();
    if (op.run) op.run();
    stream->done = op.id;
  }
  stream->done = std::max(stream->done, std::min(id, stream->next_id - 1));
  return true;
}

void RunAll(Stream* stream) { RunThrough(stream, stream->next_id - 1); }

std::vector<Stream*> StreamsOf(State& s, Context* ctx) {
  std::vector<Stream*> out{&ctx->legacy};
  for (auto& pt : ctx->per_thread) out.push_back(pt.get());
  for (auto& st : s.streams)
    if (st != nullptr && st->ctx == ctx) out.push_back(st.get());
  for (auto& st : s.retired)
    if (st->ctx == ctx) out.push_back(st.get());
  return out;
}

void RunContext(State& s, Context* ctx) {
  for (Stream* st : StreamsOf(s, ctx)) RunAll(st);
}

void Invalidate(Stream* st) {
  if (st->capturing) st->invalidated = true;
}

// The blocking streams of `ctx` that are capturing.
std::vector<Stream*> BlockingCaptures(State& s, Context* ctx) {
  std::vector<Stream*> out;
  for (Stream* st : StreamsOf(s, ctx))
    if (st->capturing && st->blocking && !st->legacy) out.push_back(st);
  return out;
}

// Every capture running in the process.
std::vector<Stream*> AllCaptures(State& s) {
  std::vector<Stream*> out;
  for (Device& dev : s.devices) {
    if (dev.primary == nullptr) continue;
    for (Stream* st : StreamsOf(s, dev.primary.get()))
      if (st->capturing) out.push_back(st);
  }
  return out;
}

// Whether this thread is prohibited from potentially unsafe calls now (kCaptureUnsafeCall); if so,
// invalidates the captures that prohibit it and records the violation.
bool UnsafeProhibited(State& s, const char* call) {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  std::vector<Stream*> culprits;
  for (Stream* st : AllCaptures(s)) {
    const bool local = st->capture_thread == std::this_thread::get_id();
    if (local && st->mode != CU_STREAM_CAPTURE_MODE_RELAXED) culprits.push_back(st);
    if (!local && t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && st->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
      culprits.push_back(st);
  }
  if (culprits.empty()) return false;
  for (Stream* st : culprits) Invalidate(st);
  Violate(s, kCaptureUnsafeCall, call,
          std::to_string(culprits.size()) + " capture(s) prohibit it; they are invalidated");
  return true;
}

// Queues `run` on `stream` with the legacy stream's implicit synchronization; returns the op id.
// Work queued on a capturing stream is captured (not run); returns 0 then.
std::uint64_t Enqueue(Stream* stream, std::function<void()> run,
                      std::vector<std::pair<Stream*, std::uint64_t>> deps = {}, bool host = false) {
  if (stream->capturing) return 0;
  Op op;
  op.id = stream->next_id++;
  op.host = host;
  op.run = std::move(run);
  op.deps = std::move(deps);
  Context* ctx = stream->ctx;
  if (stream->legacy) {
    for (Stream* st : StreamsOf(S(), ctx))
      if (st != stream && st->blocking && st->next_id > 1) op.deps.emplace_back(st, st->next_id - 1);
  } else if (stream->blocking && ctx->legacy.next_id > 1) {
    op.deps.emplace_back(&ctx->legacy, ctx->legacy.next_id - 1);
  }
  stream->queue.push_back(std::move(op));
  return stream->next_id - 1;
}

// The checks of a stream handle used in an enqueue or a sync: live, a context for the default
// handles, and the legacy stream unusable during a blocking capture. Returns the stream or sets *err.
// The stream a handle names, or nullptr with the violation recorded and *err set.
Stream* LiveStream(State& s, CUstream handle, const char* call, CUresult* err) {
  bool bad_context = false;
  Stream* st = StreamOf(s, handle, &bad_context);
  if (st != nullptr) return st;
  if (bad_context) {
    Violate(s, kContextCurrent, call, "a default stream handle with no current context");
    *err = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    Violate(s, kLiveStream, call,
            "stream handle " + std::to_string(reinterpret_cast<std::uintptr_t>(handle)) + " is not a live stream");
    *err = CUDA_ERROR_INVALID_HANDLE;
  }
  return nullptr;
}

Stream* UsableStream(State& s, CUstream handle, const char* call, CUresult* err) {
  Stream* st = LiveStream(s, handle, call, err);
  if (st == nullptr) return nullptr;
  if (st->legacy) {
    std::vector<Stream*> caps = BlockingCaptures(s, st->ctx);
    if (!caps.empty()) {
      for (Stream* c : caps) Invalidate(c);
      Violate(s, kCaptureLegacyStream, call, "the legacy stream while a blocking stream captures");
      *err = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      return nullptr;
    }
  }
  return st;
}

bool EventComplete(const Event& e) { return e.stream == nullptr || e.stream->done >= e.id; }

// Whether [p, p + bytes) may be touched by a kernel of `device`.
bool Accessible(State& s, std::uintptr_t p, std::size_t bytes, int device, std::string* why, Rule* rule) {
  *rule = kKernelAccess;
  auto lin = s.linear.upper_bound(p);
  if (lin != s.linear.begin()) {
    --lin;
    if (p >= lin->first && p + bytes <= lin->first + lin->second.bytes) {
      const int owner = lin->second.device;
      if (owner == device || s.peer_enabled[{device, owner}]) return true;
      *why = "device " + std::to_string(device) + " has no peer access to device " + std::to_string(owner) +
             "'s memory (cudaDeviceEnablePeerAccess)";
      *rule = kPeerAccess;
      return false;
    }
  }
  auto res = s.reservations.upper_bound(p);
  if (res == s.reservations.begin()) {
    *why = "the range is not device memory";
    return false;
  }
  --res;
  Reservation& r = res->second;
  if (p + bytes > r.va + r.bytes) {
    *why = "the range is not device memory";
    return false;
  }
  std::uintptr_t at = p;
  while (at < p + bytes) {
    auto m = r.mappings.upper_bound(at);
    if (m == r.mappings.begin()) {
      *why = "part of the range is reserved but not mapped";
      return false;
    }
    --m;
    if (at >= m->second.va + m->second.bytes) {
      *why = "part of the range is reserved but not mapped";
      return false;
    }
    if ((m->second.access & (std::uint64_t{1} << device)) == 0) {
      *why = "device " + std::to_string(device) + " has no access to a mapping of the range (cuMemSetAccess)";
      return false;
    }
    at = m->second.va + m->second.bytes;
  }
  return true;
}

int LaunchKernel(void* stream_handle, std::uintptr_t p, std::size_t bytes, std::uint8_t value, bool check,
                 const char* call) {
  Locked l;
  State& s = l.s;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(s, static_cast<CUstream>(stream_handle), call, &err);
  if (st == nullptr) return static_cast<int>(err);
  const int device = st->ctx->device;
  Enqueue(st, [&s, p, bytes, value, check, device, call] {
    std::string why;
    Rule rule = kKernelAccess;
    if (!Accessible(s, p, bytes, device, &why, &rule)) {
      Violate(s, rule, call, why);
      return;
    }
    auto* bytes_at = reinterpret_cast<std::uint8_t*>(p);
    if (!check) {
      std::memset(bytes_at, value, bytes);
      return;
    }
    for (std::size_t i = 0; i < bytes; ++i) {
      if (bytes_at[i] != value) {
        if (s.corruptions++ == 0) {
          s.first_corruption = "a kernel on device " + std::to_string(device) + " expected " + std::to_string(value) +
                               " at byte " + std::to_string(i) + " of [" + std::to_string(p) + ", +" +
                               std::to_string(bytes) + ") and found " + std::to_string(bytes_at[i]);
        }
        return;
      }
    }
  });
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Driver functions (the implementations; the exported names are below).

#define DRIVER_READY(s, call)                                   \
  do {                                                          \
    if (!(s).initialized) {                                     \
      Violate((s), kInitFirst, (call), "called before cuInit"); \
      return CUDA_ERROR_NOT_INITIALIZED;                        \
    }                                                           \
  } while (0)

#define NEED_CONTEXT(s, call)                                         \
  do {                                                                \
    if (Current() == nullptr) {                                       \
      Violate((s), kContextCurrent, (call), "no context is current"); \
      return CUDA_ERROR_INVALID_CONTEXT;                              \
    }                                                                 \
  } while (0)

CUresult DInit(unsigned int flags) {
  Locked l;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (l.s.devices.empty()) return CUDA_ERROR_NO_DEVICE;
  l.s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult DDriverGetVersion(int* v) {
  Locked l;
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = l.s.driver_version;
  return CUDA_SUCCESS;
}

CUresult DDeviceGetCount(int* n) {
  Locked l;
  DRIVER_READY(l.s, "cuDeviceGetCount");
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = static_cast<int>(l.s.devices.size());
  return CUDA_SUCCESS;
}

CUresult DDeviceGet(CUdevice* d, int ordinal) {
  Locked l;
  DRIVER_READY(l.s, "cuDeviceGet");
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= static_cast<int>(l.s.devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

bool ValidDevice(State& s, int d) { return d >= 0 && d < static_cast<int>(s.devices.size()); }

CUresult DDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice d) {
  Locked l;
  DRIVER_READY(l.s, "cuDeviceGetAttribute");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(l.s, d)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = l.s.posix_fd_handles ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      *value = 0;
      return CUDA_SUCCESS;
  }
}

CUresult DDeviceCanAccessPeer(int* can, CUdevice d, CUdevice peer) {
  Locked l;
  DRIVER_READY(l.s, "cuDeviceCanAccessPeer");
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(l.s, d) || !ValidDevice(l.s, peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = (d != peer && l.s.peer_access) ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult DPrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  Locked l;
  DRIVER_READY(l.s, "cuDevicePrimaryCtxRetain");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(l.s, d)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = reinterpret_cast<CUcontext>(RetainPrimary(l.s, d));
  return CUDA_SUCCESS;
}

CUresult DPrimaryCtxRelease(CUdevice d) {
  Locked l;
  DRIVER_READY(l.s, "cuDevicePrimaryCtxRelease");
  if (!ValidDevice(l.s, d)) return CUDA_ERROR_INVALID_DEVICE;
  Device& dev = l.s.devices[static_cast<std::size_t>(d)];
  if (dev.retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --dev.retains;  // the context itself is kept: its streams and events stay valid handles here
  return CUDA_SUCCESS;
}

CUresult DPrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  Locked l;
  DRIVER_READY(l.s, "cuDevicePrimaryCtxGetState");
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(l.s, d)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = l.s.devices[static_cast<std::size_t>(d)].retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

bool KnownContext(State& s, CUcontext c) {
  for (Device& dev : s.devices)
    if (dev.primary != nullptr && reinterpret_cast<CUcontext>(dev.primary.get()) == c) return true;
  return false;
}

CUresult DCtxGetCurrent(CUcontext* ctx) {
  Locked l;
  DRIVER_READY(l.s, "cuCtxGetCurrent");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = reinterpret_cast<CUcontext>(Current());
  return CUDA_SUCCESS;
}

CUresult DCtxSetCurrent(CUcontext ctx) {
  Locked l;
  DRIVER_READY(l.s, "cuCtxSetCurrent");
  if (ctx != nullptr && !KnownContext(l.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx == nullptr) {
    if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (t_ctx_stack.empty()) {
    t_ctx_stack.push_back(reinterpret_cast<Context*>(ctx));
  } else {
    t_ctx_stack.back() = reinterpret_cast<Context*>(ctx);
  }
  return CUDA_SUCCESS;
}

CUresult DCtxPushCurrent(CUcontext ctx) {
  Locked l;
  DRIVER_READY(l.s, "cuCtxPushCurrent");
  if (ctx == nullptr || !KnownContext(l.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  t_ctx_stack.push_back(reinterpret_cast<Context*>(ctx));
  return CUDA_SUCCESS;
}

CUresult DCtxPopCurrent(CUcontext* ctx) {
  Locked l;
  DRIVER_READY(l.s, "cuCtxPopCurrent");
  if (t_ctx_stack.empty()) {
    Violate(l.s, kContextCurrent, "cuCtxPopCurrent", "no context is current");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(t_ctx_stack.back());
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult DCtxGetDevice(CUdevice* d) {
  Locked l;
  DRIVER_READY(l.s, "cuCtxGetDevice");
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NEED_CONTEXT(l.s, "cuCtxGetDevice");
  *d = Current()->device;
  return CUDA_SUCCESS;
}

CUresult DCtxSynchronize() {
  Locked l;
  DRIVER_READY(l.s, "cuCtxSynchronize");
  NEED_CONTEXT(l.s, "cuCtxSynchronize");
  if (UnsafeProhibited(l.s, "cuCtxSynchronize")) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::vector<Stream*> caps = BlockingCaptures(l.s, Current());
  for (Stream* st : StreamsOf(l.s, Current()))
    if (st->capturing && std::find(caps.begin(), caps.end(), st) == caps.end()) caps.push_back(st);
  if (!caps.empty()) {
    for (Stream* c : caps) Invalidate(c);
    Violate(l.s, kCaptureSyncOrQuery, "cuCtxSynchronize", "a stream of the context is capturing");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  RunContext(l.s, Current());
  return CUDA_SUCCESS;
}

CUresult AllocLinear(State& s, const char* call, CUdeviceptr* p, std::size_t bytes) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NEED_CONTEXT(s, call);
  if (UnsafeProhibited(s, call)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const int device = Current()->device;
  Device& dev = s.devices[static_cast<std::size_t>(device)];
  if (bytes > dev.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::size_t charged = (bytes + kGranularity - 1) / kGranularity * kGranularity;
  std::size_t offset = 0;
  if (!Carve(dev, charged, &offset)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* va = mmap(nullptr, charged, PROT_READ | PROT_WRITE, MAP_SHARED, dev.fd, static_cast<off_t>(offset));
  if (va == MAP_FAILED) {
    Uncarve(dev, offset, charged);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static_assert(kAllocAlign <= 4096);
  s.linear[reinterpret_cast<std::uintptr_t>(va)] = {bytes, charged, device, offset};
  *p = reinterpret_cast<CUdeviceptr>(va);
  return CUDA_SUCCESS;
}

CUresult DMemAlloc(CUdeviceptr* p, std::size_t bytes) {
  Locked l;
  DRIVER_READY(l.s, "cuMemAlloc");
  return AllocLinear(l.s, "cuMemAlloc", p, bytes);
}

CUresult FreeLinear(State& s, const char* call, CUdeviceptr p) {
  if (UnsafeProhibited(s, call)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  auto it = s.linear.find(static_cast<std::uintptr_t>(p));
  if (it == s.linear.end()) {
    Violate(s, kFreeUnknown, call, "not an address cuMemAlloc returned (or already freed)");
    return CUDA_ERROR_INVALID_VALUE;
  }
  // cudaFree/cuMemFree of memory in use by queued work: CUDA waits for the device first.
  Device& dev = s.devices[static_cast<std::size_t>(it->second.device)];
  if (dev.primary != nullptr) RunContext(s, dev.primary.get());
  munmap(reinterpret_cast<void*>(it->first), it->second.charged);
  Uncarve(dev, it->second.offset, it->second.charged);
  s.linear.erase(it);
  return CUDA_SUCCESS;
}

CUresult DMemFree(CUdeviceptr p) {
  Locked l;
  DRIVER_READY(l.s, "cuMemFree");
  return FreeLinear(l.s, "cuMemFree", p);
}

CUresult DMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
  Locked l;
  DRIVER_READY(l.s, "cuMemGetInfo");
  if (free_bytes == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NEED_CONTEXT(l.s, "cuMemGetInfo");
  Device& dev = l.s.devices[static_cast<std::size_t>(Current()->device)];
  *total = dev.capacity;
  *free_bytes = dev.capacity - dev.used;
  return CUDA_SUCCESS;
}

CUresult DStreamCreate(CUstream* out, unsigned int flags) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamCreate");
  if (out == nullptr || (flags & ~static_cast<unsigned int>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  NEED_CONTEXT(l.s, "cuStreamCreate");
  auto st = std::make_unique<Stream>();
  st->ctx = Current();
  st->blocking = (flags & CU_STREAM_NON_BLOCKING) == 0;
  std::size_t index = 0;
  while (index < l.s.streams.size() && l.s.streams[index] != nullptr) ++index;  // handles are reused
  if (index == l.s.streams.size()) l.s.streams.emplace_back();
  l.s.streams[index] = std::move(st);
  *out = reinterpret_cast<CUstream>(kStreamBase + index * kHandleStride);
  return CUDA_SUCCESS;
}

CUresult DStreamDestroy(CUstream handle) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamDestroy");
  const auto v = reinterpret_cast<std::uintptr_t>(handle);
  Stream* st = StreamOf(l.s, handle);
  if (st == nullptr || st->legacy || v < kStreamBase) {
    Violate(l.s, kLiveStream, "cuStreamDestroy", "not a live created stream");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // "the function will return immediately and the resources associated with hStream will be
  // released automatically once the device has completed all work in hStream" (cuda.h:15804).
  const std::size_t index = (v - kStreamBase) / kHandleStride;
  st->destroyed = true;
  l.s.retired.push_back(std::move(l.s.streams[index]));
  return CUDA_SUCCESS;
}

// The checks of a stream synchronization or query: a usable stream, not capturing, not prohibited.
Stream* WaitableStream(State& s, CUstream handle, const char* call, CUresult* err) {
  Stream* st = UsableStream(s, handle, call, err);
  if (st == nullptr) return nullptr;
  if (st->capturing) {
    Invalidate(st);
    Violate(s, kCaptureSyncOrQuery, call, "the stream is capturing");
    *err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return nullptr;
  }
  if (UnsafeProhibited(s, call)) {
    *err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return nullptr;
  }
  return st;
}

CUresult DStreamSynchronize(CUstream handle) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamSynchronize");
  CUresult err = CUDA_SUCCESS;
  Stream* st = WaitableStream(l.s, handle, "cuStreamSynchronize", &err);
  if (st == nullptr) return err;
  RunAll(st);
  return CUDA_SUCCESS;
}

CUresult DStreamQuery(CUstream handle) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamQuery");
  CUresult err = CUDA_SUCCESS;
  Stream* st = WaitableStream(l.s, handle, "cuStreamQuery", &err);
  if (st == nullptr) return err;
  if (st->queue.empty()) return CUDA_SUCCESS;
  RunThrough(st, st->next_id - 1, /*progress=*/true);  // not ready now; done by a later query
  return CUDA_ERROR_NOT_READY;
}

CUresult DStreamGetCtx(CUstream handle, CUcontext* ctx) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamGetCtx");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  Stream* st = LiveStream(l.s, handle, "cuStreamGetCtx", &err);
  if (st == nullptr) return err;
  *ctx = reinterpret_cast<CUcontext>(st->ctx);
  return CUDA_SUCCESS;
}

CUresult DStreamIsCapturing(CUstream handle, CUstreamCaptureStatus* status) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamIsCapturing");
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  Stream* st = LiveStream(l.s, handle, "cuStreamIsCapturing", &err);
  if (st == nullptr) return err;
  // cuda_runtime_api.h:2603: on the legacy stream during a blocking capture: ...Implicit, and the
  // capture is not invalidated (a documented answer, not a violation).
  if (st->legacy && !BlockingCaptures(l.s, st->ctx).empty()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = !st->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
                           : (st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE);
  return CUDA_SUCCESS;
}

CUresult DStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamBeginCapture");
  const auto v = reinterpret_cast<std::uintptr_t>(handle);
  if (v == 0 || v == reinterpret_cast<std::uintptr_t>(CU_STREAM_LEGACY)) {
    Violate(l.s, kCaptureLegacyBegin, "cuStreamBeginCapture", "the legacy stream");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, handle, "cuStreamBeginCapture", &err);
  if (st == nullptr) return err;
  if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = true;
  st->invalidated = false;
  st->mode = mode;
  st->capture_thread = std::this_thread::get_id();
  st->capture_id = l.s.next_capture_id++;
  return CUDA_SUCCESS;
}

CUresult DStreamEndCapture(CUstream handle, void** graph) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamEndCapture");
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = StreamOf(l.s, handle);
  if (st == nullptr || !st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  if (st->mode != CU_STREAM_CAPTURE_MODE_RELAXED && st->capture_thread != std::this_thread::get_id()) {
    Violate(l.s, kCaptureEndThread, "cuStreamEndCapture", "ended on another thread");
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  st->capturing = false;
  *graph = nullptr;
  if (st->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  void* g = std::malloc(1);
  l.s.graphs[g] = 1;
  *graph = g;
  return CUDA_SUCCESS;
}

CUresult DThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  Locked l;
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

CUresult DEventCreate(CUevent* out, unsigned int flags) {
  Locked l;
  DRIVER_READY(l.s, "cuEventCreate");
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  NEED_CONTEXT(l.s, "cuEventCreate");
  auto e = std::make_unique<Event>();
  e->ctx = Current();
  std::size_t index = 0;
  while (index < l.s.events.size() && l.s.events[index] != nullptr) ++index;
  if (index == l.s.events.size()) l.s.events.emplace_back();
  l.s.events[index] = std::move(e);
  *out = reinterpret_cast<CUevent>(kEventBase + index * kHandleStride);
  return CUDA_SUCCESS;
}

Event* LiveEvent(State& s, CUevent handle, const char* call) {
  Event* e = EventOf(s, handle);
  if (e == nullptr) {
    Violate(s, kLiveEvent, call, "not a live event");
  }
  return e;
}

CUresult DEventRecord(CUevent handle, CUstream stream) {
  Locked l;
  DRIVER_READY(l.s, "cuEventRecord");
  Event* e = LiveEvent(l.s, handle, "cuEventRecord");
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, stream, "cuEventRecord", &err);
  if (st == nullptr) return err;
  if (st->ctx != e->ctx) {
    Violate(
        l.s, kEventStreamSameContext, "cuEventRecord",
        "event of device " + std::to_string(e->ctx->device) + ", stream of device " + std::to_string(st->ctx->device));
    return CUDA_ERROR_INVALID_HANDLE;
  }
  e->warned_not_ready = false;
  if (st->capturing) {
    e->captured = true;
    e->capture_stream = st;
    e->stream = nullptr;
    return CUDA_SUCCESS;
  }
  e->captured = false;
  e->stream = st;
  e->id = Enqueue(st, nullptr);
  return CUDA_SUCCESS;
}

// The checks shared by cuEventQuery and cuEventSynchronize.
CUresult EventWaitable(State& s, Event* e, const char* call) {
  if (e->captured) {
    if (e->capture_stream != nullptr) Invalidate(e->capture_stream);
    Violate(s, kCaptureCapturedEvent, call, "the event was last recorded inside a capture");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (UnsafeProhibited(s, call)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

CUresult DEventQuery(CUevent handle) {
  Locked l;
  DRIVER_READY(l.s, "cuEventQuery");
  Event* e = LiveEvent(l.s, handle, "cuEventQuery");
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult err = EventWaitable(l.s, e, "cuEventQuery"); err != CUDA_SUCCESS) return err;
  if (EventComplete(*e)) return CUDA_SUCCESS;
  RunThrough(e->stream, e->id, /*progress=*/true);  // the device moves on: ready at a later query
  return CUDA_ERROR_NOT_READY;
}

CUresult DEventSynchronize(CUevent handle) {
  Locked l;
  DRIVER_READY(l.s, "cuEventSynchronize");
  Event* e = LiveEvent(l.s, handle, "cuEventSynchronize");
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult err = EventWaitable(l.s, e, "cuEventSynchronize"); err != CUDA_SUCCESS) return err;
  if (e->stream != nullptr) RunThrough(e->stream, e->id);
  return CUDA_SUCCESS;
}

CUresult DEventDestroy(CUevent handle) {
  Locked l;
  DRIVER_READY(l.s, "cuEventDestroy");
  Event* e = LiveEvent(l.s, handle, "cuEventDestroy");
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const std::size_t index = (reinterpret_cast<std::uintptr_t>(handle) - kEventBase) / kHandleStride;
  l.s.events[index].reset();
  return CUDA_SUCCESS;
}

CUresult DStreamWaitEvent(CUstream stream, CUevent handle, unsigned int flags) {
  Locked l;
  DRIVER_READY(l.s, "cuStreamWaitEvent");
  (void)flags;
  Event* e = LiveEvent(l.s, handle, "cuStreamWaitEvent");
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, stream, "cuStreamWaitEvent", &err);
  if (st == nullptr) return err;
  std::vector<std::pair<Stream*, std::uint64_t>> deps;
  if (e->stream != nullptr && !EventComplete(*e)) deps.emplace_back(e->stream, e->id);
  Enqueue(st, nullptr, std::move(deps));
  return CUDA_SUCCESS;
}

CUresult DGetErrorName(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define NAME(e) \
  case e:       \
    *out = #e;  \
    return CUDA_SUCCESS;
    NAME(CUDA_SUCCESS)
    NAME(CUDA_ERROR_INVALID_VALUE)
    NAME(CUDA_ERROR_OUT_OF_MEMORY)
    NAME(CUDA_ERROR_NOT_INITIALIZED)
    NAME(CUDA_ERROR_NO_DEVICE)
    NAME(CUDA_ERROR_INVALID_DEVICE)
    NAME(CUDA_ERROR_INVALID_CONTEXT)
    NAME(CUDA_ERROR_INVALID_HANDLE)
    NAME(CUDA_ERROR_NOT_FOUND)
    NAME(CUDA_ERROR_NOT_READY)
    NAME(CUDA_ERROR_ILLEGAL_STATE)
    NAME(CUDA_ERROR_NOT_SUPPORTED)
    NAME(CUDA_ERROR_NOT_PERMITTED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    NAME(CUDA_ERROR_UNKNOWN)
#undef NAME
    default:
      *out = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult DGetErrorString(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* name = nullptr;
  if (DGetErrorName(error, &name) != CUDA_SUCCESS) {
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = name;  // the double's "description" is the name
  return CUDA_SUCCESS;
}

// --- Virtual memory.

CUresult DMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp* prop,
                                      CUmemAllocationGranularity_flags) {
  Locked l;
  DRIVER_READY(l.s, "cuMemGetAllocationGranularity");
  if (g == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *g = kGranularity;
  return CUDA_SUCCESS;
}

CUresult DMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                            unsigned long long flags) {
  Locked l;
  ++l.s.calls["cuMemAddressReserve"];
  DRIVER_READY(l.s, "cuMemAddressReserve");
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  if (ptr == nullptr || flags != 0 || size == 0 || size % page != 0 || addr % page != 0 ||
      (alignment & (alignment - 1)) != 0) {
    Violate(l.s, kVmmReserveSize, "cuMemAddressReserve",
            "size " + std::to_string(size) + ", alignment " + std::to_string(alignment));
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t align = std::max(alignment, kGranularity);
  void* raw = mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t va = (base + align - 1) / align * align;
  if (va > base) munmap(raw, va - base);
  if (va + size < base + size + align) munmap(reinterpret_cast<void*>(va + size), base + size + align - va - size);
  l.s.reservations[va] = {va, size, {}};
  *ptr = static_cast<CUdeviceptr>(va);
  return CUDA_SUCCESS;
}

CUresult DMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  Locked l;
  ++l.s.calls["cuMemAddressFree"];
  DRIVER_READY(l.s, "cuMemAddressFree");
  auto it = l.s.reservations.find(static_cast<std::uintptr_t>(ptr));
  if (it == l.s.reservations.end() || it->second.bytes != size) {
    Violate(l.s, kVmmFreeWhole, "cuMemAddressFree", "not a whole reservation");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!it->second.mappings.empty()) {
    Violate(l.s, kVmmFreeMapped, "cuMemAddressFree",
            std::to_string(it->second.mappings.size()) + " mapping(s) still in the range");
    return CUDA_ERROR_INVALID_VALUE;
  }
  munmap(reinterpret_cast<void*>(it->first), size);
  l.s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult DMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                    unsigned long long flags) {
  Locked l;
  ++l.s.calls["cuMemCreate"];
  DRIVER_READY(l.s, "cuMemCreate");
  if (handle == nullptr || prop == nullptr || flags != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(l.s, prop->location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Shareable handle types: none, or a POSIX file descriptor where the device has them
  // (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED); the others are not modelled.
  const int types = static_cast<int>(prop->requestedHandleTypes);
  if (types != CU_MEM_HANDLE_TYPE_NONE &&
      (types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !l.s.posix_fd_handles)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (size == 0 || size % kGranularity != 0) {
    Violate(l.s, kVmmCreateGranularity, "cuMemCreate", "size " + std::to_string(size));
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device& dev = l.s.devices[static_cast<std::size_t>(prop->location.id)];
  std::size_t offset = 0;
  if (!Carve(dev, size, &offset)) return CUDA_ERROR_OUT_OF_MEMORY;
  const unsigned long long h = l.s.next_handle++;
  l.s.physical[h] = {prop->location.id, offset, size, 0, false, h, types};
  ++l.s.memory_handles[h];
  *handle = h;
  return CUDA_SUCCESS;
}

// Drops handle `h`'s record once it is released and unmapped, and its allocation's memory with the
// last record.
void MaybeFreePhysical(State& s, unsigned long long h) {
  auto it = s.physical.find(h);
  if (it == s.physical.end() || !it->second.released || it->second.mappings > 0) return;
  const Physical p = it->second;
  s.physical.erase(it);
  if (--s.memory_handles[p.memory] > 0) return;
  s.memory_handles.erase(p.memory);
  Uncarve(s.devices[static_cast<std::size_t>(p.device)], p.offset, p.bytes);
}

CUresult DMemRelease(CUmemGenericAllocationHandle h) {
  Locked l;
  ++l.s.calls["cuMemRelease"];
  DRIVER_READY(l.s, "cuMemRelease");
  auto it = l.s.physical.find(h);
  if (it == l.s.physical.end() || it->second.released) {
    Violate(l.s, kVmmLiveHandle, "cuMemRelease", "not a live handle");
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.released = true;  // "freed when all outstanding mappings ... are unmapped" (cuda.h:12845)
  MaybeFreePhysical(l.s, h);
  return CUDA_SUCCESS;
}

// The (st_dev, st_ino) of descriptor `fd`, or false when it is not an open descriptor.
bool InodeOf(int fd, std::pair<dev_t, ino_t>* inode) {
  struct stat st = {};
  if (fd < 0 || fstat(fd, &st) != 0) return false;
  *inode = {st.st_dev, st.st_ino};
  return true;
}

// A new descriptor per call (as the driver makes one), a memfd of its own: its inode names the
// allocation, so that any duplicate of it imports the same one.
CUresult DMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                     unsigned long long flags) {
  Locked l;
  ++l.s.calls["cuMemExportToShareableHandle"];
  DRIVER_READY(l.s, "cuMemExportToShareableHandle");
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = l.s.physical.find(h);
  if (it == l.s.physical.end() || it->second.released) {
    Violate(l.s, kVmmLiveHandle, "cuMemExportToShareableHandle", "not a live handle");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || (it->second.handle_types & type) == 0) {
    Violate(l.s, kVmmExportRequested, "cuMemExportToShareableHandle",
            "handle type " + std::to_string(static_cast<int>(type)) +
                " asked of an allocation created with "
                "requestedHandleTypes " +
                std::to_string(it->second.handle_types));
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = memfd_create("cuda_double_export", MFD_CLOEXEC);
  std::pair<dev_t, ino_t> inode;
  if (fd < 0 || !InodeOf(fd, &inode)) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  l.s.exports[inode] = it->second.memory;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

// A new handle, one more reference to the exported allocation (released with cuMemRelease).
CUresult DMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                       CUmemAllocationHandleType type) {
  Locked l;
  ++l.s.calls["cuMemImportFromShareableHandle"];
  DRIVER_READY(l.s, "cuMemImportFromShareableHandle");
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;  // not modelled
  // cuda.h passes a POSIX descriptor by value in the pointer (as PyTorch's fromShared does).
  const auto fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  std::pair<dev_t, ino_t> inode;
  auto exported = InodeOf(fd, &inode) ? l.s.exports.find(inode) : l.s.exports.end();
  if (exported == l.s.exports.end()) {
    Violate(l.s, kVmmImportExported, "cuMemImportFromShareableHandle",
            "descriptor " + std::to_string(fd) + " is not one cuMemExportToShareableHandle made");
    return CUDA_ERROR_INVALID_VALUE;
  }
  // An open descriptor keeps its allocation alive on CUDA (cuda.h:13147); here the allocation went
  // with its last handle and mapping: not modelled, so not a violation either.
  if (!l.s.memory_handles.contains(exported->second)) return CUDA_ERROR_NOT_SUPPORTED;
  auto any = std::find_if(l.s.physical.begin(), l.s.physical.end(),
                          [&](const auto& p) { return p.second.memory == exported->second; });
  Physical imported = any->second;  // a handle of the allocation: its device, range and types
  imported.mappings = 0;
  imported.released = false;
  const unsigned long long h = l.s.next_handle++;
  l.s.physical[h] = imported;
  ++l.s.memory_handles[imported.memory];
  *handle = h;
  return CUDA_SUCCESS;
}

Reservation* ReservationOf(State& s, std::uintptr_t va, std::size_t bytes) {
  auto it = s.reservations.upper_bound(va);
  if (it == s.reservations.begin()) return nullptr;
  --it;
  if (va + bytes > it->second.va + it->second.bytes) return nullptr;
  return &it->second;
}

CUresult DMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags) {
  Locked l;
  ++l.s.calls["cuMemMap"];
  DRIVER_READY(l.s, "cuMemMap");
  const auto va = static_cast<std::uintptr_t>(ptr);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || va % kGranularity != 0 || size % kGranularity != 0 || offset % kGranularity != 0) {
    Violate(l.s, kVmmMapGranularity, "cuMemMap",
            "ptr/size/offset not multiples of the granularity (size " + std::to_string(size) + ")");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset != 0) {
    Violate(l.s, kVmmMapOffset, "cuMemMap", "offset " + std::to_string(offset) + " into the handle");
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto ph = l.s.physical.find(h);
  if (ph == l.s.physical.end() || ph->second.released) {
    Violate(l.s, kVmmLiveHandle, "cuMemMap", "not a live handle");
    return CUDA_ERROR_INVALID_VALUE;
  }
  Reservation* r = ReservationOf(l.s, va, size);
  if (r == nullptr || offset + size > ph->second.bytes) {
    Violate(l.s, kVmmMapReserved, "cuMemMap", "the range is not inside a reservation, or exceeds the allocation");
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto next = r->mappings.lower_bound(va);
  const bool overlaps_next = next != r->mappings.end() && next->first < va + size;
  const bool overlaps_prev =
      next != r->mappings.begin() && std::prev(next)->second.va + std::prev(next)->second.bytes > va;
  if (overlaps_next || overlaps_prev) {
    Violate(l.s, kVmmMapUnmapped, "cuMemMap", "part of the range is already mapped");
    return CUDA_ERROR_INVALID_VALUE;
  }
  Device& dev = l.s.devices[static_cast<std::size_t>(ph->second.device)];
  void* m = mmap(reinterpret_cast<void*>(va), size, PROT_NONE, MAP_SHARED | MAP_FIXED, dev.fd,
                 static_cast<off_t>(ph->second.offset + offset));
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  r->mappings[va] = {va, size, h, 0};
  ++ph->second.mappings;
  return CUDA_SUCCESS;
}

CUresult DMemUnmap(CUdeviceptr ptr, std::size_t size) {
  Locked l;
  ++l.s.calls["cuMemUnmap"];
  DRIVER_READY(l.s, "cuMemUnmap");
  const auto va = static_cast<std::uintptr_t>(ptr);
  Reservation* r = ReservationOf(l.s, va, size);
  if (r == nullptr || size == 0) {
    Violate(l.s, kVmmUnmapWhole, "cuMemUnmap", "not inside a reservation");
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Whole mappings only, and only mapped bytes.
  std::vector<std::uintptr_t> covered;
  std::uintptr_t at = va;
  while (at < va + size) {
    auto m = r->mappings.find(at);
    if (m == r->mappings.end() || m->second.va + m->second.bytes > va + size) {
      Violate(l.s, kVmmUnmapWhole, "cuMemUnmap", "the range cuts a mapping or includes unmapped bytes");
      return CUDA_ERROR_INVALID_VALUE;
    }
    covered.push_back(at);
    at += m->second.bytes;
  }
  // Work still queued on the range is not waited for: a kernel that runs after the unmap finds
  // the range unmapped (a kernel-access violation), as it would fault on a GPU.
  for (std::uintptr_t m_va : covered) {
    Mapping m = r->mappings[m_va];
    r->mappings.erase(m_va);
    mmap(reinterpret_cast<void*>(m.va), m.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
         0);
    --l.s.physical[m.handle].mappings;
    MaybeFreePhysical(l.s, m.handle);
  }
  return CUDA_SUCCESS;
}

CUresult DMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  Locked l;
  ++l.s.calls["cuMemSetAccess"];
  DRIVER_READY(l.s, "cuMemSetAccess");
  const auto va = static_cast<std::uintptr_t>(ptr);
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  Reservation* r = ReservationOf(l.s, va, size);
  std::vector<Mapping*> covered;
  std::uintptr_t at = va;
  while (r != nullptr && at < va + size) {
    auto m = r->mappings.upper_bound(at);
    if (m == r->mappings.begin()) break;
    --m;
    if (at >= m->second.va + m->second.bytes) break;
    covered.push_back(&m->second);
    at = m->second.va + m->second.bytes;
  }
  if (r == nullptr || size == 0 || at < va + size) {
    Violate(l.s, kVmmAccessMapped, "cuMemSetAccess", "the range is not fully mapped");
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::uint64_t grant = 0, revoke = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(l.s, desc[i].location.id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t bit = std::uint64_t{1} << desc[i].location.id;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      grant |= bit;
    } else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      revoke |= bit;
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (Mapping* m : covered) {
    const int owner = l.s.physical[m->handle].device;
    if ((grant & ~(std::uint64_t{1} << owner)) != 0 && !l.s.peer_access) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (Mapping* m : covered) {
    m->access = (m->access | grant) & ~revoke;
    mprotect(reinterpret_cast<void*>(m->va), m->bytes, m->access != 0 ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
  return CUDA_SUCCESS;
}

// --- cuGetProcAddress.

struct Symbol {
  const char* name;
  int version;  // the CUDA version of the ABI served (cudaTypedefs.h's PFN_<name>_v<version>)
  void* fn;
};

#define SYM(name, version, fn) \
  { name, version, reinterpret_cast<void*>(&fn) }

CUresult DGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult* status);

const Symbol* Symbols(std::size_t* n);

}  // namespace

// ---------------------------------------------------------------------------------------------
// The exported driver functions, under their ABI names.

extern "C" {
#define EXPORT __attribute__((visibility("default")))
EXPORT CUresult cuInit(unsigned int flags) { return DInit(flags); }
EXPORT CUresult cuDriverGetVersion(int* v) { return DDriverGetVersion(v); }
EXPORT CUresult cuDeviceGetCount(int* n) { return DDeviceGetCount(n); }
EXPORT CUresult cuDeviceGet(CUdevice* d, int o) { return DDeviceGet(d, o); }
EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) { return DDeviceGetAttribute(v, a, d); }
EXPORT CUresult cuDeviceCanAccessPeer(int* c, CUdevice d, CUdevice p) { return DDeviceCanAccessPeer(c, d, p); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) { return DPrimaryCtxRetain(c, d); }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return DPrimaryCtxRelease(d); }
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* f, int* a) { return DPrimaryCtxGetState(d, f, a); }
EXPORT CUresult cuCtxGetCurrent(CUcontext* c) { return DCtxGetCurrent(c); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { return DCtxSetCurrent(c); }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { return DCtxPushCurrent(c); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* c) { return DCtxPopCurrent(c); }
EXPORT CUresult cuCtxGetDevice(CUdevice* d) { return DCtxGetDevice(d); }
EXPORT CUresult cuCtxSynchronize() { return DCtxSynchronize(); }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t b) { return DMemAlloc(p, b); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return DMemFree(p); }
EXPORT CUresult cuMemGetInfo_v2(size_t* f, size_t* t) { return DMemGetInfo(f, t); }
EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int f) { return DStreamCreate(s, f); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return DStreamDestroy(s); }
EXPORT CUresult cuStreamSynchronize(CUstream s) { return DStreamSynchronize(s); }
EXPORT CUresult cuStreamQuery(CUstream s) { return DStreamQuery(s); }
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext* c) { return DStreamGetCtx(s, c); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) { return DStreamIsCapturing(s, st); }
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) { return DStreamWaitEvent(s, e, f); }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* m) {
  return DThreadExchangeStreamCaptureMode(m);
}
EXPORT CUresult cuEventCreate(CUevent* e, unsigned int f) { return DEventCreate(e, f); }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return DEventRecord(e, s); }
EXPORT CUresult cuEventQuery(CUevent e) { return DEventQuery(e); }
EXPORT CUresult cuEventSynchronize(CUevent e) { return DEventSynchronize(e); }
EXPORT CUresult cuEventDestroy_v2(CUevent e) { return DEventDestroy(e); }
EXPORT CUresult cuGetErrorName(CUresult e, const char** s) { return DGetErrorName(e, s); }
EXPORT CUresult cuGetErrorString(CUresult e, const char** s) { return DGetErrorString(e, s); }
EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* p,
                                              CUmemAllocationGranularity_flags o) {
  return DMemGetAllocationGranularity(g, p, o);
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t s, size_t a, CUdeviceptr ad, unsigned long long f) {
  return DMemAddressReserve(p, s, a, ad, f);
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t s) { return DMemAddressFree(p, s); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t s, const CUmemAllocationProp* p,
                            unsigned long long f) {
  return DMemCreate(h, s, p, f);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return DMemRelease(h); }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t s, size_t o, CUmemGenericAllocationHandle h, unsigned long long f) {
  return DMemMap(p, s, o, h, f);
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t s) { return DMemUnmap(p, s); }
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t s, const CUmemAccessDesc* d, size_t c) {
  return DMemSetAccess(p, s, d, c);
}
EXPORT CUresult cuMemExportToShareableHandle(void* sh, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
                                             unsigned long long f) {
  return DMemExportToShareableHandle(sh, h, t, f);
}
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* os, CUmemAllocationHandleType t) {
  return DMemImportFromShareableHandle(h, os, t);
}
EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int v, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  return DGetProcAddress(symbol, pfn, v, flags, status);
}
}  // extern "C"

namespace {

const Symbol* Symbols(std::size_t* n) {
  static const Symbol kSymbols[] = {
      SYM("cuInit", 2000, cuInit),
      SYM("cuDriverGetVersion", 2020, cuDriverGetVersion),
      SYM("cuDeviceGetCount", 2000, cuDeviceGetCount),
      SYM("cuDeviceGet", 2000, cuDeviceGet),
      SYM("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
      SYM("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
      SYM("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
      SYM("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
      SYM("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
      SYM("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
      SYM("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
      SYM("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
      SYM("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
      SYM("cuCtxGetDevice", 2000, cuCtxGetDevice),
      SYM("cuCtxSynchronize", 2000, cuCtxSynchronize),
      SYM("cuMemAlloc", 3020, cuMemAlloc_v2),
      SYM("cuMemFree", 3020, cuMemFree_v2),
      SYM("cuMemGetInfo", 3020, cuMemGetInfo_v2),
      SYM("cuStreamCreate", 2000, cuStreamCreate),
      SYM("cuStreamDestroy", 4000, cuStreamDestroy_v2),
      SYM("cuStreamSynchronize", 2000, cuStreamSynchronize),
      SYM("cuStreamQuery", 2000, cuStreamQuery),
      SYM("cuStreamGetCtx", 9020, cuStreamGetCtx),
      SYM("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
      SYM("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
      SYM("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
      SYM("cuEventCreate", 2000, cuEventCreate),
      SYM("cuEventRecord", 2000, cuEventRecord),
      SYM("cuEventQuery", 2000, cuEventQuery),
      SYM("cuEventSynchronize", 2000, cuEventSynchronize),
      SYM("cuEventDestroy", 4000, cuEventDestroy_v2),
      SYM("cuGetErrorName", 6000, cuGetErrorName),
      SYM("cuGetErrorString", 6000, cuGetErrorString),
      SYM("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
      SYM("cuMemAddressReserve", 10020, cuMemAddressReserve),
      SYM("cuMemAddressFree", 10020, cuMemAddressFree),
      SYM("cuMemCreate", 10020, cuMemCreate),
      SYM("cuMemRelease", 10020, cuMemRelease),
      SYM("cuMemMap", 10020, cuMemMap),
      SYM("cuMemUnmap", 10020, cuMemUnmap),
      SYM("cuMemSetAccess", 10020, cuMemSetAccess),
      SYM("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
      SYM("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
      SYM("cuGetProcAddress", 12000, cuGetProcAddress_v2),
  };
  *n = sizeof(kSymbols) / sizeof(kSymbols[0]);
  return kSymbols;
}

// The ABIs that changed after the version served here (cudaTypedefs.h has a newer
// PFN_<name>_v<version>): asked for at that version or later, the double cannot serve them.
int NewerAbi(const char* name) {
  if (std::strcmp(name, "cuCtxGetDevice") == 0 || std::strcmp(name, "cuCtxSynchronize") == 0) return 13000;
  if (std::strcmp(name, "cuStreamGetCtx") == 0) return 12050;
  return 0;
}

CUresult DGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult* status) {
  CUdriverProcAddressQueryResult ignored;
  if (status == nullptr) status = &ignored;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  Locked l;
  *pfn = nullptr;
  std::size_t n = 0;
  const Symbol* table = Symbols(&n);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::strcmp(table[i].name, symbol) != 0) continue;
    // cuda.h:24296: a version newer than the driver is CUDA_ERROR_INVALID_VALUE; cuda.h:24303: no
    // ABI-compatible function is CUDA_SUCCESS with pfn NULL and the status saying why.
    if (cuda_version > l.s.driver_version) {
      Violate(l.s, kDriverVersion, "cuGetProcAddress",
              std::string(symbol) + " asked for at " + std::to_string(cuda_version) + ", newer than the driver (" +
                  std::to_string(l.s.driver_version) + ")");
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (cuda_version < table[i].version) {
      *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return CUDA_SUCCESS;
    }
    if (const int newer = NewerAbi(symbol); newer != 0 && cuda_version >= newer) {
      Violate(l.s, kDriverVersion, "cuGetProcAddress",
              std::string(symbol) + " at version " + std::to_string(cuda_version) +
                  ": its ABI changed; the double serves only the older one");
      *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      return CUDA_SUCCESS;
    }
    *pfn = table[i].fn;
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// The runtime over the driver: cudaError_t values of the CUresults used here are the same numbers
// except those mapped below.

cudaError_t ToRuntime(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_CONTEXT:
      return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE:
      return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_READY:
      return cudaErrorNotReady;
    default:
      return static_cast<cudaError_t>(r);  // 1 (invalid value), 100, 101, 500, 900-908 ...: equal numbers
  }
}

// Records a runtime result as the thread's last error (as every runtime call does) and returns it.
cudaError_t Ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}
cudaError_t Ret(CUresult r) { return Ret(ToRuntime(r)); }

// The runtime's implicit initialization: cuInit, and the primary context of the thread's device
// made current if no context is.
cudaError_t EnsureContext() {
  if (DInit(0) != CUDA_SUCCESS) return cudaErrorNoDevice;
  if (Current() != nullptr) return cudaSuccess;
  Locked l;
  if (!ValidDevice(l.s, t_runtime_device)) return cudaErrorInvalidDevice;
  t_ctx_stack.push_back(RetainPrimary(l.s, t_runtime_device));
  return cudaSuccess;
}

// EnsureContext for a call on `stream`: a created stream carries its context, so only the default
// stream handles (NULL, cudaStreamLegacy, cudaStreamPerThread: the current context's) need one.
cudaError_t EnsureContextFor(cudaStream_t stream) {
  const auto v = reinterpret_cast<std::uintptr_t>(stream);
  if (v > reinterpret_cast<std::uintptr_t>(cudaStreamPerThread)) {
    return DInit(0) == CUDA_SUCCESS ? cudaSuccess : cudaErrorNoDevice;
  }
  return EnsureContext();
}

void ReportAtExit() {
  Locked l;
  if (l.s.violations.empty()) return;
  std::fprintf(stderr, "cuda double: %zu rule violation(s):\n", l.s.violations.size());
  for (const std::string& v : l.s.violations) std::fprintf(stderr, "  %s\n", v.c_str());
}

}  // namespace

extern "C" {

EXPORT cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return Ret(cudaErrorInvalidValue);
  if (DInit(0) != CUDA_SUCCESS) return Ret(cudaErrorNoDevice);
  return Ret(DDeviceGetCount(n));
}

EXPORT cudaError_t cudaSetDevice(int device) {
  if (DInit(0) != CUDA_SUCCESS) return Ret(cudaErrorNoDevice);
  Locked l;
  if (!ValidDevice(l.s, device)) return Ret(cudaErrorInvalidDevice);
  // cuda_runtime_api.h:1637: initializes the primary context, which is current at once.
  t_runtime_device = device;
  Context* ctx = RetainPrimary(l.s, device);
  if (t_ctx_stack.empty()) {
    t_ctx_stack.push_back(ctx);
  } else {
    t_ctx_stack.back() = ctx;
  }
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Ret(cudaErrorInvalidValue);
  *device = Current() != nullptr ? Current()->device : t_runtime_device;  // no context is created
  return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return Ret(cudaErrorInvalidValue);
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  Locked l;
  CUdeviceptr d = 0;
  CUresult r = AllocLinear(l.s, "cudaMalloc", &d, bytes);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
  return Ret(r);
}

EXPORT cudaError_t cudaFree(void* p) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  if (p == nullptr) return cudaSuccess;
  Locked l;
  return Ret(FreeLinear(l.s, "cudaFree", reinterpret_cast<CUdeviceptr>(p)));
}

// The runtime's stream-ordered allocator is modelled as an allocation made in stream order (no
// synchronization, legal during captures of other threads); its memory is freed at once when the
// stream reaches the free.
EXPORT cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (p == nullptr) return Ret(cudaErrorInvalidValue);
  if (cudaError_t e = EnsureContextFor(stream); e != cudaSuccess) return Ret(e);
  Locked l;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, reinterpret_cast<CUstream>(stream), "cudaMallocAsync", &err);
  if (st == nullptr) return Ret(err);
  CUstreamCaptureMode saved = t_mode;
  t_mode = CU_STREAM_CAPTURE_MODE_RELAXED;  // legal during captures: not a "potentially unsafe" call
  CUdeviceptr d = 0;
  CUresult r = AllocLinear(l.s, "cudaMallocAsync", &d, bytes == 0 ? 1 : bytes);
  t_mode = saved;
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
  return Ret(r);
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(p, bytes, stream == nullptr ? cudaStreamPerThread : stream);
}

EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (cudaError_t e = EnsureContextFor(stream); e != cudaSuccess) return Ret(e);
  if (p == nullptr) return cudaSuccess;
  Locked l;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, reinterpret_cast<CUstream>(stream), "cudaFreeAsync", &err);
  if (st == nullptr) return Ret(err);
  auto it = l.s.linear.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == l.s.linear.end()) {
    Violate(l.s, kFreeUnknown, "cudaFreeAsync", "not an address this runtime allocated");
    return Ret(cudaErrorInvalidValue);
  }
  RunAll(st);  // the free happens in stream order: the stream's earlier work first
  const LinearAlloc a = it->second;
  munmap(p, a.charged);
  Uncarve(l.s.devices[static_cast<std::size_t>(a.device)], a.offset, a.charged);
  l.s.linear.erase(it);
  return cudaSuccess;
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t stream) {
  return cudaFreeAsync(p, stream == nullptr ? cudaStreamPerThread : stream);
}

EXPORT cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  return Ret(DMemGetInfo(f, t));
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  return Ret(DStreamCreate(reinterpret_cast<CUstream*>(s), flags));
}
EXPORT cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) { return Ret(DStreamDestroy(reinterpret_cast<CUstream>(s))); }

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (cudaError_t e = EnsureContextFor(s); e != cudaSuccess) return Ret(e);
  return Ret(DStreamSynchronize(reinterpret_cast<CUstream>(s)));
}
EXPORT cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (cudaError_t e = EnsureContextFor(s); e != cudaSuccess) return Ret(e);
  return Ret(DStreamQuery(reinterpret_cast<CUstream>(s)));
}
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (cudaError_t e = EnsureContextFor(s); e != cudaSuccess) return Ret(e);
  return Ret(DStreamIsCapturing(reinterpret_cast<CUstream>(s), reinterpret_cast<CUstreamCaptureStatus*>(status)));
}
EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) {
  if (device == nullptr) return Ret(cudaErrorInvalidValue);
  if (cudaError_t e = EnsureContextFor(s); e != cudaSuccess) return Ret(e);
  CUcontext ctx = nullptr;
  if (CUresult r = DStreamGetCtx(reinterpret_cast<CUstream>(s), &ctx); r != CUDA_SUCCESS) return Ret(r);
  *device = reinterpret_cast<Context*>(ctx)->device;
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  if (cudaError_t err = EnsureContextFor(s); err != cudaSuccess) return Ret(err);
  return Ret(DStreamWaitEvent(reinterpret_cast<CUstream>(s), reinterpret_cast<CUevent>(e), flags));
}
EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (cudaError_t e = EnsureContextFor(s); e != cudaSuccess) return Ret(e);
  return Ret(DStreamBeginCapture(reinterpret_cast<CUstream>(s), static_cast<CUstreamCaptureMode>(mode)));
}
EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  return Ret(DStreamEndCapture(reinterpret_cast<CUstream>(s), reinterpret_cast<void**>(graph)));
}
EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Locked l;
  auto it = l.s.graphs.find(graph);
  if (it == l.s.graphs.end()) return Ret(cudaErrorInvalidValue);
  l.s.graphs.erase(it);
  std::free(graph);
  return cudaSuccess;
}
EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return Ret(DThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (cudaError_t err = EnsureContext(); err != cudaSuccess) return Ret(err);
  return Ret(DEventCreate(reinterpret_cast<CUevent*>(e), flags));
}
EXPORT cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (cudaError_t err = EnsureContextFor(s); err != cudaSuccess) return Ret(err);
  return Ret(DEventRecord(reinterpret_cast<CUevent>(e), reinterpret_cast<CUstream>(s)));
}
EXPORT cudaError_t cudaEventQuery(cudaEvent_t e) { return Ret(DEventQuery(reinterpret_cast<CUevent>(e))); }
EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e) { return Ret(DEventSynchronize(reinterpret_cast<CUevent>(e))); }
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e) { return Ret(DEventDestroy(reinterpret_cast<CUevent>(e))); }

EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  Locked l;
  if (flags != 0 || !ValidDevice(l.s, peer)) return Ret(cudaErrorInvalidValue);
  const int device = Current()->device;
  if (peer == device || !l.s.peer_access) return Ret(cudaErrorInvalidDevice);
  bool& enabled = l.s.peer_enabled[{device, peer}];
  if (enabled) return Ret(cudaErrorPeerAccessAlreadyEnabled);
  enabled = true;
  return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = EnsureContext(); e != cudaSuccess) return Ret(e);
  return Ret(DCtxSynchronize());
}

EXPORT cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
EXPORT cudaError_t cudaPeekAtLastError() { return t_last_error; }

EXPORT const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define NAME(x) \
  case x:       \
    return #x;
    NAME(cudaSuccess)
    NAME(cudaErrorInvalidValue)
    NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInitializationError)
    NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorNoDevice)
    NAME(cudaErrorDeviceUninitialized)
    NAME(cudaErrorInvalidResourceHandle)
    NAME(cudaErrorNotReady)
    NAME(cudaErrorIllegalState)
    NAME(cudaErrorStreamCaptureUnsupported)
    NAME(cudaErrorStreamCaptureInvalidated)
    NAME(cudaErrorStreamCaptureImplicit)
    NAME(cudaErrorStreamCaptureWrongThread)
    NAME(cudaErrorSharedObjectInitFailed)
    NAME(cudaErrorInsufficientDriver)
    NAME(cudaErrorUnknown)
#undef NAME
    default:
      return "cudaErrorUnrecognized";
  }
}
EXPORT const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

EXPORT cudaError_t cudaDriverGetVersion(int* v) { return Ret(DDriverGetVersion(v)); }
EXPORT cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return Ret(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                    unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  if (DInit(0) != CUDA_SUCCESS) return Ret(cudaErrorNoDevice);
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = DGetProcAddress(symbol, fn, static_cast<int>(version), flags, &found);
  if (r == CUDA_ERROR_INVALID_VALUE) return Ret(cudaErrorInvalidValue);
  if (status != nullptr) {
    *status = found == CU_GET_PROC_ADDRESS_SUCCESS                  ? cudaDriverEntryPointSuccess
              : found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? cudaDriverEntryPointVersionNotSufficent
                                                                    : cudaDriverEntryPointSymbolNotFound;
  }
  return r == CUDA_SUCCESS ? cudaSuccess : Ret(r);
}

}  // extern "C"

// --- Copies, sets and host functions, in stream order (the kernels the tests need). Device ranges
// are checked as kernels check them, for the device of the stream.

namespace {

// Whether [p, p + bytes) lies in device memory at all (allocated or reserved).
bool IsDeviceRange(State& s, std::uintptr_t p) {
  auto lin = s.linear.upper_bound(p);
  if (lin != s.linear.begin() && p < std::prev(lin)->first + std::prev(lin)->second.bytes) return true;
  auto res = s.reservations.upper_bound(p);
  return res != s.reservations.begin() && p < std::prev(res)->second.va + std::prev(res)->second.bytes;
}

// Queues a copy (or a set, when `src` is null) on `stream`; `sync` waits for it.
cudaError_t Transfer(const char* call, void* dst, const void* src, int value, std::size_t bytes, cudaStream_t stream,
                     bool sync) {
  if (cudaError_t e = EnsureContextFor(stream); e != cudaSuccess) return Ret(e);
  Locked l;
  State& s = l.s;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(s, reinterpret_cast<CUstream>(stream), call, &err);
  if (st == nullptr) return Ret(err);
  if (sync && UnsafeProhibited(s, call)) return Ret(cudaErrorStreamCaptureUnsupported);
  const int device = st->ctx->device;
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto from = reinterpret_cast<std::uintptr_t>(src);
  const std::uint64_t id = Enqueue(st, [&s, d, from, value, bytes, device, call] {
    std::string why;
    Rule rule = kKernelAccess;
    for (std::uintptr_t range : {d, from}) {
      if (range != 0 && IsDeviceRange(s, range) && !Accessible(s, range, bytes, device, &why, &rule)) {
        Violate(s, rule, call, why);
        return;
      }
    }
    if (from == 0) {
      std::memset(reinterpret_cast<void*>(d), value, bytes);
    } else {
      std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(from), bytes);
    }
  });
  if (sync && id != 0) RunThrough(st, id);
  return cudaSuccess;
}

}  // namespace

extern "C" {

EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Ret(cudaErrorInvalidValue);
  return Transfer("cudaMemcpy", dst, src, 0, bytes, nullptr, /*sync=*/true);
}
EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Ret(cudaErrorInvalidValue);
  return Transfer("cudaMemcpyAsync", dst, src, 0, bytes, stream, /*sync=*/false);
}
// cudaMemset on device memory is asynchronous with respect to the host: queued on the legacy stream.
EXPORT cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return Ret(cudaErrorInvalidValue);
  return Transfer("cudaMemset", dst, nullptr, value, bytes, nullptr, /*sync=*/false);
}
EXPORT cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) return Ret(cudaErrorInvalidValue);
  return Transfer("cudaMemsetAsync", dst, nullptr, value, bytes, stream, /*sync=*/false);
}

// The host function runs in stream order; like CUDA's it must not call CUDA.
EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return Ret(cudaErrorInvalidValue);
  if (cudaError_t e = EnsureContextFor(stream); e != cudaSuccess) return Ret(e);
  Locked l;
  CUresult err = CUDA_SUCCESS;
  Stream* st = UsableStream(l.s, reinterpret_cast<CUstream>(stream), "cudaLaunchHostFunc", &err);
  if (st == nullptr) return Ret(err);
  Enqueue(
      st, [fn, data] { fn(data); }, {}, /*host=*/true);
  return cudaSuccess;
}

EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return Ret(cudaErrorInvalidValue);
  Locked l;
  *attributes = {};
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto lin = l.s.linear.upper_bound(p);
  if (lin != l.s.linear.begin() && p < std::prev(lin)->first + std::prev(lin)->second.bytes) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = std::prev(lin)->second.device;
    attributes->devicePointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  if (Reservation* r = ReservationOf(l.s, p, 1)) {
    auto m = r->mappings.upper_bound(p);
    if (m != r->mappings.begin() && p < std::prev(m)->second.va + std::prev(m)->second.bytes) {
      attributes->type = cudaMemoryTypeDevice;
      attributes->device = l.s.physical[std::prev(m)->second.handle].device;
      attributes->devicePointer = const_cast<void*>(ptr);
      return cudaSuccess;
    }
  }
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = -2;
  return cudaSuccess;
}

}  // extern "C"

extern "C" {

// --- The controls (cuda_double.h).

EXPORT int cudadouble_violation_count(void) {
  Locked l;
  return static_cast<int>(l.s.violations.size());
}

EXPORT const char* cudadouble_violations(void) {
  Locked l;
  l.s.joined.clear();
  for (const std::string& v : l.s.violations) l.s.joined += v + "\n";
  return l.s.joined.c_str();
}

EXPORT void cudadouble_clear_violations(void) {
  Locked l;
  l.s.violations.clear();
}

EXPORT void cudadouble_set_label(const char* label) {
  Locked l;
  l.s.label = label != nullptr ? label : "";
}

EXPORT uint64_t cudadouble_calls(const char* name) {
  Locked l;
  auto it = l.s.calls.find(name != nullptr ? name : "");
  return it == l.s.calls.end() ? 0 : it->second;
}

EXPORT int cudadouble_contexts_created(int device) {
  Locked l;
  if (!ValidDevice(l.s, device)) return -1;
  return l.s.devices[static_cast<std::size_t>(device)].contexts_created;
}

EXPORT void cudadouble_set_posix_fd_handles(int supported) {
  Locked l;
  l.s.posix_fd_handles = supported != 0;
}

EXPORT size_t cudadouble_used_bytes(int device) {
  Locked l;
  if (!ValidDevice(l.s, device)) return 0;
  return l.s.devices[static_cast<std::size_t>(device)].used;
}

EXPORT int cudadouble_pending_work(void) {
  Locked l;
  int n = 0;
  for (Device& dev : l.s.devices) {
    if (dev.primary == nullptr) continue;
    for (Stream* st : StreamsOf(l.s, dev.primary.get())) n += static_cast<int>(st->queue.size());
  }
  return n;
}

EXPORT int cudadouble_fill(void* stream, void* ptr, size_t bytes, uint8_t value) {
  return LaunchKernel(stream, reinterpret_cast<std::uintptr_t>(ptr), bytes, value, false, "cudadouble_fill");
}

EXPORT int cudadouble_expect(void* stream, const void* ptr, size_t bytes, uint8_t value) {
  return LaunchKernel(stream, reinterpret_cast<std::uintptr_t>(ptr), bytes, value, true, "cudadouble_expect");
}

EXPORT const char* cudadouble_first_corruption(void) {
  Locked l;
  l.s.joined = l.s.first_corruption;
  return l.s.joined.c_str();
}

EXPORT uint64_t cudadouble_corruptions(void) {
  Locked l;
  return l.s.corruptions;
}

}  // extern "C"
