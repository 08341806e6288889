// The process's allocator of the C ABI and the shim (plugins/common/process_allocator.h): created
// once, and usable in a fork child even when a parent thread held its creation lock at the fork
// (the child has no such thread; before its pthread_atfork handler the child blocked for good).
#include "plugins/common/process_allocator.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

namespace bucketalloc::plugins {
namespace {

constinit ProcessAllocator g_process;

std::unique_ptr<Allocator> Make() { return ::bucketalloc::testing::MakeAllocator("capacity:64MiB"); }

TEST(ProcessAllocatorTest, CreatesOnce) {
  Allocator* a = g_process.CreateOnce(Make);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(g_process.CreateOnce(Make), a);
  EXPECT_EQ(g_process.get(), a);
}

TEST(ProcessAllocatorTest, AForkChildIsNotBlockedByALockAParentThreadHeld) {
  std::atomic<int> phase{0};  // 1: the thread holds the lock; 2: it may let go
  std::thread holder([&] {
    g_process.Locked([&](Allocator*) {
      phase = 1;
      while (phase.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return 0;
    });
  });
  while (phase.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a blocked child dies of SIGALRM
    Allocator* a = g_process.CreateOnce(Make);
    if (a == nullptr) _exit(2);
    absl::StatusOr<void*> p = a->Allocate(1 << 20);
    _exit(p.ok() && a->Free(*p).ok() ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  phase = 2;
  holder.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "wait status " << status << " (signal 14 is SIGALRM: the child blocked on the creation lock)";
}

}  // namespace
}  // namespace bucketalloc::plugins
