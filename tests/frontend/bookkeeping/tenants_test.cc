// Tenants (Options::tenants, frontend/bookkeeping/tenants.h, DeviceAllocator's tenant pools), over every
// configuration: a request goes to its stream's tenant, else to its thread's, else to the default
// tenant; one tenant's cache never serves another (every live block lies in a segment of its own
// tenant); each tenant's reserved bytes stay within its cap; the tenants' figures add up to the
// device's; an OOM names the tenant and its cap; a cap lowered at run time releases the tenant's
// cache and refuses its growth, and never frees live memory; bad names and caps are refused with
// the accepted values. Then the component alone (frontend/bookkeeping/tenants.h): Tenants' lookups, caches and
// caps, and DeviceTenants' pools, accounting and check over a registry and private pools of the
// simulated device.
#include "frontend/bookkeeping/tenants.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/testing/sim_backend.h"
#include "bucketalloc/timeline.h"
#include "frontend/bookkeeping/private_pools.h"
#include "frontend/bookkeeping/segment_registry.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::MakeAllocator;
using ::bucketalloc::testing::TestStream;

constexpr std::size_t kShortCap = 16 * kMiB;
constexpr std::size_t kLongCap = 24 * kMiB;

class TenantsTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const std::string conf = GetParam().conf;
    allocator_ = MakeAllocator(absl::StrCat(conf, conf.empty() ? "" : ",", "tenants:[short:16MiB,long:24MiB]"));
    ASSERT_NE(allocator_, nullptr) << GetParam().conf;
  }
  void TearDown() override {
    if (allocator_ == nullptr) return;
    ASSERT_TRUE(allocator_->SetThreadTenant("default").ok());
    absl::Status s = allocator_->CheckInvariants(0);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::map<std::string, TenantStats> Tenants() {
    std::map<std::string, TenantStats> out;
    absl::StatusOr<std::vector<TenantStats>> t = allocator_->GetTenantStats(0);
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) {
      for (const TenantStats& s : *t) out[s.name] = s;
    }
    return out;
  }
  // The tenant of the segment holding `ptr`, from the snapshot ("" when none holds it).
  std::string SegmentTenant(const MemorySnapshot& snap, void* ptr) {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (const SegmentSnapshot& s : snap.segments) {
      if (addr >= s.address && addr < s.address + s.total_size) return s.tenant;
    }
    return "";
  }
  // The tenants' figures add up to the device's, and each holds its cap.
  void ExpectTenantsAddUp() {
    const DeviceStats d = *allocator_->GetStats(0);
    std::size_t reserved = 0, allocated = 0, active = 0, cached = 0, requested = 0;
    std::int64_t live = 0;
    for (const auto& [name, t] : Tenants()) {
      reserved += t.reserved;
      allocated += t.allocated;
      active += t.active;
      cached += t.cached;
      requested += t.requested;
      live += t.live_allocations;
      EXPECT_LE(t.reserved, t.cap) << name;
      EXPECT_LE(t.allocated + t.cached, t.reserved) << name;
      EXPECT_EQ(t.cached, t.reserved - t.active) << name;  // the memory figures' invariant
    }
    EXPECT_EQ(reserved, static_cast<std::size_t>(d.reserved_bytes[kAllPools].current));
    EXPECT_EQ(allocated, static_cast<std::size_t>(d.allocated_bytes[kAllPools].current));
    EXPECT_EQ(active, static_cast<std::size_t>(d.active_bytes[kAllPools].current));
    EXPECT_EQ(cached, static_cast<std::size_t>(d.cached_bytes[kAllPools].current));
    EXPECT_EQ(requested, static_cast<std::size_t>(d.requested_bytes[kAllPools].current));
    EXPECT_EQ(live, d.allocation[kAllPools].current);
  }
  std::unique_ptr<Allocator> allocator_;
};

