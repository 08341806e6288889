// plugins/common/process_allocator.h — the process's one Allocator, for the C ABI
// (libbucketalloc.so) and the LD_PRELOAD shim (layer L5).
//
// Owns: `ProcessAllocator`, which creates the allocator on first use, publishes it with one atomic
// pointer (the fast path reads it with one load), and never destroys it: a host (PyTorch above
// all) may free memory during its own teardown, after a library's static destructors would have
// run. Creation runs once under a lock (other threads wait) and never re-enters: a call made on
// the creating thread while it creates (none is expected) gets nullptr. What to create from, and
// what a failure means (the C ABI reports it and tries again on the next call; the shim forwards
// to the runtime for good), is the caller's.
// Thread-safety: every method may be called from any thread, from static constructors too (the
// object is constant-initialized). fork(2): a parent thread may hold the creation lock at the fork
// (it is creating the allocator); the child has no such thread, so a pthread_atfork child handler
// makes the child's copy of the lock free again, and the child creates its own allocator if the
// parent's was not yet published. (Taking the lock before the fork instead would deadlock: the
// creating thread registers the new allocator for fork, under the fork registry's lock.)
//
// Example:
//   constinit ProcessAllocator g_process;
//   Allocator* a = g_process.get();
//   if (a == nullptr) a = g_process.CreateOnce([] { return MakeTheAllocator(); });  // unique_ptr or nullptr
#ifndef BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_
#define BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <new>

#include "bucketalloc/allocator.h"

namespace bucketalloc::plugins {

class ProcessAllocator {
 public:
  constexpr ProcessAllocator() = default;
  ProcessAllocator(const ProcessAllocator&) = delete;
  ProcessAllocator& operator=(const ProcessAllocator&) = delete;

  // The allocator once it exists, else nullptr (one atomic load).
  Allocator* get() const { return allocator_.load(std::memory_order_acquire); }

  // Returns the allocator, first calling `create()` (-> std::unique_ptr<Allocator>, nullptr when it
  // cannot be made) under the creation lock if none exists yet. Returns nullptr when `create`
  // made none, or when called on the thread that is running `create`. An exception from `create`
  // passes through and leaves nothing created (the next call tries again).
  template <typename Create>
  Allocator* CreateOnce(Create&& create) {
    if (creating_) return nullptr;
    FreeTheLockInForkChildren();
    std::lock_guard<std::mutex> lock(mu_);
    if (Allocator* a = allocator_.load(std::memory_order_acquire)) return a;
    struct Creating {  // on this thread while `create` runs, even if it throws
      Creating() { creating_ = true; }
      ~Creating() { creating_ = false; }
    };
    std::unique_ptr<Allocator> made;
    {
      Creating creating;
      made = create();
    }
    Allocator* a = made.release();  // never destroyed (see the file comment)
    if (a != nullptr) allocator_.store(a, std::memory_order_release);
    return a;
  }

  // Runs `f(existing)` under the creation lock, with the allocator or nullptr, so that nothing is
  // created meanwhile (bucketalloc_configure sets the options of the creation to come).
  template <typename F>
  auto Locked(F&& f) {
    FreeTheLockInForkChildren();
    std::lock_guard<std::mutex> lock(mu_);
    return f(allocator_.load(std::memory_order_acquire));
  }

 private:
  // Installs, once per process, the child handler that re-creates `mu_` unlocked (the process has
  // one ProcessAllocator per library: the C ABI's or the shim's).
  void FreeTheLockInForkChildren() {
    static ProcessAllocator* const self = this;
    static const int installed = pthread_atfork(nullptr, nullptr, [] { ::new (&self->mu_) std::mutex(); });
    (void)installed;  // without the handler a fork child may block on a lock a parent thread held
  }

  std::atomic<Allocator*> allocator_{nullptr};
  std::mutex mu_;
  static inline thread_local bool creating_ = false;
};

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_
