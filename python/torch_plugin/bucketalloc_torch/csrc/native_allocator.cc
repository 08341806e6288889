// bucketalloc_torch/csrc/native_allocator.cc — bucketalloc as PyTorch's own CUDA allocator: a
// c10::cuda::CUDACachingAllocator::CUDAAllocator over libbucketalloc.so, compiled against the
// installed torch (bucketalloc_torch/_torch_ext.py builds and caches it per torch build) and made
// current by bucketalloc_torch_native_install(), as torch.cuda.memory.change_current_allocator does.
//
// Every virtual function of the interface is served, so torch's own entry points work unpatched:
// allocation, raw_alloc/raw_delete, stats (memory_stats, reset_*), cacheInfo (cuDNN's workspace
// search), snapshots and history with torch's context recorder, OOM observers and trace trackers,
// CUDA graph and MemPool pools (use counts, liveness checks, per-pool empty_cache), checkpoint
// state (cudagraph trees), CUDA IPC (torch.multiprocessing) and the memory fraction.
//
// What it keeps itself (torch's C++ objects, which libbucketalloc's C ABI cannot hold): the history
// ring with torch's TraceEntry (contexts, mempool ids, user metadata), fed by bucketalloc's trace
// hook; the context of each live block; the observers; MemPools with an allocator of their own
// (their requests go to that allocator). libbucketalloc is reached through the process's one loaded
// copy (dlopen RTLD_NOLOAD of the path it is given), never linked.
//
// Thread-safety: every function may be called from any thread; state_mu_ guards the adapter's own
// state and is never held while calling bucketalloc, except from the trace hook, which bucketalloc
// calls under its device lock (lock order: device lock, then state_mu_).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "bucketalloc/bucketalloc.h"

namespace bucketalloc_torch {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using c10::MempoolId_t;

// ---- libbucketalloc, through the loaded copy -------------------------------------------------

#define BUCKETALLOC_TORCH_API_FUNCTIONS(X)  \
  X(bucketalloc_try_malloc)                 \
  X(bucketalloc_raw_delete)                 \
  X(bucketalloc_init)                       \
  X(bucketalloc_last_error)                 \
  X(bucketalloc_record_stream)              \
  X(bucketalloc_base_alloc)                 \
  X(bucketalloc_set_memory_fraction)        \
  X(bucketalloc_memory_fraction)            \
  X(bucketalloc_get_device_stats)           \
  X(bucketalloc_visit_private_pool_stats)   \
  X(bucketalloc_reset_accumulated_stats)    \
  X(bucketalloc_reset_peak_stats)           \
  X(bucketalloc_visit_segments)             \
  X(bucketalloc_set_trace_hook)             \
  X(bucketalloc_cache_info)                 \
  X(bucketalloc_pool_incref)                \
  X(bucketalloc_pool_use_count)             \
  X(bucketalloc_pool_empty_cache)           \
  X(bucketalloc_last_oom_info)              \
  X(bucketalloc_begin_allocate_to_pool)     \
  X(bucketalloc_end_allocate_to_pool)       \
  X(bucketalloc_release_pool_id)            \
  X(bucketalloc_config_string)              \
  X(bucketalloc_device_count)               \
  X(bucketalloc_pool_set_use_on_oom)        \
  X(bucketalloc_pool_set_no_split)          \
  X(bucketalloc_mark_capture)               \
  X(bucketalloc_share_block)                \
  X(bucketalloc_open_shared)                \
  X(bucketalloc_close_shared)               \
  X(bucketalloc_pool_set_segment_allocator) \
  X(bucketalloc_allocate_at)

struct Api {
#define BUCKETALLOC_TORCH_API_FIELD(name) decltype(&::name) name = nullptr;
  BUCKETALLOC_TORCH_API_FUNCTIONS(BUCKETALLOC_TORCH_API_FIELD)
#undef BUCKETALLOC_TORCH_API_FIELD
};

// Resolves every function from the loaded library at `path`; an empty string, or what is missing.
std::string LoadApi(const char* path, Api* api) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    return std::string("libbucketalloc is not loaded in this process from ") + path + " (" + dlerror() + ")";
  }
#define BUCKETALLOC_TORCH_API_RESOLVE(name)                                             \
  api->name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));                \
  if (api->name == nullptr) {                                                           \
    return std::string(path) + " has no " #name " (a library older than this package)"; \
  }
  BUCKETALLOC_TORCH_API_FUNCTIONS(BUCKETALLOC_TORCH_API_RESOLVE)
#undef BUCKETALLOC_TORCH_API_RESOLVE
  return "";
}

Api g_api;

std::string LastError() {
  const char* e = g_api.bucketalloc_last_error();
  return e == nullptr ? std::string() : std::string(e);
}

// Raises the last error of a failed call as torch's c10::Error.
void Check(int rc, const char* what) {
  if (rc >= 0) return;
  TORCH_CHECK(false, "bucketalloc: ", what, ": ", LastError());
}

bucketalloc_pool_id ToC(MempoolId_t id) { return bucketalloc_pool_id{id.first, id.second}; }
bool IsDefaultPool(MempoolId_t id) { return id.first == 0 && id.second == 0; }

// ---- history: torch's trace entries, fed by bucketalloc's trace hook --------------------------

// The context recorded for the calling thread's current allocator call (set before the call into
// bucketalloc, taken by the trace hook, which bucketalloc calls on this thread).
thread_local std::shared_ptr<c10::GatheredContext> t_context;

// Each trace action: bucketalloc's number (-1: none; torch records it itself), torch's action and
// its name in torch's snapshots (what _record_memory_history's skip_actions names).
struct ActionRow {
  int bucketalloc;
  cda::TraceEntry::Action torch;
  const char* name;
};
constexpr ActionRow kActions[] = {
    {BUCKETALLOC_TRACE_ALLOC, cda::TraceEntry::ALLOC, "alloc"},
    {BUCKETALLOC_TRACE_FREE_REQUESTED, cda::TraceEntry::FREE_REQUESTED, "free_requested"},
    {BUCKETALLOC_TRACE_FREE_COMPLETED, cda::TraceEntry::FREE_COMPLETED, "free_completed"},
    {BUCKETALLOC_TRACE_SEGMENT_ALLOC, cda::TraceEntry::SEGMENT_ALLOC, "segment_alloc"},
    {BUCKETALLOC_TRACE_SEGMENT_FREE, cda::TraceEntry::SEGMENT_FREE, "segment_free"},
    {BUCKETALLOC_TRACE_SEGMENT_MAP, cda::TraceEntry::SEGMENT_MAP, "segment_map"},
    {BUCKETALLOC_TRACE_SEGMENT_UNMAP, cda::TraceEntry::SEGMENT_UNMAP, "segment_unmap"},
    {BUCKETALLOC_TRACE_OOM, cda::TraceEntry::OOM, "oom"},
    {-1, cda::TraceEntry::SNAPSHOT, "snapshot"},
    {-1, cda::TraceEntry::ANNOTATE, "annotate"},
};

cda::TraceEntry::Action ToTorchAction(int action) {
  for (const ActionRow& row : kActions)
    if (row.bucketalloc == action) return row.torch;
  return cda::TraceEntry::OOM;  // a newer library's action: kept, as the closest torch has
}

const char* ActionName(cda::TraceEntry::Action a) {
  for (const ActionRow& row : kActions)
    if (row.torch == a) return row.name;
  return "unknown";
}

