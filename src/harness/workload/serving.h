// src/harness/workload/serving.h — the serving workload generator: the allocation trace an LLM server on
// PyTorch would produce for a request trace and a model (layer L5, the benchmark harness).
//
// The model (docs/harness.md, "The serving workload generator", states it and its simplifications):
//   1. Weights: one allocation per real tensor of the checkpoint (harness/workload/model_config.h), first.
//   2. Scheduler: continuous batching as vLLM does it. Each step first gives every running request
//      its next token (decode), then admits waiting requests that have arrived, in arrival order,
//      while the batch has fewer than max_num_seqs sequences and fewer than max_batched_tokens
//      tokens; a prompt longer than the remaining token budget is prefilled in chunks over several
//      steps. With max_kv_tokens a request is admitted only when the tokens of all running requests
//      (prompt + output, the most they will hold) stay within it: no preemption. Requests longer
//      than max_model_len are rejected, as vLLM rejects them. A step lasts
//      (step_base_ms + step_us_per_token x tokens / 1000) x weight_bytes / 16 GiB (decoding is
//      bound by reading the weights), and the clock jumps to the next arrival when idle.
//   3. Each step runs the forward pass of its batch (T tokens, B sequences): input ids and
//      positions, the embedding, the temporaries of an eager PyTorch decoder layer (RMSNorm,
//      q/k/v projections, attention output with a fused attention kernel (no T x T scores), o_proj,
//      residual, RMSNorm, gate and up, SiLU and product, down_proj, residual), the final norm, and
//      for the B sampled sequences the logits (model dtype, then float32) and probabilities. All
//      temporaries are freed in the order PyTorch frees them. Every layer repeats the same sizes
//      in the same order, and a caching allocator serves layer l + 1 from the blocks layer l freed,
//      so by default one layer pass is written per step, with the KV updates of all layers at its
//      attention; every_layer writes all passes (L times the events, the same bytes).
//   4. KV cache (kv_layout), updated inside the layer loop as a real model does:
//      - tiered: per request and layer a K and a V tensor of tier(tokens) tokens, tiers 512, 1024,
//        2048, 4096, then doubling; outgrowing a tier allocates the next one and frees the old.
//      - growth: the Hugging Face DynamicCache pattern; per request and layer K and V are
//        concatenated with the new tokens every growth_tokens tokens (a new tensor, then the old one
//        freed).
//      - paged: vLLM's one pool, one tensor per layer holding K and V for kv_pool_tokens tokens in
//        blocks of block_tokens, allocated after the weights; requests allocate nothing.
//      Finished requests free their KV after the step.
//   5. At the end everything is freed, weights included (a trace is a whole engine lifetime, so
//      `replay --repeat` measures what reloading does to the cache).
// The same requests and options give the same schedule for every layout, so traces of different
// layouts are comparable; their true need (below) is identical.
//
// The true peak need: the most of weights + exact KV of the tokens actually held (tokens x
// kv_bytes_per_token, no layout rounding) + live activations, over the run. A layout's rounding and
// an allocator's cost both show on top of it.
// Thread-safety: none.
//
// Example:
//   absl::StatusOr<ServingTrace> t = GenerateServingTrace(requests, model, ServingOptions{});
//   WriteServingTrace(*t, "serving.csv");  // and serving.meta.json beside it
#ifndef BUCKETALLOC_HARNESS_WORKLOAD_SERVING_H_
#define BUCKETALLOC_HARNESS_WORKLOAD_SERVING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "harness/replay/trace.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"

namespace bucketalloc::harness {

enum class KvLayout : std::uint8_t { kTiered, kGrowth, kPaged };

// The stream of long requests' KV tensors with ServingOptions::tenant_split_tokens:
// kLongRequestStream (harness/replay/trace.h, a convention of the trace that replays read).
absl::string_view KvLayoutName(KvLayout layout);
absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view name);  // tiered, growth, paged

