// src/internal/mutex.cc — the slow paths of the device lock (internal/mutex.h): spin, then sleep on
// the lock word with futex(2) (Drepper, "Futexes Are Tricky", mutex 3, with a bounded spin first).
#include "internal/mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace bucketalloc::internal {
namespace {

// Spins before sleeping: a cache hit holds the lock for tens of nanoseconds.
constexpr int kSpins = 100;

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long Futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op | FUTEX_PRIVATE_FLAG, value, nullptr, nullptr,
                 0);
}

}  // namespace

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t), "futex(2) waits on the word itself");

void Mutex::LockSlow() {
  for (int i = 0; i < kSpins; ++i) {
    Pause();
    std::uint32_t expected = kFree;
    if (state_.load(std::memory_order_relaxed) == kFree &&
        state_.compare_exchange_weak(expected, kHeld, std::memory_order_acquire, std::memory_order_relaxed)) {
      return;
    }
  }
  // Sleep until the holder wakes us; we hold the lock once the word goes from free to "held with
  // sleepers" in our hands (another sleeper may still be waiting, so Unlock must wake).
  while (state_.exchange(kSleepers, std::memory_order_acquire) != kFree) {
    Futex(&state_, FUTEX_WAIT, kSleepers);
  }
}

void Mutex::WakeOne() { Futex(&state_, FUTEX_WAKE, 1); }

}  // namespace bucketalloc::internal
