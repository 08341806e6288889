// Data integrity on the backed sim: a million random operations per configuration; every live block
// is filled with a pattern derived from its id and verified when it is freed, so a block handed out
// twice, a split or merge at the wrong offset, or a slab slot overlap shows up as corruption.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::AllConfigs;
using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::TestStream;

struct LiveBlock {
  std::uint64_t* p;
  std::size_t size;
  std::uint64_t id;
};

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Fill(const LiveBlock& b) {
  const std::uint64_t seed = Mix(b.id);
  const std::size_t words = b.size / 8;
  for (std::size_t i = 0; i < words; ++i) b.p[i] = seed + i;
  auto* bytes = reinterpret_cast<unsigned char*>(b.p);
  for (std::size_t i = words * 8; i < b.size; ++i) bytes[i] = static_cast<unsigned char>(seed + i);
}

bool Verify(const LiveBlock& b) {
  const std::uint64_t seed = Mix(b.id);
  const std::size_t words = b.size / 8;
  for (std::size_t i = 0; i < words; ++i) {
    if (b.p[i] != seed + i) return false;
  }
  auto* bytes = reinterpret_cast<unsigned char*>(b.p);
  for (std::size_t i = words * 8; i < b.size; ++i) {
    if (bytes[i] != static_cast<unsigned char>(seed + i)) return false;
  }
  return true;
}

class IntegrityTest : public ::testing::TestWithParam<Config> {};

TEST_P(IntegrityTest, AMillionRandomOperationsWithoutCorruption) {
  // Invariants are checked explicitly below rather than on every slow path.
  auto allocator = testing::MakeAllocator(GetParam().conf + ",debug_check_invariants:false");
  ASSERT_NE(allocator, nullptr);
  SimBackend* sim = AsSim(*allocator->backend(0));
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  // Sizes: log-uniform 1 B..128 KiB, 0.5% log-uniform 1..16 MiB (large blocks dominate the time
  // spent filling and verifying, so they are rarer than in a real workload).
  auto draw_size = [&]() -> std::size_t {
    const double hi = unit(rng) < 0.005 ? std::log(16.0 * kMiB) : std::log(128.0 * kKiB);
    const double lo = hi > std::log(kMiB * 1.0) ? std::log(kMiB * 1.0) : 0.0;
    return std::max<std::size_t>(1, static_cast<std::size_t>(std::exp(lo + (hi - lo) * unit(rng))));
  };
  const Stream streams[3] = {nullptr, TestStream(1), TestStream(2)};
  std::vector<LiveBlock> live;
  std::uint64_t next_id = 1;
  std::int64_t ooms = 0, corrupt = 0;
  constexpr int kOps = 1000000;
  constexpr std::size_t kMaxLive = 400;
  for (int op = 0; op < kOps; ++op) {
    const double r = unit(rng);
    if (live.empty() || (r < 0.5 && live.size() < kMaxLive)) {
      const std::size_t size = draw_size();
      const Stream stream = streams[rng() % 3];
      absl::StatusOr<void*> p = allocator->Allocate(size, 0, stream);
      if (!p.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
        ++ooms;
        continue;
      }
      LiveBlock b{static_cast<std::uint64_t*>(*p), size, next_id++};
      Fill(b);
      live.push_back(b);
    } else {
      const std::size_t i = rng() % live.size();
      const LiveBlock b = live[i];
      live[i] = live.back();
      live.pop_back();
      if (!Verify(b)) ++corrupt;
      if (r > 0.98) {  // a use on another stream that is still running when the block is freed
        const Stream other = streams[rng() % 3];
        ASSERT_TRUE(allocator->RecordStream(b.p, 0, other).ok());
        sim->EnqueueWork(other);
      }
      ASSERT_TRUE(allocator->Free(b.p, 0, b.size).ok());
      if (r > 0.995) sim->CompleteWork(streams[rng() % 3]);
      if (r > 0.9999) {
        ASSERT_TRUE(allocator->EmptyCache().ok());
      }
    }
    // Every operation of the first 20000 is followed by a full invariant check, then every 20000th.
    if (op < 20000 || op % 20000 == 0) {
      absl::Status s = allocator->CheckInvariants(0);
      ASSERT_TRUE(s.ok()) << "after " << op << " operations: " << s;
    }
  }
  for (const LiveBlock& b : live) {
    if (!Verify(b)) ++corrupt;
    ASSERT_TRUE(allocator->Free(b.p, 0, b.size).ok());
  }
  for (Stream s : streams) sim->CompleteWork(s);
  ASSERT_TRUE(allocator->EmptyCache().ok());
  EXPECT_EQ(corrupt, 0);
  const DeviceStats stats = *allocator->GetStats(0);
  EXPECT_EQ(stats.allocated_bytes[kAllPools].current, 0);
  EXPECT_EQ(stats.reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(sim->used_bytes(), 0u);
  EXPECT_TRUE(allocator->CheckInvariants(0).ok());
  if (absl::StrContains(GetParam().conf, "expandable_segments:true")) {
    EXPECT_GT(stats.num_granules_stitched, 0) << "the configuration is meant to stitch";
  }
  std::cout << GetParam().name << ": " << stats.allocation[kAllPools].allocated << " allocations, " << ooms
            << " out of memory, " << stats.num_cache_hits << " cache hits, " << stats.num_stitches << " stitches ("
            << stats.num_granules_stitched << " granules), peak reserved "
            << FormatBytes(static_cast<std::size_t>(stats.reserved_bytes[kAllPools].peak)) << "\n";
}

// Every configuration, plus one whose backend fails 5% of its allocations (seeded), so that
// release-and-retry and the OOM path run thousands of times in between.
std::vector<Config> IntegrityConfigs() {
  std::vector<Config> configs = AllConfigs();
  configs.push_back({"faulty_backend", "sim_fail_fraction:0.05,sim_seed:7,capacity:256MiB"});
  // Stitching with 5% of the physical creates (and slab allocations) failing.
  configs.push_back({"faulty_vmm", "expandable_segments:true,sim_fail_fraction:0.05,sim_seed:7,capacity:64MiB"});
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Configs, IntegrityTest, ::testing::ValuesIn(IntegrityConfigs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace bucketalloc