TEST_P(TenantsTest, ChurnKeepsEachTenantInItsOwnPoolsUnderItsCap) {
  // Three request sources: the default tenant (no binding), a thread tenant ("short") and a bound
  // stream ("long"); sizes from small-pool blocks to several segments.
  const Stream bound = TestStream(7);
  ASSERT_TRUE(allocator_->BindStream(bound, "long").ok());
  std::mt19937_64 rng(11);
  const std::size_t sizes[] = {512, 3000, 100000, kMiB + 17, 3 * kMiB, 6 * kMiB};
  struct Live {
    void* ptr;
    std::string tenant;
  };
  std::vector<Live> live;
  std::map<std::string, int> ooms;
  for (int step = 0; step < 1500; ++step) {
    if (!live.empty() && rng() % 2 == 0) {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(allocator_->Free(live[i].ptr).ok());
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    const int source = static_cast<int>(rng() % 3);
    const std::string tenant = source == 0 ? "default" : source == 1 ? "short" : "long";
    ASSERT_TRUE(allocator_->SetThreadTenant(source == 1 ? "short" : "default").ok());
    const Stream stream = source == 2 ? bound : TestStream(1);
    absl::StatusOr<void*> p = allocator_->Allocate(sizes[rng() % std::size(sizes)], 0, stream);
    if (!p.ok()) {
      ASSERT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
      EXPECT_TRUE(absl::StrContains(p.status().message(), absl::StrCat("for tenant '", tenant, "'"))) << p.status();
      ++ooms[tenant];
      continue;
    }
    live.push_back({*p, tenant});
    if (step % 50 == 0) {
      // No cross-tenant reuse: every live block lies in a segment of its own tenant.
      absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot(0);
      ASSERT_TRUE(snap.ok());
      for (const Live& l : live) ASSERT_EQ(SegmentTenant(*snap, l.ptr), l.tenant) << step;
      ExpectTenantsAddUp();
    }
  }
  // The capped tenants met their caps (the churn is sized to), and their OOMs are counted as theirs.
  std::map<std::string, TenantStats> t = Tenants();
  EXPECT_EQ(t["short"].ooms, ooms["short"]);
  EXPECT_EQ(t["long"].ooms, ooms["long"]);
  EXPECT_EQ(t["default"].ooms, ooms["default"]);
  EXPECT_GT(ooms["long"], 0) << "the churn never met the long tenant's cap";
  EXPECT_LE(t["short"].peak_reserved, kShortCap);
  EXPECT_LE(t["long"].peak_reserved, kLongCap);
  for (const Live& l : live) ASSERT_TRUE(allocator_->Free(l.ptr).ok());
  ExpectTenantsAddUp();
}

TEST_P(TenantsTest, OneTenantsCacheNeverServesAnother) {
  ASSERT_TRUE(allocator_->SetThreadTenant("short").ok());
  absl::StatusOr<void*> a = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(allocator_->Free(*a).ok());  // cached by "short"
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  absl::StatusOr<void*> b = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
  ASSERT_TRUE(allocator_->SetThreadTenant("short").ok());
  absl::StatusOr<void*> c = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*a, *c) << "the tenant's own cache serves it again";
  ASSERT_TRUE(allocator_->Free(*b).ok());
  ASSERT_TRUE(allocator_->Free(*c).ok());
}

TEST_P(TenantsTest, AStreamBindingComesBeforeTheThreadsTenant) {
  ASSERT_TRUE(allocator_->BindStream(TestStream(3), "short").ok());
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  EXPECT_EQ(allocator_->ThreadTenant(), "long");
  absl::StatusOr<void*> on_bound = allocator_->Allocate(kMiB, 0, TestStream(3));
  absl::StatusOr<void*> elsewhere = allocator_->Allocate(kMiB, 0, TestStream(4));
  ASSERT_TRUE(on_bound.ok() && elsewhere.ok());
  std::map<std::string, TenantStats> t = Tenants();
  EXPECT_EQ(t["short"].live_allocations, 1);
  EXPECT_EQ(t["long"].live_allocations, 1);
  EXPECT_EQ(t["default"].live_allocations, 0);
  // Unbound, the stream follows the thread; another thread has its own tenant (default here).
  ASSERT_TRUE(allocator_->BindStream(TestStream(3), "default").ok());
  absl::StatusOr<void*> unbound = allocator_->Allocate(kMiB, 0, TestStream(3));
  void* other_thread = nullptr;
  std::thread([&] {
    absl::StatusOr<void*> p = allocator_->Allocate(kMiB, 0, TestStream(5));
    if (p.ok()) other_thread = *p;
  }).join();
  ASSERT_TRUE(unbound.ok());
  ASSERT_NE(other_thread, nullptr);
  t = Tenants();
  EXPECT_EQ(t["long"].live_allocations, 2);
  EXPECT_EQ(t["default"].live_allocations, 1);
  for (void* p : {*on_bound, *elsewhere, *unbound, other_thread}) ASSERT_TRUE(allocator_->Free(p).ok());
}

