// src/frontend/bookkeeping/tenants.cc — tenants (frontend/bookkeeping/tenants.h).
#include "frontend/bookkeeping/tenants.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

std::uint64_t NextTenantsId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// A thread's tenants, one per Tenants object it set one for; past kSlots the oldest setting is
// forgotten (back to the default).
struct ThreadBinding {
  std::uint64_t owner = 0;  // 0: a free slot
  int index = 0;
};
constexpr int kSlots = 8;
thread_local ThreadBinding t_bindings[kSlots];
thread_local int t_next = 0;

// The thread's last answers of Tenants::OfBound, each valid for one object's bindings at one
// version; replaced round robin.
struct BoundCache {
  std::uint64_t owner = 0;  // 0: empty
  std::uint64_t version = 0;
  Stream stream = nullptr;
  int index = 0;  // the binding's tenant, -1 for none (the thread's tenant applies)
};
thread_local BoundCache t_bound[Tenants::kCachedStreams];
thread_local int t_bound_next = 0;

const std::string& DefaultName() {
  static const std::string* const name = new std::string("default");
  return *name;
}

// OK for a tenant cap of 2 MiB to 16 TiB, else InvalidArgument naming the tenant and the range.
absl::Status ValidateTenantCap(absl::string_view name, std::size_t cap) {
  if (TenantCapInRange(cap)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("bucketalloc: cap ", cap, " bytes for tenant '", name, "' is invalid; accepted: 2MiB to 16TiB"));
}

}  // namespace

// ---- Tenants ------------------------------------------------------------------------------------

Tenants::Tenants(std::vector<TenantSpec> specs) : id_(NextTenantsId()), specs_(std::move(specs)) {
  MutexLock lock(mu_);
  for (const TenantSpec& t : specs_) caps_.push_back(t.cap);
}

absl::StatusOr<int> Tenants::Index(absl::string_view name) const {
  if (name == DefaultName()) return 0;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return static_cast<int>(i) + 1;
  }
  std::vector<std::string> names = {DefaultName()};
  for (const TenantSpec& t : specs_) names.push_back(t.name);
  return absl::NotFoundError(absl::StrCat("bucketalloc: no tenant named '", name,
                                          "'; accepted: ", absl::StrJoin(names, ", "),
                                          specs_.empty() ? " (set tenants:[NAME:SIZE,...] in the CONF)" : ""));
}

const std::string& Tenants::Name(int index) const {
  BA_CHECK(index >= 0 && index < count(), "tenant index out of range");
  return index == 0 ? DefaultName() : specs_[static_cast<std::size_t>(index) - 1].name;
}

void Tenants::Bind(Stream stream, int index) {
  BA_CHECK(index >= 0 && index < count(), "binding to a tenant that does not exist");
  MutexLock lock(mu_);
  bool changed = false;
  if (index == 0) {
    changed = bindings_.erase(stream) > 0;
  } else {
    auto [it, inserted] = bindings_.try_emplace(stream, index);
    changed = inserted || it->second != index;
    it->second = index;
  }
  if (!changed) return;
  version_.fetch_add(1, std::memory_order_release);
  has_bindings_.store(!bindings_.empty(), std::memory_order_release);
}

int Tenants::OfBound(Stream stream) const {
  const std::uint64_t version = version_.load(std::memory_order_acquire);
  for (const BoundCache& c : t_bound) {
    if (c.owner == id_ && c.version == version && c.stream == stream) return c.index >= 0 ? c.index : ThreadTenant();
  }
  BoundCache& c = t_bound[t_bound_next];
  t_bound_next = (t_bound_next + 1) % kCachedStreams;
  {
    MutexLock lock(mu_);
    auto it = bindings_.find(stream);
    c = BoundCache{id_, version_.load(std::memory_order_relaxed), stream, it == bindings_.end() ? -1 : it->second};
  }
  return c.index >= 0 ? c.index : ThreadTenant();
}

int Tenants::ThreadTenant() const {
  for (const ThreadBinding& b : t_bindings) {
    if (b.owner == id_) return b.index;
  }
  return 0;
}

void Tenants::SetThreadTenant(int index) {
  BA_CHECK(index >= 0 && index < count(), "a thread tenant that does not exist");
  for (ThreadBinding& b : t_bindings) {
    if (b.owner == id_) {
      b.index = index;
      return;
    }
  }
  if (index == 0) return;
  t_bindings[t_next] = {id_, index};
  t_next = (t_next + 1) % kSlots;
}

absl::Status Tenants::SetCap(int index, std::size_t cap) {
  if (index == 0) {
    return absl::InvalidArgumentError(
        "bucketalloc: the default tenant's cap is the device's; accepted: a tenant named in tenants:[...] (set the "
        "device's cap with capacity or memory_fraction)");
  }
  BA_CHECK(index > 0 && index < count(), "a cap for a tenant that does not exist");
  if (absl::Status s = ValidateTenantCap(Name(index), cap); !s.ok()) return s;
  MutexLock lock(mu_);
  caps_[static_cast<std::size_t>(index) - 1] = cap;
  return absl::OkStatus();
}

