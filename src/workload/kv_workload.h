// src/workload/kv_workload.h — a generated LLM-serving workload (used by the demo and the tests).
//
// Owns: a deterministic, seeded simulation of a serving loop whose allocation sizes change every
// step, the pattern that fragments a best-fit-with-splitting cache:
//   - requests arrive with a random prompt+output length (tokens) and hold a KV-cache block of
//     length x bytes_per_token until they finish (a random number of steps later);
//   - the batch size changes every step; each step allocates padded activation buffers
//     (batch x longest sequence x activation_bytes_per_token) and a logits buffer, and frees them
//     at the end of the step.
// Not part of the installed library (target bucketalloc_workload).
// Thread-safety: a run uses one allocator from one thread.
//
// Example:
//   KvWorkloadResult r = RunKvWorkload(*allocator, KvWorkloadConfig{.steps = 300});
//   if (r.oom) std::cout << r.oom->diagnosis;
#ifndef BUCKETALLOC_WORKLOAD_KV_WORKLOAD_H_
#define BUCKETALLOC_WORKLOAD_KV_WORKLOAD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "bucketalloc/allocator.h"

namespace bucketalloc::workload {

struct KvWorkloadConfig {
  std::uint64_t seed = 1;
  int steps = 300;
  int device = 0;
  Stream stream = nullptr;
  std::size_t kv_bytes_per_token = 128 * kKiB;  // e.g. Llama-3.1-8B in bf16
  std::size_t activation_bytes_per_token = 16 * kKiB;
  std::size_t logits_bytes_per_sequence = 256 * kKiB;
  int min_tokens = 32;
  int max_tokens = 4096;
  int max_batch = 48;
  int min_steps_alive = 2;  // a request lives this many to max_steps_alive steps
  int max_steps_alive = 40;
  bool stop_at_first_oom = true;
};

struct KvWorkloadResult {
  int steps_completed = 0;
  std::int64_t allocations = 0;
  std::int64_t failures = 0;
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  std::size_t peak_requested = 0;
  std::optional<OomReport> oom;  // the first out-of-memory report
  std::string ToString() const;
};

// Runs the workload against `allocator`; frees everything it still holds at the end.
KvWorkloadResult RunKvWorkload(Allocator& allocator, const KvWorkloadConfig& config);

}  // namespace bucketalloc::workload

#endif  // BUCKETALLOC_WORKLOAD_KV_WORKLOAD_H_
