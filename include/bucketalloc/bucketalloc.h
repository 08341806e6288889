/* bucketalloc/bucketalloc.h — the C ABI of libbucketalloc.so (layer L5, plugins).
 *
 * One process-wide allocator behind plain C functions. PyTorch loads it through
 * `torch.cuda.memory.CUDAPluggableAllocator(lib, "bucketalloc_malloc", "bucketalloc_free")` and the
 * hook setters of its `.allocator()` object; C and C++ runtimes call it directly.
 *
 * Rules of the ABI:
 *   - every symbol starts with `bucketalloc_`; nothing else is exported by the shared library;
 *   - no C++ exception ever crosses a function of this header (except bucketalloc_malloc_or_throw,
 *     which only C++ hosts can declare and which exists to throw);
 *   - errors come back as a return value (NULL, -1, or 0 for "nothing written") plus a thread-local
 *     message read with bucketalloc_last_error(); the allocator state is left consistent;
 *   - hooks whose PyTorch signature returns void report errors through bucketalloc_last_error() and
 *     one line on stderr (they have no other channel);
 *   - the allocator is created on first use (or by bucketalloc_init) from the configuration given to
 *     bucketalloc_configure(), else from the BUCKETALLOC_CONF environment variable, else defaults.
 *     It is never destroyed: memory still held by the host at exit stays valid until the process ends.
 *
 * Thread-safety: every function may be called from any thread.
 *
 * Example (C):
 *   bucketalloc_configure("backend:sim,capacity:4GiB");
 *   void* p = bucketalloc_malloc(1 << 20, 0, NULL);
 *   if (p == NULL) fprintf(stderr, "%s\n", bucketalloc_last_error());
 *   bucketalloc_free(p, 1 << 20, 0, NULL);
 *   char buf[1 << 16];
 *   ssize_t n = bucketalloc_stats_json(0, buf, sizeof buf);   // n >= sizeof buf: buffer too small
 */
#ifndef BUCKETALLOC_BUCKETALLOC_H_
#define BUCKETALLOC_BUCKETALLOC_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#include "bucketalloc/stat_list.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as CUDA's (driver_types.h declares the identical typedef), so this header needs no
 * CUDA header and mixes with one. */
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

#define BUCKETALLOC_API __attribute__((visibility("default")))

/* A private pool's id: PyTorch's MempoolId_t (CUDA graph pools and MemPools). {0, 0} names the
 * device's own pools. */
typedef struct bucketalloc_pool_id {
  unsigned long long first;
  unsigned long long second;
} bucketalloc_pool_id;

/* ---- Allocation: PyTorch's CUDAPluggableAllocator signatures ------------------------------- */

/* Allocates `size` bytes on `device` for use on `stream` (NULL: the legacy default stream).
 * Size 0 returns NULL with no error. On failure returns NULL and sets the last error: a negative
 * size or bad device (invalid argument), out of memory (the OOM report with its diagnosis:
 * capacity, fragmentation, cache held or device exhausted; also printed to stderr), or growth
 * during CUDA stream capture of `stream`. */
BUCKETALLOC_API void* bucketalloc_malloc(ssize_t size, int device, cudaStream_t stream);

/* Frees `ptr` (NULL is a no-op). `size` is the size passed to bucketalloc_malloc (PyTorch passes the
 * requested size; a negative size means "unknown" and is not checked); `stream` is the allocation
 * stream and is not needed. The current CUDA device may differ from `device`. A double free, an
 * unknown pointer, a pointer of another device or a size mismatch leaves the allocator untouched
 * and sets the last error (and prints it to stderr). */
BUCKETALLOC_API void bucketalloc_free(void* ptr, ssize_t size, int device, cudaStream_t stream);

/* The same as bucketalloc_malloc, with the kind of failure: 0 and *out set (NULL for size 0); 1 out
 * of memory, with the last error beginning as PyTorch's own OOM message ("CUDA out of memory. Tried
 * to allocate 20.00 MiB. GPU 0 has a total capacity of ...") followed by bucketalloc's report (its
 * first line names the cause); -1 any other error (the last error names it). For an alloc function
 * compiled against a host's exception types (bucketalloc_torch builds one that throws PyTorch's
 * c10::OutOfMemoryError). */
