// examples/consumer/main.cc — uses bucketalloc through its installed CMake package only.
//
// Creates an allocator on the simulated device (backed: real host memory, so the blocks can be
// written), allocates 4 KiB (small pool), 3 MiB and 100 MiB (large pool), writes every byte, frees
// them, prints the stats summary and checks the allocator's invariants. Returns non-zero on any error.
#include <cstddef>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/stats.h"

int main() {
  constexpr int kDevice = 0;
  absl::StatusOr<bucketalloc::Options> options =
      bucketalloc::ParseOptions("backend:sim,sim_memory:backed,sim_total_memory:1GiB");
  if (!options.ok()) {
    std::cerr << "ParseOptions: " << options.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<bucketalloc::Allocator>> allocator = bucketalloc::Allocator::Create(*options);
  if (!allocator.ok()) {
    std::cerr << "Allocator::Create: " << allocator.status() << "\n";
    return 1;
  }

  const std::vector<std::size_t> sizes = {4 * bucketalloc::kKiB, 3 * bucketalloc::kMiB, 100 * bucketalloc::kMiB};
  std::vector<void*> blocks;
  int rc = 0;
  for (std::size_t size : sizes) {
    absl::StatusOr<void*> p = (*allocator)->Allocate(size, kDevice);
    if (!p.ok() || *p == nullptr) {
      std::cerr << "Allocate(" << size << "): " << (p.ok() ? "returned nullptr" : p.status().ToString()) << "\n";
      rc = 1;
      break;
    }
    std::memset(*p, 0xA5, size);  // backed sim memory: every byte is writable
    blocks.push_back(*p);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (absl::Status s = (*allocator)->Free(blocks[i], kDevice, sizes[i]); !s.ok()) {
      std::cerr << "Free: " << s << "\n";
      rc = 1;
    }
  }

  absl::StatusOr<bucketalloc::DeviceStats> stats = (*allocator)->GetStats(kDevice);
  if (!stats.ok()) {
    std::cerr << "GetStats: " << stats.status() << "\n";
    return 1;
  }
  std::cout << bucketalloc::StatsSummary(*stats, kDevice) << "\n";
  if (stats->allocation[bucketalloc::kAllPools].current != 0) {
    std::cerr << "expected no live allocations, found " << stats->allocation[bucketalloc::kAllPools].current << "\n";
    rc = 1;
  }
  if (absl::Status s = (*allocator)->CheckInvariants(kDevice); !s.ok()) {
    std::cerr << "CheckInvariants: " << s << "\n";
    return 1;
  }
  std::cout << (rc == 0 ? "consumer: OK" : "consumer: FAILED") << "\n";
  return rc;
}
