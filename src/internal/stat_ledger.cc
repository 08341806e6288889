// src/internal/stat_ledger.cc — reading and checking the ledger (src/internal/stat_ledger.h).
#include "internal/stat_ledger.h"

#include "absl/strings/str_cat.h"

namespace bucketalloc::internal {

void StatLedger::PayDebt() const {
  StatDebtor* debtor = owed_;
  owed_ = nullptr;  // first: paying increases gauges, which check that nothing is owed
  debtor->PayStats();
}

std::int64_t StatLedger::Current(PoolGauge gauge, PoolIndex pool) const {
  Settle();
  const StatArray& s = stats_.*gauge;
  if (pool != kAllPools) return s[pool].current;
  std::int64_t sum = 0;
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) sum += s[p].current;
  return sum;
}

DeviceStats StatLedger::Snapshot(bool since_start) const {
  Settle();
  DeviceStats out = stats_;
#define BUCKETALLOC_DERIVE_FREED(name, doc) \
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) out.name[p].freed = FreedOf(stats_.name[p], base_.name[p]);
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_DERIVE_FREED)
#undef BUCKETALLOC_DERIVE_FREED
  if (since_start) {
    const auto add = [](Stat& s, const Stat& zeroed) {
      s.allocated += zeroed.allocated;
      s.freed += zeroed.freed;
    };
#define BUCKETALLOC_ADD_TOTALS(name, doc) \
  for (int p = 0; p < kNumPoolIndices; ++p) add(out.name[p], zeroed_.name[p]);
    BUCKETALLOC_POOL_STATS(BUCKETALLOC_ADD_TOTALS)
#undef BUCKETALLOC_ADD_TOTALS
#define BUCKETALLOC_ADD_COUNTER(name, doc) out.name += zeroed_.name;
    BUCKETALLOC_COUNTERS(BUCKETALLOC_ADD_COUNTER)
#undef BUCKETALLOC_ADD_COUNTER
#define BUCKETALLOC_ADD_DEVICE_TOTALS(name, doc) add(out.name, zeroed_.name);
    BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_ADD_DEVICE_TOTALS)
#undef BUCKETALLOC_ADD_DEVICE_TOTALS
  }
#define BUCKETALLOC_FILL_ALL(name, doc)                     \
  {                                                         \
    Stat& all = out.name[kAllPools];                        \
    all.current = all.allocated = all.freed = 0;            \
    for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) { \
      all.current += out.name[p].current;                   \
      all.allocated += out.name[p].allocated;               \
      all.freed += out.name[p].freed;                       \
    }                                                       \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_FILL_ALL)
#undef BUCKETALLOC_FILL_ALL
  return out;
}

void StatLedger::ResetAccumulated() {
  Settle();
  // Each gauge's current value becomes its base: freed == base + allocated - current still holds.
  const auto reset = [](Stat& s, Stat& base, Stat& zeroed) {
    base.current = s.current;
    zeroed.allocated += s.allocated;
    zeroed.freed += s.freed;
    s.allocated = s.freed = 0;
  };
#define BUCKETALLOC_RESET_TOTALS(name, doc)                                                         \
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {                                           \
    stats_.name[p].freed = FreedOf(stats_.name[p], base_.name[p]); /* the derived total, to zero */ \
    reset(stats_.name[p], base_.name[p], zeroed_.name[p]);                                          \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_RESET_TOTALS)
#undef BUCKETALLOC_RESET_TOTALS
#define BUCKETALLOC_RESET_COUNTER(name, doc) \
  zeroed_.name += stats_.name;               \
  stats_.name = 0;
  BUCKETALLOC_COUNTERS(BUCKETALLOC_RESET_COUNTER)
#undef BUCKETALLOC_RESET_COUNTER
#define BUCKETALLOC_RESET_DEVICE_TOTALS(name, doc) reset(stats_.name, base_.name, zeroed_.name);
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_RESET_DEVICE_TOTALS)
#undef BUCKETALLOC_RESET_DEVICE_TOTALS
}

void StatLedger::ResetPeaks() {
  Settle();
#define BUCKETALLOC_RESET_PEAK(name, doc)                   \
  {                                                         \
    std::int64_t sum = 0;                                   \
    for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) { \
      stats_.name[p].ResetPeak();                           \
      sum += stats_.name[p].current;                        \
    }                                                       \
    stats_.name[kAllPools].peak = sum;                      \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_RESET_PEAK)
#undef BUCKETALLOC_RESET_PEAK
#define BUCKETALLOC_RESET_DEVICE_PEAK(name, doc) stats_.name.ResetPeak();
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_RESET_DEVICE_PEAK)
#undef BUCKETALLOC_RESET_DEVICE_PEAK
}

absl::Status StatLedger::CheckInvariants() const {
  Settle();
  auto consistent = [](const Stat& s, const Stat& base) {
    return s.current == base.current + s.allocated - s.freed && s.peak >= s.current && s.current >= 0;
  };
#define BUCKETALLOC_CHECK_GAUGE(name, doc)                                                                  \
  {                                                                                                         \
    std::int64_t sum = 0;                                                                                   \
    for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {                                                 \
      const Stat& s = stats_.name[p];                                                                       \
      const std::int64_t freed = FreedOf(s, base_.name[p]);                                                 \
      if (s.peak < s.current || s.current < 0 || freed < 0 || s.allocated < 0) {                            \
        return absl::InternalError(absl::StrCat("stats: ", #name, ".", kPoolNames[p].key,                   \
                                                " is inconsistent: current ", s.current, ", peak ", s.peak, \
                                                ", allocated ", s.allocated, ", freed (derived) ", freed)); \
      }                                                                                                     \
      sum += s.current;                                                                                     \
    }                                                                                                       \
    if (stats_.name[kAllPools].peak < sum) {                                                                \
      return absl::InternalError(absl::StrCat("stats: ", #name, ".all peak ", stats_.name[kAllPools].peak,  \
                                              " is below the pools' sum ", sum));                           \
    }                                                                                                       \
  }
  BUCKETALLOC_POOL_STATS(BUCKETALLOC_CHECK_GAUGE)
#undef BUCKETALLOC_CHECK_GAUGE
#define BUCKETALLOC_CHECK_DEVICE_GAUGE(name, doc)                                                                  \
  if (!consistent(stats_.name, base_.name)) {                                                                      \
    return absl::InternalError(absl::StrCat("stats: ", #name, " is inconsistent: current ", stats_.name.current)); \
  }
  BUCKETALLOC_DEVICE_STATS(BUCKETALLOC_CHECK_DEVICE_GAUGE)
#undef BUCKETALLOC_CHECK_DEVICE_GAUGE
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