BUCKETALLOC_API int bucketalloc_try_malloc(ssize_t size, int device, cudaStream_t stream, void** out);
/* Frees `ptr` (NULL: nothing) on whichever device holds it, without its size or device (PyTorch's
 * raw_delete and DataPtr deleter). Returns 0, or -1 with the last error set (not a live allocation
 * of bucketalloc: nothing changes). */
BUCKETALLOC_API int bucketalloc_raw_delete(void* ptr);

#ifdef __cplusplus
/* C++ hosts only (PyTorch): the same as bucketalloc_malloc, but a failure with size > 0 throws
 * std::bad_alloc whose what() is the error message (the OOM report) instead of returning NULL.
 * PyTorch does not check the pointer its pluggable allocator returns, so a NULL would become a
 * tensor at address 0 and a later illegal-address fault; PyTorch turns this exception into a Python
 * RuntimeError naming the cause. The allocator state is consistent when it is thrown. */
BUCKETALLOC_API void* bucketalloc_malloc_or_throw(ssize_t size, int device, cudaStream_t stream);
#endif

/* ---- Hooks PyTorch can call (CUDAPluggableAllocator.allocator().set_*_fn) ------------------ */

/* set_init_fn: creates the allocator now (it is otherwise created on first use). `device_count`
 * is what the host sees; a count that disagrees with the backend's is reported on stderr. */
BUCKETALLOC_API void bucketalloc_init(int device_count);

/* set_reset_fn (torch.cuda.empty_cache): synchronizes pending stream events and releases every
 * cached segment and empty slab of every device. Not allowed while a CUDA stream capture is
 * running (CUDA forbids the synchronization and cudaFree it needs). */
BUCKETALLOC_API void bucketalloc_empty_cache(void);

/* set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction): caps `device` at
 * fraction x device memory; fraction in (0, 1]. */
BUCKETALLOC_API void bucketalloc_set_memory_fraction(double fraction, int device);

/* set_record_stream_fn (Tensor.record_stream): the block of `ptr` is not reused after its free
 * until the work queued on `stream` up to that free has completed (a CUDA event). NULL (the
 * storage of an empty tensor) is a no-op. */
BUCKETALLOC_API void bucketalloc_record_stream(void* ptr, cudaStream_t stream);

/* Call before cudaStreamDestroy(stream): cudaStreamDestroy returns while work is still queued, and
 * CUDA may hand the same handle value to a new stream. When bucketalloc keeps cached memory for
 * `stream`, this waits for the stream's work, so that the new stream inherits only idle blocks.
 * Returns 0, or -1 (last error set: e.g. during a CUDA graph capture, which forbids the wait). */
BUCKETALLOC_API int bucketalloc_retire_stream(cudaStream_t stream);

/* set_base_alloc_fn: the start of the device allocation (segment or slab) that holds `ptr`, and
 * its size in *size. Returns NULL (last error set) when `ptr` is not a live allocation. */
BUCKETALLOC_API void* bucketalloc_base_alloc(void* ptr, size_t* size);

/* ---- CUDA graph capture --------------------------------------------------------------------
 * A host that captures CUDA graphs announces each capture (PyTorch does it through the hooks below,
 * registered by bucketalloc_torch.enable()), with PyTorch's private-pool semantics: requests on
 * `stream` between begin and end go to private pool `pool` (its use count + 1), which has its own
 * memory: its freed blocks serve later requests of the pool (in this capture or another sharing
 * it) and nothing else. A miss grows the pool in relaxed capture mode; nothing is freed,
 * synchronized or queried during the capture. Each returns 0, or -1 with the last error set. */
BUCKETALLOC_API int bucketalloc_capture_begin(int device, unsigned long long pool, cudaStream_t stream);
BUCKETALLOC_API int bucketalloc_capture_end(int device, unsigned long long pool);
/* The graph of `pool` is destroyed: its use count - 1; at 0 its memory goes back at the next
 * release (empty_cache, or release-and-retry before an OOM) after a device synchronization. A
 * capture into it still running (it failed before end) ends. Unknown pools are a no-op. */
BUCKETALLOC_API int bucketalloc_release_pool(int device, unsigned long long pool);

