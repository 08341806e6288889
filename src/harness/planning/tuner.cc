// src/harness/planning/tuner.cc — the settings that need the least memory for one workload
// (harness/planning/tuner.h).
#include "harness/planning/tuner.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "bucketalloc/options.h"
#include "bucketalloc/units.h"
#include "harness/replay/policies.h"
#include "harness/reports/page.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr std::size_t kSmallLimit = std::size_t{1} << 20;  // both allocators' small pool limit
constexpr double kRecurringShare = 0.01;                   // of the large allocations, per size
constexpr std::uint64_t kRecurringCount = 8;
constexpr std::size_t kMaxTiers = 32;
constexpr double kTiersCover = 0.5;
constexpr int kValidated = 3;  // the best of each family measured on the held-out part

// "bucketalloc" or "pytorch-policy" and their settings as key:value, or the allocator as it is.
struct Candidate {
  std::string family;  // "bucketalloc", "pytorch-policy", "pytorch-expandable"
  std::vector<std::pair<std::string, std::string>> settings;
  std::string change;
  std::string Allocator() const {
    if (settings.empty()) return family;
    std::vector<std::string> kv;
    for (const auto& [k, v] : settings) kv.push_back(absl::StrCat(k, ":", v));
    return absl::StrCat(family, ":", absl::StrJoin(kv, ","));
  }
  bool pytorch() const { return family != "bucketalloc"; }
};

