// src/backend/stream_keys.cc — the threads' per-thread pool keys (backend/stream_keys.h).
#include "backend/stream_keys.h"

namespace bucketalloc::internal {

Stream PerThreadKey() {
  static thread_local const Stream key = NewPseudoStream();  // one per thread, never reused
  return key;
}

}  // namespace bucketalloc::internal
