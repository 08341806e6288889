// src/frontend/core/fork_registry.h — what makes fork(2) safe for the allocators of a process (layer L4).
//
// Owns: the process's list of `ForkParticipant`s (each Allocator's device set) and the
// pthread_atfork handlers, installed once, that run them: before fork every participant takes its
// locks (in registration order, under the list's own lock), after it the parent releases them in
// reverse, and the child releases them and makes its state its own (ChildAfterFork). So a child
// forked while other threads were inside an allocator finds every lock free, and its copy of the
// allocator consistent: no thread was half-way through an operation when the copy was taken.
// Thread-safety: Register and Unregister may be called from any thread; the handlers run on the
// forking thread.
//
// Example:
//   class Devices : public ForkParticipant { ... };
//   RegisterForFork(&devices);  ...  UnregisterForFork(&devices);
#ifndef BUCKETALLOC_FRONTEND_CORE_FORK_REGISTRY_H_
#define BUCKETALLOC_FRONTEND_CORE_FORK_REGISTRY_H_

namespace bucketalloc::internal {

class ForkParticipant {
 public:
  virtual void PrepareFork() = 0;      // takes every lock the participant's operations take
  virtual void ParentAfterFork() = 0;  // releases them, in the parent
  virtual void ChildAfterFork() = 0;   // releases them, in the child
 protected:
  ~ForkParticipant() = default;
};

void RegisterForFork(ForkParticipant* p);
void UnregisterForFork(ForkParticipant* p);

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_FRONTEND_CORE_FORK_REGISTRY_H_