TEST_P(TenantsTest, AnOomNamesTheTenantAndItsCapAndLeavesTheOthersServed) {
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  std::vector<void*> held;
  absl::Status oom;
  for (int i = 0; i < 64 && oom.ok(); ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(4 * kMiB, 0, TestStream(1));
    if (p.ok()) {
      held.push_back(*p);
    } else {
      oom = p.status();
    }
  }
  ASSERT_TRUE(absl::IsResourceExhausted(oom)) << oom;
  EXPECT_TRUE(absl::StrContains(oom.message(), "for tenant 'long' (cap 24.00 MiB)")) << oom;
  // The cause is the tenant's cap (issue 27: the same in a process, its metrics and timeline, and a
  // replay); the diagnosis within the tenant stays in the text: its working set exceeds its cap.
  EXPECT_TRUE(absl::StrContains(oom.message(), "tenant cap: the tenant's own cap refused the growth")) << oom;
  EXPECT_TRUE(absl::StrContains(oom.message(), "within the tenant, capacity")) << oom;
  absl::StatusOr<std::optional<OomReport>> report = allocator_->LastOomReport(0);
  ASSERT_TRUE(report.ok() && report->has_value());
  EXPECT_EQ((*report)->tenant, "long");
  EXPECT_EQ((*report)->tenant_cap, kLongCap);
  EXPECT_EQ((*report)->cause, OomCause::kTenantCap);
  const DeviceStats stats = *allocator_->GetStats(0);
  EXPECT_EQ(stats.num_ooms_tenant_cap, 1);
  EXPECT_EQ(stats.num_ooms_capacity + stats.num_ooms_fragmentation, 0);
  // The timeline lists it with the tenant and its cap.
  std::vector<DeviceMetrics> metrics = allocator_->Metrics();
  ASSERT_FALSE(metrics.empty());
  ASSERT_FALSE(metrics[0].recent_ooms.empty());
  const OomEvent& listed = metrics[0].recent_ooms.back();
  EXPECT_EQ(listed.cause, OomCause::kTenantCap);
  EXPECT_EQ(listed.tenant, "long");
  EXPECT_EQ(listed.tenant_cap, kLongCap);
  const std::string line = TimelineToJsonLine(TimelineSampleOf(metrics[0], 1.0, 0));
  EXPECT_TRUE(absl::StrContains(line, "\"tenant_cap\":1")) << line;
  EXPECT_TRUE(absl::StrContains(line, "\"cause\":\"tenant_cap\",\"tenant\":\"long\",\"tenant_cap_bytes\":25165824"))
      << line;
  EXPECT_LE(held.size() * 4 * kMiB, kLongCap);
  // The other tenants still get memory.
  ASSERT_TRUE(allocator_->SetThreadTenant("short").ok());
  absl::StatusOr<void*> s = allocator_->Allocate(8 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(allocator_->SetThreadTenant("default").ok());
  absl::StatusOr<void*> d = allocator_->Allocate(8 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(d.ok()) << d.status();
  std::map<std::string, TenantStats> t = Tenants();
  EXPECT_EQ(t["long"].ooms, 1);
  EXPECT_EQ(t["short"].ooms, 0);
  ExpectTenantsAddUp();
  for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());
  ASSERT_TRUE(allocator_->Free(*s).ok());
  ASSERT_TRUE(allocator_->Free(*d).ok());
}

TEST_P(TenantsTest, LoweringACapReleasesCacheAndRefusesGrowthButKeepsLiveMemory) {
  // Blocks of 12 MiB: each a segment of its own (tiers round it to 16 MiB), so a free one is whole
  // cached segments that can go back.
  ASSERT_TRUE(allocator_->SetTenantCap("long", 48 * kMiB).ok());
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
    ASSERT_TRUE(p.ok()) << p.status();
    held.push_back(*p);
  }
  ASSERT_TRUE(allocator_->Free(held.back()).ok());  // one segment cached, two live
  held.pop_back();
  const TenantStats before = Tenants()["long"];
  ASSERT_GT(before.cached, 0u);
  // Below what it reserves, and below what it holds live.
  ASSERT_TRUE(allocator_->SetTenantCap("long", 16 * kMiB).ok());
  const TenantStats after = Tenants()["long"];
  EXPECT_EQ(after.cap, 16 * kMiB);
  EXPECT_EQ(after.allocated, before.allocated) << "live memory stays";
  EXPECT_EQ(after.reserved, before.reserved - before.cached) << "the cache went back";
  EXPECT_EQ(after.cached, 0u);
  absl::Status refused = allocator_->Allocate(12 * kMiB, 0, TestStream(1)).status();
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "for tenant 'long' (cap 16.00 MiB)")) << refused;
  // Live blocks stay usable and freeable; while the tenant reserves more than its cap, what they
  // free goes back at once (its reserved bytes come down to its cap as its frees allow), not at
  // its next allocation.
  for (void* p : held) EXPECT_TRUE(allocator_->DeviceOf(p).ok());
  ASSERT_TRUE(allocator_->Free(held[0]).ok());
  held.erase(held.begin());
  const TenantStats freed = Tenants()["long"];
  EXPECT_LT(freed.reserved, after.reserved) << "the freed segment went back";
  EXPECT_EQ(freed.cached, 0u);
  EXPECT_LE(freed.reserved, 16 * kMiB);
  // Within its cap again, a free stays cached and serves the tenant without growth.
  ASSERT_TRUE(allocator_->Free(held[0]).ok());
  held.erase(held.begin());
  const std::size_t within = Tenants()["long"].reserved;
  EXPECT_GT(within, 0u) << "within the cap: cached";
  EXPECT_LE(within, 16 * kMiB);
  absl::StatusOr<void*> again = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(again.ok()) << again.status();
  held.push_back(*again);
  EXPECT_EQ(Tenants()["long"].reserved, within) << "served from its cache, no growth";
  // Raising it lets it grow again.
  ASSERT_TRUE(allocator_->SetTenantCap("long", 48 * kMiB).ok());
  absl::StatusOr<void*> more = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(more.ok()) << more.status();
  held.push_back(*more);
  ExpectTenantsAddUp();
  for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());
}

