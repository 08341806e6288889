// src/frontend/core/fork_registry.cc — the pthread_atfork handlers (frontend/core/fork_registry.h).
#include "frontend/core/fork_registry.h"

#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<ForkParticipant*> participants;  // guarded by mu; in registration order
};

Registry& TheRegistry() {
  static Registry* const registry = new Registry;  // never destroyed: a handler may run during exit
  return *registry;
}

void Prepare() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = TheRegistry();
  r.mu.lock();  // held across fork: no participant comes or goes meanwhile
  for (ForkParticipant* p : r.participants) p->PrepareFork();
}

void Parent() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = TheRegistry();
  for (auto it = r.participants.rbegin(); it != r.participants.rend(); ++it) (*it)->ParentAfterFork();
  r.mu.unlock();
}

void Child() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = TheRegistry();
  for (auto it = r.participants.rbegin(); it != r.participants.rend(); ++it) (*it)->ChildAfterFork();
  r.mu.unlock();
}

}  // namespace

void RegisterForFork(ForkParticipant* p) {
  static const int installed = pthread_atfork(Prepare, Parent, Child);
  BA_CHECK(installed == 0, "pthread_atfork failed: fork would not be safe");
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.participants.push_back(p);
}

void UnregisterForFork(ForkParticipant* p) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.participants.erase(std::remove(r.participants.begin(), r.participants.end(), p), r.participants.end());
}

}  // namespace bucketalloc::internal
