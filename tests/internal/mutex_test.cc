#include "internal/mutex.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

TEST(MutexTest, MutualExclusionUnderContention) {
  Mutex mu;
  std::int64_t counter = 0;  // guarded by mu
  std::int64_t shadow = 0;   // a non-atomic read-modify-write pair that a race would break
  constexpr int kThreads = 4, kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        MutexLock lock(mu);
        const std::int64_t before = counter;
        ++counter;
        shadow = before + 1;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(counter, kThreads * kIters);
  EXPECT_EQ(shadow, counter);
}

TEST(CheckDeathTest, FailedCheckAbortsWithTheMessage) {
  EXPECT_DEATH(BA_CHECK(1 + 1 == 3, "arithmetic is broken"), "internal error.*arithmetic is broken");
}

}  // namespace
}  // namespace bucketalloc::internal