#ifdef __cplusplus
} /* extern "C" */
#include <functional>
#include <utility>
extern "C" {
/* PyTorch's graph-pool hooks (C++ only: the begin hook takes a std::function). Register with
 * CUDAPluggableAllocator.allocator().set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
 * set_release_pool; PyTorch calls them from CUDAGraph.capture_begin, capture_end and reset. The pool
 * id is PyTorch's MempoolId_t; `filter` is true for the capturing stream. Errors are printed. */
typedef std::pair<unsigned long long, unsigned long long> bucketalloc_mempool_id;
BUCKETALLOC_API void bucketalloc_torch_begin_allocate_to_pool(int device, bucketalloc_mempool_id pool,
                                                              std::function<bool(cudaStream_t)> filter);
BUCKETALLOC_API void bucketalloc_torch_end_allocate_to_pool(int device, bucketalloc_mempool_id pool);
BUCKETALLOC_API void bucketalloc_torch_release_pool(int device, bucketalloc_mempool_id pool);
/* The same three with their errors returned (0, or -1 with the last error set), not printed: for a
 * host that raises them (bucketalloc_torch's native allocator). */
BUCKETALLOC_API int bucketalloc_begin_allocate_to_pool(int device, bucketalloc_pool_id pool,
                                                       std::function<bool(cudaStream_t)> filter);
BUCKETALLOC_API int bucketalloc_end_allocate_to_pool(int device, bucketalloc_pool_id pool);
BUCKETALLOC_API int bucketalloc_release_pool_id(int device, bucketalloc_pool_id pool);
#endif

/* ---- Structured inspection and pools -------------------------------------------------------
 * What a host's own allocator interface needs as data, not text: PyTorch's native
 * c10::cuda::CUDACachingAllocator::CUDAAllocator, which bucketalloc_torch compiles against the
 * installed torch (python/torch_plugin/bucketalloc_torch/csrc/native_allocator.cc), is served from
 * these. Each returns 0 (or the value named) on success and -1 on error, with the last error set.
 * A struct passed with its size (`size`: sizeof the caller's struct) must have this header's size:
 * another is refused, naming both (a host compiled against another version of this header). */

/* A gauge or count as PyTorch keeps it: the current value, its peak since the last reset, and the
 * totals added and taken away since the last reset of accumulated stats. */
typedef struct bucketalloc_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated;
  int64_t freed;
} bucketalloc_stat;

/* The stats of one device, generated from the lists of bucketalloc/stat_list.h: every per-pool
 * gauge as [0] all pools, [1] small pool, [2] large pool; every counter; every device-wide gauge. */
#define BUCKETALLOC_C_POOL_STAT(name, doc) bucketalloc_stat name[3];
#define BUCKETALLOC_C_COUNTER(name, doc) int64_t name;
#define BUCKETALLOC_C_DEVICE_STAT(name, doc) bucketalloc_stat name;
typedef struct bucketalloc_device_stats {
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_C_POOL_STAT)
  BUCKETALLOC_COUNTERS(BUCKETALLOC_C_COUNTER)
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_C_DEVICE_STAT)
  int64_t max_split_size; /* -1: unlimited, as PyTorch reports it */
  int64_t capacity_bytes; /* the effective cap */
} bucketalloc_device_stats;
#undef BUCKETALLOC_C_POOL_STAT
#undef BUCKETALLOC_C_COUNTER
#undef BUCKETALLOC_C_DEVICE_STAT

/* Fills *out with the stats of `device`. */
BUCKETALLOC_API int bucketalloc_get_device_stats(int device, bucketalloc_device_stats* out, size_t size);
/* Calls fn(pool, reserved[3], ctx) for each private pool of `device` that holds or held memory:
 * its reserved bytes per pool index, as PyTorch's reserved_bytes_by_private_pools. */
typedef void (*bucketalloc_pool_stat_fn)(bucketalloc_pool_id pool, const bucketalloc_stat* reserved, void* ctx);
BUCKETALLOC_API int bucketalloc_visit_private_pool_stats(int device, bucketalloc_pool_stat_fn fn, void* ctx);
/* Resets the accumulated stats of `device` (PyTorch's resetAccumulatedStats): every gauge's
 * allocated and freed totals and every counter to 0; currents and peaks stay. */
BUCKETALLOC_API int bucketalloc_reset_accumulated_stats(int device);