std::size_t Tenants::Cap(int index) const {
  BA_CHECK(index > 0 && index < count(), "the cap of a tenant that does not exist");
  MutexLock lock(mu_);
  return caps_[static_cast<std::size_t>(index) - 1];
}

absl::Status Tenants::CheckInvariants() const {
  MutexLock lock(mu_);
  if (caps_.size() != specs_.size()) return absl::InternalError("tenants: a cap per tenant");
  for (std::size_t i = 0; i < caps_.size(); ++i) {
    if (!TenantCapInRange(caps_[i])) {
      return absl::InternalError(absl::StrCat("tenants: tenant '", specs_[i].name, "' has cap ", caps_[i]));
    }
  }
  for (const auto& [stream, index] : bindings_) {
    if (index <= 0 || index >= count()) {
      return absl::InternalError(
          absl::StrCat("tenants: a stream is bound to tenant ", index, ", which does not exist"));
    }
  }
  if (has_bindings_.load(std::memory_order_relaxed) == bindings_.empty()) {
    return absl::InternalError("tenants: has_bindings disagrees with the bindings");
  }
  return absl::OkStatus();
}

// ---- DeviceTenants ------------------------------------------------------------------------------

absl::Status DeviceTenants::AddPools(int device) {
  if (tenants_ == nullptr || !tenants_->enabled()) return absl::OkStatus();
  // Tenant i's pool is a private pool of its own, whose growth the registry holds to its cap.
  tags_.push_back(0);  // the default tenant: the device's own pools
  for (int i = 1; i < tenants_->count(); ++i) {
    absl::StatusOr<std::uint16_t> tag = pools_->AddTenant(i, device);
    if (!tag.ok()) return tag.status();
    tags_.push_back(*tag);
    registry_->SetOwnerCap(*tag, tenants_->Cap(i), tenants_->Name(i));
  }
  ooms_.assign(tags_.size(), {});
  return absl::OkStatus();
}

int DeviceTenants::TenantOfTag(std::uint16_t tag) const {
  if (tag == 0) return 0;
  const absl::Span<const std::uint16_t> own = pool_tags();
  auto it = std::find(own.begin(), own.end(), tag);
  return it == own.end() ? 0 : static_cast<int>(it - own.begin()) + 1;
}

std::string DeviceTenants::NameOfPool(GraphPoolId id) const {
  if (!enabled()) return "";
  if (id == GraphPoolId{}) return tenants_->Name(0);
  if (id.first != PrivatePools::kTenantIdFirst) return "";  // a graph's or MemPool's
  return tenants_->Name(static_cast<int>(id.second));
}

DeviceTenants::Use DeviceTenants::UseOf(std::uint16_t tag) const {
  Use use = tag < uses_.size() ? uses_[tag] : Use{};
  use.active[kAllPools] = use.allocated[kAllPools] = use.requested[kAllPools] = 0;
  for (int p = kAllPools + 1; p < kNumPoolIndices; ++p) {
    use.active[kAllPools] += use.active[p];
    use.allocated[kAllPools] += use.allocated[p];
    use.requested[kAllPools] += use.requested[p];
  }
  return use;
}

FragmentationReport DeviceTenants::FragmentationOf(std::uint16_t tag, const Use& use) const {
  FragmentationReport r;
  const PrivatePools::Pool& p = pools_->at(tag);
  p.pools->AddFragmentation(p.streams, &r);
  const StatArray* owned = registry_->OwnedReserved(tag);
  for (int i = kAllPools + 1; i < kNumPoolIndices; ++i) {
    r.pools[i].requested = static_cast<std::int64_t>(use.requested[i]);
    r.pools[i].allocated = static_cast<std::int64_t>(use.allocated[i]);
    r.pools[i].reserved = owned == nullptr ? 0 : (*owned)[i].current;
    r.all().Merge(r.pools[i]);
  }
  return r;
}

namespace {

// The memory figures of a tenant whose pools reserve `owned` (null: nothing yet) and whose blocks
// hold `use`. Its largest free block is not kept (0).
MemoryFigures TenantFigures(const StatArray* owned, const DeviceTenants::Use& use) {
  MemoryFigures f;
  f.reserved = owned == nullptr ? 0 : static_cast<std::size_t>((*owned)[kAllPools].current);
  f.allocated = use.allocated[kAllPools];
  f.active = use.active[kAllPools];
  f.cached = f.reserved - std::min(f.reserved, f.active);
  f.requested = use.requested[kAllPools];
  f.live_allocations = use.live;
  return f;
}

}  // namespace

bool DeviceTenants::NarrowOom(std::uint16_t tag, std::size_t segment, OomSituation* s) const {
  if (!OwnsPool(tag) || !AtCap(tag, segment)) return false;
  // The tenant's own cap refused the growth: diagnose within the tenant, as a device of its cap.
  const Use use = UseOf(tag);
  const StatArray* owned = registry_->OwnedReserved(tag);
  s->capacity = registry_->OwnerCap(tag).value_or(0);
  s->figures = TenantFigures(owned, use);
  const auto pool_reserved = owned == nullptr ? 0 : static_cast<std::size_t>((*owned)[s->pool].current);
  s->pool_cached = pool_reserved - std::min(pool_reserved, use.active[s->pool]);
  s->fragmentation = FragmentationOf(tag, use);
  return true;
}

