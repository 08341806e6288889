// fork(2) and the allocator (src/frontend/core/fork_registry.cc, the backends' fork hooks), on the
// simulated device: a child forked while other threads are inside the allocator must find it
// usable and consistent, and a child's writes to device memory must not reach the parent's.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/units.h"
#include "test_util.h"

namespace bucketalloc {
namespace {

// Runs `child` in a fork child (which alarm(2) kills if it hangs) and returns its wait status.
template <typename F>
int InChild(F&& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);  // a deadlocked child dies of SIGALRM instead of hanging the test
    _exit(child());
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (14: SIGALRM, it hung)");
  return absl::StrCat("wait status ", status);
}

class ForkTest : public ::bucketalloc::testing::ConfiguredAllocatorTest {};

// Four threads allocate and free while the main thread forks ten children; each child allocates,
// frees, checks the invariants and empties the cache. Before the fork handlers, children
// deadlocked on a device lock a parent thread held at the fork (4 of 10).
TEST_P(ForkTest, ChildrenOfABusyProcessAllocateAndStayConsistent) {
  BUCKETALLOC_SKIP_BUSY_FORK_UNDER_ASAN();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<void*> held;
      while (!stop.load(std::memory_order_relaxed)) {
        const std::size_t size = std::size_t{1} << (rng() % 22);  // 1 B to 2 MiB
        if (absl::StatusOr<void*> p = allocator_->Allocate(size); p.ok() && *p != nullptr) held.push_back(*p);
        if (held.size() > 16 || (rng() % 3 == 0 && !held.empty())) {
          ASSERT_TRUE(allocator_->Free(held.back()).ok());
          held.pop_back();
        }
      }
      for (void* p : held) ASSERT_TRUE(allocator_->Free(p).ok());
    });
  }
  for (int child = 0; child < 10; ++child) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the threads are inside the allocator
    const int status = InChild([&] {
      std::vector<void*> mine;
      for (int i = 0; i < 64; ++i) {
        absl::StatusOr<void*> p = allocator_->Allocate((i + 1) * 4096 * (i % 8 == 0 ? 16 : 1));
        if (absl::IsResourceExhausted(p.status())) continue;  // a tiny cap, with the parent's blocks held
        if (!p.ok()) return 2;
        mine.push_back(*p);
      }
      for (void* p : mine) {
        if (!allocator_->Free(p).ok()) return 3;
      }
      for (int d = 0; d < allocator_->device_count(); ++d) {
        if (!allocator_->CheckInvariants(d).ok()) return 4;
      }
      return allocator_->EmptyCache().ok() ? 0 : 5;
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << child << " " << Describe(status);
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(allocator_->CheckInvariants(0).ok());
}

BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(ForkTest);

// Expandable segments map the simulated physical memory from a MAP_SHARED memfd: the child must
// get a copy of its own. The child overwrites every byte of the parent's 40 MiB of live blocks,
// frees them and allocates anew; the parent's bytes must be untouched, and the child must see the
// parent's bytes as they were at the fork.
TEST(ForkVmmTest, AChildsWritesDoNotReachTheParentsExpandableSegments) {
  std::unique_ptr<Allocator> a =
      ::bucketalloc::testing::MakeAllocator("expandable_segments:true,capacity:256MiB,sim_total_memory:512MiB");
  ASSERT_NE(a, nullptr);
  std::vector<std::pair<unsigned char*, std::size_t>> blocks;
  for (std::size_t size : {8 * kMiB, 12 * kMiB, 3 * kMiB, 17 * kMiB}) {
    absl::StatusOr<void*> p = a->Allocate(size);
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(*p, 0xab, size);
    blocks.emplace_back(static_cast<unsigned char*>(*p), size);
  }
  const int status = InChild([&] {
    for (const auto& [p, size] : blocks) {
      for (std::size_t i = 0; i < size; ++i) {
        if (p[i] != 0xab) return 2;  // the child's copy is the parent's memory at the fork
      }
      std::memset(p, 0x11, size);
    }
    for (const auto& [p, size] : blocks) {
      if (!a->Free(p).ok()) return 3;
    }
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<void*> q = a->Allocate(10 * kMiB);
      if (!q.ok()) return 4;
      std::memset(*q, 0x22, 10 * kMiB);
    }
    return a->CheckInvariants(0).ok() ? 0 : 5;
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Describe(status);
  std::size_t changed = 0;
  for (const auto& [p, size] : blocks) {
    for (std::size_t i = 0; i < size; ++i) changed += p[i] != 0xab;
  }
  EXPECT_EQ(changed, 0u) << "bytes of the parent's live blocks the child overwrote";
  for (const auto& [p, size] : blocks) ASSERT_TRUE(a->Free(p).ok());
  EXPECT_TRUE(a->CheckInvariants(0).ok());
}

}  // namespace
}  // namespace bucketalloc
