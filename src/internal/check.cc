#include "internal/check.h"

#include <cstdio>
#include <cstdlib>

namespace bucketalloc::internal {

void CheckFailed(const char* file, int line, const char* condition, const char* message) {
  std::fprintf(stderr, "bucketalloc: internal error at %s:%d: %s (%s)\n", file, line, condition, message);
  std::abort();
}

}  // namespace bucketalloc::internal
