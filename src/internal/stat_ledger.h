// src/internal/stat_ledger.h — the live statistics of one device (layer L0).
//
// Owns: `StatLedger`, the one place every layer counts into. Each pool keeps its own gauges; the
// "all" entry of a gauge is derived when the stats are read (current, allocated and freed are the
// sums over the pools), and only its peak is kept as it happens: on an increase, the sum of the
// pools' currents is compared with it. So a change of a pool's gauge updates one Stat, not two, on
// the fast path. A pool gauge's freed total is derived too (base + allocated - current, read from
// the others), so a decrease writes its current only. The counters (num_*) and the device-wide
// gauges are kept as they are.
// Invariants (CheckInvariants): for every pool gauge peak >= current >= 0 and its derived freed
// total >= 0, the all-peak at least the sum of the pools' currents; for every device gauge
// current == base + allocated - freed, peak >= current >= 0.
// A debt: a component may change its own state now and count the change later (StatDebtor: a
// large pool's deferred free block, pool/large_pool.h); the ledger has the debt paid before any
// read, and every pool settles it at its entry points before it counts, so that no gauge is
// increased, and no gauge the debt may raise is decreased, while a debt is unpaid (both checked in
// debug builds): every figure read and every peak is what counting at once gives (other decreases
// never move a peak, and the totals are sums). One debtor at a time.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   ledger.Increase(&DeviceStats::active_bytes, kSmallPool, 4096);
//   ledger.Count(&DeviceStats::num_cache_hits);
//   DeviceStats s = ledger.Snapshot();   // s.active_bytes[kAllPools].current == the sum
#ifndef BUCKETALLOC_INTERNAL_STAT_LEDGER_H_
#define BUCKETALLOC_INTERNAL_STAT_LEDGER_H_

#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "bucketalloc/stat_types.h"
#include "internal/check.h"

namespace bucketalloc::internal {

// A pool gauge of DeviceStats (e.g. &DeviceStats::active_bytes).
using PoolGauge = StatArray DeviceStats::*;

// What a component owes the ledger (StatLedger::Owe): PayStats counts, through the ledger's
// updates, the changes it made and has not counted yet, as they would have been counted then.
class StatDebtor {
 public:
  virtual void PayStats() = 0;