// A trace entry whose time is already in microseconds since the epoch (what a snapshot holds).
cda::TraceEntry MakeEntry(cda::TraceEntry::Action action, c10::DeviceIndex device, std::size_t addr, std::size_t size,
                          void* stream, MempoolId_t mempool, std::int64_t time_us,
                          std::shared_ptr<c10::GatheredContext> context, std::string compile_context,
                          std::string user_metadata) {
  cda::TraceEntry e(action, device, addr, size, stream, mempool, 0, std::move(context), std::move(compile_context),
                    std::move(user_metadata));
  e.time_.t_ = static_cast<time_t>(time_us);
  return e;
}

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A MemPool created with an allocator of its own (torch.cuda.MemPool(allocator), as vLLM's sleep
// mode builds one): bucketalloc's private pool gets its segments from that allocator
// (bucketalloc_pool_set_segment_allocator) and caches, splits and counts them as torch's does. The
// context the library holds is a reference to the allocator, dropped when the pool is forgotten.
struct ExternalSegments {
  std::shared_ptr<cca::CUDAAllocator> allocator;
  bool have_cuda = false;  // false on the simulated device: no CUDA device to make current
};
// True on a thread inside a MemPool allocator's raw_alloc or raw_delete, which the library calls
// under the device's lock: a tensor freed meanwhile (the allocator runs Python, whose garbage
// collection may free one) is deferred until the library returns (DrainDeferredFrees).
thread_local bool t_in_segment_callback = false;
thread_local std::vector<void*> t_deferred_frees;
struct SegmentCallbackScope {
  SegmentCallbackScope() { t_in_segment_callback = true; }
  ~SegmentCallbackScope() { t_in_segment_callback = false; }
};
void* ExternalSegmentAlloc(size_t bytes, int device, cudaStream_t stream, void* ctx) {
  auto* segments = static_cast<ExternalSegments*>(ctx);
  SegmentCallbackScope scope;
  try {
    std::optional<c10::cuda::CUDAGuard> guard;
    if (segments->have_cuda) guard.emplace(static_cast<c10::DeviceIndex>(device));  // torch's raw_alloc reads it
    return segments->allocator->raw_alloc_with_stream(bytes, stream);
  } catch (const c10::OutOfMemoryError&) {  // no memory: the pool reports bucketalloc's OOM
    return nullptr;
  } catch (const std::exception& e) {  // anything else is named, then reported as no memory
    std::fprintf(stderr, "bucketalloc: a MemPool allocator's raw_alloc(%zu) failed: %s\n", bytes, e.what());
    return nullptr;
  }
}
void ExternalSegmentFree(void* ptr, size_t, int device, void* ctx) {
  auto* segments = static_cast<ExternalSegments*>(ctx);
  SegmentCallbackScope scope;
  try {
    std::optional<c10::cuda::CUDAGuard> guard;
    if (segments->have_cuda) guard.emplace(static_cast<c10::DeviceIndex>(device));
    segments->allocator->raw_delete(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bucketalloc: a MemPool allocator's raw_delete(%p) failed: %s\n", ptr, e.what());
  }
}
void ExternalSegmentRelease(void* ctx) { delete static_cast<ExternalSegments*>(ctx); }

// What getCheckpointState returns: the pool's live blocks then, each with the stream of its
// segment (setCheckpointPoolState allocates a block that is no longer live on that stream's lists).
struct PoolCheckpoint final : cca::AllocatorState {
  struct Block {
    std::uintptr_t address = 0;
    std::size_t size = 0;  // the block size
    cudaStream_t stream = nullptr;
  };
  c10::DeviceIndex device = 0;
  MempoolId_t pool{0, 0};
  std::vector<Block> live;  // in address order within each segment
};

// The segments of a device, copied with their blocks (what bucketalloc_visit_segments gives).
struct SegmentCopy {
  std::vector<bucketalloc_segment_info> segments;
  std::vector<std::vector<bucketalloc_block_info>> blocks;
  std::vector<bucketalloc_segment_info>::const_iterator begin() const { return segments.begin(); }
  std::vector<bucketalloc_segment_info>::const_iterator end() const { return segments.end(); }
};

class BucketallocAllocator final : public cca::CUDAAllocator {
 public:
  BucketallocAllocator() { have_cuda_ = c10::cuda::device_count() > 0; }

  // ---- allocation ----------------------------------------------------------------------------

  c10::DataPtr allocate(size_t size) override {
    const c10::DeviceIndex device = CurrentDevice();
    void* ptr = Malloc(size, device, CurrentStream(device));
    return {ptr, ptr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  // Allocates `size` bytes at `addr` in the device's own pools of the current device, for the
  // current stream: the free block there (of the segment or slab holding addr, which belongs to that
  // stream) is carved to the block the pool rounds `size` to (bucketalloc_allocate_at).
  c10::DataPtr allocateWithAddress(size_t size, void* addr) override {
    const c10::DeviceIndex device = CurrentDevice();
    if (size == 0) return {nullptr, nullptr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device)};
    Check(g_api.bucketalloc_allocate_at(device, bucketalloc_pool_id{0, 0}, addr, 0, size, CurrentStream(device)),
          "allocateWithAddress");
    return {addr, addr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &RawDelete; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }
  void* raw_alloc(size_t nbytes) override {
    const c10::DeviceIndex device = CurrentDevice();
    return Malloc(nbytes, device, CurrentStream(device));
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return Malloc(nbytes, CurrentDevice(), stream);
  }
  void raw_delete(void* ptr) override { Free(ptr); }

  void init(int device_count) override {
    g_api.bucketalloc_init(device_count);
    initialized_.store(true);
  }
  bool initialized() override { return initialized_.load(); }

  double getMemoryFraction(c10::DeviceIndex device) override {
    const double f = g_api.bucketalloc_memory_fraction(device);
    Check(f < 0 ? -1 : 0, "getMemoryFraction");
    return f;
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "bucketalloc: invalid memory fraction ", fraction,
                "; accepted: a number in [0, 1]");
    g_api.bucketalloc_set_memory_fraction(fraction, device);
    // The hook returns nothing: a fraction bucketalloc refused (a cap under one granule, as torch's 0
    // would give) leaves the one before, and is raised here.
    TORCH_CHECK(g_api.bucketalloc_memory_fraction(device) == fraction, "bucketalloc: setMemoryFraction(", fraction,
                ") on device ", static_cast<int>(device), " was not applied: ", LastError());
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::vector<cca::StreamSegmentSize> sizes;
    for (const bucketalloc_segment_info& s : Segments(device)) {
      if (s.is_expandable) sizes.emplace_back(reinterpret_cast<cudaStream_t>(s.stream), s.is_small != 0, s.total_size);
    }
    return sizes;
  }

  void emptyCache(MempoolId_t mempool_id) override {
    DeferredFreesDrain drain(this);
    RetryPendingCloses();
    // Every device bucketalloc serves already; none is created (a context on an idle GPU) by asking.
    if (g_api.bucketalloc_pool_empty_cache(-1, ToC(mempool_id)) != 0) {
      // torch's empty_cache is a silent no-op while a capture or MemPool context runs (PR #158152).
      TORCH_WARN_ONCE("bucketalloc: ", LastError());
    }
  }
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }

  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    Check(g_api.bucketalloc_cache_info(device, largestBlock), "cacheInfo");
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = g_api.bucketalloc_base_alloc(ptr, size);
    TORCH_CHECK(base != nullptr, "bucketalloc: getBaseAllocation: ", LastError());
    return base;
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // As torch: only blocks this allocator handed out (IPC-received tensors, DLPack imports and a
    // MemPool allocator's blocks are not).
    if (ptr.get() == nullptr || ptr.get_deleter() != &RawDelete) return;
    g_api.bucketalloc_record_stream(ptr.get(), stream.stream());
  }

  // ---- stats -----------------------------------------------------------------------------------

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    bucketalloc_device_stats s{};
    Check(g_api.bucketalloc_get_device_stats(device, &s, sizeof s), "getDeviceStats");
    cda::DeviceStats out;
    const auto copy = [](const bucketalloc_stat& from, c10::CachingAllocator::Stat& to) {
      to.current = from.current;
      to.peak = from.peak;
      to.allocated = from.allocated;
      to.freed = from.freed;
    };
    const auto copy_array = [&](const bucketalloc_stat* from, c10::CachingAllocator::StatArray& to) {
      for (std::size_t i = 0; i < to.size(); ++i) copy(from[i], to[i]);
    };
    copy_array(s.allocation, out.allocation);
    copy_array(s.segment, out.segment);
    copy_array(s.active, out.active);
    copy_array(s.inactive_split, out.inactive_split);
    copy_array(s.allocated_bytes, out.allocated_bytes);
    copy_array(s.reserved_bytes, out.reserved_bytes);
    copy_array(s.active_bytes, out.active_bytes);
    copy_array(s.inactive_split_bytes, out.inactive_split_bytes);
    copy_array(s.requested_bytes, out.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    copy(s.oversize_allocations, out.oversize_allocations);
    copy(s.oversize_segments, out.oversize_segments);
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.num_oom_rejections = s.num_oom_rejections;
    out.max_split_size = s.max_split_size;
    Check(g_api.bucketalloc_visit_private_pool_stats(
              device,
              [](bucketalloc_pool_id pool, const bucketalloc_stat* reserved, void* c) {
                c10::CachingAllocator::StatArray& to =
                    static_cast<cda::DeviceStats*>(c)->reserved_bytes_by_private_pools[{pool.first, pool.second}];
                for (std::size_t i = 0; i < to.size(); ++i) {
                  to[i].current = reserved[i].current;
                  to[i].peak = reserved[i].peak;
                  to[i].allocated = reserved[i].allocated;
                  to[i].freed = reserved[i].freed;
                }
              },
              &out),
          "getDeviceStats");
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    Check(g_api.bucketalloc_reset_accumulated_stats(device), "resetAccumulatedStats");
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    Check(g_api.bucketalloc_reset_peak_stats(device), "resetPeakStats");
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    if (have_cuda_) return cca::CUDAAllocator::getMemoryInfo(device);
    // The simulated device: its cap and what is left under it.
    bucketalloc_device_stats s{};
    Check(g_api.bucketalloc_get_device_stats(device, &s, sizeof s), "getMemoryInfo");
    const auto total = static_cast<size_t>(s.capacity_bytes);
    const auto reserved = static_cast<size_t>(s.reserved_bytes[0].current);
    return {total > reserved ? total - reserved : 0, total};
  }

  // ---- snapshots and history -------------------------------------------------------------------

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo info;
    const SegmentCopy segments = Segments(-1);  // before any lock of ours (the trace hook's order)
    std::unique_lock<std::mutex> blocks_lock(block_mu_);
    for (const bucketalloc_segment_info& s : segments) {
      const MempoolId_t pool{s.pool.first, s.pool.second};
      if (!IsDefaultPool(mempool_id) && pool != mempool_id) continue;
      cda::SegmentInfo seg;
      seg.device = static_cast<c10::DeviceIndex>(s.device);
      seg.address = s.address;
      seg.total_size = s.total_size;
      seg.requested_size = s.requested_size;
      seg.allocated_size = s.allocated_size;
      seg.active_size = s.active_size;
      seg.stream = reinterpret_cast<void*>(s.stream);
      seg.is_large = s.is_small == 0;
      seg.is_expandable = s.is_expandable != 0;
      seg.owner_private_pool_id = pool;
      for (std::size_t i = 0; i < s.num_blocks; ++i) {
        const bucketalloc_block_info& b = s.blocks[i];
        cda::BlockInfo block;
        block.size = b.size;
        block.requested_size = b.requested_size;
        block.allocated = b.state == BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED;
        block.active = b.state != BUCKETALLOC_BLOCK_INACTIVE;
        if (block.active) {
          auto it = block_contexts_.find(b.address);
          if (it != block_contexts_.end()) block.context_when_allocated = it->second;
        }
        if (i == 0 && block.active) seg.context_when_allocated = block.context_when_allocated;
        seg.blocks.push_back(std::move(block));
      }
      info.segments.push_back(std::move(seg));
    }
    blocks_lock.unlock();
    const int devices = std::max(DeviceCount(), 1);
    info.device_traces.resize(static_cast<std::size_t>(devices));
    if (include_traces) {
      std::vector<std::size_t> active(static_cast<std::size_t>(devices), 0);
      for (const cda::SegmentInfo& seg : info.segments) {
        if (seg.device >= 0 && seg.device < devices) active[static_cast<std::size_t>(seg.device)] += seg.active_size;
      }
      std::lock_guard<std::mutex> state(state_mu_);
      for (std::size_t d = 0; d < traces_.size() && d < info.device_traces.size(); ++d) {
        info.device_traces[d].assign(traces_[d].begin(), traces_[d].end());
      }
      info.external_annotations.assign(annotations_.begin(), annotations_.end());
      if (recording_) {
        // As torch: each snapshot is marked in the history (seen by the next snapshot), its size the
        // active bytes.
        for (int d = 0; d < devices; ++d)
          Push(MakeEntry(cda::TraceEntry::SNAPSHOT, static_cast<c10::DeviceIndex>(d), 0,
                         active[static_cast<std::size_t>(d)], nullptr, mempool_id, NowUs(), nullptr, "", ""));
      }
    }
    FillConfig(&info.config_metadata);
    return info;
  }

  bool isHistoryEnabled() override {
    std::lock_guard<std::mutex> lock(state_mu_);
    return recording_;
  }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    std::lock_guard<std::mutex> lock(block_mu_);
    auto it = block_contexts_.find(reinterpret_cast<std::uintptr_t>(ptr));
    return it == block_contexts_.end() ? nullptr : it->second;
  }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      recording_ = enabled;
      recorder_ = enabled ? context_recorder : nullptr;
      when_ = enabled ? when : cca::RecordContext::NEVER;
      max_entries_ = std::max<size_t>(alloc_trace_max_entries, 1);
      skip_.clear();
      for (const std::string& name : skip_actions) skip_.insert(name);
      if (clearHistory || !enabled) {
        traces_.clear();
        annotations_.clear();
      }
      for (std::deque<cda::TraceEntry>& trace : traces_) {
        while (trace.size() > max_entries_) trace.pop_front();
      }
      while (annotations_.size() > max_entries_) annotations_.pop_front();
      recording_flag_.store(enabled && when_ != cca::RecordContext::NEVER ? 2 : (enabled ? 1 : 0));
    }
    if (!enabled || when == cca::RecordContext::NEVER) {
      std::lock_guard<std::mutex> lock(block_mu_);
      block_contexts_.clear();
    }
    UpdateHook();
  }
  // record_function annotations (torch's profiler callbacks while history is recorded): kept, as
  // torch keeps them, for the snapshot's external_annotations.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    const c10::DeviceIndex device = CurrentDevice();
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!recording_) return;
    cda::AnnotationEntry entry(device, 0);
    entry.time_.t_ = static_cast<time_t>(NowUs());  // microseconds since the epoch, as MakeEntry's
    for (const auto& [name, value] : md) entry.recordUserMetadata(name, value);
    annotations_.push_back(std::move(entry));
    while (annotations_.size() > max_entries_) annotations_.pop_front();
  }
  void pushCompileContext(std::string& md) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    compile_contexts_.push_back(md);
  }
  void popCompileContext() override {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!compile_contexts_.empty()) compile_contexts_.pop_back();
  }
  bool supportsUserMetadata() override { return true; }
  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    user_metadata_ = metadata;
  }
  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> lock(state_mu_);
    return user_metadata_;
  }
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!recording_) return;
    Push(MakeEntry(cda::TraceEntry::ANNOTATE, CurrentDevice(), reinterpret_cast<std::size_t>(ptr), 0, nullptr, {0, 0},
                   NowUs(), nullptr, "", metadata));
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    oom_rejection_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      trackers_.push_back(std::move(tracker));
    }
    UpdateHook();
  }

  // ---- pools -----------------------------------------------------------------------------------

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    Check(g_api.bucketalloc_begin_allocate_to_pool(device, {mempool_id.first, mempool_id.second}, std::move(filter)),
          "beginAllocateToPool");
  }
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    Check(g_api.bucketalloc_end_allocate_to_pool(device, {mempool_id.first, mempool_id.second}), "endAllocateToPool");
  }
  // CUDAGraph marks its captures (torch 2.15): a use_mem_pool context is then not one.
  void markCaptureBegin(c10::DeviceIndex device) override {
    Check(g_api.bucketalloc_mark_capture(device, 1), "markCaptureBegin");
  }
  void markCaptureEnd(c10::DeviceIndex device) override {
    Check(g_api.bucketalloc_mark_capture(device, 0), "markCaptureEnd");
  }
  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    DeferredFreesDrain drain(this);
    Check(g_api.bucketalloc_release_pool_id(device, {mempool_id.first, mempool_id.second}), "releasePool");
    if (g_api.bucketalloc_pool_use_count(device, ToC(mempool_id)) == 0) {
      std::lock_guard<std::mutex> lock(state_mu_);
      pool_allocators_.erase({device, mempool_id});  // ~MemPool: no use left
    }
  }
  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    const int count = g_api.bucketalloc_pool_use_count(device, ToC(mempool_id));
    Check(count, "getPoolUseCount");
    return count;
  }
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    Check(g_api.bucketalloc_pool_incref(device, ToC(mempool_id)), "createOrIncrefPool");
    if (allocator == nullptr || allocator.get() == this) return;
    // MemPool(allocator): the pool's segments come from `allocator` (set once, before it holds
    // memory). The library is called without state_mu_ held (lock order: device, then state_mu_).
    bool added = false;
    bool other = false;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      auto [it, inserted] = pool_allocators_.emplace(std::make_pair(device, mempool_id), allocator.get());
      added = inserted;
      other = !inserted && it->second != allocator.get();
    }
    if (other) {
      g_api.bucketalloc_release_pool_id(device, ToC(mempool_id));  // the use this call took
      TORCH_CHECK(false, "bucketalloc: MemPool (", mempool_id.first, ", ", mempool_id.second,
                  ") already has another allocator");
    }
    if (!added) return;
    auto* context = new ExternalSegments{std::move(allocator), have_cuda_};
    if (g_api.bucketalloc_pool_set_segment_allocator(device, ToC(mempool_id), &ExternalSegmentAlloc,
                                                     &ExternalSegmentFree, &ExternalSegmentRelease, context) != 0) {
      const std::string error = LastError();  // the library released `context`
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        pool_allocators_.erase({device, mempool_id});
      }
      g_api.bucketalloc_release_pool_id(device, ToC(mempool_id));  // the use this call took
      TORCH_CHECK(false, "bucketalloc: createOrIncrefPool: ", error);
    }
  }
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    Check(g_api.bucketalloc_pool_set_use_on_oom(device, ToC(mempool_id), use_on_oom ? 1 : 0), "setUseOnOOM");
  }
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    Check(g_api.bucketalloc_pool_set_no_split(device, ToC(mempool_id)), "setNoSplit");
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    std::size_t live = 0;
    for (const bucketalloc_segment_info& s : Segments(device)) {
      if (MempoolId_t{s.pool.first, s.pool.second} != mempool_id) continue;
      for (std::size_t i = 0; i < s.num_blocks; ++i) {
        const bucketalloc_block_info& b = s.blocks[i];
        if (b.state != BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED) continue;
        if (expected_live_allocations.count(reinterpret_cast<void*>(b.address)) == 0) return false;
        ++live;
      }
    }
    return live == expected_live_allocations.size();
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    const int uses = g_api.bucketalloc_pool_use_count(device, ToC(id));
    Check(uses, "getCheckpointState");
    TORCH_CHECK(uses > 0, "bucketalloc: getCheckpointState: no graph or MemPool uses pool (", id.first, ", ", id.second,
                ") on device ", static_cast<int>(device), " (a pool is checkpointed while in use)");
    auto state = std::make_shared<PoolCheckpoint>();
    state->device = device;
    state->pool = id;
    for (const bucketalloc_segment_info& s : Segments(device)) {
      if (MempoolId_t{s.pool.first, s.pool.second} != id) continue;
      for (std::size_t i = 0; i < s.num_blocks; ++i) {
        if (s.blocks[i].state == BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED) {
          state->live.push_back({s.blocks[i].address, s.blocks[i].size, reinterpret_cast<cudaStream_t>(s.stream)});
        }
      }
    }
    return state;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    auto* state = dynamic_cast<PoolCheckpoint*>(pps.get());
    TORCH_CHECK(state != nullptr,
                "bucketalloc: setCheckpointPoolState: the state is not one bucketalloc's "
                "getCheckpointState returned");
    TORCH_CHECK(state->device == device, "bucketalloc: setCheckpointPoolState: the state is device ",
                static_cast<int>(state->device), "'s, not device ", static_cast<int>(device), "'s");
    // torch's semantics: every block of the pool live now is freed, and the checkpoint's blocks are
    // allocated again at their addresses and block sizes. A block live in both, at the same address
    // and size, stays (reported freed and allocated: its new DataPtr owns it, as the caller's
    // storages take them over); the others live now are freed; the checkpoint's blocks not live now
    // are allocated at their addresses (bucketalloc_allocate_at), on their segment's stream.
    std::unordered_map<std::uintptr_t, std::size_t> now;
    for (const bucketalloc_segment_info& s : Segments(device)) {
      if (MempoolId_t{s.pool.first, s.pool.second} != state->pool) continue;
      for (std::size_t i = 0; i < s.num_blocks; ++i) {
        if (s.blocks[i].state == BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED) now[s.blocks[i].address] = s.blocks[i].size;
      }
    }
    cca::CheckpointDelta delta;
    std::vector<const PoolCheckpoint::Block*> missing;
    for (const PoolCheckpoint::Block& b : state->live) {
      auto it = now.find(b.address);
      if (it != now.end() && it->second == b.size) {
        now.erase(it);
      } else {
        missing.push_back(&b);
      }
    }
    // First the frees, so that the memory of the blocks to allocate again is free.
    for (const auto& [address, size] : now) {
      (void)size;
      void* ptr = reinterpret_cast<void*>(address);
      Free(ptr);
      delta.ptrs_freed.push_back(ptr);
    }
    std::unordered_set<void*> allocated;
    for (const PoolCheckpoint::Block* b : missing) {
      void* ptr = reinterpret_cast<void*>(b->address);
      if (g_api.bucketalloc_allocate_at(device, ToC(state->pool), ptr, b->size, b->size, b->stream) != 0) {
        const std::string error = LastError();
        for (void* p : allocated) Free(p);  // what this call allocated goes back
        TORCH_CHECK(false, "bucketalloc: setCheckpointPoolState: cannot allocate the checkpoint's block of ", b->size,
                    " bytes at ", ptr, " in pool (", state->pool.first, ", ", state->pool.second, ") on device ",
                    static_cast<int>(device), " again: ", error);
      }
      allocated.insert(ptr);
    }
    for (const PoolCheckpoint::Block& b : state->live) {
      void* ptr = reinterpret_cast<void*>(b.address);
      if (allocated.count(ptr) == 0) delta.ptrs_freed.push_back(ptr);  // live before: freed and allocated
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // ---- IPC -------------------------------------------------------------------------------------

  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    bucketalloc_shared_memory shared{};
    std::vector<bucketalloc_shared_piece> pieces(16);
    int rc = g_api.bucketalloc_share_block(ptr, &shared, sizeof shared, pieces.data(), pieces.size());
    if (rc != 0 && shared.num_pieces > pieces.size()) {  // more pieces than room: again with room
      pieces.resize(shared.num_pieces);
      rc = g_api.bucketalloc_share_block(ptr, &shared, sizeof shared, pieces.data(), pieces.size());
    }
    TORCH_CHECK(rc == 0, "bucketalloc: shareIpcHandle: ", LastError());
    pieces.resize(shared.num_pieces);
    std::string text;
    text.push_back(kShareableHandleVersion);
    if (shared.virtual_memory != 0) {
      // An expandable (vmm) segment: its physical pieces under the block, each a POSIX descriptor
      // of this process that the receiver reads with pidfd_getfd.
      const bool uniform = std::all_of(pieces.begin(), pieces.end(),
                                       [&](const bucketalloc_shared_piece& p) { return p.bytes == pieces[0].bytes; });
      if (uniform) {
        // torch's layout ('e', ExpandableSegment::share): the header, then one int per page.
        text.push_back(kShareableExpandable);
        TorchShareHeader header;
        std::memset(&header, 0, sizeof header);  // deterministic padding, as torch writes it
        header.pid = getpid();
        header.segment_size = pieces[0].bytes;
        header.num_handles = pieces.size();
        header.handle_type = kPosixFdHandles;
        text.append(reinterpret_cast<const char*>(&header), sizeof header);
        for (const bucketalloc_shared_piece& p : pieces) text.append(reinterpret_cast<const char*>(&p.fd), sizeof(int));
      } else {
        // Pieces of different sizes (a stitched segment), which torch's layout cannot say:
        // bucketalloc's ('b'): pid, piece count, then each piece's descriptor and bytes. torch's own
        // allocator refuses this type by name; bucketalloc's opens it.
        text.push_back(kShareablePieces);
        const std::int64_t head[2] = {getpid(), static_cast<std::int64_t>(pieces.size())};
        text.append(reinterpret_cast<const char*>(head), sizeof head);
        for (const bucketalloc_shared_piece& p : pieces) {
          const std::int64_t piece[2] = {p.fd, static_cast<std::int64_t>(p.bytes)};
          text.append(reinterpret_cast<const char*>(piece), sizeof piece);
        }
      }
      return cca::ShareableHandle{static_cast<std::ptrdiff_t>(shared.offset), text};
    }
    TORCH_CHECK(have_cuda_,
                "bucketalloc: shareIpcHandle: the simulated device (backend:sim) has no memory another "
                "process can open; CUDA IPC needs a GPU (backend:cuda or backend:vmm)");
    void* base = reinterpret_cast<void*>(shared.base);
    cudaIpcMemHandle_t handle;
    const cudaError_t err = cudaIpcGetMemHandle(&handle, base);
    (void)cudaGetLastError();  // a failure must not stay behind for an unrelated kernel's check
    TORCH_CHECK(err == cudaSuccess, "bucketalloc: shareIpcHandle: cudaIpcGetMemHandle of the segment at ", base,
                " failed: ", cudaGetErrorString(err));
    // torch's layout (c10/cuda/CUDACachingAllocator.cpp): a version byte, the handle type, the
    // cudaIpcMemHandle_t; the offset of `ptr` in its segment beside it.
    text.push_back(kShareableCudaMalloc);
    text.append(reinterpret_cast<const char*>(&handle), CUDA_IPC_HANDLE_SIZE);
    return cca::ShareableHandle{static_cast<std::ptrdiff_t>(shared.offset), text};
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    // torch's layouts: a bare cudaIpcMemHandle_t (older torch), or a version byte (<= 3), the type
    // and its data: 'c' a cudaIpcMemHandle_t, 'e' an expandable segment's pages; and bucketalloc's
    // 'b' (pieces of different sizes).
    const bool legacy = handle.size() == CUDA_IPC_HANDLE_SIZE;
    const bool versioned = handle.size() >= 2 && handle[0] >= 1 && handle[0] <= kShareableHandleVersion;
    const char type = legacy ? kShareableCudaMalloc : (versioned ? handle[1] : '?');
    const c10::DeviceIndex device = CurrentDevice();
    RetryPendingCloses();
    std::lock_guard<std::mutex> lock(ipc_mu_);
    auto it = ipc_open_.find(handle);  // one opening per handle in the process, as torch keeps it
    if (it != ipc_open_.end()) {
      if (std::shared_ptr<void> open = it->second.lock()) return open;
    }
    std::shared_ptr<void> open;
    if (type == kShareableExpandable || type == kShareablePieces) {
      open = OpenPieces(handle, device);
    } else {
      TORCH_CHECK(type == kShareableCudaMalloc && (legacy || handle.size() == 2 + CUDA_IPC_HANDLE_SIZE),
                  "bucketalloc: getIpcDevPtr: not an IPC handle of torch's layout (", handle.size(),
                  " bytes; accepted: ", CUDA_IPC_HANDLE_SIZE, " handle bytes, or a version byte up to ",
                  static_cast<int>(kShareableHandleVersion), " and the type 'c' with a cudaIpcMemHandle_t, 'e' with ",
                  "an expandable segment's pages, or bucketalloc's 'b')");
      TORCH_CHECK(have_cuda_,
                  "bucketalloc: getIpcDevPtr: the simulated device (backend:sim) cannot open CUDA IPC "
                  "handles; it needs a GPU");
      cudaIpcMemHandle_t h;
      std::memcpy(&h, handle.data() + (legacy ? 0 : 2), CUDA_IPC_HANDLE_SIZE);
      void* dev = nullptr;
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev, h, cudaIpcMemLazyEnablePeerAccess));
      open = std::shared_ptr<void>(dev, [device](void* p) {
        c10::cuda::CUDAGuard g(device);
        (void)cudaIpcCloseMemHandle(p);
        (void)cudaGetLastError();
      });
    }
    ipc_open_[handle] = open;
    return open;
  }

  // ---- devices and copies ----------------------------------------------------------------------

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    C10_CUDA_CHECK(err);
  }
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }
  std::string name() override { return "bucketalloc"; }

  // torch.cuda.memory._set_allocator_settings(text): torch has parsed and validated `text` into its
  // own configuration. bucketalloc's is fixed when it is created, except the memory fraction:
  // per_process_memory_fraction is applied to every device; any other device key whose value
  // differs from bucketalloc's is named in a warning (torch's pinned_* keys are its host
  // allocator's, which reads them itself).
  void OnAllocatorSettings(const std::string& text) {
    const std::string config = ConfigString();
    std::vector<std::string> not_applied;
    for (const auto& [key, value] : SplitSettings(text)) {
      if (key.rfind("pinned_", 0) == 0) continue;
      if (key == "per_process_memory_fraction") {
        const double fraction = std::strtod(value.c_str(), nullptr);
        for (int d = 0; d < std::max(DeviceCount(), 1); ++d)
          setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(d));
        continue;
      }
      std::string lower = value;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (("," + config + ",").find("," + key + ":" + lower + ",") == std::string::npos) {
        not_applied.push_back(key + ":" + value);
      }
    }
    if (!not_applied.empty()) {
      std::string names;
      for (const std::string& n : not_applied) names += (names.empty() ? "" : ", ") + n;
      TORCH_WARN("bucketalloc: _set_allocator_settings: ", names,
                 " not applied: bucketalloc's configuration is fixed when it is created (set it in BUCKETALLOC_CONF "
                 "or PYTORCH_CUDA_ALLOC_CONF before the process starts; per_process_memory_fraction applies at once)");
    }
  }

  // The trace hook bucketalloc calls (under its device lock) while this adapter records.
  // Never throws: it runs inside bucketalloc's allocation, after the block is committed (a throw
  // would lose the block). A tracker's exception is reported and dropped.
  void OnEvent(const bucketalloc_trace_event& event) noexcept {
    try {
      OnEventOrThrow(event);
    } catch (const std::exception& e) {
      TORCH_WARN_ONCE("bucketalloc: a memory trace tracker or the history failed: ", e.what());
    } catch (...) {
      TORCH_WARN_ONCE("bucketalloc: a memory trace tracker or the history failed");
    }
  }

  void OnEventOrThrow(const bucketalloc_trace_event& event) {
    const cda::TraceEntry::Action action = ToTorchAction(event.action);
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!recording_ && trackers_.empty()) return;
    // As torch: a trace entry keeps a context at ALLOC or ALL; a free's is the one gathered at the
    // free (ALL), else the block's from its allocation.
    std::shared_ptr<c10::GatheredContext> context;
    if (when_ == cca::RecordContext::ALLOC || when_ == cca::RecordContext::ALL) {
      context = t_context;
      const bool is_free = action == cda::TraceEntry::FREE_REQUESTED || action == cda::TraceEntry::FREE_COMPLETED;
      if (context == nullptr && is_free) {
        std::lock_guard<std::mutex> blocks(block_mu_);  // lock order: device, state_mu_, block_mu_
        auto it = block_contexts_.find(event.addr);
        if (it != block_contexts_.end()) context = it->second;
      }
    }
    const std::size_t addr = action == cda::TraceEntry::OOM ? event.device_free : event.addr;
    cda::TraceEntry e = MakeEntry(action, static_cast<c10::DeviceIndex>(event.device), addr, event.size,
                                  reinterpret_cast<void*>(event.stream),
                                  MempoolId_t{event.pool.first, event.pool.second}, event.time_us, std::move(context),
                                  compile_contexts_.empty() ? std::string() : compile_contexts_.back(), user_metadata_);
    for (const cca::AllocatorTraceTracker& tracker : trackers_) tracker(e);
    if (recording_ && skip_.count(ActionName(action)) == 0) Push(std::move(e));
  }

  static BucketallocAllocator* instance;

 private:
  static constexpr char kShareableHandleVersion = 3;  // torch 2.15's SHAREABLE_HANDLE_VERSION
  static constexpr char kShareableCudaMalloc = 'c';
  static constexpr char kShareableExpandable = 'e';  // torch's SHAREABLE_CUDA_EXPANDABLE_SEGMENT
  static constexpr char kShareablePieces = 'b';      // bucketalloc's: pieces of different sizes
  static constexpr int kPosixFdHandles = 1;          // torch's Expandable_Segments_Handle_Type::POSIX_FD
  // torch's ShareHeader (ExpandableSegment::share), field for field.
  struct TorchShareHeader {
    pid_t pid;
    size_t segment_size;
    size_t num_handles;
    int handle_type;
  };

  // Opens an 'e' (torch's expandable segment) or 'b' (bucketalloc's pieces) handle: the sender's
  // descriptors, read from its process, mapped side by side (bucketalloc_open_shared) until the
  // last user of the returned pointer lets it go.
  std::shared_ptr<void> OpenPieces(const std::string& handle, c10::DeviceIndex device) {
    std::vector<bucketalloc_shared_piece> pieces;
    int pid = 0;
    const char* data = handle.data() + 2;
    const std::size_t size = handle.size() - 2;
    if (handle[1] == kShareableExpandable) {
      TorchShareHeader header;
      // Version 3 (torch 2.15) says the handle type; version 2 wrote pid, page size and count only
      // (POSIX descriptors).
      const bool typed = handle[0] >= 3;
      const std::size_t header_size = typed ? sizeof header : offsetof(TorchShareHeader, handle_type);
      TORCH_CHECK(size >= header_size, "bucketalloc: getIpcDevPtr: an expandable segment's handle of ", handle.size(),
                  " bytes is shorter than its header (", header_size, " bytes in version ", static_cast<int>(handle[0]),
                  ")");
      std::memset(&header, 0, sizeof header);
      std::memcpy(&header, data, header_size);
      if (!typed) header.handle_type = kPosixFdHandles;
      TORCH_CHECK(header.handle_type == kPosixFdHandles, "bucketalloc: getIpcDevPtr: the expandable segment was ",
                  "shared with handle type ", header.handle_type,
                  "; accepted: POSIX file descriptors (1). Fabric handles (2) are not opened by bucketalloc, and 0 "
                  "means the sender made its segments without IPC handles");
      TORCH_CHECK(header.num_handles <= (size - header_size) / sizeof(int) &&
                      size == header_size + header.num_handles * sizeof(int),
                  "bucketalloc: getIpcDevPtr: an expandable segment's handle of ", handle.size(), " bytes for ",
                  header.num_handles, " pages");
      pid = header.pid;
      for (std::size_t i = 0; i < header.num_handles; ++i) {
        int fd = -1;
        std::memcpy(&fd, data + header_size + i * sizeof(int), sizeof(int));
        pieces.push_back({fd, header.segment_size});
      }
    } else {
      std::int64_t head[2] = {0, 0};
      TORCH_CHECK(size >= sizeof head, "bucketalloc: getIpcDevPtr: a 'b' handle of ", handle.size(),
                  " bytes is shorter than its header");
      std::memcpy(head, data, sizeof head);
      TORCH_CHECK(head[1] > 0 &&
                      static_cast<std::uint64_t>(head[1]) <= (size - sizeof head) / (2 * sizeof(std::int64_t)) &&
                      size == sizeof head + static_cast<std::size_t>(head[1]) * 2 * sizeof(std::int64_t),
                  "bucketalloc: getIpcDevPtr: a 'b' handle of ", handle.size(), " bytes for ", head[1], " pieces");
      pid = static_cast<int>(head[0]);
      for (std::int64_t i = 0; i < head[1]; ++i) {
        std::int64_t piece[2];
        std::memcpy(piece, data + sizeof head + static_cast<std::size_t>(i) * sizeof piece, sizeof piece);
        pieces.push_back({static_cast<int>(piece[0]), static_cast<size_t>(piece[1])});
      }
    }
    void* base = g_api.bucketalloc_open_shared(device, pid, pieces.data(), pieces.size());
    TORCH_CHECK(base != nullptr, "bucketalloc: getIpcDevPtr: ", LastError());
    return std::shared_ptr<void>(base, [](void* p) { instance->CloseShared(p); });
  }
  // Unmaps an opening whose last user went; one refused now (during a capture) is kept and closed
  // again at the next empty_cache or opening.
  void CloseShared(void* base) {
    if (g_api.bucketalloc_close_shared(base) == 0) return;
    const std::string error = LastError();
    if (error.find("during CUDA graph capture") == std::string::npos) {
      std::fprintf(stderr, "bucketalloc: closing shared memory at %p failed: %s\n", base, error.c_str());
      return;
    }
    std::lock_guard<std::mutex> lock(pending_close_mu_);
    pending_closes_.push_back(base);
  }
  void RetryPendingCloses() {
    std::vector<void*> pending;
    {
      std::lock_guard<std::mutex> lock(pending_close_mu_);
      pending.swap(pending_closes_);
    }
    for (void* base : pending) CloseShared(base);
  }

  static void RawDelete(void* ptr) { instance->Free(ptr); }

  c10::DeviceIndex CurrentDevice() const {
    if (!have_cuda_) return 0;  // the simulated device (no CUDA device is visible to torch)
    return c10::cuda::current_device();
  }
  cudaStream_t CurrentStream(c10::DeviceIndex device) const {
    if (!have_cuda_) return nullptr;
    return c10::cuda::getCurrentCUDAStream(device).stream();
  }
  int DeviceCount() const { return g_api.bucketalloc_device_count(); }

  void* Malloc(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) return nullptr;
    if (t_in_segment_callback) [[unlikely]] {
      TORCH_CHECK(false,
                  "bucketalloc: a MemPool's allocator allocated through torch's CUDA allocator from inside its own "
                  "raw_alloc or raw_delete, where bucketalloc holds the device's lock; such an allocator must take "
                  "its memory from the device (cudaMalloc, cuMemCreate)");
    }
    DeferredFreesDrain drain(this);  // frees a MemPool allocator's callback deferred, once the library returns
    const int recording = recording_flag_.load(std::memory_order_relaxed);
    if (recording != 0) [[unlikely]] {
      return MallocRecorded(size, device, stream, recording == 2);
    }
    return MallocPlain(size, device, stream);
  }

  void* MallocPlain(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    void* p = nullptr;
    int rc = g_api.bucketalloc_try_malloc(static_cast<ssize_t>(size), device, stream, &p);
    if (rc == 0) [[likely]]
      return p;
    std::string message = LastError();
    if (rc == 1 && !LastOomRejected(device) && RunFreeMemoryCallbacks()) {
      rc = g_api.bucketalloc_try_malloc(static_cast<ssize_t>(size), device, stream, &p);
      if (rc == 0) return p;
      message = LastError();
    }
    if (rc == 1) OutOfMemory(size, device, message);
    TORCH_CHECK(false, message);
  }

  void* MallocRecorded(size_t size, c10::DeviceIndex device, cudaStream_t stream, bool with_context) {
    cca::CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      recorder = recorder_;
    }
    // The context is gathered before the call, outside every lock, as torch does.
    t_context = with_context && recorder != nullptr ? recorder() : nullptr;
    struct Reset {
      ~Reset() { t_context.reset(); }
    } reset;
    void* p = MallocPlain(size, device, stream);
    if (p != nullptr && t_context != nullptr) {
      std::lock_guard<std::mutex> lock(block_mu_);
      block_contexts_[reinterpret_cast<std::uintptr_t>(p)] = t_context;
    }
    return p;
  }

  [[noreturn]] void OutOfMemory(size_t size, c10::DeviceIndex device, const std::string& message) {
    bucketalloc_oom_info oom{};
    if (g_api.bucketalloc_last_oom_info(device, &oom, sizeof oom) != 0) oom = bucketalloc_oom_info{};
    std::vector<cca::OutOfMemoryObserver> observers;
    std::vector<cca::OomRejectionObserver> rejections;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      observers = oom_observers_;
      rejections = oom_rejection_observers_;
    }
    const size_t needed = oom.segment != 0 ? oom.segment : size;
    if (oom.present && oom.rejected) {
      // throw_on_cudamalloc_oom refused it at the cap: torch's preemptive rejection, which tells only
      // its rejection observers (device, the allocation, what was allocated, the device's memory).
      for (const auto& observer : rejections) {
        try {
          observer(device, needed, oom.allocated, oom.device_total);
        } catch (const std::exception& e) {
          TORCH_WARN("bucketalloc: an OOM-rejection observer failed: ", e.what());
        }
      }
    } else {
      // As torch's: the device, the allocation it needed (the segment), the allowed maximum (the
      // cap) and the device's free memory.
      for (const auto& observer : observers) observer(device, needed, oom.capacity, oom.device_free);
    }
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
  }

  // True when the last OOM of `device` was a throw_on_cudamalloc_oom rejection (no retry then).
  static bool LastOomRejected(c10::DeviceIndex device) {
    bucketalloc_oom_info oom{};
    return g_api.bucketalloc_last_oom_info(device, &oom, sizeof oom) == 0 && oom.present && oom.rejected;
  }

  // torch's FreeCudaMemoryCallbacksRegistry (e.g. cuda_ipc_collect, which frees tensors other
  // processes released): true when one freed something (the request is tried once more).
  static bool RunFreeMemoryCallbacks() {
    bool freed = false;
    for (const std::string& key : c10::FreeCudaMemoryCallbacksRegistry()->Keys()) {
      const std::unique_ptr<c10::FreeMemoryCallback> callback = c10::FreeCudaMemoryCallbacksRegistry()->Create(key);
      if (callback != nullptr) freed |= callback->Execute();
    }
    return freed;
  }

  void Free(void* ptr) {
    if (ptr == nullptr) return;
    if (t_in_segment_callback) [[unlikely]] {
      t_deferred_frees.push_back(ptr);  // inside the library's call: after it returns
      return;
    }
    DeferredFreesDrain drain(this);
    const int recording = recording_flag_.load(std::memory_order_relaxed);
    if (recording == 2) [[unlikely]] {
      cca::CreateContextFn recorder = nullptr;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        if (when_ == cca::RecordContext::ALL) recorder = recorder_;
      }
      t_context = recorder != nullptr ? recorder() : nullptr;
    }
    const int rc = g_api.bucketalloc_raw_delete(ptr);
    t_context.reset();
    TORCH_CHECK(rc == 0, "bucketalloc: ", LastError());
    if (recording != 0) [[unlikely]] {
      std::lock_guard<std::mutex> lock(block_mu_);
      block_contexts_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    }
  }

  // ---- frees deferred out of a MemPool allocator's callback ---------------------------------------

  void DrainDeferredFrees() noexcept {
    while (!t_deferred_frees.empty()) {
      void* p = t_deferred_frees.back();
      t_deferred_frees.pop_back();
      try {
        Free(p);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bucketalloc: a deferred free of %p failed: %s\n", p, e.what());
      }
    }
  }
  struct DeferredFreesDrain {
    explicit DeferredFreesDrain(BucketallocAllocator* a) : allocator(a) {}
    ~DeferredFreesDrain() {
      if (!t_deferred_frees.empty()) [[unlikely]]
        allocator->DrainDeferredFrees();
    }
    BucketallocAllocator* allocator;
  };

  // ---- helpers -------------------------------------------------------------------------------------

  // Every segment of `device` (-1: all), copied with its blocks.
  SegmentCopy Segments(int device) const {
    SegmentCopy copy;
    Check(g_api.bucketalloc_visit_segments(
              device,
              [](const bucketalloc_segment_info* s, void* ctx) {
                auto* c = static_cast<SegmentCopy*>(ctx);
                c->blocks.emplace_back(s->blocks, s->blocks + s->num_blocks);
                c->segments.push_back(*s);
              },
              &copy),
          "visit segments");
    for (std::size_t i = 0; i < copy.segments.size(); ++i) {
      copy.segments[i].blocks = copy.blocks[i].data();
      copy.segments[i].num_blocks = copy.blocks[i].size();
    }
    return copy;
  }

  void Push(cda::TraceEntry e) {  // state_mu_ held
    if (e.device_ < 0) return;
    const auto device = static_cast<std::size_t>(e.device_);
    if (traces_.size() <= device) traces_.resize(device + 1);
    std::deque<cda::TraceEntry>& trace = traces_[device];  // each device its own ring, as torch's
    trace.push_back(std::move(e));
    while (trace.size() > max_entries_) trace.pop_front();
  }

  void UpdateHook() {
    bool want = false;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      want = recording_ || !trackers_.empty();
    }
    bucketalloc_trace_fn hook = nullptr;
    if (want) {
      hook = [](const bucketalloc_trace_event* e, void* self) {
        static_cast<BucketallocAllocator*>(self)->OnEvent(*e);
      };
    }
    g_api.bucketalloc_set_trace_hook(hook, this);
  }

  static std::string ConfigString() {
    std::string text(static_cast<std::size_t>(std::max<ssize_t>(g_api.bucketalloc_config_string(nullptr, 0), 0)), '\0');
    g_api.bucketalloc_config_string(text.data(), text.size() + 1);
    return text;
  }

  // "k:v,k:[a,b],..." as (key, value) pairs, brackets kept in the value.
  static std::vector<std::pair<std::string, std::string>> SplitSettings(const std::string& text) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string part;
    int depth = 0;
    auto flush = [&] {
      const auto colon = part.find(':');
      if (colon != std::string::npos) out.emplace_back(part.substr(0, colon), part.substr(colon + 1));
      part.clear();
    };
    for (char c : text) {
      if (std::isspace(static_cast<unsigned char>(c))) continue;
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (c == ',' && depth == 0) {
        flush();
      } else {
        part.push_back(c);
      }
    }
    flush();
    return out;
  }

  // torch's config metadata, from bucketalloc's effective configuration.
  void FillConfig(cca::AllocatorConfigInfo* config) const {
    const std::string text = ConfigString();
    config->last_allocator_settings = text;
    config->garbage_collection_threshold = 0;
    config->max_split_size = std::numeric_limits<size_t>::max();
    config->expandable_segments = false;
    config->release_lock_on_malloc = false;
    config->pinned_use_host_register = false;
    config->pinned_num_register_threads = 0;
    config->graph_capture_record_stream_reuse = false;
    config->max_round_threshold = 0;
    config->max_cached_size = 0;
    std::stringstream parts(text);
    std::string part;
    while (std::getline(parts, part, ',')) {
      const auto colon = part.find(':');
      if (colon == std::string::npos) continue;
      const std::string key = part.substr(0, colon), value = part.substr(colon + 1);
      if (key == "garbage_collection_threshold") {
        config->garbage_collection_threshold = std::strtod(value.c_str(), nullptr);
      } else if (key == "max_split_size_mb" && value != "unlimited") {
        config->max_split_size = std::strtoull(value.c_str(), nullptr, 10) << 20;
      } else if (key == "expandable_segments" || key == "backend") {
        config->expandable_segments |= value == "True" || value == "true" || value == "vmm";
      }
    }
  }

  bool have_cuda_ = false;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};

  std::mutex state_mu_;
  // 0: no history; 1: history without contexts; 2: with contexts (read without state_mu_).
  std::atomic<int> recording_flag_{0};
  bool recording_ = false;
  cca::CreateContextFn recorder_ = nullptr;
  cca::RecordContext when_ = cca::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::unordered_set<std::string> skip_;
  std::vector<std::deque<cda::TraceEntry>> traces_;  // by device
  std::deque<cda::AnnotationEntry> annotations_;     // recordAnnotation's, every device's
  std::vector<std::string> compile_contexts_;
  std::string user_metadata_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::OomRejectionObserver> oom_rejection_observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  // The MemPools with an allocator of their own (createOrIncrefPool), by device and id, until their
  // last use is released; the library holds the allocator itself.
  std::map<std::pair<c10::DeviceIndex, MempoolId_t>, const cca::CUDAAllocator*> pool_allocators_;

  mutable std::mutex block_mu_;
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> block_contexts_;

  std::mutex ipc_mu_;
  std::mutex pending_close_mu_;
  std::vector<void*> pending_closes_;  // openings whose close was refused (a capture ran)
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_open_;
};