/* A block's state (PyTorch's names): held by a caller, freed but awaiting stream events, free. */
enum {
  BUCKETALLOC_BLOCK_ACTIVE_ALLOCATED = 0,
  BUCKETALLOC_BLOCK_ACTIVE_PENDING_FREE = 1,
  BUCKETALLOC_BLOCK_INACTIVE = 2
};
typedef struct bucketalloc_block_info {
  uintptr_t address;
  size_t size;
  size_t requested_size; /* 0 when inactive */
  int state;             /* BUCKETALLOC_BLOCK_* */
} bucketalloc_block_info;
/* One backend allocation (a large-pool segment, or a small-pool slab or segment) with its blocks in
 * address order, which tile it. */
typedef struct bucketalloc_segment_info {
  int device;
  uintptr_t address;
  size_t total_size;
  size_t allocated_size; /* active_allocated blocks */
  size_t active_size;    /* active_allocated and active_pending_free blocks */
  size_t requested_size; /* the requests of the active blocks */
  uintptr_t stream;
  int is_small;
  int is_expandable; /* a mapped run of a stitched (vmm) range */
  bucketalloc_pool_id pool;
  const bucketalloc_block_info* blocks; /* valid during the call only */
  size_t num_blocks;
} bucketalloc_segment_info;
typedef void (*bucketalloc_segment_fn)(const bucketalloc_segment_info* segment, void* ctx);
/* Calls fn(segment, ctx) for each segment of `device` (-1: every device created so far), in device
 * then address order, from a copy taken under the device's lock (fn may call bucketalloc). */
BUCKETALLOC_API int bucketalloc_visit_segments(int device, bucketalloc_segment_fn fn, void* ctx);

/* The history's actions, in the order of PyTorch's TraceEntry::Action. */
enum {
  BUCKETALLOC_TRACE_ALLOC = 0,
  BUCKETALLOC_TRACE_FREE_REQUESTED = 1,
  BUCKETALLOC_TRACE_FREE_COMPLETED = 2,
  BUCKETALLOC_TRACE_SEGMENT_ALLOC = 3,
  BUCKETALLOC_TRACE_SEGMENT_FREE = 4,
  BUCKETALLOC_TRACE_SEGMENT_MAP = 5,
  BUCKETALLOC_TRACE_SEGMENT_UNMAP = 6,
  BUCKETALLOC_TRACE_OOM = 8
};
typedef struct bucketalloc_trace_event {
  int device;
  int action; /* BUCKETALLOC_TRACE_* */
  uintptr_t addr;
  size_t size; /* the request for alloc and free_requested, the block or segment otherwise */
  uintptr_t stream;
  int64_t time_us;          /* microseconds since the Unix epoch */
  size_t device_free;       /* oom: the device's free bytes */
  bucketalloc_pool_id pool; /* the private pool of the block or segment ({0, 0}: the device's own) */
} bucketalloc_trace_event;
typedef void (*bucketalloc_trace_fn)(const bucketalloc_trace_event* event, void* ctx);
/* While history recording is on (bucketalloc_record_history), calls fn(event, ctx) for every event
 * as it is recorded, on the thread that caused it and under its device's lock: fn must not call
 * bucketalloc, and must be quick (a PyTorch AllocatorTraceTracker has the same rule). NULL removes
 * the hook. Returns 0. */
BUCKETALLOC_API int bucketalloc_set_trace_hook(bucketalloc_trace_fn fn, void* ctx);

/* PyTorch's cacheInfo (cuDNN's workspace search asks it): *largest_block becomes the largest block
 * a request on `device` could get now without a release: the largest free cached block of any pool,
 * and, when *largest_block is 0 on entry, at least what the device could still give under the cap
 * (the smaller of its free memory and the cap less what is reserved). */
BUCKETALLOC_API int bucketalloc_cache_info(int device, size_t* largest_block);
/* The memory fraction of `device` (bucketalloc_set_memory_fraction, else memory_fraction), or -1. */
BUCKETALLOC_API double bucketalloc_memory_fraction(int device);

/* Creates physical memory on `device` ahead of need, off any request's path (Allocator::Prefetch):
 * spare pieces that the large pool's grows and stitches map before they create any. Brings the
 * spares up to `spare_target` bytes, creating at most `max_create` bytes (0: no limit) in this call,
 * in whole granules; call it again as requests use them. Counted as reserved and cached, never past
 * the cap (it stops there), given back by bucketalloc_empty_cache and release-and-retry. Holds the
 * device's lock while it creates (`max_create` bounds how long): call it where no request waits
 * (start-up, between steps). *created (may be NULL) becomes the bytes created (0 when the spares were
 * enough). Returns 0, or -1 (bucketalloc_last_error) when the large pool's segments are not virtual
 * memory (backend:vmm or expandable_segments:true needed) or it needed to create and could not. */