 protected:
  ~StatDebtor() = default;
};

class StatLedger {
 public:
  // The updates are on every fast path: always inlined (a TU grown past GCC's inlining budget
  // once turned each into a call, +48 instructions per slab hit pair).
  // Adds n >= 0 to `gauge` of `pool`, and keeps the all-peak.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Increase(PoolGauge gauge, PoolIndex pool, std::int64_t n) {
    BA_DCHECK(owed_ == nullptr, "a gauge increased with a debt unpaid (the pool's entry must Settle first)");
    StatArray& s = stats_.*gauge;
    s[pool].Increase(n);
    KeepAllPeak(s, 0);
  }
  // Subtracts n >= 0 from `gauge` of `pool` (its freed total is derived).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Decrease(PoolGauge gauge, PoolIndex pool, std::int64_t n) {
    BA_DCHECK(owed_ == nullptr || !DebtMayRaise(gauge),
              "a gauge a debt may raise decreased with the debt unpaid (its peak would be counted too low)");
    (stats_.*gauge)[pool].current -= n;
  }
  // The gauges a debt (a deferred free block's return) may raise: while one is unpaid, none of them
  // may move, or its peaks, counted when the debt is paid, would come out wrong.
  static constexpr bool DebtMayRaise(PoolGauge gauge) {
    return gauge == &DeviceStats::cached_bytes || gauge == &DeviceStats::inactive_split_bytes ||
           gauge == &DeviceStats::inactive_split;
  }
  // Adds `delta` (either sign).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Add(PoolGauge gauge, PoolIndex pool, std::int64_t delta) {
    if (delta > 0) {
      Increase(gauge, pool, delta);
    } else if (delta < 0) {
      Decrease(gauge, pool, -delta);
    }
  }
  // `gauge` of `pool` moved and came back, and nothing else changed meanwhile: its totals and peaks
  // as the two updates would leave them, its current as it is. Only for a debtor settling its own
  // debt (they do not settle one). Rise: up by n >= 0 and down; Dip: down by n >= 0 and up (no
  // peak moves); Excursion: by `delta` of either sign and back.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Rise(PoolGauge gauge, PoolIndex pool, std::int64_t n) {
    StatArray& s = stats_.*gauge;
    Stat& own = s[pool];
    own.allocated += n;  // and the derived freed total
    if (own.current + n > own.peak) own.peak = own.current + n;
    KeepAllPeak(s, n);
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Dip(PoolGauge gauge, PoolIndex pool, std::int64_t n) {
    (stats_.*gauge)[pool].allocated += n;  // and the derived freed total
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Excursion(PoolGauge gauge, PoolIndex pool, std::int64_t delta) {
    if (delta > 0) {
      Rise(gauge, pool, delta);
    } else if (delta < 0) {
      Dip(gauge, pool, -delta);
    }
  }
  // The current value of a pool's gauge (pool > kAllPools), or of the sum (kAllPools).
  std::int64_t Current(PoolGauge gauge, PoolIndex pool) const;

  // `debtor` owes the ledger from now until it is paid (Settle) or forgiven. Precondition: nothing
  // is owed (the debtor settled before it changed its state).
  void Owe(StatDebtor* debtor) {
    BA_DCHECK(owed_ == nullptr, "a debt made while another is unpaid (settle first)");
    owed_ = debtor;
  }
  // The debtor counts its debt itself, with what it counts next (a deferred block taken back).
  void Forgive() { owed_ = nullptr; }
  bool owes(const StatDebtor* debtor) const { return owed_ == debtor; }
  // Has the debt, if any, paid (logically const: every read calls it).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Settle() const {
    if (owed_ != nullptr) [[unlikely]]
      PayDebt();
  }

  // A counter (e.g. &DeviceStats::num_cache_hits).
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Count(std::int64_t DeviceStats::*counter, std::int64_t n = 1) {
    stats_.*counter += n;
  }
  std::int64_t counter(std::int64_t DeviceStats::*counter) const {
    Settle();
    return stats_.*counter;
  }
  // A device-wide gauge (e.g. &DeviceStats::oversize_segments).
  Stat& device(Stat DeviceStats::*gauge) {
    Settle();
    return stats_.*gauge;
  }

  // The fields that are not gauges: the cap and max_split_size.
  void SetCapacity(std::int64_t bytes) { stats_.capacity_bytes = bytes; }
  void SetMaxSplitSize(std::int64_t bytes) { stats_.max_split_size = bytes; }

  // The stats with every "all" entry filled in. `since_start`: the counters and the gauges'
  // allocated and freed totals since the ledger was made, whatever ResetAccumulated zeroed (what
  // monotonic exporters read: Prometheus counters, the timeline).
  DeviceStats Snapshot(bool since_start = false) const;
  // Resets every peak to its current value (the all-peaks to the sums).
  void ResetPeaks();
  // Resets the accumulated stats (PyTorch's resetAccumulatedStats): every gauge's allocated and
  // freed totals and every counter to 0; currents and peaks stay.
  void ResetAccumulated();
  absl::Status CheckInvariants() const;

 private:
  // The all-peak of a gauge when its pools' currents sum to more by `extra`.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void KeepAllPeak(StatArray& s, std::int64_t extra) {
    std::int64_t sum = extra;
    for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) sum += s[p].current;
    if (sum > s[kAllPools].peak) s[kAllPools].peak = sum;
  }
  void PayDebt() const;
  // A pool gauge's freed total since the last ResetAccumulated.
  static std::int64_t FreedOf(const Stat& s, const Stat& base) { return base.current + s.allocated - s.current; }

  // The debtor, or nullptr. mutable: a read has the debt paid, which changes the figures as they
  // would have changed (logically const).
  mutable StatDebtor* owed_ = nullptr;
  // The "all" entries hold only the peak; a pool gauge's `freed` is unused (derived).
  DeviceStats stats_;
  // Each gauge's current value at the last ResetAccumulated (zero before one): per gauge, its freed
  // total is base_.current + allocated - current (a pool gauge's by definition, a device gauge's
  // an invariant).
  DeviceStats base_;
  // The counters and allocated/freed totals ResetAccumulated zeroed, summed over every reset.
  DeviceStats zeroed_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_STAT_LEDGER_H_
