// Concurrency stress: several threads, several streams, cross-thread frees and RecordStream, on one
// device; deterministic per thread (seeded), invariants checked at the end. The TSan build runs it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "bucketalloc/allocator.h"
#include "bucketalloc/testing/sim_backend.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

using ::bucketalloc::testing::AllConfigs;
using ::bucketalloc::testing::Config;
using ::bucketalloc::testing::TestStream;

struct Handoff {
  std::mutex mu;
  std::vector<std::pair<void*, std::size_t>> blocks;  // freed by whichever thread takes them
};

class ConcurrencyTest : public ::testing::TestWithParam<Config> {};

TEST_P(ConcurrencyTest, ThreadsAndStreams) {
  auto allocator = testing::MakeAllocator(GetParam().conf + ",debug_check_invariants:false,sim_devices:2");
  ASSERT_NE(allocator, nullptr);
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 20000;
  Handoff handoff;
  std::atomic<int> errors{0};
  std::atomic<std::int64_t> ooms{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    const int device = t % 2;
    SimBackend* sim = AsSim(*allocator->backend(device));
    const Stream my_streams[2] = {TestStream(10 * t), TestStream(10 * t + 1)};
    std::vector<std::pair<void*, std::size_t>> mine;
    for (int op = 0; op < kOpsPerThread; ++op) {
      const unsigned r = rng() % 100;
      if (mine.empty() || r < 50) {
        const std::size_t size = (rng() % 8 == 0) ? (kMiB + rng() % (12 * kMiB)) : (1 + rng() % (64 * kKiB));
        absl::StatusOr<void*> p = allocator->Allocate(size, device, my_streams[rng() % 2]);
        if (!p.ok()) {
          if (!absl::IsResourceExhausted(p.status())) ++errors;
          ++ooms;
          continue;
        }
        // The first bytes carry the block's tag (its size), checked when it is freed.
        std::memset(*p, static_cast<int>(size & 0xff), std::min<std::size_t>(size, 256));
        mine.emplace_back(*p, size);
      } else if (r < 60) {
        // Hand a block to another thread of the same device (or take one handed over).
        std::lock_guard<std::mutex> lock(handoff.mu);
        if (device == 0 && !mine.empty()) {
          handoff.blocks.push_back(mine.back());
          mine.pop_back();
        } else if (device == 0 && !handoff.blocks.empty()) {
          mine.push_back(handoff.blocks.back());
          handoff.blocks.pop_back();
        }
      } else {
        const std::size_t i = rng() % mine.size();
        auto [p, size] = mine[i];
        mine[i] = mine.back();
        mine.pop_back();
        for (std::size_t b = 0; b < std::min<std::size_t>(size, 256); ++b) {
          if (static_cast<unsigned char*>(p)[b] != static_cast<unsigned char>(size & 0xff)) {
            ++errors;
            break;
          }
        }
        if (r > 95) {
          const Stream other = TestStream(10 * ((t + 1) % kThreads));
          if (!allocator->RecordStream(p, device, other).ok()) ++errors;
          sim->EnqueueWork(other);
        }
        if (!allocator->Free(p, device, size).ok()) ++errors;
        if (r == 99) sim->CompleteWork(TestStream(10 * t));
      }
      if (op % 5000 == 0 && t == 0) {
        if (!allocator->EmptyCache().ok()) ++errors;
      }
    }
    for (auto [p, size] : mine) {
      if (!allocator->Free(p, device, size).ok()) ++errors;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  for (auto [p, size] : handoff.blocks) ASSERT_TRUE(allocator->Free(p, 0, size).ok());
  EXPECT_EQ(errors.load(), 0);
  for (int device = 0; device < 2; ++device) {
    SimBackend* sim = AsSim(*allocator->backend(device));
    for (int t = 0; t < kThreads * 10 + 2; ++t) sim->CompleteWork(TestStream(t));
    ASSERT_TRUE(allocator->EmptyCache().ok());
    absl::Status s = allocator->CheckInvariants(device);
    EXPECT_TRUE(s.ok()) << s;
    const DeviceStats stats = *allocator->GetStats(device);
    EXPECT_EQ(stats.allocated_bytes[kAllPools].current, 0);
    EXPECT_EQ(stats.active_bytes[kAllPools].current, 0);
    EXPECT_EQ(stats.reserved_bytes[kAllPools].current, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ConcurrencyTest, ::testing::ValuesIn(AllConfigs()),
                         [](const auto& info) { return info.param.name; });

// Tenants' bindings change while threads allocate on the streams being bound and retired: each
// request's lookup (Tenants::Of, a thread-local cache checked against the bindings' version) runs
// under the device lock while another thread changes the bindings under the tenants' lock.
TEST(TenantConcurrencyTest, BindingsChangeWhileThreadsAllocateOnTheirStreams) {
  auto allocator = testing::MakeAllocator("backend:sim,capacity:256MiB,tenants:[a:64MiB,b:64MiB]");
  ASSERT_NE(allocator, nullptr);
  constexpr int kStreams = 6;
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::thread binder([&] {
    std::mt19937_64 rng(7);
    const char* names[] = {"default", "a", "b"};
    while (!stop.load()) {
      const Stream s = TestStream(static_cast<int>(rng() % kStreams));
      if (!allocator->BindStream(s, names[rng() % 3]).ok()) errors.fetch_add(1);
    }
  });
  auto worker = [&](int t) {
    std::mt19937_64 rng(100 + t);
    std::vector<std::pair<void*, Stream>> live;
    for (int i = 0; i < 20000; ++i) {
      if (live.size() < 32 && rng() % 2 == 0) {
        const Stream s = TestStream(static_cast<int>(rng() % kStreams));
        absl::StatusOr<void*> p = allocator->Allocate(std::size_t{1} << (9 + rng() % 13), 0, s);
        if (p.ok()) {
          live.emplace_back(*p, s);
        } else if (!absl::IsResourceExhausted(p.status())) {
          errors.fetch_add(1);
        }
      } else if (!live.empty()) {
        const std::size_t k = rng() % live.size();
        if (!allocator->Free(live[k].first, 0).ok()) errors.fetch_add(1);
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (const auto& [p, s] : live) {
      if (!allocator->Free(p, 0).ok()) errors.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  stop.store(true);
  binder.join();
  EXPECT_EQ(errors.load(), 0);
  absl::Status s = allocator->CheckInvariants(0);
  EXPECT_TRUE(s.ok()) << s;
  absl::StatusOr<std::vector<TenantStats>> tenants = allocator->GetTenantStats(0);
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  for (const TenantStats& t : *tenants) {
    EXPECT_EQ(t.allocated, 0u) << t.name;
    EXPECT_LE(t.peak_reserved, t.cap) << t.name;
  }
}

}  // namespace
}  // namespace bucketalloc