BUCKETALLOC_API int bucketalloc_prefetch(int device, size_t spare_target, size_t max_create, size_t* created);

/* Private pools beyond CUDA graph captures (PyTorch's MemPool): */
/* One more use of private pool `pool` without routing anything to it (createOrIncrefPool: a MemPool
 * is created); the pool is created when it does not exist. bucketalloc_torch_release_pool drops it. */
BUCKETALLOC_API int bucketalloc_pool_incref(int device, bucketalloc_pool_id pool);
/* MemPool(use_on_oom=True) (setUseOnOOM): while `pool` is in use, a request of the device's own
 * pools that would fail with an OOM takes a cached block of `pool` instead, as PyTorch's fallback. */
BUCKETALLOC_API int bucketalloc_pool_set_use_on_oom(int device, bucketalloc_pool_id pool, int use_on_oom);
/* MemPool(no_split=True) (setNoSplit): no block of `pool` is ever split; each allocation takes a
 * whole free block or a segment of its own (what NCCL window registration needs). Set before the
 * pool holds memory (right after bucketalloc_pool_incref); -1 naming why otherwise. */
BUCKETALLOC_API int bucketalloc_pool_set_no_split(int device, bucketalloc_pool_id pool);
/* MemPool(allocator) (createOrIncrefPool with an allocator, as vLLM's sleep mode builds one): the
 * segments of `pool` come from `alloc` and go back through `free`, not from the device; the pool
 * caches, splits, counts and reports them as its others, and does not stitch them. `alloc` returns
 * NULL when it has no memory (the pool then releases its cache and retries), else `bytes` of memory
 * at a 512-byte-aligned address that no segment of the device holds: a pointer that overlaps one (a
 * pointer returned twice) or is not aligned fails the request with an error naming it, and nothing
 * is registered (a misaligned one is given back through `free`; an overlapping one is not, as its
 * free could release memory live blocks use). Both are called under the device's lock, on the
 * allocating or releasing thread, and must not call into bucketalloc: a call from inside them (or
 * from `release`) is refused with an error that says so (-1, NULL, or for a void function the
 * message on stderr) instead of waiting for that lock forever.
 * `release(ctx)` (may be NULL) is called once the pool no longer needs them: when it is forgotten
 * (freeable and empty), or at once when this call fails. Set before the pool holds memory. */
typedef void* (*bucketalloc_segment_alloc_fn)(size_t bytes, int device, cudaStream_t stream, void* ctx);
typedef void (*bucketalloc_segment_free_fn)(void* ptr, size_t bytes, int device, void* ctx);
BUCKETALLOC_API int bucketalloc_pool_set_segment_allocator(int device, bucketalloc_pool_id pool,
                                                           bucketalloc_segment_alloc_fn alloc,
                                                           bucketalloc_segment_free_fn free, void (*release)(void* ctx),
                                                           void* ctx);
/* markCaptureBegin (begin = 1) / markCaptureEnd (0): a CUDA graph capture starts or ends on
 * `device`. From the first mark on, the device treats a pool routing with no marked capture
 * underway as a MemPool context (use_mem_pool): an OOM there releases the cache and retries, and
 * cross-stream frees record their events, as outside one. Callers that never mark have every
 * routing treated as a capture. */
BUCKETALLOC_API int bucketalloc_mark_capture(int device, int begin);
/* The use count of `pool` on `device` (0 for a pool it does not hold), or -1. */
BUCKETALLOC_API int bucketalloc_pool_use_count(int device, bucketalloc_pool_id pool);
/* emptyCache(mempool_id): releases the wholly free memory of `pool` on `device` after a device
 * synchronization, when no graph or MemPool uses the pool any more (its use count is 0; a pool in
 * use keeps its memory, as in PyTorch); {0, 0}: bucketalloc_empty_cache's release on this device.
 * Device -1: every device created so far (none is created by asking).
 * -1 during a capture or MemPool context (nothing released). */
BUCKETALLOC_API int bucketalloc_pool_empty_cache(int device, bucketalloc_pool_id pool);