// Issue 27: a cap lowered below the tenant's live memory; as that memory is freed, the tenant's
// reserved bytes come down to its cap at once (they kept 160 MiB against a 4 MiB cap until the
// tenant's next allocation). Each 12 MiB block is a segment of its own here.
TEST_P(TenantsTest, FreesBelowALoweredCapGiveTheCacheBack) {
  ASSERT_TRUE(allocator_->SetTenantCap("long", 48 * kMiB).ok());
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
    ASSERT_TRUE(p.ok()) << p.status();
    held.push_back(*p);
  }
  ASSERT_TRUE(allocator_->SetTenantCap("long", 4 * kMiB).ok());
  ASSERT_TRUE(allocator_->SetThreadTenant("default").ok());  // the frees come from another thread's tenant
  for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());
  const TenantStats t = Tenants()["long"];
  EXPECT_LE(t.reserved, 4 * kMiB) << "reserved " << t.reserved << " against a cap of " << t.cap;
  EXPECT_EQ(t.allocated, 0u);
  ExpectTenantsAddUp();
}

// The same when the frees wait for another stream's work (record_stream) and that work completes
// later: the pending blocks come back during another tenant's free, which trims the tenant too.
TEST_P(TenantsTest, PendingFreesRetiredLaterGiveTheCacheBackToo) {
  SimBackend* sim = AsSim(*allocator_->backend(0));
  ASSERT_NE(sim, nullptr) << "every configuration runs on the sim backend";
  ASSERT_TRUE(allocator_->SetTenantCap("long", 48 * kMiB).ok());
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  const Stream other = TestStream(5);
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(allocator_->RecordStream(*p, 0, other).ok());
    held.push_back(*p);
  }
  sim->EnqueueWork(other);  // a kernel on `other` still reads them
  ASSERT_TRUE(allocator_->SetTenantCap("long", 4 * kMiB).ok());
  for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());  // pending: still active
  EXPECT_GT(Tenants()["long"].reserved, 4 * kMiB);
  sim->CompleteWork(other);
  ASSERT_TRUE(allocator_->SetThreadTenant("default").ok());
  absl::StatusOr<void*> d = allocator_->Allocate(4096, 0, TestStream(1));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(allocator_->Free(*d).ok());  // polls the pending frees: the long tenant's come back
  const TenantStats t = Tenants()["long"];
  EXPECT_LE(t.reserved, 4 * kMiB) << "reserved " << t.reserved << " against a cap of " << t.cap;
  ExpectTenantsAddUp();
}

TEST_P(TenantsTest, EmptyCacheReleasesEveryTenantsCache) {
  for (const char* tenant : {"default", "short", "long"}) {
    ASSERT_TRUE(allocator_->SetThreadTenant(tenant).ok());
    absl::StatusOr<void*> p = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(allocator_->Free(*p).ok());
  }
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  for (const auto& [name, t] : Tenants()) EXPECT_EQ(t.reserved, 0u) << name;
  EXPECT_EQ(allocator_->GetStats(0)->reserved_bytes[kAllPools].current, 0);
}

TEST_P(TenantsTest, ACaptureRoutesToItsGraphPoolWhateverTheTenant) {
  ASSERT_TRUE(allocator_->SetThreadTenant("short").ok());
  const Stream s = TestStream(2);
  ASSERT_TRUE(allocator_->BeginCapture(0, GraphPoolId{0, 1}, [s](Stream x) { return x == s; }).ok());
  absl::StatusOr<void*> p = allocator_->Allocate(kMiB, 0, s);
  ASSERT_TRUE(allocator_->EndCapture(0, GraphPoolId{0, 1}).ok());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Tenants()["short"].live_allocations, 0);
  const DeviceStats d = *allocator_->GetStats(0);
  ASSERT_EQ(d.reserved_bytes_by_private_pools.size(), 1u) << "only the graph pool, not the tenants' pools";
  ASSERT_TRUE(allocator_->Free(*p).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, GraphPoolId{0, 1}).ok());
}

TEST_P(TenantsTest, MetricsAndSnapshotsCarryTheTenant) {
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  absl::StatusOr<void*> p = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string text = MetricsToPrometheus(allocator_->Metrics());
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_tenant_cap_bytes{device=\"0\",tenant=\"long\"} 25165824")) << text;
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_tenant_live_allocations{device=\"0\",tenant=\"long\"} 1"));
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_tenant_ooms_total{device=\"0\",tenant=\"short\"} 0"));
  absl::StatusOr<MemorySnapshot> snap = allocator_->Snapshot(0);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(SegmentTenant(*snap, *p), "long");
  EXPECT_TRUE(absl::StrContains(SnapshotToJson(*snap), "\"tenant\":\"long\""));
  EXPECT_TRUE(absl::StrContains(TenantStatsToJson(*allocator_->GetTenantStats(0)), "\"tenant\":\"long\""));
  ASSERT_TRUE(allocator_->Free(*p).ok());
}