std::string SizeList(const std::vector<std::size_t>& sizes) {
  std::vector<std::string> s;
  for (std::size_t b : sizes)
    s.push_back(b % kSmallLimit == 0 ? absl::StrCat(b / kSmallLimit, "MiB") : absl::StrCat(b));
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

// max_split_size_mb's candidates: the large sizes' quantiles in MiB, at least `floor` (bucketalloc's
// is the large segment, 20; PyTorch's CUDAAllocatorConfig takes only values above 20, so the PyTorch
// family's is 21: a setting every PyTorch version accepts), each once.
std::vector<std::size_t> SplitCandidates(const TraceShape& shape, std::size_t floor) {
  std::vector<std::size_t> mib;
  for (std::size_t b : {shape.large_p50, shape.large_p90, shape.large_p99}) {
    const std::size_t m = std::max<std::size_t>(floor, (b + kSmallLimit - 1) / kSmallLimit);
    if (b > 0 && std::find(mib.begin(), mib.end(), m) == mib.end()) mib.push_back(m);
  }
  return mib;
}

// One change each from the family's default (the default first).
std::vector<Candidate> FirstRound(const TraceShape& shape) {
  std::vector<Candidate> c;
  c.push_back({"bucketalloc", {}, "the default"});
  c.push_back({"pytorch-policy", {}, "the default"});
  c.push_back({"bucketalloc", {{"backend", "vmm"}}, "stitching"});
  // Fewer creates on requests' path (a 20 MiB piece per call, as expandable segments' pages) for
  // memory a stitch cannot move while a live block shares its piece.
  c.push_back({"bucketalloc", {{"backend", "vmm"}, {"grow_piece_mb", "20"}}, "stitching, grow pieces of 20 MiB"});
  if (!shape.tier_sizes.empty()) {
    c.push_back({"bucketalloc",
                 {{"tiers", SizeList(shape.tier_sizes)}},
                 "tiers of the recurring large sizes that divide one another"});
  }
  if (shape.recurring_sizes.size() > shape.tier_sizes.size()) {
    c.push_back({"bucketalloc", {{"tiers", SizeList(shape.recurring_sizes)}}, "tiers of all recurring large sizes"});
  }
  for (const auto& [family, floor] : {std::pair{"bucketalloc", 20}, std::pair{"pytorch-policy", 21}}) {
    for (std::size_t m : SplitCandidates(shape, floor)) {
      c.push_back({family, {{"max_split_size_mb", absl::StrCat(m)}}, absl::StrCat("max_split_size_mb ", m)});
    }
  }
  for (int d : {2, 4, 8}) {
    for (const char* family : {"bucketalloc", "pytorch-policy"}) {
      c.push_back(
          {family, {{"roundup_power2_divisions", absl::StrCat(d)}}, absl::StrCat("roundup_power2_divisions ", d)});
    }
  }
  for (int m : {2, 64}) {
    c.push_back(
        {"bucketalloc", {{"large_segment_size_mb", absl::StrCat(m)}}, absl::StrCat("large_segment_size_mb ", m)});
  }
  c.push_back({"bucketalloc", {{"garbage_collection_threshold", "0.8"}}, "garbage_collection_threshold 0.8"});
  c.push_back({"pytorch-expandable", {}, "expandable segments"});
  return c;
}

// Runs f(0) ... f(n - 1) on up to `jobs` threads.
void ForEachParallel(int n, int jobs, const std::function<void(int)>& f) {
  const int threads = std::max(1, std::min(jobs, n));
  if (threads == 1) {
    for (int i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) f(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

TuneFigures FiguresOf(const MinCapacityResult& m) {
  return {m.min_capacity_bytes, m.min_capacity_over_live, m.at_min.backend_calls, m.at_min.simulated_backend_ms,
          m.at_min.driver_time};
}

// Which candidates stop after the probe under the family's best min capacity, when it fails:
// none (the defaults), those a measured point dominates (the first round: the others may be on
// the front), or all (a combination that is no better is dropped).
enum class Prune { kNone, kDominated, kNotBetter };

// The search's state: the points, the clock and the counts.
class Search {
 public:
  Search(const TuneOptions& o, const Trace& tune, std::size_t tune_live)
      : o_(o), tune_(tune), tune_live_(tune_live), start_(Clock::now()) {
    jobs_ = o.jobs > 0 ? o.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // The search stops starting probes at 70% of the budget; the held-out check may use the rest.
  bool SearchExpired() const { return o_.budget_s > 0 && Elapsed() > 0.7 * o_.budget_s; }
  bool Expired() const { return o_.budget_s > 0 && Elapsed() > o_.budget_s; }
  int jobs() const { return jobs_; }
  std::vector<TunePoint>& points() { return points_; }
  int replays() const { return replays_; }
  void AddExpected(int n) { total_ += n; }

  // Adds and measures `batch` (screens, then each against its family's best so far, in parallel);
  // returns their indices.
  std::vector<int> Measure(const std::vector<Candidate>& batch, Prune prune) {
    std::vector<int> index;
    for (const Candidate& c : batch) {
      int existing = Find(c.Allocator());
      if (existing >= 0) {
        index.push_back(existing);
        Done(absl::StrCat(c.Allocator(), ": measured already"));
        continue;
      }
      TunePoint p;
      p.allocator = c.Allocator();
      p.pytorch = c.pytorch();
      p.policy = c.family;
      p.change = c.change;
      points_.push_back(std::move(p));
      index.push_back(static_cast<int>(points_.size()) - 1);
    }
    std::vector<int> fresh;  // each new point once
    for (int i : index) {
      if (points_[i].state.empty() && std::find(fresh.begin(), fresh.end(), i) == fresh.end()) fresh.push_back(i);
    }
    ForEachParallel(static_cast<int>(fresh.size()), jobs_, [&](int k) { Screen(points_[fresh[k]]); });
    // In order of their upper bound, two at a time against the best before them.
    std::stable_sort(fresh.begin(), fresh.end(), [&](int a, int b) {
      auto key = [&](int i) {
        const std::size_t u = points_[i].screen_peak_reserved_bytes;
        return u == 0 ? std::numeric_limits<std::size_t>::max() : u;
      };
      return key(a) < key(b);
    });
    for (std::size_t at = 0; at < fresh.size(); at += 2) {
      const std::size_t n = std::min<std::size_t>(2, fresh.size() - at);
      std::vector<std::optional<std::pair<std::size_t, double>>> best(n);
      for (std::size_t k = 0; k < n; ++k) {
        const TunePoint& p = points_[fresh[at + k]];
        // A combination is held against its own policy's best (a pytorch-policy chain not against
        // pytorch-expandable); a first-round change against its family's.
        if (prune == Prune::kNotBetter) best[k] = Best([&](const TunePoint& q) { return q.policy == p.policy; });
        if (prune == Prune::kDominated) best[k] = Best([&](const TunePoint& q) { return q.pytorch == p.pytorch; });
      }
      const std::vector<TunePoint> measured = points_;  // read by the dominance test below, as it was
      ForEachParallel(static_cast<int>(n), jobs_,
                      [&](int k) { Evaluate(points_[fresh[at + k]], best[k], prune, measured); });
      for (std::size_t k = 0; k < n; ++k) {
        const TunePoint& p = points_[fresh[at + k]];
        Done(absl::StrCat(p.allocator, ": ", TunePointText(p)));
      }
    }
    return index;
  }

  // The best measured point of those `of` takes: its min capacity and backend time.
  template <typename Of>
  std::optional<std::pair<std::size_t, double>> Best(Of of) const {
    std::optional<std::pair<std::size_t, double>> best;
    for (const TunePoint& p : points_) {
      if (!of(p) || !p.tune.has_value()) continue;
      std::pair<std::size_t, double> v{p.tune->min_capacity_bytes, p.tune->backend_ms};
      if (!best.has_value() || v < *best) best = v;
    }
    return best;
  }

  int Find(const std::string& allocator) const {
    for (std::size_t i = 0; i < points_.size(); ++i) {
      if (points_[i].allocator == allocator) return static_cast<int>(i);
    }
    return -1;
  }

  void Done(const std::string& line) {
    ++done_;
    total_ = std::max(total_, done_);
    if (o_.progress) o_.progress(done_, total_, line);
  }

  // A min-capacity search of `trace` for `allocator` within the budget (`held_out`: the whole one).
  absl::StatusOr<MinCapacityResult> MinCapacityOf(const Trace& trace, const std::string& allocator,
                                                  MinCapacitySearch search, bool held_out) {
    search.expired = [this, held_out] { return held_out ? Expired() : SearchExpired(); };
    search.progress = [this](const std::string&) { ++replays_; };
    return MinCapacity(trace, allocator, o_.cost, search);
  }

  // A replay of `trace`; counted.
  absl::StatusOr<ReplayResult> ReplayOf(const Trace& trace, const std::string& allocator, std::size_t capacity,
                                        bool stop_at_first_oom) {
    ++replays_;
    ReplayOptions r;
    r.allocator = allocator;
    r.capacity = capacity;
    r.cost = o_.cost;
    r.stop_at_first_oom = stop_at_first_oom;
    return Replay(trace, r);
  }

 private:
  // The uncapped replay.
  void Screen(TunePoint& p) {
    if (SearchExpired()) return;
    const std::size_t cap =
        std::min(kMaxSimReplayCapacity,
                 RoundUp(std::max<std::size_t>(4 * tune_live_, std::size_t{8} << 30), kReplayGranularity));
    absl::StatusOr<ReplayResult> r = ReplayOf(tune_, p.allocator, cap, /*stop_at_first_oom=*/true);
    if (!r.ok()) {
      p.state = "failed";
      p.error = std::string(r.status().message());
      return;
    }
    if (r->card_ooms() == 0) p.screen_peak_reserved_bytes = r->peak_reserved_bytes;
    p.screen_backend_ms = r->simulated_backend_ms;
    p.screen_driver_time = r->driver_time;
  }

  void Evaluate(TunePoint& p, const std::optional<std::pair<std::size_t, double>>& best, Prune prune,
                const std::vector<TunePoint>& measured) {
    if (p.state == "failed") return;
    if (SearchExpired()) {
      p.state = "budget";
      return;
    }
    MinCapacitySearch search;
    search.passing = p.screen_peak_reserved_bytes;
    if (best.has_value() && best->first > 2 * kReplayGranularity) {
      const std::size_t below = best->first - kReplayGranularity;
      absl::StatusOr<ReplayResult> r = ReplayOf(tune_, p.allocator, below, /*stop_at_first_oom=*/true);
      if (!r.ok()) {
        p.state = "failed";
        p.error = std::string(r.status().message());
        return;
      }
      if (r->card_ooms() == 0) {
        search.passing = below;
      } else {
        p.fails_at = below;
        search.failing = below;
        if (prune == Prune::kNotBetter) {
          p.state = "pruned";
          return;
        }
        for (const TunePoint& q : measured) {
          if (q.pytorch == p.pytorch && q.tune.has_value() && q.tune->min_capacity_bytes <= best->first &&
              q.tune->driver_time.request_path_ms <= p.screen_driver_time.request_path_ms &&
              q.tune->driver_time.synchronizations <= p.screen_driver_time.synchronizations) {
            p.state = "pruned";
            return;
          }
        }
      }
    }
    absl::StatusOr<MinCapacityResult> m = MinCapacityOf(tune_, p.allocator, search, /*held_out=*/false);
    if (!m.ok()) {
      p.state = absl::IsDeadlineExceeded(m.status()) ? "budget" : "failed";
      p.error = std::string(m.status().message());
      return;
    }
    p.state = "measured";
    p.tune = FiguresOf(*m);
  }

  const TuneOptions& o_;
  const Trace& tune_;
  std::size_t tune_live_;
  Clock::time_point start_;
  int jobs_ = 1;
  std::vector<TunePoint> points_;
  std::atomic<int> replays_{0};
  int done_ = 0, total_ = 0;
};

// Greedy combination of the family's changes that beat its default, best first.
void Combine(Search& s, const std::string& family, int default_point) {
  std::vector<TunePoint>& points = s.points();
  if (default_point < 0 || !points[default_point].tune.has_value()) return;
  const std::size_t base = points[default_point].tune->min_capacity_bytes;
  // The improving single changes, best first, one value per key.
  std::vector<std::pair<std::size_t, std::pair<std::string, std::string>>> better;
  for (const TunePoint& p : points) {
    if (!p.tune.has_value() || p.tune->min_capacity_bytes >= base) continue;
    absl::string_view conf = p.allocator;
    if (!absl::ConsumePrefix(&conf, family + ":")) continue;
    absl::StatusOr<std::vector<OptionSetting>> kv = SplitOptions(conf);
    if (!kv.ok() || kv->size() != 1) continue;
    better.push_back({p.tune->min_capacity_bytes, {(*kv)[0].key, (*kv)[0].value}});
  }
  std::sort(better.begin(), better.end());
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& entry : better) {
    const std::pair<std::string, std::string>& kv = entry.second;
    if (std::none_of(keys.begin(), keys.end(), [&](const auto& k) { return k.first == kv.first; })) keys.push_back(kv);
  }
  if (keys.size() < 2) return;
  s.AddExpected(static_cast<int>(keys.size()) - 1);
  Candidate current{family, {keys[0]}, ""};
  std::size_t current_min = better.front().first;
  for (std::size_t k = 1; k < keys.size(); ++k) {
    Candidate next = current;
    next.settings.push_back(keys[k]);
    std::vector<std::string> changes;
    for (const auto& [key, value] : next.settings) changes.push_back(absl::StrCat(key, " ", value));
    next.change = absl::StrCat("combined: ", absl::StrJoin(changes, ", "));
    const int i = s.Measure({next}, Prune::kNotBetter).front();
    const TunePoint& p = s.points()[i];
    if (p.tune.has_value() && p.tune->min_capacity_bytes < current_min) {
      current = next;
      current_min = p.tune->min_capacity_bytes;
    }
  }
}

// A point is on the front when no other is no worse in memory, driver time on requests' path and
// synchronizations, and better in one: what a service pays for the memory it saves.
void MarkFront(std::vector<TunePoint>& points) {
  auto axes = [](const TuneFigures& f) {
    return std::array<double, 3>{static_cast<double>(f.min_capacity_bytes), f.driver_time.request_path_ms,
                                 static_cast<double>(f.driver_time.synchronizations)};
  };
  for (TunePoint& p : points) {
    if (!p.tune.has_value()) continue;
    const std::array<double, 3> mine = axes(*p.tune);
    p.on_front = std::none_of(points.begin(), points.end(), [&](const TunePoint& q) {
      if (!q.tune.has_value() || &q == &p) return false;
      const std::array<double, 3> theirs = axes(*q.tune);
      bool no_worse = true, better = false;
      for (int k = 0; k < 3; ++k) {
        no_worse = no_worse && theirs[k] <= mine[k];
        better = better || theirs[k] < mine[k];
      }
      return no_worse && better;
    });
  }
}

// The environment's text of a point's allocator: its CONF, PyTorch's expandable_segments:True.
std::string ConfOf(const std::string& allocator) {
  if (allocator == "pytorch-expandable") return "expandable_segments:True";
  const std::size_t colon = allocator.find(':');
  return colon == std::string::npos ? "" : allocator.substr(colon + 1);
}

Json FiguresJson(const std::optional<TuneFigures>& f) {
  if (!f.has_value()) return nullptr;
  Json j;
  j["min_capacity_bytes"] = f->min_capacity_bytes;
  j["min_capacity_over_live"] = f->over_live;
  j["backend_calls"] = f->backend_calls;
  j["simulated_backend_ms"] = f->backend_ms;
  j["driver_time"] = f->driver_time.ToJson();
  return j;
}

}  // namespace

std::string TuneFiguresText(const std::optional<TuneFigures>& f) {
  if (!f.has_value()) return "-";
  return absl::StrFormat(
      "%s (%.3f x live), %llu calls, %.1f ms (%.1f on requests' path, %llu syncs)", FormatBytes(f->min_capacity_bytes),
      f->over_live, static_cast<unsigned long long>(f->backend_calls), f->backend_ms, f->driver_time.request_path_ms,
      static_cast<unsigned long long>(f->driver_time.synchronizations));
}

std::string TunePointText(const TunePoint& p) {
  if (p.state == "pruned") return absl::StrCat("fails at ", FormatBytes(p.fails_at), " (2 MiB under the best): pruned");
  if (p.state == "budget") return "not measured: the budget ran out";
  if (p.state == "failed") return absl::StrCat("failed: ", p.error);
  return TuneFiguresText(p.tune);
}

TraceShape ReadShape(const Trace& trace) {
  TraceShape s;
  s.peak_live_bytes = PeakLiveBytes(trace);
  std::map<std::size_t, std::uint64_t> count;
  std::vector<std::size_t> large;
  for (const TraceEvent& e : trace.events) {
    if (e.action != TraceAction::kAllocate || e.size == 0) continue;
    ++s.allocations;
    if (e.size <= kSmallLimit) continue;
    ++s.large_allocations;
    ++count[e.size];
    large.push_back(e.size);
  }
  if (large.empty()) return s;
  std::sort(large.begin(), large.end());
  auto quantile = [&](double q) {
    return large[std::min(large.size() - 1, static_cast<std::size_t>(q * large.size()))];
  };
  s.large_p50 = quantile(0.5);
  s.large_p90 = quantile(0.9);
  s.large_p99 = quantile(0.99);
  std::vector<std::pair<std::uint64_t, std::size_t>> by_count;
  const auto least = std::max<std::uint64_t>(
      kRecurringCount, static_cast<std::uint64_t>(std::ceil(kRecurringShare * static_cast<double>(large.size()))));
  for (const auto& [size, n] : count) {
    if (n >= least) by_count.push_back({n, size});
  }
  std::sort(by_count.rbegin(), by_count.rend());
  if (by_count.size() > kMaxTiers) by_count.resize(kMaxTiers);
  std::uint64_t covered = 0;
  for (const auto& [n, size] : by_count) covered += n;
  const double share = static_cast<double>(covered) / static_cast<double>(large.size());
  if (by_count.empty() || share < kTiersCover) return s;
  s.recurring_share = share;
  std::size_t smallest = 0;
  for (const auto& [n, size] : by_count) {  // the most frequent first
    s.recurring_sizes.push_back(size);
    if (smallest == 0 || size % smallest == 0 || smallest % size == 0) {
      s.tier_sizes.push_back(size);
      smallest = smallest == 0 ? size : std::min(smallest, size);
      s.quantum_bytes = std::gcd(s.quantum_bytes, size);
    }
  }
  std::sort(s.recurring_sizes.begin(), s.recurring_sizes.end());
  std::sort(s.tier_sizes.begin(), s.tier_sizes.end());
  return s;
}

TraceParts SplitTrace(const Trace& trace) {
  TraceParts parts;
  const std::size_t mid = trace.events.size() / 2;
  parts.tune.events.assign(trace.events.begin(), trace.events.begin() + static_cast<std::ptrdiff_t>(mid));
  // The blocks live at the midpoint, in the order they were allocated.
  absl::flat_hash_map<std::uint64_t, std::size_t> live;  // pointer -> its allocation's event
  for (std::size_t i = 0; i < mid; ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.action == TraceAction::kAllocate) live[e.pointer] = i;
    if (e.action == TraceAction::kFree) live.erase(e.pointer);
  }
  std::vector<std::size_t> order;
  for (const auto& [ptr, i] : live) order.push_back(i);
  std::sort(order.begin(), order.end());
  for (std::size_t i : order) parts.held_out.events.push_back(trace.events[i]);
  parts.held_out.events.insert(parts.held_out.events.end(), trace.events.begin() + static_cast<std::ptrdiff_t>(mid),
                               trace.events.end());
  return parts;
}

absl::StatusOr<TuneResult> Tune(const Trace& trace, const TuneOptions& options) {
  if (!(options.budget_s >= 0.0 && options.budget_s <= kMaxTuneBudgetSeconds)) {  // NaN fails too
    return absl::InvalidArgumentError(absl::StrCat("tune: budget ", options.budget_s, " s; accepted: 0 (none) to ",
                                                   static_cast<std::int64_t>(kMaxTuneBudgetSeconds),
                                                   " seconds (--budget-s)"));
  }
  TuneResult result;
  result.shape = ReadShape(trace);
  result.capacity = options.capacity;
  auto nothing = [](absl::string_view what, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tune: ", what, " ", why,
        "; accepted: a recording of the workload (RMM CSV, a profiler trace or a memory snapshot with its history) "
        "with allocations above 1 MiB, where every setting tune searches acts"));
  };
  if (result.shape.allocations == 0) return nothing("the trace", "has no allocations");
  if (result.shape.large_allocations == 0) {
    return nothing("the trace", "has no allocation above 1 MiB (the small pool's, which no setting changes)");
  }
  TraceParts parts;
  if (options.validate.has_value()) {
    parts.tune = trace;
    parts.held_out = *options.validate;
    result.held_out_name = options.validate_name.empty() ? "the validation trace" : options.validate_name;
    result.held_out_is_second_half = false;
    const TraceShape held = ReadShape(parts.held_out);
    if (held.allocations == 0) return nothing(result.held_out_name, "has no allocations");
    if (held.large_allocations == 0) {
      return nothing(result.held_out_name,
                     "has no allocation above 1 MiB (the small pool's, which no setting changes)");
    }
  } else {
    parts = SplitTrace(trace);
    result.held_out_name = "the trace's second half";
    result.held_out_is_second_half = true;
  }
  result.tune_peak_live_bytes = PeakLiveBytes(parts.tune);
  result.held_out_peak_live_bytes = PeakLiveBytes(parts.held_out);
  if (result.tune_peak_live_bytes == 0 || result.held_out_peak_live_bytes == 0) {
    return nothing("the trace", "is too short to split in halves that each allocate (give --validate TRACE2)");
  }

  Search s(options, parts.tune, result.tune_peak_live_bytes);
  const std::vector<Candidate> first = FirstRound(result.shape);
  s.AddExpected(static_cast<int>(first.size()) + 2 * (kValidated + 2));
  // The defaults, measured whole (no pruning): the baselines of every comparison.
  const std::vector<int> defaults = s.Measure({first[0], first[1]}, Prune::kNone);
  for (int i : defaults) {
    const TunePoint& p = s.points()[i];
    if (p.state == "failed") return absl::InternalError(absl::StrCat("tune: ", p.allocator, ": ", p.error));
    if (p.state != "measured") {
      return absl::DeadlineExceededError(absl::StrFormat(
          "tune: the budget (--budget-s %g) ran out after %.1f s, before the defaults (bucketalloc, pytorch-policy) "
          "were measured on this trace: nothing could be compared; accepted: a budget that lets them finish (without "
          "--budget-s, tune takes what it needs)",
          options.budget_s, s.Elapsed()));
    }
  }
  s.Measure(std::vector<Candidate>(first.begin() + 2, first.end()), Prune::kDominated);
  Combine(s, "bucketalloc", defaults[0]);
  Combine(s, "pytorch-policy", defaults[1]);

  // The held-out check: the family's best few and its baselines.
  std::vector<TunePoint>& points = s.points();
  auto ranked = [&](bool pytorch) {
    std::vector<int> r;
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (points[i].pytorch == pytorch && points[i].tune.has_value()) r.push_back(static_cast<int>(i));
    }
    std::stable_sort(r.begin(), r.end(), [&](int a, int b) {
      return std::make_pair(points[a].tune->min_capacity_bytes, points[a].tune->backend_ms) <
             std::make_pair(points[b].tune->min_capacity_bytes, points[b].tune->backend_ms);
    });
    return r;
  };
  const std::vector<std::string> baselines[2] = {{"bucketalloc", "bucketalloc:backend:vmm"},
                                                 {"pytorch-policy", "pytorch-expandable"}};
  std::vector<int> check;
  for (bool pytorch : {false, true}) {
    const std::vector<int> r = ranked(pytorch);
    for (std::size_t k = 0; k < r.size() && k < kValidated; ++k) check.push_back(r[k]);
    for (const std::string& b : baselines[pytorch]) {
      int i = s.Find(b);
      if (i < 0) {
        TunePoint p;
        p.allocator = b;
        p.pytorch = pytorch;
        p.policy = b.substr(0, b.find(':'));
        p.change = "a baseline";
        p.state = "budget";
        points.push_back(std::move(p));
        i = static_cast<int>(points.size()) - 1;
      }
      if (std::find(check.begin(), check.end(), i) == check.end()) check.push_back(i);
    }
  }
  std::vector<absl::StatusOr<MinCapacityResult>> held(check.size(), absl::UnknownError("not run"));
  ForEachParallel(static_cast<int>(check.size()), s.jobs(), [&](int k) {
    held[k] = s.MinCapacityOf(parts.held_out, points[check[k]].allocator, MinCapacitySearch{}, /*held_out=*/true);
  });
  bool held_out_cut = false;  // the budget ran out before a held-out measurement
  for (std::size_t k = 0; k < check.size(); ++k) {
    if (held[k].ok()) {
      points[check[k]].held_out = FiguresOf(*held[k]);
    } else if (absl::IsDeadlineExceeded(held[k].status())) {
      held_out_cut = true;
    } else {
      return absl::Status(held[k].status().code(),
                          absl::StrCat("tune: ", points[check[k]].allocator, " on ", result.held_out_name, ": ",
                                       held[k].status().message()));
    }
    s.Done(absl::StrCat(points[check[k]].allocator, " on ", result.held_out_name));
  }

  // The choice per family: the best on the tuning part that the held-out part does not veto.
  const double tolerance = 0.002 * static_cast<double>(result.held_out_peak_live_bytes);
  auto choose = [&](bool pytorch, TuneChoice* choice) {
    choice->default_point = s.Find(baselines[pytorch][0]);
    std::optional<std::size_t> bar;  // the least baseline on the held-out part
    for (const std::string& b : pytorch ? std::vector<std::string>{"pytorch-policy"} : baselines[0]) {
      const int i = s.Find(b);
      if (i >= 0 && points[i].held_out.has_value()) {
        bar = std::min(bar.value_or(std::numeric_limits<std::size_t>::max()), points[i].held_out->min_capacity_bytes);
      }
    }
    const char* baseline = pytorch ? "default" : "default and stitching";
    int vetoed = 0, unchecked = 0;  // ranked above the choice
    for (int i : ranked(pytorch)) {
      if (!points[i].held_out.has_value() || !bar.has_value()) {
        ++unchecked;
        continue;
      }
      if (static_cast<double>(points[i].held_out->min_capacity_bytes) <=
          static_cast<double>(*bar) + (pytorch ? 0.0 : tolerance)) {
        choice->point = i;
        if (vetoed + unchecked == 0) {
          choice->why = absl::StrCat("the least memory on the tuning part, and no more than the ", baseline, " on ",
                                     result.held_out_name);
        } else {
          choice->why = absl::StrCat("the best on the tuning part that is no worse than the ", baseline, " on ",
                                     result.held_out_name);
          if (vetoed > 0) absl::StrAppend(&choice->why, "; ", vetoed, " ranked above it were worse there");
          if (unchecked > 0) {
            absl::StrAppend(&choice->why, "; ", unchecked,
                            " ranked above it were not checked there (only the best three are, and the budget may "
                            "have run out)");
          }
        }
        return;
      }
      ++vetoed;
    }
    choice->point = choice->default_point;
    choice->why = bar.has_value() ? "nothing held up on the held-out part: the default"
                                  : "the budget ran out before the held-out check: the default";
  };
  choose(false, &result.bucketalloc);
  choose(true, &result.pytorch);
  for (TuneChoice* c : {&result.bucketalloc, &result.pytorch}) c->conf = ConfOf(points[c->point].allocator);

  // OOMs at the card, the whole trace (not when the budget has run out: said in the result).
  const bool ooms_cut = options.capacity > 0 && s.Expired();
  if (options.capacity > 0 && !s.Expired()) {
    const int list[4] = {result.bucketalloc.point, result.bucketalloc.default_point, result.pytorch.point,
                         result.pytorch.default_point};
    std::vector<absl::StatusOr<ReplayResult>> at(4, absl::UnknownError("not run"));
    ForEachParallel(4, s.jobs(), [&](int k) {
      at[k] = s.ReplayOf(trace, points[list[k]].allocator, options.capacity, /*stop_at_first_oom=*/false);
    });
    for (int k = 0; k < 4; ++k) {
      if (!at[k].ok()) return at[k].status();
    }
    result.bucketalloc.ooms = at[0]->ooms;
    result.bucketalloc.fragmentation_ooms = at[0]->fragmentation_ooms;
    result.bucketalloc.default_ooms = at[1]->ooms;
    result.bucketalloc.default_fragmentation_ooms = at[1]->fragmentation_ooms;
    result.pytorch.ooms = at[2]->ooms;
    result.pytorch.fragmentation_ooms = at[2]->fragmentation_ooms;
    result.pytorch.default_ooms = at[3]->ooms;
    result.pytorch.default_fragmentation_ooms = at[3]->fragmentation_ooms;
  }
  MarkFront(points);
  result.budget_ran_out = held_out_cut || ooms_cut || std::any_of(points.begin(), points.end(), [](const TunePoint& p) {
                            return p.state == "budget";
                          });
  result.points = std::move(points);
  result.seconds = s.Elapsed();
  result.replays = s.replays();
  return result;
}

