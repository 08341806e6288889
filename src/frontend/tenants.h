// src/frontend/tenants.h — tenants' names and the calling thread's tenant (layer L4).
//
// Owns: the lookup of a tenant by name in Options::tenants (index 1 up; 0 is the default tenant,
// which takes what no tenant is bound to), and each thread's tenant per allocator (a thread-local:
// no lock, no allocation). The device keeps the stream bindings and the pools (DeviceAllocator).
// Thread-safety: the thread's tenant is the calling thread's own; the lookup is pure.
//
// Example:
//   absl::StatusOr<int> i = TenantIndex(options, "long");   // 2 for tenants:[short:20GiB,long:40GiB]
//   SetThreadTenant(allocator, *i);                          // this thread's requests go to "long"
//   ThreadTenant(allocator);                                 // 2 (0 for any other allocator)
#ifndef BUCKETALLOC_FRONTEND_TENANTS_H_
#define BUCKETALLOC_FRONTEND_TENANTS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/options.h"

namespace bucketalloc::internal {

// The index of tenant `name`: 0 for "default", i + 1 for options.tenants[i]; NotFound naming the
// accepted names.
absl::StatusOr<int> TenantIndex(const Options& options, absl::string_view name);
// The name of tenant `index` ("default" for 0).
std::string TenantName(const Options& options, int index);

// OK for a tenant cap of 2 MiB to 16 TiB, else InvalidArgument naming the tenant and the range.
absl::Status ValidateTenantCap(absl::string_view name, std::size_t cap);

// The calling thread's tenant for the allocator `owner` (Allocator's id, never reused in a process;
// 0 when none was set for it). A thread keeps its tenants for its last 8 allocators.
int ThreadTenant(std::uint64_t owner);
// Sets it (0: the default tenant).
void SetThreadTenant(std::uint64_t owner, int index);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_TENANTS_H_
