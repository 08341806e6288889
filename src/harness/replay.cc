// src/harness/replay.cc — trace replay, its metrics, and the min-capacity bisection.
#include "harness/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"
#include "harness/pytorch_policy.h"
#include "internal/bits.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr std::size_t kGranularity = std::size_t{2} << 20;

// bucketalloc on a simulated device of `capacity` bytes.
class BucketallocReplay final : public ReplayAllocator {
 public:
  explicit BucketallocReplay(std::unique_ptr<Allocator> a) : a_(std::move(a)) {}
  absl::StatusOr<void*> Allocate(std::size_t size, Stream stream) override { return a_->Allocate(size, 0, stream); }
  absl::Status Free(void* ptr, std::size_t size) override { return a_->Free(ptr, 0, size); }
  std::size_t reserved_bytes() const override { return Reserved().current; }
  std::size_t peak_reserved_bytes() const override { return Reserved().peak; }
  void ResetPeak() override { a_->ResetPeakStats(0).IgnoreError(); }
  BackendCounters backend_counters() const override { return (*a_->backend(0))->counters(); }

 private:
  struct Gauge {
    std::size_t current;
    std::size_t peak;
  };
  Gauge Reserved() const {
    absl::StatusOr<DeviceStats> stats = a_->GetStats(0);  // device 0 exists: it was created with the allocator
    if (!stats.ok()) return {0, 0};
    const Stat s = stats->reserved_bytes[kAllPools];
    return {static_cast<std::size_t>(s.current), static_cast<std::size_t>(s.peak)};
  }
  std::unique_ptr<Allocator> a_;
};

// One backend call per request: what cudaMalloc/cudaFree without a cache does.
class NoCacheReplay final : public ReplayAllocator {
 public:
  explicit NoCacheReplay(std::unique_ptr<SimBackend> b) : b_(std::move(b)) {}
  absl::StatusOr<void*> Allocate(std::size_t size, Stream) override {
    if (size == 0) return nullptr;
    absl::StatusOr<void*> p = b_->Allocate(internal::RoundUp(size, b_->Granularity()));
    if (p.ok()) peak_ = std::max(peak_, b_->used_bytes());
    return p;
  }
  absl::Status Free(void* ptr, std::size_t size) override {
    if (ptr == nullptr) return absl::OkStatus();
    return b_->Free(ptr, internal::RoundUp(size, b_->Granularity()));
  }
  std::size_t reserved_bytes() const override { return b_->used_bytes(); }
  std::size_t peak_reserved_bytes() const override { return peak_; }
  void ResetPeak() override { peak_ = b_->used_bytes(); }
  BackendCounters backend_counters() const override { return b_->counters(); }

 private:
  std::unique_ptr<SimBackend> b_;
  std::size_t peak_ = 0;
};

double Percentile(std::vector<std::uint32_t>& v, double q) {
  if (v.empty()) return 0.0;
  const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

absl::StatusOr<std::unique_ptr<SimBackend>> MakeReplayDevice(std::size_t capacity) {
  SimBackendOptions o;
  o.total_memory = capacity;
  o.memory = SimMemoryMode::kUnbacked;
  return MakeSimBackend(o);
}

absl::StatusOr<std::unique_ptr<ReplayAllocator>> MakeReplayAllocator(absl::string_view spec, std::size_t capacity) {
  if (capacity < kGranularity) {
    return absl::InvalidArgumentError(absl::StrCat("capacity ", capacity, " bytes is too small; accepted: 2 MiB or more"));
  }
  capacity = capacity / kGranularity * kGranularity;
  if (spec == "pytorch-policy") return MakePyTorchPolicy(capacity);
  if (spec == "nocache") {
    absl::StatusOr<std::unique_ptr<SimBackend>> b = MakeReplayDevice(capacity);
    if (!b.ok()) return b.status();
    return std::unique_ptr<ReplayAllocator>(std::make_unique<NoCacheReplay>(std::move(*b)));
  }
  if (spec == "bucketalloc" || absl::StartsWith(spec, "bucketalloc:")) {
    const absl::string_view conf = spec == "bucketalloc" ? absl::string_view() : spec.substr(12);
    std::string full = absl::StrCat("backend:sim,sim_memory:unbacked,sim_total_memory:", capacity);
    if (!conf.empty()) absl::StrAppend(&full, ",", conf);
    absl::StatusOr<Options> options = ParseOptions(full);
    if (!options.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("allocator \"", spec, "\": ", options.status().message()));
    }
    absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(*options);
    if (!a.ok()) return a.status();
    return std::unique_ptr<ReplayAllocator>(std::make_unique<BucketallocReplay>(std::move(*a)));
  }
  return absl::InvalidArgumentError(absl::StrCat("allocator \"", spec,
                                                 "\" is unknown; accepted: bucketalloc, bucketalloc:CONF, "
                                                 "pytorch-policy, nocache"));
}