TEST_P(TenantsTest, BadNamesAndCapsAreRefusedWithWhatIsAccepted) {
  absl::Status s = allocator_->SetThreadTenant("medium");
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "accepted: default, short, long")) << s;
  EXPECT_TRUE(absl::IsNotFound(allocator_->BindStream(TestStream(1), "")));
  s = allocator_->SetTenantCap("default", 8 * kMiB);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = allocator_->SetTenantCap("short", kMiB);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "accepted: 2MiB to 16TiB")) << s;
  EXPECT_EQ(Tenants()["short"].cap, kShortCap) << "a refused cap changes nothing";
  EXPECT_EQ(allocator_->ThreadTenant(), "default");
}

TEST_P(TenantsTest, ATenantAtItsCapKeepsTheOtherTenantsCaches) {
  // The default tenant caches a block; the long tenant then fills its cap with small blocks and fails.
  absl::StatusOr<void*> d = allocator_->Allocate(3 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(allocator_->Free(*d).ok());
  const std::size_t default_cached = Tenants()["default"].cached;
  ASSERT_GT(default_cached, 0u);
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  std::vector<void*> held;
  absl::Status oom;
  for (int i = 0; i < 4096 && oom.ok(); ++i) {
    absl::StatusOr<void*> p = allocator_->Allocate(300000, 0, TestStream(1));
    if (p.ok()) {
      held.push_back(*p);
    } else {
      oom = p.status();
    }
  }
  ASSERT_TRUE(absl::IsResourceExhausted(oom)) << oom;
  std::map<std::string, TenantStats> t = Tenants();
  EXPECT_EQ(t["default"].cached, default_cached) << "its own cap refused: the device's cache was not released";
  EXPECT_EQ(t["long"].ooms_at_cap, 1);
  EXPECT_LE(t["long"].reserved, kLongCap);
  ExpectTenantsAddUp();
  for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());
}

TEST_P(TenantsTest, ACapThatNeedsAReleaseIsRefusedDuringACapture) {
  ASSERT_TRUE(allocator_->SetThreadTenant("long").ok());
  absl::StatusOr<void*> p = allocator_->Allocate(12 * kMiB, 0, TestStream(1));
  ASSERT_TRUE(p.ok()) << p.status();
  const Stream s = TestStream(2);
  ASSERT_TRUE(allocator_->BeginCapture(0, GraphPoolId{0, 1}, [s](Stream x) { return x == s; }).ok());
  absl::Status refused = allocator_->SetTenantCap("long", 4 * kMiB);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "during CUDA graph capture")) << refused;
  EXPECT_EQ(Tenants()["long"].cap, kLongCap) << "the cap is unchanged";
  EXPECT_TRUE(allocator_->SetTenantCap("long", 32 * kMiB).ok()) << "raising it needs no release";
  ASSERT_TRUE(allocator_->EndCapture(0, GraphPoolId{0, 1}).ok());
  ASSERT_TRUE(allocator_->ReleasePool(0, GraphPoolId{0, 1}).ok());
  EXPECT_TRUE(allocator_->SetTenantCap("long", 4 * kMiB).ok()) << "after the capture it may";
  ASSERT_TRUE(allocator_->Free(*p).ok());
}