struct ServingOptions {
  KvLayout kv_layout = KvLayout::kTiered;
  int max_num_seqs = 256;          // vLLM's default
  int max_batched_tokens = 8192;   // per step, prefill chunks included
  std::int64_t max_kv_tokens = 0;  // admission limit on tokens the running requests may hold (0 = none)
  int max_model_len = 0;           // 0 = the config's max_position_embeddings
  std::vector<int> tiers_tokens = {512, 1024, 2048, 4096};  // tiered: then doubling
  int growth_tokens = 16;           // growth: concatenate every N tokens (1 = every token, as HF does)
  int block_tokens = 16;            // paged: tokens per block (vLLM's default)
  std::int64_t kv_pool_tokens = 0;  // paged: 0 = the schedule's peak of blocks held, in tokens
  bool every_layer = false;         // write each layer's pass (see the file comment)
  // > 0: the KV tensors of requests longer than this (prompt + output tokens) are allocated (and
  // freed) on kLongRequestStream, every other event on stream 0, so that a replay can give long
  // requests a pool of their own (a tenant, docs/configuration.md). Tiered and growth layouts.
  std::int64_t tenant_split_tokens = 0;
  double step_base_ms = 10.0;  // step time for a 16 GiB model (see the file comment)
  double step_us_per_token = 40.0;
};

// What the generator measured while writing the trace (also in the meta file).
struct ServingSummary {
  std::int64_t requests = 0;  // given
  std::int64_t served = 0;
  std::int64_t rejected_too_long = 0;       // input + output > max_model_len
  std::int64_t rejected_over_kv_limit = 0;  // input + output > max_kv_tokens (it could never be admitted)
  std::int64_t steps = 0;
  double simulated_seconds = 0.0;
  int max_running = 0;  // the most sequences in one step
  std::int64_t tokens_prefilled = 0;
  std::int64_t tokens_decoded = 0;
  std::int64_t kv_pool_tokens = 0;  // paged only
  std::uint64_t weight_bytes = 0;
  std::uint64_t peak_live_bytes = 0;  // of the trace
  std::uint64_t true_peak_need_bytes = 0;
  // The parts of the true need at its peak.
  std::uint64_t need_kv_bytes = 0;
  std::uint64_t need_activation_bytes = 0;
  std::uint64_t peak_kv_layout_bytes = 0;  // the most bytes the layout's KV tensors held at once
  std::int64_t long_requests = 0;          // served requests over tenant_split_tokens (0 without a split)
};

// What each event's memory is for.
enum class TensorKind : std::uint8_t { kWeight, kKv, kActivation };

struct ServingTrace {
  Trace trace;
  std::vector<TensorKind> kinds;  // parallel to trace.events
  ServingSummary summary;
};

absl::StatusOr<ServingTrace> GenerateServingTrace(const std::vector<Request>& requests, const ModelSpec& model,
                                                  const ServingOptions& options);

// The most activation bytes live at once in one step of `tokens` tokens of which `sampled`
// sequences produce a token (the forward pass of item 3 above, without its KV updates).
std::uint64_t ActivationPeakBytes(const ModelSpec& model, std::uint64_t tokens, std::uint64_t sampled);

// The simulated seconds of one step of `tokens` batched tokens (item 2 of the file comment):
// (step_base_ms + step_us_per_token x tokens / 1000) / 1000 x the model's weight bytes / 16 GiB.
double StepSeconds(const ModelSpec& model, const ServingOptions& options, std::uint64_t tokens);

// The token capacity a request's KV tensors have when they hold `tokens` tokens in the tiered layout
// (the first tier that holds them, then doubling past the last) or the growth layout (whole growth
// steps); `tokens` itself for the paged layout.
std::int64_t KvCapacityTokens(const ServingOptions& options, std::int64_t tokens);

// For the tiered layout: the BUCKETALLOC_CONF whose tiers are exactly this trace's K/V tensor sizes
// (tiers_tokens over bytes_per_token = one layer's K or V bytes per token), from the first tier
// above bucketalloc's default small_pool_limit (1 MiB) up to the largest tensor the trace holds;
// empty for other layouts or when no tensor is that large.
std::string TieredBucketallocConf(const ServingTrace& trace, const ModelSpec& model, const ServingOptions& options);

// The meta file beside a trace: "x.csv" -> "x.meta.json" (any other name: name + ".meta.json").
std::string MetaPathFor(const std::string& trace_path);

// Writes the trace and its meta file. `meta_inputs` (a JSON object, may be empty) records where the
// requests and model came from; the meta file also holds the options and the summary.
absl::Status WriteServingTrace(const ServingTrace& trace, const ModelSpec& model, const ServingOptions& options,
                               const std::string& meta_inputs_json, const std::string& path);

// The true peak need recorded in a trace's meta file; nullopt when the trace has none. An
// unreadable or malformed meta file, or one written for a trace of another number of events than
// `trace_events`, is an error.
absl::StatusOr<std::optional<std::uint64_t>> ReadTrueNeed(const std::string& trace_path, std::size_t trace_events);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_WORKLOAD_SERVING_H_
