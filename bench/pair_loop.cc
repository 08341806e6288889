// bench/pair_loop.cc — bucketalloc_pair_loop: N cache-hit alloc+free pairs of one size, for counting
// the fast path's instructions with a tool that counts them (valgrind --tool=callgrind): the count
// of N2 pairs less that of N1, over N2 - N1, is the cost of one pair, set-up excluded.
//
//   bucketalloc_pair_loop PAIRS BYTES [CONF]     (CONF defaults to a 1 GiB unbacked sim device)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PAIRS BYTES [BUCKETALLOC_CONF]\n", argv[0]);
    return 2;
  }
  const long pairs = std::atol(argv[1]);
  const std::size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const std::string conf = argc > 3 ? argv[3] : "backend:sim,sim_memory:unbacked,sim_total_memory:1GiB";
  absl::StatusOr<bucketalloc::Options> options = bucketalloc::ParseOptions(conf);
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<bucketalloc::Allocator>> a = bucketalloc::Allocator::Create(*options);
  if (!a.ok()) {
    std::fprintf(stderr, "%s\n", std::string(a.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<void*> warm = (*a)->Allocate(bytes);  // the one miss: the block is cached after it
  if (!warm.ok() || !(*a)->Free(*warm).ok()) return 1;
  for (long i = 0; i < pairs; ++i) {
    absl::StatusOr<void*> p = (*a)->Allocate(bytes);
    if (!p.ok()) return 1;
    void* ptr = *p;
    asm volatile("" : : "r"(ptr) : "memory");
    if (!(*a)->Free(ptr).ok()) return 1;
  }
  return (*a)->GetStats(0)->num_cache_misses == 1 ? 0 : 3;  // every pair was a hit
}
