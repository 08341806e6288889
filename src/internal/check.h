// src/internal/check.h — fatal checks for internal consistency (layer L0).
//
// Owns: BA_CHECK (always on) and BA_DCHECK (debug builds only). They guard conditions that can only
// fail through a bug in bucketalloc itself; bad input from callers is reported as a Status instead.
// Thread-safety: stateless.
//
// Example: BA_CHECK(block->size >= size, "a free-list block is smaller than its bin");
#ifndef BUCKETALLOC_INTERNAL_CHECK_H_
#define BUCKETALLOC_INTERNAL_CHECK_H_

namespace bucketalloc::internal {

// Prints "bucketalloc: internal error at file:line: condition (message)" to stderr and aborts.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition, const char* message);

}  // namespace bucketalloc::internal

#define BA_CHECK(cond, msg)                                                                                   \
  do {                                                                                                        \
    if (__builtin_expect(!(cond), 0)) ::bucketalloc::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#ifdef NDEBUG
#define BA_DCHECK(cond, msg) \
  do {                       \
  } while (0)
#else
#define BA_DCHECK(cond, msg) BA_CHECK(cond, msg)
#endif

#endif  // BUCKETALLOC_INTERNAL_CHECK_H_
