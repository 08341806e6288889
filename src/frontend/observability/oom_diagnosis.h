// src/frontend/observability/oom_diagnosis.h — why a request could not be served (layer L4).
//
// Owns: `DiagnoseOom`, a pure function from the numbers of a failed request (`OomSituation`) to
// the OOM report whose first line names the cause. With the memory figures then (`figures`:
// `allocated` the live bytes, `reserved` the backend bytes, `live_requested` = figures.requested
// what the live allocations' callers asked for), `pending = active - allocated` (freed blocks
// awaiting stream events), `headroom = cap - reserved`, `rounded` the rounded request, `segment`
// the backend allocation it needed, and `pool_cached` the free cached bytes of the request's pool,
// the first matching row names it:
//   capacity          live_requested + requested > cap (WorkingSetExceedsCap: what the callers
//                     asked for does not fit, whatever any allocator rounds; the harness counts an
//                     OOM of every replayed policy by the same function)
//   device exhausted  headroom >= segment (the cap allows it but the device refused)
//   cache held        pending > 0 and headroom + pool_cached < rounded
//   fragmentation     otherwise
// Every failure matches one row (docs/architecture.md, "The OOM diagnosis"); tests/frontend/
// oom_diagnosis_test.cc holds a table of situations.
// Thread-safety: pure.
//
// Example:
//   OomReport r = DiagnoseOom({.device = 0, .pool = kLargePool, .requested = n, ..., .figures = f, ...});
//   r.cause == OomCause::kFragmentation;  r.ToString();  // the diagnosis, numbers and histograms
#ifndef BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_DIAGNOSIS_H_
#define BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_DIAGNOSIS_H_

#include <cstddef>
#include <string>

#include "bucketalloc/stats.h"

namespace bucketalloc::internal {

// The capacity row: the bytes the live allocations' callers asked for, plus this request, exceed
// the cap. Rounding (block sizes, roundup_power2_divisions) is the allocator's own overhead: an OOM
// it causes is fragmentation, internal rather than between blocks.
inline bool WorkingSetExceedsCap(std::size_t live_requested, std::size_t requested, std::size_t cap) {
  return live_requested > cap || requested > cap - live_requested;
}

struct OomSituation {
  int device = 0;
  PoolIndex pool = kLargePool;  // the request's pool
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t segment = 0;   // the backend allocation the request needed
  std::size_t capacity = 0;  // the cap
  // The memory then (the device's: MemoryFiguresOf; at a tenant's own cap, the tenant's). The
  // report's largest_free is the request's pool's, from `fragmentation`.
  MemoryFigures figures;
  std::size_t pool_cached = 0;  // the request's pool's cached bytes
  std::size_t device_free = 0;  // as the backend reported it
  std::size_t device_total = 0;
  std::string failure;  // the failed call's message
  // When the request's pool stitches (its segments are virtual memory): the bytes of whole free pieces
  // a stitch could move there.
  bool stitching = false;
  std::size_t movable = 0;
  FragmentationReport fragmentation;
};

OomReport DiagnoseOom(const OomSituation& s);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_OBSERVABILITY_OOM_DIAGNOSIS_H_
