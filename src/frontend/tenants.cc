// src/frontend/tenants.cc — tenants' names and the thread's tenant (frontend/tenants.h).
#include "frontend/tenants.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bucketalloc::internal {
namespace {

// A thread's tenants, one per allocator it set one for (a few: a process has one allocator, tests
// and the harness a handful); past kSlots the oldest setting is forgotten (back to the default).
struct ThreadBinding {
  std::uint64_t owner = 0;  // 0: a free slot
  int index = 0;
};
constexpr int kSlots = 8;
thread_local ThreadBinding t_bindings[kSlots];
thread_local int t_next = 0;

}  // namespace

absl::StatusOr<int> TenantIndex(const Options& options, absl::string_view name) {
  if (name == "default") return 0;
  for (std::size_t i = 0; i < options.tenants.size(); ++i) {
    if (options.tenants[i].name == name) return static_cast<int>(i) + 1;
  }
  std::vector<std::string> names = {"default"};
  for (const TenantSpec& t : options.tenants) names.push_back(t.name);
  return absl::NotFoundError(absl::StrCat("bucketalloc: no tenant named '", name,
                                          "'; accepted: ", absl::StrJoin(names, ", "),
                                          options.tenants.empty() ? " (set tenants:[NAME:SIZE,...] in the CONF)" : ""));
}

std::string TenantName(const Options& options, int index) {
  return index == 0 ? "default" : options.tenants[static_cast<std::size_t>(index) - 1].name;
}

absl::Status ValidateTenantCap(absl::string_view name, std::size_t cap) {
  if (TenantCapInRange(cap)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("bucketalloc: cap ", cap, " bytes for tenant '", name, "' is invalid; accepted: 2MiB to 16TiB"));
}

int ThreadTenant(std::uint64_t owner) {
  for (const ThreadBinding& b : t_bindings) {
    if (b.owner == owner) return b.index;
  }
  return 0;
}

void SetThreadTenant(std::uint64_t owner, int index) {
  for (ThreadBinding& b : t_bindings) {
    if (b.owner == owner) {
      b.index = index;
      return;
    }
  }
  if (index == 0) return;
  t_bindings[t_next] = {owner, index};
  t_next = (t_next + 1) % kSlots;
}

}  // namespace bucketalloc::internal