/* Allocates the block [addr, addr + block_size) in free memory of private pool `pool` of `device`
 * ({0, 0}: the device's own pools) for use on `stream`, as a live allocation (bucketalloc_free
 * returns it); `requested` (0 < requested <= block_size) is the size stats and history record.
 * PyTorch's cudagraph trees restore a checkpoint with it (setCheckpointPoolState): `block_size` is
 * a block size bucketalloc handed out (bucketalloc_visit_segments), or 0 for the block the pool
 * holding addr rounds `requested` to (allocateWithAddress); the range must lie wholly
 * inside one free block of the segment or slab holding addr (a slab: exactly one free slot), which
 * belongs to `stream`. Returns 0, or -1 with the last error naming why (nothing changes): the pool
 * is unknown or freeable, no memory of it holds addr, the range overlaps a block in use, is
 * misaligned or not a slot, or the memory is another stream's. */
BUCKETALLOC_API int bucketalloc_allocate_at(int device, bucketalloc_pool_id pool, void* addr, size_t block_size,
                                            size_t requested, cudaStream_t stream);

/* CUDA IPC (PyTorch's shareIpcHandle / getIpcDevPtr). What another process needs to map the
 * memory of live allocation `ptr`:
 * - virtual_memory 0: a plain allocation (backend:cuda): [base, base + bytes) is the segment
 *   holding it; share it with cudaIpcGetMemHandle(base). num_pieces is 0.
 * - virtual_memory 1: the physical pieces mapped under it (backend:vmm, expandable segments), side
 *   by side from `base`: each a POSIX file descriptor of this process (kept by bucketalloc while
 *   the piece exists) and its bytes; another process maps them with bucketalloc_open_shared.
 * offset: ptr - base. `pieces` receives up to `capacity` pieces; out->num_pieces is how many there
 * are (call again with more room when it exceeds capacity: -1, "capacity"). `size` is
 * sizeof(bucketalloc_shared_memory). Returns 0, or -1 naming why (not a live allocation; a backend
 * that cannot export, such as the simulated device). */
typedef struct bucketalloc_shared_piece {
  int fd;
  size_t bytes;
} bucketalloc_shared_piece;
typedef struct bucketalloc_shared_memory {
  int virtual_memory;
  uintptr_t base;
  size_t bytes;
  size_t offset;
  size_t num_pieces;
} bucketalloc_shared_memory;
BUCKETALLOC_API int bucketalloc_share_block(void* ptr, bucketalloc_shared_memory* out, size_t size,
                                            bucketalloc_shared_piece* pieces, size_t capacity);
/* Maps on `device` the `n` pieces process `pid` shared (its descriptors, read with pidfd_getfd,
 * and their bytes) side by side in a new address range of the device, and returns its start (NULL
 * naming why: the process is gone, the kernel or ptrace rules forbid reading its descriptors, the
 * backend has no virtual memory). The memory is the sender's: not reserved here, not under the cap.
 * bucketalloc_close_shared unmaps it. */
BUCKETALLOC_API void* bucketalloc_open_shared(int device, int pid, const bucketalloc_shared_piece* pieces, size_t n);
/* Unmaps what bucketalloc_open_shared mapped at `base`, after a device synchronization. 0, or -1. */
BUCKETALLOC_API int bucketalloc_close_shared(void* base);

/* The last out-of-memory failure of `device`, as numbers (the text: bucketalloc_last_oom_report). */
typedef struct bucketalloc_oom_info {
  int present;         /* 1 when the device has had an OOM; 0: none (the rest is 0) */
  size_t requested;    /* the request that failed */
  size_t segment;      /* the backend allocation it needed (PyTorch's "Tried to allocate") */
  size_t allocated;    /* live bytes then */
  size_t reserved;     /* reserved bytes then */
  size_t capacity;     /* the cap then (the tenant's when its cap refused it) */
  size_t device_total; /* the device's memory */
  size_t device_free;  /* the device's free memory, as the backend reported it */
  int cause;           /* 0 capacity, 1 fragmentation, 2 cache held, 3 device exhausted, 4 tenant cap */
  int rejected;        /* 1: throw_on_cudamalloc_oom refused it at the cap, with no release and retry */
} bucketalloc_oom_info;
BUCKETALLOC_API int bucketalloc_last_oom_info(int device, bucketalloc_oom_info* out, size_t size);