TEST_P(TenantsTest, RetiringABoundStreamUnbindsIt) {
  const Stream s = TestStream(6);
  ASSERT_TRUE(allocator_->BindStream(s, "long").ok());
  absl::StatusOr<void*> a = allocator_->Allocate(kMiB, 0, s);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(allocator_->Free(*a).ok());
  ASSERT_TRUE(allocator_->RetireStream(s).ok());
  absl::StatusOr<void*> b = allocator_->Allocate(kMiB, 0, s);  // a new stream with the old handle
  ASSERT_TRUE(b.ok());
  std::map<std::string, TenantStats> t = Tenants();
  EXPECT_EQ(t["default"].live_allocations, 1);
  EXPECT_EQ(t["long"].live_allocations, 0);
  ASSERT_TRUE(allocator_->Free(*b).ok());
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(TenantsTest);

// A graph pool released while it still holds memory (freeable) goes back in the release-and-retry of
// a tenant's slow path; the retry's growth is still the tenant's (its cap, its count), with and
// without stitching.
TEST(TenantGraphPoolTest, ATenantsRetryAfterAGraphPoolGoesBackCountsAsTheTenants) {
  for (const char* extra : {"", ",expandable_segments:true"}) {
    std::unique_ptr<Allocator> a =
        MakeAllocator(absl::StrCat("capacity:64MiB,sim_total_memory:128MiB,tenants:[long:24MiB]", extra));
    ASSERT_NE(a, nullptr);
    const Stream s = TestStream(2);
    ASSERT_TRUE(a->BeginCapture(0, GraphPoolId{0, 1}, [s](Stream x) { return x == s; }).ok());
    absl::StatusOr<void*> g = a->Allocate(12 * kMiB, 0, s);
    ASSERT_TRUE(a->EndCapture(0, GraphPoolId{0, 1}).ok());
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(a->Free(*g).ok());
    ASSERT_TRUE(a->ReleasePool(0, GraphPoolId{0, 1}).ok());  // freeable, still holding 12 MiB
    std::vector<void*> held;
    for (int i = 0; i < 4; ++i) {  // the default tenant: 48 MiB live, 4 MiB left under the cap
      absl::StatusOr<void*> p = a->Allocate(12 * kMiB, 0, TestStream(1));
      ASSERT_TRUE(p.ok()) << p.status();
      held.push_back(*p);
    }
    ASSERT_TRUE(a->SetThreadTenant("long").ok());
    absl::StatusOr<void*> l = a->Allocate(12 * kMiB, 0, TestStream(1));  // needs the graph pool's memory
    ASSERT_TRUE(l.ok()) << l.status();
    held.push_back(*l);
    absl::Status check = a->CheckInvariants(0);
    EXPECT_TRUE(check.ok()) << extra << ": " << check;
    absl::StatusOr<std::vector<TenantStats>> t = a->GetTenantStats(0);
    ASSERT_TRUE(t.ok() && t->size() == 2u);
    EXPECT_EQ((*t)[1].reserved, 12 * kMiB) << extra;
    EXPECT_EQ((*t)[0].reserved + (*t)[1].reserved,
              static_cast<std::size_t>(a->GetStats(0)->reserved_bytes[kAllPools].current))
        << extra;
    ASSERT_TRUE(a->SetThreadTenant("default").ok());
    for (void* p : held) ASSERT_TRUE(a->Free(p).ok());
  }
}

TEST(TenantOptionsTest, ParsesFormatsAndRefusesBadLists) {
  absl::StatusOr<Options> o = ParseOptions("tenants:[short:20GiB,long:40GiB]");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->tenants.size(), 2u);
  EXPECT_EQ(o->tenants[0], (TenantSpec{"short", 20 * kGiB}));
  EXPECT_EQ(o->tenants[1], (TenantSpec{"long", 40 * kGiB}));
  EXPECT_TRUE(absl::StrContains(FormatOptions(*o), "tenants:[short:20GiB,long:40GiB]")) << FormatOptions(*o);
  for (const char* bad : {"tenants:[short]", "tenants:[short:1MiB]", "tenants:[default:4GiB]",
                          "tenants:[a:4GiB,a:4GiB]", "tenants:[a b:4GiB]", "tenants:[x:lots]"}) {
    absl::StatusOr<Options> b = ParseOptions(bad);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) {
      EXPECT_TRUE(absl::StrContains(b.status().message(), "tenants")) << b.status();
    }
  }
  // No tenants: no tenant stats, no tenant in reports.
  std::unique_ptr<Allocator> plain = MakeAllocator("");
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(plain->GetTenantStats(0)->empty());
  EXPECT_TRUE(absl::IsNotFound(plain->SetThreadTenant("long")));
  EXPECT_TRUE(plain->SetThreadTenant("default").ok());
}

// ---- The component alone (frontend/bookkeeping/tenants.h) ----------------------------------------------------