std::string TuneResult::ToJson() const {
  Json j;
  Json t;
  t["allocations"] = shape.allocations;
  t["large_allocations"] = shape.large_allocations;
  t["peak_live_bytes"] = shape.peak_live_bytes;
  t["recurring_large_sizes"] = shape.recurring_sizes;
  t["recurring_share"] = shape.recurring_share;
  t["tier_sizes"] = shape.tier_sizes;
  t["quantum_bytes"] = shape.quantum_bytes;
  t["large_size_p50"] = shape.large_p50;
  t["large_size_p90"] = shape.large_p90;
  t["large_size_p99"] = shape.large_p99;
  j["trace"] = t;
  j["tuning_part"] = {{"peak_live_bytes", tune_peak_live_bytes}};
  j["held_out_part"] = {{"name", held_out_name}, {"peak_live_bytes", held_out_peak_live_bytes}};
  j["capacity_bytes"] = capacity;
  Json list = Json::array();
  Json front = Json::array();
  for (const TunePoint& p : points) {
    Json q;
    q["allocator"] = p.allocator;
    q["family"] = p.pytorch ? "pytorch" : "bucketalloc";
    q["change"] = p.change;
    q["state"] = p.state;
    q["screen_peak_reserved_bytes"] = p.screen_peak_reserved_bytes;
    q["screen_simulated_backend_ms"] = p.screen_backend_ms;
    if (p.fails_at > 0) q["fails_at_bytes"] = p.fails_at;
    if (!p.error.empty()) q["error"] = p.error;
    q["tuning_part"] = FiguresJson(p.tune);
    q["held_out_part"] = FiguresJson(p.held_out);
    q["on_front"] = p.on_front;
    list.push_back(q);
    if (p.on_front) front.push_back(p.allocator);
  }
  j["points"] = list;
  j["front"] = front;
  j["recommended"] = {{"bucketalloc", points[bucketalloc.point].allocator},
                      {"pytorch", points[pytorch.point].allocator}};
  auto choice = [&](const TuneChoice& c, const char* variable) {
    Json o;
    const TunePoint& p = points[c.point];
    const TunePoint& d = points[c.default_point];
    o["allocator"] = p.allocator;
    o[variable] = c.conf;
    o["why"] = c.why;
    o["tuning_part"] = FiguresJson(p.tune);
    o["held_out_part"] = FiguresJson(p.held_out);
    o["default"] = d.allocator;
    o["default_tuning_part"] = FiguresJson(d.tune);
    o["default_held_out_part"] = FiguresJson(d.held_out);
    if (c.ooms.has_value()) {
      o["ooms_at_capacity"] = *c.ooms;
      o["fragmentation_ooms_at_capacity"] = *c.fragmentation_ooms;
      o["default_ooms_at_capacity"] = *c.default_ooms;
      o["default_fragmentation_ooms_at_capacity"] = *c.default_fragmentation_ooms;
    }
    return o;
  };
  j["bucketalloc"] = choice(bucketalloc, "BUCKETALLOC_CONF");
  j["pytorch"] = choice(pytorch, "PYTORCH_CUDA_ALLOC_CONF");
  j["budget_ran_out"] = budget_ran_out;
  j["seconds"] = seconds;
  j["replays"] = replays;
  return j.dump(2);
}