void DeviceTenants::AccountOom(std::uint16_t tag, bool at_cap, OomReport* r) {
  if (at_cap) {
    // One cause for every reader (stats, metrics, the timeline, a replay's count): the tenant's cap;
    // the diagnosis within the tenant stays in the text.
    r->diagnosis =
        absl::StrCat("tenant cap: the tenant's own cap refused the growth, not the device's; within the tenant, ",
                     r->diagnosis, " (or raise the tenant's cap, or bind less to it)");
    r->cause = OomCause::kTenantCap;
  }
  if (!enabled()) return;
  const int tenant = TenantOfTag(tag);
  r->tenant = tenants_->Name(tenant);
  r->tenant_cap = registry_->OwnerCap(tag).value_or(registry_->cap());
  r->at_tenant_cap = at_cap;
  ++ooms_[static_cast<std::size_t>(tenant)].all;
  if (at_cap) ++ooms_[static_cast<std::size_t>(tenant)].at_cap;
}

void DeviceTenants::ApplyCap(int index, std::size_t cap) {
  registry_->SetOwnerCap(PoolTag(index), cap, tenants_->Name(index));
}

bool DeviceTenants::TrimToCaps() {
  bool released = false;
  over_cap_ = false;
  const std::uint16_t owner = registry_->owner();
  for (std::uint16_t tag : pool_tags()) {
    const std::optional<std::size_t> cap = registry_->OwnerCap(tag);
    if (!cap.has_value() || registry_->OwnedNow(tag) <= *cap) continue;
    registry_->set_owner(tag);  // its releases are counted as its own
    pools_->at(tag).pools->ForEach([&](auto& pool) {
      while (registry_->OwnedNow(tag) > *cap && pool.ReleaseOldest() > 0) released = true;
    });
    registry_->set_owner(owner);
    over_cap_ = over_cap_ || registry_->OwnedNow(tag) > *cap;  // live memory above it: later frees
  }
  return released;
}

std::vector<TenantStats> DeviceTenants::Stats() const {
  std::vector<TenantStats> out;
  for (std::size_t t = 0; t < tags_.size(); ++t) {
    const std::uint16_t tag = tags_[t];
    const StatArray* owned = registry_->OwnedReserved(tag);
    TenantStats ts;
    static_cast<MemoryFigures&>(ts) = TenantFigures(owned, UseOf(tag));  // kept as the blocks move: no walk
    ts.name = tenants_->Name(static_cast<int>(t));
    ts.cap = t == 0 ? registry_->cap() : registry_->OwnerCap(tag).value_or(0);
    ts.peak_reserved = owned == nullptr ? 0 : static_cast<std::size_t>((*owned)[kAllPools].peak);
    ts.ooms = ooms_[t].all;
    ts.ooms_at_cap = ooms_[t].at_cap;
    out.push_back(std::move(ts));
  }
  return out;
}

absl::Status DeviceTenants::CheckInvariants(absl::FunctionRef<void(AddBlock)> walk) const {
  if (!enabled()) return absl::OkStatus();
  if (absl::Status s = tenants_->CheckInvariants(); !s.ok()) return s;
  if (static_cast<int>(tags_.size()) != tenants_->count() || ooms_.size() != tags_.size()) {
    return absl::InternalError("tenants: a pool tag and OOM counts per tenant");
  }
  // Each tenant has its pool, with its cap.
  for (std::size_t t = 1; t < tags_.size(); ++t) {
    const std::uint16_t tag = tags_[t];
    if (!pools_->contains(tag) || pools_->at(tag).tenant() != static_cast<int>(t) ||
        !registry_->OwnerCap(tag).has_value()) {
      return absl::InternalError(absl::StrCat("tenant ", t, " has no pool or no cap"));
    }
  }
  // Each tenant's kept use (what a scrape reads) is what a walk over the blocks finds.
  std::vector<Use> walked(tags_.size());
  walk([&](std::uint16_t tag, PoolIndex pool, std::size_t block, std::size_t requested, bool live) {
    const int t = TenantOfTag(tag);
    if (tag != 0 && t == 0) return;  // a graph pool's: no tenant's
    Use& use = walked[static_cast<std::size_t>(t)];
    for (PoolIndex i : {pool, kAllPools}) {
      use.active[i] += block;
      if (live) {
        use.allocated[i] += block;
        use.requested[i] += requested;
      }
    }
    if (live) ++use.live;
  });
  for (std::size_t t = 0; t < tags_.size(); ++t) {
    const Use kept = UseOf(tags_[t]);
    const Use& w = walked[t];
    if (kept.active != w.active || kept.allocated != w.allocated || kept.requested != w.requested ||
        kept.live != w.live) {
      return absl::InternalError(absl::StrCat("tenant ", t, "'s kept use (", kept.allocated[kAllPools],
                                              " bytes allocated, ", kept.live, " live) differs from a walk's (",
                                              w.allocated[kAllPools], ", ", w.live, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
