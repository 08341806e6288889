// fuzz/fuzz_util.h — what the fuzz targets share: a property failure aborts with its reason (so
// libFuzzer saves the input as a crash), and the input as text.
#ifndef BUCKETALLOC_FUZZ_FUZZ_UTIL_H_
#define BUCKETALLOC_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"

namespace bucketalloc::fuzz {

// Aborts, naming the broken property and the detail; libFuzzer keeps the input that did it.
[[noreturn]] inline void Broken(absl::string_view property, absl::string_view detail = "") {
  std::fprintf(stderr, "fuzz property broken: %.*s\n%.*s\n", static_cast<int>(property.size()), property.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline absl::string_view Text(const std::uint8_t* data, std::size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace bucketalloc::fuzz

#endif  // BUCKETALLOC_FUZZ_FUZZ_UTIL_H_
