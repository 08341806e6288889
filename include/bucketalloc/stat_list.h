/* bucketalloc/stat_list.h — every statistic, declared once as X-macro lists (plain C preprocessor,
 * so that the C ABI's struct bucketalloc_device_stats (bucketalloc.h) and the C++ DeviceStats
 * (stat_types.h) are generated from the same lists, with the JSON keys, the summary table, the
 * metrics and the invariant checks).
 *
 *   BUCKETALLOC_POOL_STATS(X):   X(name, doc) for each gauge kept per pool (all, small, large);
 *   BUCKETALLOC_COUNTERS(X):     X(name, doc) for each device-wide counter;
 *   BUCKETALLOC_DEVICE_STATS(X): X(name, doc) for each device-wide gauge.
 */
#ifndef BUCKETALLOC_STAT_LIST_H_
#define BUCKETALLOC_STAT_LIST_H_

#define BUCKETALLOC_POOL_STATS(X)                                                             \
  X(requested_bytes, "bytes the callers asked for, of live allocations")                      \
  X(allocated_bytes, "bytes of live allocations after rounding (block sizes)")                \
  X(active_bytes, "allocated bytes plus blocks freed but awaiting stream events")             \
  X(reserved_bytes, "bytes obtained from the backend (segments and slabs; vmm: granules)")    \
  X(cached_bytes, "reserved bytes not active: free blocks kept for reuse")                    \
  X(inactive_split_bytes, "free bytes inside segments or slabs that also hold active blocks") \
  X(allocation, "number of live allocations")                                                 \
  X(active, "number of active blocks (live or awaiting stream events)")                       \
  X(segment, "number of backend allocations held (segments and slabs)")                       \
  X(inactive_split, "number of free blocks inside partly used segments and slabs")

// Event counters: X(name, meaning). PyTorch's names where they exist.
#define BUCKETALLOC_COUNTERS(X)                                                                                        \
  X(num_alloc_retries, "allocations that released the cache and retried")                                              \
  X(num_ooms, "allocations that failed with out-of-memory")                                                            \
  X(num_ooms_capacity, "out-of-memory failures whose cause was capacity: live memory plus the request exceed the cap") \
  X(num_ooms_fragmentation, "out-of-memory failures whose cause was fragmentation: enough free, no piece fits")        \
  X(num_ooms_cache_held, "out-of-memory failures whose cause was memory held for unsynchronized stream events")        \
  X(num_ooms_device_exhausted, "out-of-memory failures the device refused under the cap (memory used outside)")        \
  X(num_ooms_tenant_cap, "out-of-memory failures a tenant's own cap refused (the device's cap was not reached)")       \
  X(num_oom_rejections, "device allocations refused without asking the device: they would exceed the cap")             \
  X(num_device_alloc, "backend allocations (cudaMalloc calls that succeeded)")                                         \
  X(num_device_free, "backend frees (cudaFree calls)")                                                                 \
  X(num_device_free_failures, "backend frees that failed (the memory stayed cached)")                                  \
  X(num_sync_all_streams, "times pending stream events were synchronized to release memory")                           \
  X(num_splits, "free blocks split to serve a smaller request")                                                        \
  X(num_merges, "adjacent free blocks coalesced")                                                                      \
  X(num_cache_hits, "allocations served from cached memory without a backend call")                                    \
  X(num_cache_misses, "allocations that needed a new segment or slab")                                                 \
  X(num_tier_fallbacks, "tier requests served at their exact rounded size instead")                                    \
  X(num_gc_releases, "segments and slabs released by garbage_collection_threshold")                                    \
  X(num_invalid_frees, "frees rejected (unknown pointer, double free, size mismatch)")                                 \
  X(num_capture_refusals, "allocations refused during CUDA graph capture (the backend cannot allocate then)")          \
  X(num_abandoned_captures, "captures ended by bucketalloc: their streams stopped capturing without an end call")      \
  X(num_deferred_frees, "cross-stream frees whose events were recorded later (a capture ran, or recording failed)")    \
  X(num_stitches, "large allocations served by stitching granules of free blocks into a new range (vmm)")              \
  X(num_granules_stitched, "physical granules unmapped from free blocks and mapped into a stitched range (vmm)")       \
  X(num_granules_released, "physical granules of free blocks unmapped and given back to the device (vmm)")

// Device-wide gauges (no per-pool split, as in PyTorch): X(name, meaning).
#define BUCKETALLOC_DEVICE_STATS(X)                                      \
  X(oversize_allocations, "live allocations larger than max_split_size") \
  X(oversize_segments, "segments larger than max_split_size")

// The reserved bytes of one private pool (PyTorch's reserved_bytes_by_private_pools), by its id.

#endif /* BUCKETALLOC_STAT_LIST_H_ */