namespace tenant_component {

using internal::DeviceTenants;
using internal::Tenants;

std::vector<TenantSpec> ShortAndLong() { return {{"short", 16 * kMiB}, {"long", 24 * kMiB}}; }

TEST(TenantsComponentTest, ABindingComesBeforeTheThreadsTenantAndEveryChangeIsSeenAtOnce) {
  Tenants t(ShortAndLong());
  const Stream s1 = TestStream(1), s2 = TestStream(2);
  EXPECT_EQ(t.Of(s1), 0) << "nothing bound, no thread tenant: the default";
  t.Bind(s1, 1);
  EXPECT_EQ(t.Of(s1), 1);
  EXPECT_EQ(t.Of(s2), 0);
  t.SetThreadTenant(2);
  EXPECT_EQ(t.Of(s2), 2) << "an unbound stream: the thread's tenant";
  EXPECT_EQ(t.Of(s1), 1) << "a binding comes first";
  t.Bind(s1, 2);  // the thread's cached answer for s1 is for the old bindings
  EXPECT_EQ(t.Of(s1), 2);
  t.Forget(s1);
  t.SetThreadTenant(1);
  EXPECT_EQ(t.Of(s1), 1) << "unbound again: the thread's tenant, read at each request";
  t.SetThreadTenant(0);
  EXPECT_EQ(t.Of(s1), 0);
  EXPECT_TRUE(t.CheckInvariants().ok());
}

TEST(TenantsComponentTest, AnotherThreadsBindingIsSeenByAThreadThatCachedTheOldOne) {
  Tenants t(ShortAndLong());
  const Stream s = TestStream(3);
  t.Bind(s, 1);
  EXPECT_EQ(t.Of(s), 1);  // cached on this thread
  std::thread([&] {
    EXPECT_EQ(t.Of(s), 1);
    t.Bind(s, 2);
  }).join();
  EXPECT_EQ(t.Of(s), 2);
  std::thread([&] { t.Forget(s); }).join();
  EXPECT_EQ(t.Of(s), 0);
}

TEST(TenantsComponentTest, TwoAllocatorsTenantsShareNoBindingThreadTenantOrCache) {
  Tenants a(ShortAndLong()), b(ShortAndLong());
  const Stream s = TestStream(4);
  a.Bind(s, 1);
  a.SetThreadTenant(2);
  b.Bind(TestStream(5), 2);                  // b has bindings too: its lookups go through its own cache
  for (int round = 0; round < 3; ++round) {  // alternating: a's cached answer never answers b
    EXPECT_EQ(a.Of(s), 1);
    EXPECT_EQ(b.Of(s), 0);
  }
  EXPECT_EQ(b.ThreadTenant(), 0);
  EXPECT_EQ(a.ThreadTenant(), 2);
  a.SetThreadTenant(0);
}

TEST(TenantsComponentTest, NamesAndCapsAreCheckedAndABadCapChangesNothing) {
  Tenants t(ShortAndLong());
  EXPECT_TRUE(t.enabled());
  EXPECT_EQ(t.count(), 3);
  EXPECT_EQ(*t.Index("default"), 0);
  EXPECT_EQ(*t.Index("long"), 2);
  EXPECT_EQ(t.Name(1), "short");
  absl::StatusOr<int> none = t.Index("medium");
  ASSERT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_TRUE(absl::StrContains(none.status().message(), "accepted: default, short, long")) << none.status();
  EXPECT_EQ(t.Cap(1), 16 * kMiB);
  absl::Status s = t.SetCap(1, kMiB);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_TRUE(absl::StrContains(s.message(), "accepted: 2MiB to 16TiB")) << s;
  EXPECT_EQ(t.Cap(1), 16 * kMiB) << "unchanged";
  EXPECT_TRUE(absl::IsInvalidArgument(t.SetCap(0, 8 * kMiB))) << "the default tenant's cap is the device's";
  ASSERT_TRUE(t.SetCap(2, 8 * kMiB).ok());
  EXPECT_EQ(t.Cap(2), 8 * kMiB);
  EXPECT_TRUE(t.CheckInvariants().ok());
  EXPECT_FALSE(Tenants({}).enabled());
}

// DeviceTenants over a registry and private pools of the simulated device, as a device holds them.
class DeviceTenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimBackend>> made = MakeSimBackend({.total_memory = 64 * kMiB});
    ASSERT_TRUE(made.ok());
    sim_ = std::move(*made);
    registry_ = std::make_unique<internal::SegmentRegistry>(sim_.get(), &ledger_, &history_);
    registry_->set_cap(48 * kMiB);
    private_ = std::make_unique<internal::PrivatePools>([this](const PrivatePoolSettings&) {
      return std::make_unique<internal::Pools>(internal::PoolContext{&ledger_, registry_.get(), &clock_},
                                               internal::PoolsConfig{.slab_limit = internal::kMaxSmallSize});
    });
    tenants_ = std::make_shared<Tenants>(ShortAndLong());
    device_ = std::make_unique<DeviceTenants>(tenants_, private_.get(), registry_.get());
    ASSERT_TRUE(device_->AddPools(0).ok());
  }
  internal::StatLedger ledger_;
  internal::HistoryRing history_;
  std::uint64_t clock_ = 0;
  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<internal::SegmentRegistry> registry_;
  std::unique_ptr<internal::PrivatePools> private_;
  std::shared_ptr<Tenants> tenants_;
  std::unique_ptr<DeviceTenants> device_;
};

TEST_F(DeviceTenantsTest, EachTenantHasAPoolWithItsCapAndRequestsRouteToIt) {
  ASSERT_TRUE(device_->enabled());
  ASSERT_EQ(device_->pool_tags().size(), 2u);
  const std::uint16_t short_tag = device_->PoolTag(1), long_tag = device_->PoolTag(2);
  EXPECT_EQ(registry_->OwnerCap(short_tag), 16 * kMiB);
  EXPECT_EQ(registry_->OwnerCap(long_tag), 24 * kMiB);
  EXPECT_EQ(device_->TenantOfTag(long_tag), 2);
  EXPECT_TRUE(device_->OwnsPool(short_tag));
  EXPECT_FALSE(device_->OwnsPool(0)) << "the default tenant's pools are the device's own";
  tenants_->Bind(TestStream(1), 2);
  EXPECT_EQ(device_->TagFor(TestStream(1)), long_tag);
  EXPECT_EQ(device_->TagFor(TestStream(2)), 0);
  EXPECT_EQ(device_->NameOfPool(internal::PrivatePools::TenantPoolId(1)), "short");
  EXPECT_EQ(device_->NameOfPool(GraphPoolId{}), "default");
  EXPECT_EQ(device_->NameOfPool(GraphPoolId{7, 1}), "") << "a graph's pool belongs to no tenant";
  EXPECT_TRUE(device_->AtCap(short_tag, 17 * kMiB));
  EXPECT_FALSE(device_->AtCap(short_tag, 16 * kMiB));
  device_->ApplyCap(1, 4 * kMiB);
  EXPECT_EQ(registry_->OwnerCap(short_tag), 4 * kMiB);
  EXPECT_FALSE(device_->ReservesOver(1, 4 * kMiB));
  EXPECT_TRUE(device_->CheckInvariants([](DeviceTenants::AddBlock) {}).ok());
}

