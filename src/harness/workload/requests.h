// src/harness/workload/requests.h — LLM serving request traces: arrival time and input/output token counts
// (layer L5, the benchmark harness; input of the serving workload generator, harness/workload/serving.h).
//
// Formats, recognised by their first line:
//   - Azure LLM inference traces (CSV `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is
//     wall-clock "2023-11-16 18:15:46.6805900", optionally with a UTC offset "+00:00", or RFC 3339);
//   - Mooncake (JSON lines with `timestamp` in ms, `input_length`, `output_length`; `hash_ids`,
//     the prefix-cache blocks, are ignored: the generator does not model prefix caching);
//   - sarathi-serve / vidur length CSVs (`num_prefill_tokens,num_decode_tokens,...`): lengths only,
//     so arrivals are drawn as a Poisson process at `qps` requests per second (of the kept requests).
// Sampling comes first, then the limit; arrival times are made relative to the earliest kept request
// and multiplied by time_scale.
// Thread-safety: none (values).
//
// Example:
//   absl::StatusOr<std::vector<Request>> r = ReadRequestsFile("conv.csv", {.limit = 500, .time_scale = 0.1});
#ifndef BUCKETALLOC_HARNESS_WORKLOAD_REQUESTS_H_
#define BUCKETALLOC_HARNESS_WORKLOAD_REQUESTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::harness {

struct Request {
  double arrival_s = 0.0;  // seconds since the first kept request arrived
  int input_tokens = 0;    // > 0
  int output_tokens = 0;   // > 0 (a 0 in the file counts as 1: a request produces at least one token)
};

enum class RequestFormat : std::uint8_t { kAzure, kMooncake, kLengthsOnly };
absl::string_view RequestFormatName(RequestFormat format);

struct RequestOptions {
  // Keep each request with this probability (seeded), in (0, 1].
  double sample_fraction = 1.0;
  // Then keep the first `limit` kept requests (0 = all).
  std::int64_t limit = 0;
  // Arrival times are multiplied by this (> 0): 0.5 makes the same requests arrive twice as fast.
  double time_scale = 1.0;
  // Requests per second of the Poisson arrivals drawn for the kept requests of a lengths-only file (> 0).
  double qps = 5.0;
  std::uint64_t seed = 1;
};

struct RequestSet {
  RequestFormat format = RequestFormat::kAzure;
  std::int64_t rows = 0;  // requests in the file
  std::vector<Request> requests;
};

// Parses a request trace; errors (InvalidArgument) name `source`, the line, the field and what is
// accepted.
absl::StatusOr<RequestSet> ParseRequests(absl::string_view text, const RequestOptions& options,
                                         absl::string_view source = "requests");
absl::StatusOr<RequestSet> ReadRequestsFile(const std::string& path, const RequestOptions& options);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_WORKLOAD_REQUESTS_H_
