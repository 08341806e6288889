// src/frontend/bookkeeping/private_pools.cc — captures and their private pools (frontend/bookkeeping/private_pools.h).
#include "frontend/bookkeeping/private_pools.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace bucketalloc::internal {
namespace {

std::string PoolName(GraphPoolId id) { return absl::StrCat("(", id.first, ", ", id.second, ")"); }

}  // namespace

std::uint16_t PrivatePools::TagFor(Stream stream, absl::FunctionRef<bool(Stream)> capturing) {
  for (auto it = routings_.rbegin(); it != routings_.rend(); ++it) {
    if (!it->filter(stream)) continue;
    if (std::find(it->served.begin(), it->served.end(), stream) == it->served.end()) {
      it->served.push_back(stream);
      it->captured = it->captured || capturing(stream);
    }
    return it->tag;
  }
  return 0;
}

StreamPools& PrivatePools::StreamPoolsFor(std::uint16_t tag, Stream stream) {
  Pool& pool = at(tag);
  auto it = pool.streams.find(stream);
  if (it == pool.streams.end()) it = pool.streams.emplace(stream, pool.pools->NewStreamPools()).first;
  return *it->second;
}

std::uint16_t PrivatePools::Find(GraphPoolId id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? 0 : it->second;
}

absl::Status PrivatePools::NotInUse(GraphPoolId id, absl::string_view what, int device) const {
  return absl::NotFoundError(absl::StrCat("bucketalloc: ", what, " private pool ", PoolName(id), " on device ", device,
                                          ": no such pool is in use (no capture or MemPool began into it)"));
}

absl::Status PrivatePools::Begin(GraphPoolId id, CaptureFilter filter, int device) {
  if (!filter) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: begin allocating to private pool ", PoolName(id),
                                                   " on device ", device,
                                                   " needs a stream filter; accepted: a callable that is true for "
                                                   "the capturing stream(s)"));
  }
  if (id.first == kTenantIdFirst) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: begin allocating to private pool ", PoolName(id),
                                                   " on device ", device,
                                                   ": ids with this first half are tenants' pools; accepted: any "
                                                   "other id (PyTorch's graph and MemPool ids)"));
  }
  std::uint16_t tag = Find(id);
  if (tag != 0 && std::any_of(routings_.begin(), routings_.end(), [&](const Routing& r) { return r.tag == tag; })) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: begin allocating to private pool ", PoolName(id),
                                                      " on device ", device,
                                                      ": a capture or MemPool context already allocates to it; end "
                                                      "it first (PyTorch refuses this too)"));
  }
  if (tag == 0) {
    absl::StatusOr<std::uint16_t> stored = Store(id, device);
    if (!stored.ok()) return stored.status();
    tag = *stored;
  }
  ++pools_[tag]->use_count;  // a freeable pool begun into again is in use again
  routings_.push_back(Routing{tag, std::move(filter), {}});
  return absl::OkStatus();
}

absl::Status PrivatePools::Incref(GraphPoolId id, int device) {
  if (id.first == kTenantIdFirst || id == GraphPoolId{}) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: a use of private pool ", PoolName(id), " on device ",
                                                   device,
                                                   ": {0, 0} is the device's own pools and ids with this first half "
                                                   "are tenants'; accepted: any other id (PyTorch's MemPool ids)"));
  }
  std::uint16_t tag = Find(id);
  if (tag == 0) {
    absl::StatusOr<std::uint16_t> stored = Store(id, device);
    if (!stored.ok()) return stored.status();
    tag = *stored;
  }
  ++pools_[tag]->use_count;
  return absl::OkStatus();
}

absl::Status PrivatePools::End(GraphPoolId id, int device) {
  absl::Cleanup forget = [&] { ForgetMarksIfNotRouting(); };
  const std::uint16_t tag = Find(id);
  if (tag == 0 || pools_[tag]->freeable()) return NotInUse(id, "end allocating to", device);
  auto it = std::find_if(routings_.rbegin(), routings_.rend(), [&](const Routing& r) { return r.tag == tag; });
  if (it == routings_.rend()) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: end allocating to private pool ", PoolName(id),
                                                      " on device ", device, ": no capture into it is running"));
  }
  routings_.erase(std::next(it).base());
  return absl::OkStatus();
}

absl::Status PrivatePools::Configure(GraphPoolId id, PrivatePoolSettings settings, int device) {
  const std::uint16_t tag = Find(id);
  if (tag == 0) return NotInUse(id, "configure", device);
  Pool& p = *pools_[tag];
  if (p.tenant() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketalloc: configure private pool ", PoolName(id), " on device ", device,
                     ": it is a tenant's pool, whose settings are the device's; accepted: a MemPool's or graph's id"));
  }
  if (p.pools->HoldsMemory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucketalloc: configure private pool ", PoolName(id), " on device ", device,
        ": it already holds memory, whose blocks keep the settings they were made with; configure a pool before its "
        "first allocation (as PyTorch's MemPool constructor does)"));
  }
  std::unique_ptr<Pools> rebuilt = make_pools_(settings);
  p.streams.clear();  // their free lists are empty, and belong to the pools being replaced
  p.pools = std::move(rebuilt);
  p.settings = std::move(settings);
  return absl::OkStatus();
}