TEST_F(DeviceTenantsTest, TheCheckHoldsTheKeptUseToAWalkOverTheBlocks) {
  const std::uint16_t tag = device_->PoolTag(2);
  device_->StepUse(tag, kLargePool, 4 * kMiB, 4 * kMiB, 3 * kMiB, 1);  // a live 4 MiB block of "long"
  auto one_block = [&](DeviceTenants::AddBlock add) { add(tag, kLargePool, 4 * kMiB, 3 * kMiB, true); };
  EXPECT_TRUE(device_->CheckInvariants(one_block).ok());
  absl::Status s = device_->CheckInvariants([](DeviceTenants::AddBlock) {});
  EXPECT_TRUE(absl::StrContains(s.message(), "tenant 2's kept use")) << s;
  const std::vector<TenantStats> stats = device_->Stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[2].name, "long");
  EXPECT_EQ(stats[2].allocated, 4 * kMiB);
  EXPECT_EQ(stats[2].requested, 3 * kMiB);
  EXPECT_EQ(stats[2].live_allocations, 1);
  EXPECT_EQ(stats[2].cap, 24 * kMiB);
  EXPECT_EQ(stats[0].cap, 48 * kMiB) << "the default tenant's cap is the device's";
  // The block goes back: the kept use steps down exactly.
  device_->StepUse(tag, kLargePool, -4 * kMiB, -4 * kMiB, -3 * kMiB, -1);
  EXPECT_TRUE(device_->CheckInvariants([](DeviceTenants::AddBlock) {}).ok());
}

TEST_F(DeviceTenantsTest, AnOomAtTheTenantsCapIsNarrowedToTheTenantAndCounted) {
  const std::uint16_t tag = device_->PoolTag(1);
  internal::OomSituation s;
  s.capacity = 48 * kMiB;
  EXPECT_FALSE(device_->NarrowOom(tag, 8 * kMiB, &s)) << "within its cap";
  EXPECT_EQ(s.capacity, 48 * kMiB);
  ASSERT_TRUE(device_->NarrowOom(tag, 32 * kMiB, &s));
  EXPECT_EQ(s.capacity, 16 * kMiB) << "diagnosed as a device of the tenant's cap";
  OomReport r;
  r.diagnosis = "fragmentation: ...";
  device_->AccountOom(tag, /*at_cap=*/true, &r);
  EXPECT_EQ(r.cause, OomCause::kTenantCap);
  EXPECT_EQ(r.tenant, "short");
  EXPECT_EQ(r.tenant_cap, 16 * kMiB);
  EXPECT_TRUE(absl::StartsWith(r.diagnosis, "tenant cap:")) << r.diagnosis;
  OomReport other;
  device_->AccountOom(0, /*at_cap=*/false, &other);
  EXPECT_EQ(other.tenant, "default");
  EXPECT_EQ(other.tenant_cap, 48 * kMiB);
  const std::vector<TenantStats> stats = device_->Stats();
  EXPECT_EQ(stats[1].ooms, 1);
  EXPECT_EQ(stats[1].ooms_at_cap, 1);
  EXPECT_EQ(stats[0].ooms, 1);
  EXPECT_EQ(stats[0].ooms_at_cap, 0);
}

TEST(DeviceTenantsNoneTest, WithoutTenantsNothingIsAddedOrCounted) {
  internal::StatLedger ledger;
  internal::HistoryRing history;
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend({.total_memory = 64 * kMiB});
  ASSERT_TRUE(sim.ok());
  internal::SegmentRegistry registry(sim->get(), &ledger, &history);
  internal::PrivatePools pools([](const PrivatePoolSettings&) -> std::unique_ptr<internal::Pools> { return nullptr; });
  DeviceTenants none(nullptr, &pools, &registry);
  ASSERT_TRUE(none.AddPools(0).ok());
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(pools.num_tags(), 1u) << "no pool was made";
  EXPECT_TRUE(none.Stats().empty());
  EXPECT_EQ(none.NameOfPool(GraphPoolId{}), "");
  OomReport r;
  none.AccountOom(0, false, &r);
  EXPECT_EQ(r.tenant, "");
}

}  // namespace tenant_component
}  // namespace
}  // namespace bucketalloc