/* ---- Inspection ------------------------------------------------------------------------------
 * Each writes NUL-terminated text into buf[0..len) (truncated when it does not fit; buf may be NULL
 * when len is 0) and returns the length of the whole text without the NUL, as snprintf does: a
 * return value >= len means the buffer was too small. Returns -1 on error (last error set). */

/* A flat JSON object with PyTorch's torch.cuda.memory_stats() keys, e.g.
 * "allocated_bytes.all.current", plus bucketalloc's own counters. */
BUCKETALLOC_API ssize_t bucketalloc_stats_json(int device, char* buf, size_t len);
/* The fragmentation report as JSON: per pool the free-block histogram (count and bytes per size
 * bin), largest and total free, external and internal fragmentation; the per-tier table. */
BUCKETALLOC_API ssize_t bucketalloc_fragmentation_json(int device, char* buf, size_t len);
/* Every device's metrics in Prometheus's text exposition format (version 0.0.4): gauges per device
 * and pool (reserved, allocated, active, cached, requested bytes, largest free block, external and
 * internal fragmentation, tier use), counters (allocations, frees, cache hits, backend calls, OOMs
 * by cause, retries, stitches, tier fallbacks) and the free-block size histogram;
 * docs/operations.md lists them. Empty before the allocator exists (this call never creates it).
 * BUCKETALLOC_METRICS_ADDR=HOST:PORT serves the same text at http://HOST:PORT/metrics. */
BUCKETALLOC_API ssize_t bucketalloc_metrics_text(char* buf, size_t len);
/* The port the BUCKETALLOC_METRICS_ADDR server listens on (the one picked when it asks for port 0),
 * or -1 with the last error naming why none is served: the variable is not set (or was not when
 * the allocator was created), the allocator, which starts the server, does not exist yet, a host
 * name is still being resolved (on the server's thread), the address or the bind failed, or this
 * process is a child of fork. Never creates the allocator. */
BUCKETALLOC_API int bucketalloc_metrics_port(void);
/* The memory timeline: appends to `path` (created if missing) one JSON line per device every
 * `interval_ms` (1 to 3600000) with the figures above and the OOMs since the device's previous
 * line (docs/operations.md), and a last line at stop or exit; replaces a timeline running.
 * BUCKETALLOC_TIMELINE=PATH[,interval_ms] starts one with the allocator (a PATH with a comma needs
 * the interval). The file is opened without waiting: a FIFO needs a reader already (else -1, saying
 * so), and a reader that stops reading or a full disk loses lines (reported once on stderr) but
 * never blocks the process. 0, or -1 with the last error set (creates the allocator when it does
 * not exist yet). */
BUCKETALLOC_API int bucketalloc_timeline_start(const char* path, int interval_ms);
/* Stops the timeline after its last line (nothing when none runs; waits at most about a second
 * for a FIFO's reader); 0. */
BUCKETALLOC_API int bucketalloc_timeline_stop(void);
/* Each tenant's figures on `device` as JSON: {"tenants": [{"tenant", "cap_bytes",
 * "reserved_bytes", "peak_reserved_bytes", "allocated_bytes", "requested_bytes", "cached_bytes",
 * "live_allocations", "ooms", "ooms_at_cap" (refused by its own cap)}, ...]}, the default tenant
 * first; an empty list without tenants. */
BUCKETALLOC_API ssize_t bucketalloc_tenant_stats_json(int device, char* buf, size_t len);
/* The calling thread's tenant ("default" when none is set). */
BUCKETALLOC_API ssize_t bucketalloc_thread_tenant(char* buf, size_t len);
/* The readable memory-summary table (stats, then the fragmentation table). */
BUCKETALLOC_API ssize_t bucketalloc_summary(int device, char* buf, size_t len);
/* The layout of torch.cuda.memory._snapshot() as JSON: "segments" (each with its "blocks" and
 * their states), "device_traces" (one list per device; filled while history recording is on) and
 * "allocator_settings". `device` selects one device, or -1 for every device created so far. */
BUCKETALLOC_API ssize_t bucketalloc_snapshot_json(int device, char* buf, size_t len);
/* The last out-of-memory report of `device` (empty text when there has been none). */
BUCKETALLOC_API ssize_t bucketalloc_last_oom_report(int device, char* buf, size_t len);
/* The configuration the environment gives (BUCKETALLOC_CONF, else PyTorch's PYTORCH_CUDA_ALLOC_CONF,
 * else PYTORCH_ALLOC_CONF, read as the allocator reads them; docs/configuration.md), every key, in
 * BUCKETALLOC_CONF syntax: what a host extends with options of its own. Never creates the allocator;
 * -1 with the error of a bad variable. */
