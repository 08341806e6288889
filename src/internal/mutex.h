// src/internal/mutex.h — the lock of a device state (layer L0).
//
// Owns: `Mutex`, a futex-based lock (one atomic exchange to take it uncontended, one to release
// it; waiters sleep in the kernel, so a thread that holds the lock across a slow cudaMalloc does
// not make others spin), annotated as a capability so that clang's thread-safety analysis checks
// ABSL_GUARDED_BY members; and `MutexLock`, its scoped holder. Under ThreadSanitizer it is a
// std::mutex, so that TSan sees every acquisition (the system Abseil is not built with TSan).
// Thread-safety: it is the lock.
//
// Example:
//   Mutex mu; int x ABSL_GUARDED_BY(mu);
//   { MutexLock lock(mu); ++x; }
#ifndef BUCKETALLOC_INTERNAL_MUTEX_H_
#define BUCKETALLOC_INTERNAL_MUTEX_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/base/thread_annotations.h"

#if defined(__SANITIZE_THREAD__)
#define BUCKETALLOC_STD_MUTEX 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BUCKETALLOC_STD_MUTEX 1
#endif
#endif

namespace bucketalloc::internal {

#ifdef BUCKETALLOC_STD_MUTEX
class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};
#else
// States: 0 free, 1 held, 2 held with (possible) sleepers.
class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    std::uint32_t expected = 0;
    if (__builtin_expect(state_.compare_exchange_strong(expected, 1, std::memory_order_acquire), 1)) return;
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (__builtin_expect(state_.exchange(0, std::memory_order_release) != 1, 0)) WakeOne();
  }

 private:
  void LockSlow();
  void WakeOne();
  std::atomic<std::uint32_t> state_{0};
};
#endif

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
