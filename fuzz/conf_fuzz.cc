// fuzz/conf_fuzz.cc — the CONF parser (src/frontend/core/options.cc): any text either parses or is an
// InvalidArgument; what parses prints a configuration that parses again to the same options, and
// printing that again gives the same text (what configures a fresh process to the same options).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "bucketalloc/options.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using bucketalloc::fuzz::Broken;
  absl::StatusOr<bucketalloc::Options> o = bucketalloc::ParseOptions(bucketalloc::fuzz::Text(data, size));
  if (!o.ok()) {
    if (!absl::IsInvalidArgument(o.status())) Broken("a bad CONF is InvalidArgument", o.status().ToString());
    return 0;
  }
  if (absl::Status s = bucketalloc::ValidateOptions(*o); !s.ok()) Broken("parsed options validate", s.ToString());
  const std::string printed = bucketalloc::FormatOptions(*o);
  absl::StatusOr<bucketalloc::Options> again = bucketalloc::ParseOptions(printed);
  if (!again.ok()) Broken("the printed configuration parses", printed + "\n" + again.status().ToString());
  const std::string reprinted = bucketalloc::FormatOptions(*again);
  if (reprinted != printed) Broken("the printed configuration round-trips", printed + "\n" + reprinted);
  if (again->memory_fraction != o->memory_fraction ||
      again->garbage_collection_threshold != o->garbage_collection_threshold ||
      again->tier_min_fill != o->tier_min_fill || again->ResolvedTiers(1) != o->ResolvedTiers(1)) {
    Broken("the printed configuration gives the same options", printed);
  }
  return 0;
}