namespace {

// The front as an SVG plot: x the min capacity over the tuning part's peak live bytes, y the
// driver time on requests' path at it (log scale: the candidates span orders of magnitude).
std::string FrontSvg(const TuneResult& r) {
  constexpr double kW = 760, kH = 380, kLeft = 70, kRight = 20, kTop = 20, kBottom = 50;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const TunePoint& p : r.points) {
    if (!p.tune.has_value()) continue;
    x0 = std::min(x0, p.tune->over_live);
    x1 = std::max(x1, p.tune->over_live);
    const double y = std::log10(std::max(p.tune->driver_time.request_path_ms, 0.01));
    y0 = std::min(y0, y);
    y1 = std::max(y1, y);
  }
  if (x0 > x1) return "<p>No point was measured.</p>";
  const double xpad = std::max(1e-3, (x1 - x0) * 0.08), ypad = std::max(0.05, (y1 - y0) * 0.08);
  x0 -= xpad;
  x1 += xpad;
  y0 -= ypad;
  y1 += ypad;
  auto X = [&](double v) { return kLeft + (v - x0) / (x1 - x0) * (kW - kLeft - kRight); };
  auto Y = [&](double ms) { return kTop + (y1 - std::log10(std::max(ms, 0.01))) / (y1 - y0) * (kH - kTop - kBottom); };
  std::string svg = absl::StrFormat(
      "<svg class=\"chart front\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"min capacity against driver "
      "time on requests' path\">",
      kW, kH);
  for (int k = 0; k <= 4; ++k) {  // the axes' ticks
    const double xv = x0 + (x1 - x0) * k / 4, yv = y0 + (y1 - y0) * k / 4;
    absl::StrAppendFormat(&svg,
                          "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3f</text>",
                          X(xv), kTop, X(xv), kH - kBottom, X(xv), kH - kBottom + 16, xv);
    const double ms = std::pow(10.0, yv);
    absl::StrAppendFormat(&svg,
                          "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>",
                          kLeft, Y(ms), kW - kRight, Y(ms), kLeft - 6, Y(ms) + 4, ms);
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">min capacity / peak live (tuning "
                        "part)</text><text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" "
                        "text-anchor=\"middle\">driver ms on requests' path at min capacity</text>",
                        (kLeft + kW - kRight) / 2, kH - 8, (kTop + kH - kBottom) / 2, (kTop + kH - kBottom) / 2);
  // The front, in order of memory.
  std::vector<const TunePoint*> front;
  for (const TunePoint& p : r.points) {
    if (p.on_front) front.push_back(&p);
  }
  std::sort(front.begin(), front.end(),
            [](const TunePoint* a, const TunePoint* b) { return a->tune->over_live < b->tune->over_live; });
  std::string line;
  for (const TunePoint* p : front)
    absl::StrAppendFormat(&line, "%.1f,%.1f ", X(p->tune->over_live), Y(p->tune->driver_time.request_path_ms));
  if (front.size() > 1) absl::StrAppend(&svg, "<polyline class=\"front-line\" points=\"", line, "\"/>");
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const TunePoint& p = r.points[i];
    if (!p.tune.has_value()) continue;
    absl::StrAppendFormat(
        &svg, "<circle class=\"point %s%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\"><title>%s: %s</title></circle>",
        p.pytorch ? "pytorch" : "bucketalloc", p.on_front ? " on-front" : "", X(p.tune->over_live),
        Y(p.tune->driver_time.request_path_ms), EscapeHtml(p.allocator), EscapeHtml(TuneFiguresText(p.tune)));
  }
  for (const auto& [choice, label] :
       {std::pair{&r.bucketalloc, "recommended bucketalloc"}, std::pair{&r.pytorch, "recommended PyTorch"}}) {
    const TunePoint& p = r.points[choice->point];
    if (!p.tune.has_value()) continue;
    absl::StrAppendFormat(&svg,
                          "<circle class=\"chosen\" cx=\"%.1f\" cy=\"%.1f\" r=\"10\"/>"
                          "<text class=\"chosen-label\" x=\"%.1f\" y=\"%.1f\">%s</text>",
                          X(p.tune->over_live), Y(p.tune->driver_time.request_path_ms), X(p.tune->over_live) + 13,
                          Y(p.tune->driver_time.request_path_ms) - 8, label);
  }
  absl::StrAppend(&svg, "</svg>");
  return svg;
}

}  // namespace

