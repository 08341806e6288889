// fuzz/workload_fuzz.cc — the generator's readers (src/harness/workload/model_config.cc, requests.cc): a
// model config or request file is a result or an InvalidArgument naming the key or line, never
// a crash, a hang or a huge allocation; a model that parses has weights that add up without
// wrapping. The first byte picks the reader (a model config, or requests in one of the formats).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using bucketalloc::fuzz::Broken;
  if (size == 0) return 0;
  const absl::string_view text = bucketalloc::fuzz::Text(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    absl::StatusOr<bucketalloc::harness::ModelSpec> m = bucketalloc::harness::ParseModelConfig(text, "fuzz.json");
    if (!m.ok()) {
      if (!absl::IsInvalidArgument(m.status())) Broken("a bad config is InvalidArgument", m.status().ToString());
      return 0;
    }
    std::uint64_t total = 0;
    for (const auto& w : m->weights) {
      if (w.bytes > (std::uint64_t{1} << 50) || total + w.bytes < total) Broken("weights add up without wrapping");
      total += w.bytes;
    }
    if (total != m->weight_bytes()) Broken("weight_bytes is the sum of the tensors");
    return 0;
  }
  bucketalloc::harness::RequestOptions options;
  options.limit = 1000;
  absl::StatusOr<bucketalloc::harness::RequestSet> r = bucketalloc::harness::ParseRequests(text, options, "fuzz");
  if (!r.ok() && !absl::IsInvalidArgument(r.status()))
    Broken("bad requests are InvalidArgument", r.status().ToString());
  if (r.ok()) {
    for (const auto& q : r->requests) {
      if (!(q.arrival_s >= 0 && q.arrival_s <= 1e15) || q.input_tokens <= 0 || q.output_tokens <= 0) {
        Broken("requests are well formed");
      }
    }
  }
  return 0;
}
