// src/internal/mutex.h — the lock of a device state (layer L0).
//
// Owns: `Mutex`, a lock of one atomic word (0 free, 1 held, 2 held with sleepers) taken with one
// compare-and-swap when free, so that an uncontended alloc+free pair pays two atomic operations and
// no call into the C library; a waiter spins a little (a device lock is held for well under a
// microsecond on a cache hit) and then sleeps on the word with futex(2), so a thread holding it
// across a slow backend call does not make the others spin. `MutexLock` is its scoped holder. The
// acquire and release orderings are the synchronization ThreadSanitizer sees (it models atomics),
// and the class is annotated as a capability for clang's thread-safety analysis (ABSL_GUARDED_BY).
// Thread-safety: it is the lock.
//
// Example:
//   Mutex mu; int x ABSL_GUARDED_BY(mu);
//   { MutexLock lock(mu); ++x; }
#ifndef BUCKETALLOC_INTERNAL_MUTEX_H_
#define BUCKETALLOC_INTERNAL_MUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"

namespace bucketalloc::internal {

class ABSL_LOCKABLE Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    std::uint32_t expected = kFree;
    if (state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire, std::memory_order_relaxed))
        [[likely]] {
      return;
    }
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (state_.exchange(kFree, std::memory_order_release) == kSleepers) [[unlikely]]
      WakeOne();
  }

 private:
  static constexpr std::uint32_t kFree = 0, kHeld = 1, kSleepers = 2;
  void LockSlow();  // spins, then sleeps (mutex.cc)
  void WakeOne();

  std::atomic<std::uint32_t> state_{kFree};
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_MUTEX_H_