BUCKETALLOC_API ssize_t bucketalloc_env_config_string(char* buf, size_t len);
/* The effective configuration, in BUCKETALLOC_CONF syntax. */
BUCKETALLOC_API ssize_t bucketalloc_config_string(char* buf, size_t len);

/* ---- Control --------------------------------------------------------------------------------
 * Each returns 0 on success and -1 on error (last error set). */

/* Resets the peaks of every gauge of `device` to its current value. */
BUCKETALLOC_API int bucketalloc_reset_peak_stats(int device);
/* Sets the configuration (BUCKETALLOC_CONF syntax, e.g. "backend:sim,capacity:8GiB,
 * max_split_size_mb:512"; NULL or "" = defaults). Only before the allocator is created; the error
 * names a bad key or value and what is accepted. */
BUCKETALLOC_API int bucketalloc_configure(const char* conf);
/* Turns history recording on (enabled != 0) or off for every device: alloc, free_requested,
 * free_completed, segment_alloc, segment_free and oom entries, the last `max_entries` (>= 1) kept
 * per device in a ring buffer. Turning it on again clears the history. */
BUCKETALLOC_API int bucketalloc_record_history(int enabled, size_t max_entries);
/* Tenants (tenants:[NAME:SIZE,...] in the configuration; docs/configuration.md, "Tenants"): each
 * has its own pools, cap and stats; a request goes to the tenant its stream is bound to, else to
 * the calling thread's, else to "default". An unknown name is an error listing the tenants. */
/* Binds `stream` to `tenant` on every device ("default" unbinds it). */
BUCKETALLOC_API int bucketalloc_bind_stream(cudaStream_t stream, const char* tenant);
/* Sets the calling thread's tenant ("default": none). */
BUCKETALLOC_API int bucketalloc_set_thread_tenant(const char* tenant);
/* Changes a tenant's cap at run time (2 MiB to 16 TiB); lowering it below what the tenant reserves
 * releases its cache and refuses its growth until it fits; live memory is never freed. */
BUCKETALLOC_API int bucketalloc_set_tenant_cap(const char* tenant, size_t cap);
/* Checks every internal invariant of `device` (tests and debugging; takes the device lock). */
BUCKETALLOC_API int bucketalloc_check_invariants(int device);

/* The message of the last failed call on this thread ("" when none); valid until the next call on
 * this thread. */
BUCKETALLOC_API const char* bucketalloc_last_error(void);
/* 1 once the allocator has been created, else 0. */
BUCKETALLOC_API int bucketalloc_is_initialized(void);
/* The number of devices the backend serves (creates the allocator); -1 on error. */
BUCKETALLOC_API int bucketalloc_device_count(void);
/* The library version, e.g. "0.1.0". */
BUCKETALLOC_API const char* bucketalloc_version(void);
/* The installed CUDA driver's version (cuDriverGetVersion, e.g. 13000 for 13.0), read through
 * libcuda.so.1 loaded at run time, without cuInit and without creating the allocator; -1 with the
 * last error naming why when there is no driver. */
BUCKETALLOC_API int bucketalloc_cuda_driver_version(void);
/* The CUDA toolkit version whose headers this library was compiled with (CUDA_VERSION, e.g. 13000);
 * no CUDA library is linked. */
BUCKETALLOC_API int bucketalloc_cuda_headers_version(void);

/* ---- Simulated device controls (backend:sim only; -1 with an error on another backend) ------
 * For tests of stream semantics without a GPU: streams are any distinct pointer values. */

/* Queues one unit of simulated work on `stream`: events recorded from now on wait for it. */
BUCKETALLOC_API int bucketalloc_sim_enqueue_work(int device, cudaStream_t stream);
/* Completes all work queued on `stream` so far. */
BUCKETALLOC_API int bucketalloc_sim_complete_work(int device, cudaStream_t stream);
/* Starts (capturing != 0) or ends a simulated CUDA stream capture on `stream`: while any stream
 * captures, the simulated device refuses the calls CUDA forbids (and counts them). */
BUCKETALLOC_API int bucketalloc_sim_set_capturing(int device, cudaStream_t stream, int capturing);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BUCKETALLOC_BUCKETALLOC_H_ */