std::string TuneResult::ToHtml(const std::string& recording) const {
  std::string h = absl::StrCat(
      "<h1>Tune: ", EscapeHtml(recording), "</h1><p class=\"meta\">",
      absl::StrFormat("%llu allocations, %llu above 1 MiB; peak live %s. Tuned on the ",
                      static_cast<unsigned long long>(shape.allocations),
                      static_cast<unsigned long long>(shape.large_allocations), FormatBytes(shape.peak_live_bytes)),
      held_out_is_second_half ? "first half" : "whole recording", ", checked on ", EscapeHtml(held_out_name),
      absl::StrFormat(". %d replays in %.1f s.", replays, seconds),
      budget_ran_out ? " The budget ran out: some candidates were not measured." : "", "</p>");
  for (const auto& [c, family, variable] : {std::tuple{&bucketalloc, "bucketalloc", "BUCKETALLOC_CONF"},
                                            std::tuple{&pytorch, "PyTorch", "PYTORCH_CUDA_ALLOC_CONF"}}) {
    const TunePoint& p = points[c->point];
    const TunePoint& d = points[c->default_point];
    absl::StrAppend(&h, "<h2>Recommended for ", family, "</h2><pre class=\"conf\"><code>", variable, "=",
                    EscapeHtml(c->conf), "</code></pre><p>", EscapeHtml(c->why), "</p><table class=\"facts\">",
                    "<tr><th></th><th>tuning part</th><th>", EscapeHtml(held_out_name), "</th></tr><tr><td>",
                    EscapeHtml(p.allocator), "</td><td>", EscapeHtml(TuneFiguresText(p.tune)), "</td><td>",
                    EscapeHtml(TuneFiguresText(p.held_out)), "</td></tr><tr><td>default (", EscapeHtml(d.allocator),
                    ")</td><td>", EscapeHtml(TuneFiguresText(d.tune)), "</td><td>",
                    EscapeHtml(TuneFiguresText(d.held_out)), "</td></tr></table>");
    if (c->ooms.has_value()) {
      absl::StrAppendFormat(&h, "<p>OOMs at %s: %llu (fragmentation %llu); the default %llu (fragmentation %llu).</p>",
                            FormatBytes(capacity), static_cast<unsigned long long>(*c->ooms),
                            static_cast<unsigned long long>(*c->fragmentation_ooms),
                            static_cast<unsigned long long>(*c->default_ooms),
                            static_cast<unsigned long long>(*c->default_fragmentation_ooms));
    }
  }
  absl::StrAppend(&h,
                  "<h2>The front</h2><figure><figcaption>Each measured setting: its min capacity on the tuning "
                  "part and the driver time on requests' path at it (blue: bucketalloc, orange: PyTorch; filled: on "
                  "the front, no point better in memory, request-path time and synchronizations at once; ringed: "
                  "recommended)</figcaption>",
                  FrontSvg(*this),
                  "</figure><h2>Every candidate</h2><div class=\"table-wrap\"><table><tr>"
                  "<th>allocator</th><th>change</th><th>state</th><th>tuning part</th><th>",
                  EscapeHtml(held_out_name), "</th></tr>");
  for (const TunePoint& p : points) {
    absl::StrAppend(&h, "<tr><td><code>", EscapeHtml(p.allocator), "</code></td><td>", EscapeHtml(p.change),
                    "</td><td>", EscapeHtml(p.state), p.on_front ? ", on the front" : "", "</td><td>",
                    EscapeHtml(TunePointText(p)), "</td><td>", EscapeHtml(TuneFiguresText(p.held_out)), "</td></tr>");
  }
  absl::StrAppend(&h, "</table></div>");
  return HtmlPage(absl::StrCat("bucketalloc-bench tune: ", recording), h);
}

}  // namespace bucketalloc::harness
