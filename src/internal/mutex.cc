#include "internal/mutex.h"

#ifndef BUCKETALLOC_STD_MUTEX
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace bucketalloc::internal {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void Futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op | FUTEX_PRIVATE_FLAG, value, nullptr, nullptr, 0);
}

}  // namespace

void Mutex::LockSlow() {
  // Spin briefly: critical sections on the fast path are a few hundred instructions.
  for (int i = 0; i < 64; ++i) {
    std::uint32_t expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_weak(expected, 1, std::memory_order_acquire)) {
      return;
    }
    CpuRelax();
  }
  // Mark the lock contended and sleep until it is released.
  while (state_.exchange(2, std::memory_order_acquire) != 0) Futex(&state_, FUTEX_WAIT, 2);
}

void Mutex::WakeOne() { Futex(&state_, FUTEX_WAKE, 1); }

}  // namespace bucketalloc::internal
#endif
