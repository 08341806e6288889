// src/frontend/core/device_check.cc — the device-wide invariant check (frontend/core/device_allocator.h):
// each component checks itself, and this sums what they report and holds the sums against each
// other and the stats.
#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frontend/core/device_allocator.h"
#include "internal/check.h"

namespace bucketalloc::internal {
void DeviceAllocator::MaybeCheckInvariants() const {
#ifdef NDEBUG
  if (!options_.debug_check_invariants) return;
#endif
  absl::Status s = CheckInvariantsLocked();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    BA_CHECK(false, "bucketalloc invariant violated (debug_check_invariants)");
  }
}

absl::Status DeviceAllocator::CheckInvariants() const {
  MutexLock lock(mu_);
  return CheckInvariantsLocked();
}

absl::Status DeviceAllocator::CheckInvariantsLocked() const {
  auto fail = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("bucketalloc invariant violated on device ", device_, ": ", what));
  };
  // Each component checks itself.
  for (absl::Status s :
       {stats_.CheckInvariants(), live_.CheckInvariants(), history_.CheckInvariants(),
        registry_.CheckInvariants(SpareBytes()), imports_.CheckInvariants(),
        pending_.CheckInvariants([&](std::uintptr_t p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return live_.contains(p); })}) {
    if (!s.ok()) return fail(s.message());
  }
  // The live and pending entries, summed per pool: what the pools, the registry and the stats must
  // agree with.
  struct Sums {
    std::int64_t requested = 0, allocated = 0, count = 0, active_bytes = 0, active = 0;
  };
  Sums sums[kNumPoolIndices];
  std::int64_t oversize = 0;
  std::vector<std::int64_t> tags(private_.num_tags());
  // Active blocks per private pool tag and pool index (tag 0: the device's own pools).
  std::vector<std::array<std::int64_t, Pools::kNumPools>> active_by_tag(private_.num_tags());
  std::vector<std::pair<std::uintptr_t, std::size_t>> blocks;
  blocks.reserve(live_.size() + pending_.size());
  absl::Status entries;
  auto visit = [&](std::uintptr_t ptr, const LiveEntry& e, bool live) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!entries.ok()) return;
    const std::uint16_t tag = e.private_pool;
    if (tag != 0 && !private_.contains(tag)) {
      entries = fail("an entry names a private pool that does not exist");
      return;
    }
    ++tags[tag];
    PoolsOf(tag).Visit(e.handle, [&](const auto& pool, auto h) {
      using P = PoolType<decltype(pool)>;
      const std::size_t size = P::BlockSize(h);
      if (absl::Status s = pool.CheckHandle(h, live); !s.ok()) {
        entries = fail(s.message());
      } else if (P::Address(h) != ptr) {
        entries = fail("a live entry's block starts elsewhere");
      } else if (e.requested > size) {
        entries = fail("a block is smaller than its request");
      }
      Sums& s = sums[P::kIndex];
      if (live) {
        s.requested += static_cast<std::int64_t>(e.requested);
        s.allocated += static_cast<std::int64_t>(size);
        s.count += 1;
        oversize += pool.Oversize(h);
      }
      s.active_bytes += static_cast<std::int64_t>(size);
      s.active += 1;
      active_by_tag[tag][Pools::SlotOf<P>()] += 1;
      blocks.emplace_back(ptr, size);
    });
  };
  live_.ForEach([&](std::uintptr_t ptr, const LiveEntry& e) { visit(ptr, e, true); });
  pending_.ForEach([&](std::uintptr_t ptr, const LiveEntry& e) { visit(ptr, e, false); });
  if (!entries.ok()) return entries;
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 0; i + 1 < blocks.size(); ++i) {
    if (blocks[i].first + blocks[i].second > blocks[i + 1].first) {
      return fail(
          absl::StrCat("live blocks overlap at ", absl::Hex(blocks[i].first), " and ", absl::Hex(blocks[i + 1].first)));
    }
  }
  if (absl::Status s = registry_.CheckHolds(blocks); !s.ok()) return fail(s.message());
  if (absl::Status s = private_.CheckInvariants(tags); !s.ok()) return fail(s.message());
  // Each pool checks itself, given the active blocks the entries name; and its units are exactly
  // the registered ranges.
  absl::Status pools;
  std::vector<SegmentRegistry::Range> units;  // every pool's segments and slabs, for the registry
  std::int64_t spare[kNumPoolIndices] = {};   // reserved bytes in no unit (spare pieces)
  InactiveSplit split[kNumPoolIndices];
  // Returns the reserved bytes the pools hold: what their units map and their spares hold.
  auto check_pools =
      [&](std::uint16_t tag, const Pools& instance,
          const absl::flat_hash_map<Stream, std::unique_ptr<StreamPools>>& streams) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        std::int64_t held = 0;
        instance.ForEach([&](const auto& pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          using P = PoolType<decltype(pool)>;
          spare[P::kIndex] += static_cast<std::int64_t>(pool.spare_bytes());
          const InactiveSplit is = pool.inactive_split();
          split[P::kIndex].bytes += is.bytes;
          split[P::kIndex].count += is.count;
          if (pools.ok()) pools = pool.CheckInvariants(active_by_tag[tag][Pools::SlotOf<P>()]);
          std::size_t largest = 0;  // kept: each stream's lists'
          for (const auto& [stream, sp] : streams) {
            if (pools.ok()) pools = pool.CheckStreamState(sp->template of<P>());
            largest = std::max(largest, pool.LargestFree(sp->template of<P>()));
          }
          FragmentationReport walked;
          pool.WalkFragmentation(&walked);
          if (pools.ok() && static_cast<std::int64_t>(largest) != walked.pools[P::kIndex].largest_free) {
            pools = absl::InternalError(absl::StrCat(kPoolNames[P::kIndex].key,
                                                     ": the largest free block of the streams' lists is ", largest,
                                                     " bytes, a walk finds ", walked.pools[P::kIndex].largest_free));
          }
          held += static_cast<std::int64_t>(pool.spare_bytes());
          pool.ForEachUnit([&](std::uintptr_t base, std::size_t bytes, std::size_t mapped, bool virtual_memory) {
            SegmentRegistry::Range& u = units.emplace_back();
            u.base = base;
            u.bytes = bytes;
            u.pool = P::kIndex;
            u.virtual_memory = virtual_memory;
            u.mapped = mapped;
            held += static_cast<std::int64_t>(mapped);
          });
        });
        return held;
      };
  // The reserved bytes counted for a pool (tag; 0: the device's own) are what its units map and
  // its spares hold (`held`, as check_pools summed them).
  auto check_owned = [&](std::uint16_t tag, std::int64_t held, const std::string& name) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const StatArray* owned = registry_.OwnedReserved(tag);
    const std::int64_t counted = owned == nullptr ? 0 : (*owned)[kAllPools].current;
    if (pools.ok() && counted != held) {
      pools = absl::InternalError(
          absl::StrCat(name, " holds ", held, " reserved bytes but ", counted, " are counted for it"));
    }
  };
  check_owned(0, check_pools(0, pools_, streams_), "the device's own pool");
  private_.ForEach([&](std::uint16_t tag, const PrivatePools::Pool& p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (pools.ok() && p.freeable() && !p.pools->HoldsMemory()) {
      pools = absl::InternalError("a freeable private pool that holds no memory is still kept");
    }
    check_owned(tag, check_pools(tag, *p.pools, p.streams),
                absl::StrCat("private pool (", p.id.first, ", ", p.id.second, ")"));
  });
  // Tenants: their pools, caps and kept uses (a walk over the live and pending blocks).
  if (pools.ok()) {
    pools = tenants_.CheckInvariants([&](DeviceTenants::AddBlock add) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      auto walk = [&](const LiveEntry& e, bool live) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        PoolsOf(e.private_pool).Visit(e.handle, [&](const auto& pool, auto h) {
          using P = PoolType<decltype(pool)>;
          add(e.private_pool, P::kIndex, P::BlockSize(h), e.requested, live);
        });
      };
      live_.ForEach([&](std::uintptr_t, const LiveEntry& e) { walk(e, true); });
      pending_.ForEach([&](std::uintptr_t, const LiveEntry& e) { walk(e, false); });
    });
  }
  if (!pools.ok()) return fail(pools.message());
  if (absl::Status s = registry_.CheckUnits(units); !s.ok()) return fail(s.message());
  const SegmentRegistry::Totals totals = registry_.totals();
  // The stats: every gauge equals the sum of what the components hold.
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {
    const auto pool = static_cast<PoolIndex>(p);
    const std::int64_t reserved = totals.reserved[p] + spare[p];  // spares are reserved too
    const Sums& s = sums[p];
    struct Expect {
      const char* name;
      PoolGauge gauge;
      std::int64_t want;
    };
    for (const Expect& x : {Expect{"requested_bytes", &DeviceStats::requested_bytes, s.requested},
                            Expect{"allocated_bytes", &DeviceStats::allocated_bytes, s.allocated},
                            Expect{"allocation", &DeviceStats::allocation, s.count},
                            Expect{"active_bytes", &DeviceStats::active_bytes, s.active_bytes},
                            Expect{"active", &DeviceStats::active, s.active},
                            Expect{"reserved_bytes", &DeviceStats::reserved_bytes, reserved},
                            Expect{"segment", &DeviceStats::segment, totals.segments[p]},
                            Expect{"cached_bytes", &DeviceStats::cached_bytes, reserved - s.active_bytes},
                            Expect{"inactive_split_bytes", &DeviceStats::inactive_split_bytes, split[p].bytes},
                            Expect{"inactive_split", &DeviceStats::inactive_split, split[p].count}}) {
      if (const std::int64_t got = stats_.Current(x.gauge, pool); got != x.want) {
        return fail(absl::StrCat(x.name, ".", kPoolNames[p].key, " is ", got, " but the components hold ", x.want));
      }
    }
  }
  const DeviceStats now = stats_.Snapshot();
  if (now.oversize_segments.current != registry_.LargeRangesOver(options_.max_split_size) ||
      now.oversize_allocations.current != oversize) {
    return fail("oversize_segments or oversize_allocations does not match the blocks");
  }
  std::int64_t by_cause = 0;
  for (std::int64_t n : OomCounts(now)) by_cause += n;
  if (now.num_ooms != by_cause) {
    return fail(absl::StrCat("num_ooms is ", now.num_ooms, " but its causes add up to another count"));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