std::size_t PeakLiveBytes(const Trace& trace) {
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live;
  std::size_t now = 0, peak = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.action == TraceAction::kAllocate) {
      if (auto [it, inserted] = live.emplace(e.pointer, e.size); inserted) {
        now += e.size;
      } else {  // a pointer allocated twice without a free: the log lost a free; count the new size
        now += e.size - it->second;
        it->second = e.size;
      }
      peak = std::max(peak, now);
    } else if (e.action == TraceAction::kFree) {
      if (auto it = live.find(e.pointer); it != live.end()) {
        now -= it->second;
        live.erase(it);
      }
    }
  }
  return peak;
}

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.repeat < 1) {
    return absl::InvalidArgumentError(absl::StrCat("repeat ", options.repeat, " is invalid; accepted: 1 or more"));
  }
  absl::StatusOr<std::unique_ptr<ReplayAllocator>> made = MakeReplayAllocator(options.allocator, options.capacity);
  if (!made.ok()) return made.status();
  ReplayAllocator& a = **made;
  ReplayResult r;
  r.allocator = options.allocator;
  r.capacity = options.capacity / kGranularity * kGranularity;
  r.peak_live_bytes = PeakLiveBytes(trace);
  struct Held {
    void* ptr;
    std::uint64_t size;
  };
  absl::flat_hash_map<std::uint64_t, Held> live;  // trace pointer -> the replay's block
  std::size_t live_bytes = 0;
  std::vector<std::uint32_t> latencies;
  latencies.reserve(trace.events.size() * static_cast<std::size_t>(options.repeat));
  using Clock = std::chrono::steady_clock;
  auto elapsed_ns = [](Clock::time_point t0) {
    return static_cast<std::uint32_t>(
        std::min<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                               std::numeric_limits<std::uint32_t>::max()));
  };
  std::vector<std::size_t> end_of_round_live;
  std::vector<Held> held_over;  // blocks earlier rounds never freed
  for (int round = 0; round < options.repeat; ++round) {
    a.ResetPeak();
    for (const TraceEvent& e : trace.events) {
      if (e.action == TraceAction::kAllocate) {
        ++r.allocations;
        const auto t0 = Clock::now();
        absl::StatusOr<void*> p = a.Allocate(e.size, reinterpret_cast<Stream>(static_cast<std::uintptr_t>(e.stream)));
        latencies.push_back(elapsed_ns(t0));
        if (p.ok()) {
          if (auto old = live.find(e.pointer); old != live.end()) {
            // Logged twice without a free between: the log lost the free (PeakLiveBytes agrees).
            a.Free(old->second.ptr, old->second.size).IgnoreError();
            live_bytes -= old->second.size;
          }
          live[e.pointer] = Held{*p, e.size};
          live_bytes += e.size;
        } else if (absl::IsResourceExhausted(p.status())) {
          ++r.ooms;
          ++(live_bytes + e.size > r.capacity ? r.capacity_ooms : r.fragmentation_ooms);
        } else {
          return absl::Status(p.status().code(), absl::StrCat("line ", e.line, ": ", p.status().message()));
        }
      } else if (e.action == TraceAction::kFree) {
        auto it = live.find(e.pointer);
        if (it == live.end()) continue;  // its allocation failed in this replay (or was never logged)
        const auto t0 = Clock::now();
        absl::Status s = a.Free(it->second.ptr, it->second.size);
        latencies.push_back(elapsed_ns(t0));
        if (!s.ok()) return absl::Status(s.code(), absl::StrCat("line ", e.line, ": ", s.message()));
        live_bytes -= it->second.size;
        live.erase(it);
      }
    }
    r.per_round_peak_reserved_bytes.push_back(a.peak_reserved_bytes());
    end_of_round_live.push_back(live_bytes);
    // Blocks this round never freed stay held; the next round's pointers are new blocks.
    for (const auto& [pointer, held] : live) held_over.push_back(held);
    live.clear();
  }
  // What the trace never freed goes back (untimed), so that the allocator ends clean.
  for (const Held& held : held_over) a.Free(held.ptr, held.size).IgnoreError();
  r.peak_reserved_bytes = *std::max_element(r.per_round_peak_reserved_bytes.begin(), r.per_round_peak_reserved_bytes.end());
  r.reserved_over_live = r.peak_live_bytes == 0 ? 0.0
                                                : static_cast<double>(r.peak_reserved_bytes) /
                                                      static_cast<double>(r.peak_live_bytes);
  r.p50_ns = Percentile(latencies, 0.50);
  r.p99_ns = Percentile(latencies, 0.99);
  const BackendCounters c = a.backend_counters();
  r.backend_calls = static_cast<std::uint64_t>(c.allocs + c.failed_allocs + c.frees);
  r.simulated_backend_ms = (static_cast<double>(c.allocs + c.failed_allocs) * options.cost.malloc_us +
                            static_cast<double>(c.frees) * options.cost.free_us) /
                           1000.0;
  if (options.repeat == 1) {
    r.verdict = "single round";
  } else {
    // Fragmentation settles in the first rounds; a peak that still grows in the second half, or
    // bytes still held at the end of each round that grow round over round, is a leak.
    const std::size_t settled = r.per_round_peak_reserved_bytes[static_cast<std::size_t>(options.repeat) / 2];
    const bool peak_grows = r.per_round_peak_reserved_bytes.back() > settled;
    const bool held_grows = end_of_round_live.back() > end_of_round_live.front();
    r.verdict = peak_grows || held_grows ? "rising" : "stable";
  }
  return r;
}

