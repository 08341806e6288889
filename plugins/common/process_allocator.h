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
// object is constant-initialized).
//
// Example:
//   constinit ProcessAllocator g_process;
//   Allocator* a = g_process.get();
//   if (a == nullptr) a = g_process.CreateOnce([] { return MakeTheAllocator(); });  // unique_ptr or nullptr
#ifndef BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_
#define BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_

#include <atomic>
#include <memory>
#include <mutex>

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
    std::lock_guard<std::mutex> lock(mu_);
    return f(allocator_.load(std::memory_order_acquire));
  }

 private:
  std::atomic<Allocator*> allocator_{nullptr};
  std::mutex mu_;
  static inline thread_local bool creating_ = false;
};

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_PROCESS_ALLOCATOR_H_
