// The OOM diagnosis (src/frontend/observability/oom_diagnosis.cc) from a table of situations: each names its
// cause by the first matching row of docs/architecture.md's table, with the numbers behind it.
#include "frontend/observability/oom_diagnosis.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace bucketalloc::internal {
namespace {

constexpr std::size_t M = kMiB;

struct Row {
  const char* name;
  OomSituation situation;
  OomCause cause;
  std::vector<std::string> says;  // substrings of the diagnosis
};

OomSituation Base() {
  OomSituation s;
  s.device = 3;
  s.pool = kLargePool;
  s.requested = 30 * M;
  s.rounded = 30 * M;
  s.segment = 30 * M;
  s.capacity = 100 * M;
  s.figures.reserved = 100 * M;
  s.figures.allocated = 60 * M;
  s.figures.requested = 60 * M;
  s.figures.active = 60 * M;
  s.figures.cached = 40 * M;
  s.pool_cached = 40 * M;
  s.device_free = 5 * M;
  s.failure = "sim backend: out of memory";
  s.fragmentation.pools[kLargePool].largest_free = 12 * M;
  return s;
}

std::vector<Row> Table() {
  std::vector<Row> rows;
  {
    OomSituation s = Base();
    s.figures.allocated = s.figures.active = s.figures.requested = 80 * M;  // 80 live + 30 asked > 100
    s.pool_cached = 20 * M;
    rows.push_back({"capacity: the working set does not fit",
                    s,
                    OomCause::kCapacity,
                    {"capacity: live allocations (80.00 MiB requested) plus this request (30.00 MiB) exceed the "
                     "cap (100.00 MiB)"}});
  }
  {
    // roundup_power2_divisions: 60 MiB asked is held as 75 MiB, and 30 MiB rounds to 32 MiB. What
    // the callers asked for fits (90 <= 100): the rounding is the allocator's, so fragmentation,
    // and the harness counts it the same way (WorkingSetExceedsCap).
    OomSituation s = Base();
    s.figures.allocated = s.figures.active = 75 * M;
    s.rounded = s.segment = 32 * M;
    s.pool_cached = 25 * M;
    rows.push_back({"rounding past the cap is fragmentation, not capacity",
                    s,
                    OomCause::kFragmentation,
                    {"fragmentation:",
                     "rounding alone exceeds the cap: the live blocks (75.00 MiB for 60.00 MiB "
                     "requested) and this request (32.00 MiB for 30.00 MiB) round up past 100.00 MiB"}});
  }
  {
    OomSituation s = Base();
    s.figures.reserved = s.figures.active = s.figures.allocated =
        20 * M;  // 80 MiB under the cap, yet the device refused
    s.pool_cached = 0;
    rows.push_back({"device exhausted: the cap allows it, the device refused",
                    s,
                    OomCause::kDeviceExhausted,
                    {"device exhausted: the cap leaves 80.00 MiB", "refused 30.00 MiB", "device free 5.00 MiB",
                     "sim backend: out of memory"}});
  }
  {
    OomSituation s = Base();
    s.figures.active = 90 * M;  // 30 MiB pending on streams that could not be synchronized
    s.pool_cached = 10 * M;
    rows.push_back({"cache held: pending frees hold what the pool lacks",
                    s,
                    OomCause::kCacheHeld,
                    {"cache held: 30.00 MiB is held by freed blocks awaiting stream events", "reserved 100.00 MiB",
                     "allocated 60.00 MiB"}});
  }
  {
    OomSituation s = Base();  // 40 MiB cached in pieces, the largest 12 MiB
    rows.push_back({"fragmentation: enough free, in pieces",
                    s,
                    OomCause::kFragmentation,
                    {"fragmentation: 40.00 MiB is free in total (40.00 MiB cached in pieces of partly used large-pool "
                     "memory, the largest 12.00 MiB; 0 B in the other pool; 0 B under the cap) but no free block fits "
                     "30.00 MiB"}});
  }
  {
    OomSituation s = Base();
    s.figures.active = 70 * M;  // pending, but the pool's cache and the headroom would have covered the request
    s.pool_cached = 30 * M;
    rows.push_back(
        {"pending frees that did not matter: fragmentation", s, OomCause::kFragmentation, {"fragmentation:"}});
  }
  {
    OomSituation s = Base();
    s.pool = kSmallPool;
    s.requested = s.rounded = 1 * M;
    s.segment = 2 * M;
    s.pool_cached = 1 * M;  // the rest of the cache is the large pool's
    s.fragmentation.pools[kSmallPool].largest_free = 512 * kKiB;
    rows.push_back({"a small request: the other pool's cache is named",
                    s,
                    OomCause::kFragmentation,
                    {"partly used small-pool memory, the largest 512.00 KiB; 39.00 MiB in the other pool"}});
  }
  {
    OomSituation s = Base();
    s.stitching = true;
    s.movable = 8 * M;
    rows.push_back({"with stitching: what could move and what lies in shared pieces",
                    s,
                    OomCause::kFragmentation,
                    {"stitching could move 8.00 MiB of whole free pieces, and 32.00 MiB of the free large-pool "
                     "memory lies in pieces shared with live blocks"}});
  }
  {
    OomSituation s = Base();
    s.figures.allocated = s.figures.active = s.figures.requested =
        71 * M;                   // 71 + 30 > 100: capacity wins over every later row
    s.figures.reserved = 80 * M;  // and the device also refused (headroom 20 < 30: no)
    rows.push_back({"capacity comes first", s, OomCause::kCapacity, {"capacity:"}});
  }
  // The figures' invariant: cached == reserved - active.
  for (Row& row : rows) row.situation.figures.cached = row.situation.figures.reserved - row.situation.figures.active;
  return rows;
}

TEST(OomDiagnosisTableTest, EachSituationNamesItsCauseAndTheNumbers) {
  for (const Row& row : Table()) {
    SCOPED_TRACE(row.name);
    const OomReport r = DiagnoseOom(row.situation);
    EXPECT_EQ(r.cause, row.cause) << r.diagnosis;
    EXPECT_TRUE(absl::StartsWith(r.diagnosis, OomCauseName(row.cause))) << r.diagnosis;
    for (const std::string& s : row.says) EXPECT_TRUE(absl::StrContains(r.diagnosis, s)) << r.diagnosis;
    EXPECT_EQ(r.device, 3);
    EXPECT_EQ(r.requested, row.situation.requested);
    EXPECT_EQ(r.cached, row.situation.figures.cached);
    EXPECT_EQ(r.largest_free,
              static_cast<std::size_t>(row.situation.fragmentation.pools[row.situation.pool].largest_free));
    EXPECT_TRUE(absl::StrContains(r.ToString(), r.diagnosis));
    EXPECT_TRUE(absl::StrContains(r.ToJson(), OomCauseName(row.cause)));
  }
}

TEST(OomDiagnosisTableTest, WithoutStitchingNothingIsSaidOfGranules) {
  const OomReport r = DiagnoseOom(Base());
  EXPECT_FALSE(absl::StrContains(r.diagnosis, "granules")) << r.diagnosis;
}

}  // namespace
}  // namespace bucketalloc::internal