absl::StatusOr<std::uint16_t> PrivatePools::AddTenant(int index, int device) {
  const GraphPoolId id = TenantPoolId(index);
  if (const std::uint16_t tag = Find(id); tag != 0) return tag;
  absl::StatusOr<std::uint16_t> tag = Store(id, device);
  if (tag.ok()) pools_[*tag]->use_count = 1;  // for good
  return tag;
}

absl::StatusOr<std::uint16_t> PrivatePools::Store(GraphPoolId id, int device) {
  std::size_t slot = pools_.empty() ? 1 : pools_.size();  // slot 0 is "no pool"
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
  } else if (slot > std::numeric_limits<std::uint16_t>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: device ", device, " already has ", slot - 1,
                                                     " private pools; release some (graph reset) first"));
  }
  auto pool = std::make_unique<Pool>();
  pool->id = id;
  pool->pools = make_pools_(pool->settings);
  by_id_.emplace(id, static_cast<std::uint16_t>(slot));  // the last call that may throw
  if (!free_slots_.empty()) {
    free_slots_.pop_back();
  } else {
    pools_.resize(slot + 1);
  }
  pools_[slot] = std::move(pool);
  return static_cast<std::uint16_t>(slot);
}

std::uint16_t PrivatePools::Release(GraphPoolId id) {
  absl::Cleanup forget = [&] { ForgetMarksIfNotRouting(); };
  const std::uint16_t tag = Find(id);
  if (tag == 0 || pools_[tag]->freeable() || pools_[tag]->tenant() != 0) return 0;
  // A routing still running into it was abandoned (cudaStreamEndCapture failed, so End never came).
  routings_.erase(std::remove_if(routings_.begin(), routings_.end(), [&](const Routing& r) { return r.tag == tag; }),
                  routings_.end());
  return --pools_[tag]->use_count == 0 ? tag : 0;
}

int PrivatePools::EndAbandoned(absl::FunctionRef<bool(Stream)> capturing) {
  if (!routing()) return 0;
  absl::Cleanup forget = [&] { ForgetMarksIfNotRouting(); };
  const std::size_t before = routings_.size();
  routings_.erase(std::remove_if(routings_.begin(), routings_.end(),
                                 [&](const Routing& r) {
                                   return r.captured && std::none_of(r.served.begin(), r.served.end(),
                                                                     [&](Stream s) { return capturing(s); });
                                 }),
                  routings_.end());
  return static_cast<int>(before - routings_.size());
}

bool PrivatePools::ForgetIfEmpty(std::uint16_t tag) {
  if (!contains(tag) || !pools_[tag]->freeable() || pools_[tag]->pools->HoldsMemory()) return false;
  by_id_.erase(pools_[tag]->id);
  pools_[tag].reset();
  free_slots_.push_back(tag);
  return true;
}

absl::Status PrivatePools::CheckInvariants(const std::vector<std::int64_t>& blocks_per_tag) const {
  if (blocks_per_tag.size() != pools_.size())
    return absl::InternalError("private pools: a block carries an unknown tag");
  for (const Routing& r : routings_) {
    if (r.tag == 0 || r.tag >= pools_.size() || pools_[r.tag] == nullptr) {
      return absl::InternalError("private pools: a routing has no pool");
    }
    if (pools_[r.tag]->freeable()) return absl::InternalError("private pools: a freeable pool is routed to");
    if (pools_[r.tag]->tenant() != 0) return absl::InternalError("private pools: a capture routes to a tenant's pool");
  }
  std::size_t stored = 0, erased = 0;
  for (std::size_t tag = 1; tag < pools_.size(); ++tag) {
    if (pools_[tag] == nullptr) {
      ++erased;
      if (blocks_per_tag[tag] != 0) return absl::InternalError("private pools: a block belongs to an erased pool");
      continue;
    }
    const Pool& p = *pools_[tag];
    ++stored;
    if (p.tenant() != 0 && p.use_count != 1) {
      return absl::InternalError(absl::StrCat("tenant pool ", p.tenant(), " has ", p.use_count, " uses"));
    }
    if (Find(p.id) != tag) return absl::InternalError(absl::StrCat("private pool ", PoolName(p.id), " is not indexed"));
    const auto routed =
        std::count_if(routings_.begin(), routings_.end(), [&](const Routing& r) { return r.tag == tag; });
    if (p.use_count < routed) {
      return absl::InternalError(absl::StrCat("private pool ", PoolName(p.id), " counts ", p.use_count, " uses but ",
                                              routed, " routings run into it"));
    }
  }
  if (by_id_.size() != stored || free_slots_.size() != erased) {
    return absl::InternalError(absl::StrCat("private pools: ", by_id_.size(), " indexed and ", free_slots_.size(),
                                            " free slots for ", stored, " stored pools and ", erased, " erased"));
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