BucketallocAllocator* BucketallocAllocator::instance = nullptr;

}  // namespace
}  // namespace bucketalloc_torch

extern "C" {

// Makes bucketalloc torch's CUDA allocator: resolves libbucketalloc at `library_path` (already loaded
// in this process), creates the allocator and calls torch's changeCurrentAllocator. Returns 0, or -1
// with the reason in error[0..len) (torch's own message when it refuses the swap).
__attribute__((visibility("default"))) int bucketalloc_torch_native_install(const char* library_path, char* error,
                                                                            size_t len) {
  using bucketalloc_torch::BucketallocAllocator;
  auto fail = [&](const std::string& why) {
    if (error != nullptr && len > 0) {
      const std::size_t n = std::min(why.size(), len - 1);
      std::memcpy(error, why.data(), n);
      error[n] = '\0';
    }
    return -1;
  };
  try {
    if (BucketallocAllocator::instance != nullptr) return 0;
    const std::string missing = bucketalloc_torch::LoadApi(library_path, &bucketalloc_torch::g_api);
    if (!missing.empty()) return fail(missing);
    auto allocator = std::make_shared<BucketallocAllocator>();
    BucketallocAllocator::instance = allocator.get();
    try {
      torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    } catch (...) {
      BucketallocAllocator::instance = nullptr;
      throw;
    }
    // torch's setAllocatorSettings (torch.cuda.memory._set_allocator_settings) calls the device
    // configuration hook after parsing: wrapped, so that bucketalloc hears of the settings too.
    std::function<void(const std::string&)>& hook =
        c10::CachingAllocator::AcceleratorAllocatorConfig::getConfigParserHook();
    hook = [previous = hook](const std::string& settings) {
      if (previous) previous(settings);
      if (BucketallocAllocator::instance != nullptr) BucketallocAllocator::instance->OnAllocatorSettings(settings);
    };
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

// The name of the allocator torch holds now ("" when none).
__attribute__((visibility("default"))) int bucketalloc_torch_current_allocator_name(char* out, size_t len) {
  try {
    c10::cuda::CUDACachingAllocator::CUDAAllocator* a = c10::cuda::CUDACachingAllocator::get();
    const std::string name = a == nullptr ? std::string() : a->name();
    if (out != nullptr && len > 0) {
      const std::size_t n = std::min(name.size(), len - 1);
      std::memcpy(out, name.data(), n);
      out[n] = '\0';
    }
    return static_cast<int>(name.size());
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
