#include "workload/kv_workload.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bucketalloc::workload {
namespace {

struct Request {
  void* kv = nullptr;
  void* meta = nullptr;  // per-request sampling state and block table (small pool)
  std::size_t kv_bytes = 0;
  int tokens = 0;
  int steps_left = 0;
};

}  // namespace

std::string KvWorkloadResult::ToString() const {
  std::string out = absl::StrFormat(
      "steps completed %d, allocations %d, failures %d, peak requested %s, peak allocated %s, peak reserved %s",
      steps_completed, allocations, failures, FormatBytes(peak_requested), FormatBytes(peak_allocated),
      FormatBytes(peak_reserved));
  if (oom) absl::StrAppend(&out, "; first OOM: ", OomCauseName(oom->cause));
  return out;
}

KvWorkloadResult RunKvWorkload(Allocator& allocator, const KvWorkloadConfig& c) {
  KvWorkloadResult result;
  std::mt19937_64 rng(c.seed);
  // Lengths: log-uniform between min and max tokens (many short, some long requests).
  std::uniform_real_distribution<double> log_len(std::log(c.min_tokens), std::log(c.max_tokens));
  std::uniform_int_distribution<int> batch_dist(1, c.max_batch);
  std::uniform_int_distribution<int> life_dist(c.min_steps_alive, c.max_steps_alive);
  std::vector<Request> active;
  auto alloc = [&](std::size_t bytes) -> void* {
    absl::StatusOr<void*> p = allocator.Allocate(bytes, c.device, c.stream);
    ++result.allocations;
    if (!p.ok()) {
      ++result.failures;
      if (!result.oom) {
        absl::StatusOr<std::optional<OomReport>> r = allocator.LastOomReport(c.device);
        if (r.ok() && r->has_value()) result.oom = **r;
      }
      return nullptr;
    }
    return *p;
  };
  auto release = [&](void* p) { allocator.Free(p, c.device).IgnoreError(); };
  bool stop = false;
  for (int step = 0; step < c.steps && !stop; ++step) {
    // Finish requests.
    for (Request& r : active) {
      if (--r.steps_left <= 0) {
        release(r.meta);
        release(r.kv);
        r.kv = nullptr;
      }
    }
    std::erase_if(active, [](const Request& r) { return r.kv == nullptr; });
    // Admit requests up to this step's batch size.
    const int target = batch_dist(rng);
    while (static_cast<int>(active.size()) < target) {
      Request r;
      r.tokens = static_cast<int>(std::exp(log_len(rng)));
      r.kv_bytes = static_cast<std::size_t>(r.tokens) * c.kv_bytes_per_token;
      r.steps_left = life_dist(rng);
      r.kv = alloc(r.kv_bytes);
      r.meta = r.kv == nullptr ? nullptr : alloc(static_cast<std::size_t>(r.tokens) * 4 + 512);
      if (r.kv == nullptr || r.meta == nullptr) {
        release(r.kv);
        stop = c.stop_at_first_oom;
        if (stop) break;
        continue;
      }
      active.push_back(r);
    }
    if (stop) break;
    // The step's padded activations and logits.
    int longest = 0;
    for (const Request& r : active) longest = std::max(longest, r.tokens);
    const std::size_t batch = active.size();
    std::vector<void*> temps;
    for (std::size_t bytes :
         {batch * static_cast<std::size_t>(longest) * c.activation_bytes_per_token,
          batch * static_cast<std::size_t>(longest) * c.activation_bytes_per_token / 2,
          batch * c.logits_bytes_per_sequence, batch * static_cast<std::size_t>(longest) * 8}) {  // position ids
      if (bytes == 0) continue;
      void* p = alloc(bytes);
      if (p == nullptr) {
        stop = c.stop_at_first_oom;
        if (stop) break;
        continue;
      }
      temps.push_back(p);
    }
    if (absl::StatusOr<DeviceStats> s = allocator.GetStats(c.device); s.ok()) {
      result.peak_reserved =
          std::max(result.peak_reserved, static_cast<std::size_t>(s->reserved_bytes[kAllPools].current));
      result.peak_allocated =
          std::max(result.peak_allocated, static_cast<std::size_t>(s->allocated_bytes[kAllPools].current));
      result.peak_requested =
          std::max(result.peak_requested, static_cast<std::size_t>(s->requested_bytes[kAllPools].current));
    }
    for (void* p : temps) release(p);
    if (!stop) result.steps_completed = step + 1;
  }
  for (Request& r : active) {
    release(r.meta);
    release(r.kv);
  }
  return result;
}

}  // namespace bucketalloc::workload