std::string ReplayResult::ToJson() const {
  nlohmann::ordered_json j = {{"allocator", allocator},
                              {"capacity_bytes", capacity},
                              {"allocations", allocations},
                              {"peak_live_bytes", peak_live_bytes},
                              {"peak_reserved_bytes", peak_reserved_bytes},
                              {"reserved_over_live", reserved_over_live},
                              {"ooms", ooms},
                              {"capacity_ooms", capacity_ooms},
                              {"fragmentation_ooms", fragmentation_ooms},
                              {"p50_ns", p50_ns},
                              {"p99_ns", p99_ns},
                              {"backend_calls", backend_calls},
                              {"simulated_backend_ms", simulated_backend_ms},
                              {"per_round_peak_reserved_bytes", per_round_peak_reserved_bytes},
                              {"verdict", verdict}};
  return j.dump(2);
}

absl::StatusOr<MinCapacityResult> MinCapacity(const Trace& trace, absl::string_view allocator, const CostModel& cost,
                                              void (*progress)(const std::string& line)) {
  const std::size_t live = PeakLiveBytes(trace);
  auto probe = [&](std::size_t capacity) -> absl::StatusOr<ReplayResult> {
    ReplayOptions o;
    o.allocator = std::string(allocator);
    o.capacity = capacity;
    o.cost = cost;
    absl::StatusOr<ReplayResult> r = Replay(trace, o);
    if (r.ok() && progress != nullptr) {
      progress(absl::StrCat("min-capacity ", allocator, ": ", FormatBytes(capacity), " -> ", r->ooms, " OOMs"));
    }
    return r;
  };
  // Below the peak of live bytes nothing can work: start just under it and double until it works.
  std::size_t lo = std::max(kGranularity, internal::RoundUp(live, kGranularity)) - kGranularity;
  std::size_t hi = std::max(2 * kGranularity, internal::RoundUp(live, kGranularity));
  absl::StatusOr<ReplayResult> at_hi = probe(hi);
  while (at_hi.ok() && at_hi->ooms > 0) {
    if (hi >= kMaxRequestBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("allocator ", allocator, " does not serve the trace even with ",
                                                       FormatBytes(hi)));
    }
    lo = hi;
    hi *= 2;
    at_hi = probe(hi);
  }
  if (!at_hi.ok()) return at_hi.status();
  while (hi - lo > kGranularity) {
    const std::size_t mid = (lo + hi) / 2 / kGranularity * kGranularity;
    absl::StatusOr<ReplayResult> r = probe(mid);
    if (!r.ok()) return r.status();
    if (r->ooms == 0) {
      hi = mid;
      at_hi = std::move(r);
    } else {
      lo = mid;
    }
  }
  MinCapacityResult m;
  m.min_capacity_bytes = hi;
  m.min_capacity_over_live = live == 0 ? 0.0 : static_cast<double>(hi) / static_cast<double>(live);
  m.at_min = std::move(*at_hi);
  return m;
}

std::string MinCapacityResult::ToJson() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(at_min.ToJson());
  j["min_capacity_bytes"] = min_capacity_bytes;
  j["min_capacity_over_live"] = min_capacity_over_live;
  return j.dump(2);
}

}  // namespace bucketalloc::harness
