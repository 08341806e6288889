// src/backend/stream_keys.h — the calling thread's pool key for cudaStreamPerThread (layer L1).
//
// Owns: each thread's per-thread pool key (a pseudo stream, bucketalloc/backend.h) and the mapping
// between that key and the cudaStreamPerThread handle that names the stream on that thread. The
// public Allocator::PoolKey/StreamOfKey (bucketalloc/allocator.h, inline there for callers of the
// public header) give the same answers through Allocator::PerThreadKey, which returns this
// PerThreadKey; the front end calls these, not the public Allocator.
// Thread-safety: a thread-local, made on first use; pure otherwise.
//
// Example:
//   Stream key = PerThreadKey();          // this thread's key (unique in the process)
//   StreamOfKey(key) == kPerThreadStream;  // on this thread; another thread's key stays a key
#ifndef BUCKETALLOC_BACKEND_STREAM_KEYS_H_
#define BUCKETALLOC_BACKEND_STREAM_KEYS_H_

#include "bucketalloc/backend.h"

namespace bucketalloc::internal {

// The calling thread's per-thread key: made on its first call, never reused in the process.
Stream PerThreadKey();

// The stream handle that names pool key `key` on this thread (this thread's key:
// cudaStreamPerThread); another pseudo key stays as it is (it names no stream).
inline Stream StreamOfKey(Stream key) { return IsPseudoStream(key) && key == PerThreadKey() ? kPerThreadStream : key; }

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_BACKEND_STREAM_KEYS_H_
