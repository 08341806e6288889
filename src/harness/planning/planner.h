// src/harness/planning/planner.h — `bucketalloc-bench plan`: the card's memory budget before serving, from
// the model, the card and the request profile, checked by replaying what it recommends (layer L5,
// the benchmark harness; docs/planner.md has the method and a worked example).
//
// Owns: the budget's formulas and the recommendation (`MakePlan`), and their check (`CheckPlan`).
//   - weights per GPU: each tensor of the checkpoint (harness/workload/model_config.h) in the serving dtype:
//     bf16/fp16 2 bytes a parameter; fp8 1 byte for the linear layers' weights (q/k/v/o, gate/up/down
//     projections) and 2 for the embeddings, lm_head, norms and biases, as FP8 checkpoints keep them;
//     int4 0.5 byte plus a 16-bit scale and a 4-bit zero point per group of 128 for the linear
//     layers (AWQ/GPTQ), 2 bytes for the rest. Tensor parallelism splits every tensor but the norms
//     (replicated) by N.
//   - KV bytes per token per GPU: 2 x layers x KV heads per GPU x head_dim x 2 bytes (the KV cache
//     stays in the activations' 16 bits; quantization changes the weights only). KV heads per GPU are
//     kv_heads / N, or 1 when N is a multiple of kv_heads (vLLM replicates them).
//   - activations: the peak of one step of max_batched_tokens tokens with max_num_seqs sampled
//     rows, as the serving generator's forward pass allocates them (ActivationPeakBytes).
//   - the allocator's budget: card x gpu-memory-utilization - runtime reserve (the CUDA context,
//     library workspaces and CUDA graphs, which the allocator never sees; default 1 GiB).
//   - KV cache tokens: (budget - weights - activations) / KV bytes per token, in whole blocks of 16.
//   - the request profile in buckets by input and output length: S (input <= 512, output <= 128),
//     M (<= 2048, <= 256), L (<= 8192, <= 512), XL (longer input or output over 512); a request is in
//     the larger of its input's and its output's bucket. Per bucket: share, P50 and P99 of prompt and
//     output (nearest rank).
//   - max_model_len: PlanOptions::max_model_len, else the longest request rounded up to 256 tokens,
//     at most the config's max_position_embeddings and the KV cache tokens (requests longer are
//     rejected: the plan says how many).
//   - max_num_seqs: the most sequences of the P99 length (prompt + output) that the KV cache holds at
//     once with whole blocks, at most 256 (vLLM's default), with the activations of that many rows.
//   - tiers for the tiered KV layout: the P50 and P99 of each bucket's length, rounded up to 256
//     tokens, with doubling steps between two more than twice apart, then doubling; or the default
//     tiers (512, 1024, 2048, 4096, then doubling) when they waste less over the profile. CheckPlan
//     then measures both on its tiered trace and keeps the one that wastes less there.
//   - fits: the budget holds the weights, one step's activations and one request of the P99 length;
//     the smallest card is the one whose budget does, rounded up to a GiB. When it does not, the
//     best plan on this card (CardPlan) is the plan of the longest max_model_len one sequence fits
//     in, for the profile's requests no longer; "does not fit" at all only when the weights and
//     one step's activations leave no room for a sequence.
// `CheckPlan` generates the serving trace of the recommended settings (the profile's first requests
// arriving together, the worst case for memory) in the paged layout (the KV cache allocated up front,
// as vLLM does) and the tiered layout (tensors by tier, admission within the tiers' worst rounding),
// and measures min-capacity for bucketalloc and pytorch-policy: the margin is the budget less the
// largest; a margin under the headroom (1% of the budget, at least 256 MiB: what other requests'
// step shapes may fragment beyond these) lowers the KV cache tokens by the difference and measures
// again. The smallest card is
// measured the same way with one sequence.
// Thread-safety: none (values).
//
// Example:
//   absl::StatusOr<Plan> p = MakePlan(model, PlanOptions{.card_bytes = 80 * kGiB}, requests);
//   CheckPlan(model, requests, &*p);  // p->checks, p->measured_margin_bytes
//   std::string json = PlanToJson(*p);
#ifndef BUCKETALLOC_HARNESS_PLANNING_PLANNER_H_
#define BUCKETALLOC_HARNESS_PLANNING_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"
#include "harness/workload/serving.h"

namespace bucketalloc::harness {

// What MakePlan accepts (InvalidArgument names the option, its value and these bounds: see
// PlanOption). They keep every size of the budget within 64 bits: cards and reserves up to 64 TiB,
// a utilization of at least 1% (the smallest card is a need divided by it), steps of up to 2^20
// tokens.
inline constexpr std::uint64_t kMaxPlanCardBytes = std::uint64_t{64} << 40;  // 64 TiB
inline constexpr double kMinGpuMemoryUtilization = 0.01;
inline constexpr int kMaxPlanBatchedTokens = 1 << 20;
// The check replays a trace only when its schedule is at most this many steps (estimated from the
// requests before it is generated: a step is tens of events, and each trace is replayed about ten
// times per allocator); a longer one is skipped with a note naming why (Plan::notes).
inline constexpr std::int64_t kMaxCheckSteps = 250000;

struct PlanOptions {
  std::uint64_t card_bytes = 0;         // the card's memory, 1 byte to kMaxPlanCardBytes
  std::string dtype;                    // bf16, fp16, fp8, int4; empty: the config's (float32 stays 4 bytes)
  int tensor_parallel = 1;              // 1 to 1024, dividing the heads (PerGpuModel)
  double gpu_memory_utilization = 0.9;  // kMinGpuMemoryUtilization to 1; vLLM's default
  int max_model_len = 0;                // 0: from the profile (see the file comment); else 2 to max_position_embeddings
  std::uint64_t runtime_reserve_bytes = std::uint64_t{1} << 30;  // at most kMaxPlanCardBytes
  int max_batched_tokens = 8192;                                 // per step, 1 to kMaxPlanBatchedTokens
  int max_num_seqs_limit = 256;                                  // the most max_num_seqs recommended
  std::int64_t check_requests = 400;  // the profile's first requests the check serves (0: all)
};

// One length bucket of the request profile.
struct LengthBucket {
  std::string name;  // S, M, L, XL
  std::int64_t requests = 0;
  double share = 0.0;
  int p50_input = 0, p99_input = 0, p50_output = 0, p99_output = 0;
  int p50_total = 0, p99_total = 0;  // prompt + output
};
// S, M, L, XL (see the file comment).
std::vector<LengthBucket> LengthProfile(const std::vector<Request>& requests);
// The bucket of a request of `input` and `output` tokens: 0 S, 1 M, 2 L, 3 XL.
int LengthBucketOf(int input, int output);

// What one replay of the check measured.
struct PlanCheck {
  std::string layout;     // paged, tiered
  std::string allocator;  // bucketalloc, pytorch-policy (as given to min-capacity)
  std::string what;       // "recommended" or "smallest card"
  std::uint64_t budget_bytes = 0;
  std::uint64_t min_capacity_bytes = 0;
  std::int64_t margin_bytes = 0;  // budget - min capacity
  std::uint64_t true_need_bytes = 0;
  std::int64_t served = 0, rejected = 0;
  std::int64_t steps = 0;  // the schedule's steps (a burst of requests: few)
  std::string command;     // the generate serving command line that writes the same trace
};

// The best plan on the card the operator has, when it cannot hold the profile's P99 request
// (Plan::fits false) but holds the weights, one step's activations and a sequence: the longest
// max_model_len that fits with one sequence (in whole blocks, at most max_position_embeddings),
// the concurrency that then fits the profile's requests no longer than it, and the share of the
// profile's requests longer (rejected). Checked by replay as a fitting plan is (CheckPlan: its
// requests, max_model_len shortened when one sequence of it does not fit by the check).
struct CardPlan {
  int max_model_len = 0;
  int max_num_seqs = 0;
  std::int64_t kv_cache_tokens = 0;
  std::int64_t rejected = 0;    // profile requests longer than max_model_len
  double rejected_share = 0.0;  // of the profile's requests (0 without a profile)
  bool checked = false;
  std::int64_t measured_margin_bytes = 0;
  std::vector<PlanCheck> checks;
};

struct Plan {
  // Inputs, as used.
  std::string model;
  std::string dtype;
  int tensor_parallel = 1;
  double gpu_memory_utilization = 0.9;
  std::uint64_t card_bytes = 0, runtime_reserve_bytes = 0, budget_bytes = 0;
  int max_batched_tokens = 0;
  // The budget.
  std::uint64_t parameters = 0;
  std::uint64_t weights_bytes = 0;       // per GPU
  std::uint64_t kv_bytes_per_token = 0;  // per GPU
  std::uint64_t activation_bytes = 0;    // one step at max_num_seqs
  std::int64_t kv_cache_tokens = 0;      // the paged pool, whole blocks
  // The profile.
  std::int64_t requests = 0;
  std::vector<LengthBucket> buckets;
  int p99_total = 0, longest_total = 0;
  // Recommendations.
  bool fits = false;
  std::uint64_t smallest_card_bytes = 0;  // 0: no card up to kMaxPlanCardBytes fits
  int max_num_seqs = 0;
  int max_model_len = 0;
  std::int64_t rejected_too_long = 0;     // profile requests longer than max_model_len
  std::int64_t max_kv_tokens_paged = 0;   // admission: the pool less a block per sequence
  std::int64_t max_kv_tokens_tiered = 0;  // admission within the tiers' worst rounding
  std::vector<int> tiers_tokens;
  double tier_waste = 0.0;          // over the profile: 1 - tokens / tier tokens at each request's end
  double default_tier_waste = 0.0;  // the generator's default tiers 512, 1024, 2048, 4096, ...
  // Measured by CheckPlan on the tiered check's trace (1 - exact KV bytes / the tiers' KV bytes at
  // the trace's peak need), for the profile's tiers and the default ones; tiers_tokens is the one
  // with less (-1: not measured).
  double measured_tier_waste = -1.0, measured_default_tier_waste = -1.0;
  // Fits false, and the card holds the weights, one step's activations and a sequence.
  std::optional<CardPlan> on_this_card;
  // The check.
  std::vector<PlanCheck> checks;
  bool checked = false;
  std::int64_t measured_margin_bytes = 0;  // the least margin of the recommended settings' checks
  std::vector<std::string> notes;
};

// The options MakePlan, CheckPlan and PerGpuModel check. An error about one of them is
// InvalidArgument whose message starts with the option's name as PlanOptions spells it, then the
// value given and what is accepted ("max_model_len 1: accepted 0 (from the profile) or 2 to ..."),
// and which carries the option (PlanOptionOf), so that a caller can name it as its own users know it
// (bucketalloc-bench names the flag: tools/bench_plan.h).
enum class PlanOption {
  kCardBytes,
  kDtype,
  kTensorParallel,
  kGpuMemoryUtilization,
  kMaxModelLen,
  kRuntimeReserveBytes,
  kMaxBatchedTokens,
  kMaxNumSeqsLimit,
  kCheckRequests,
};
// Its name: the PlanOptions field ("card_bytes", "max_model_len", ...), PerGpuModel's "dtype" and
// "tensor_parallel".
absl::string_view PlanOptionName(PlanOption option);
// The option an error of the planner is about; nullopt for any other status (an error of the model's
// config names its file and key instead).
std::optional<PlanOption> PlanOptionOf(const absl::Status& status);

// The plan from the formulas (no replay). InvalidArgument for a bad option (see PlanOption: a dtype,
// a tensor-parallel degree that does not divide the heads, a utilization outside [0.01, 1], a
// max_model_len past the config's max_position_embeddings, a step whose activations no allocator
// could hold), and for a profile that no request of can be served (every one longer than
// max_model_len, or than the config's max_position_embeddings: the error names the config file and
// key).
absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const PlanOptions& options, const std::vector<Request>& requests);

// Replays the plan's recommendations (see the file comment), filling `plan->checks`, the measured
// margin and a measured smallest card; lowers the KV cache tokens when a margin is negative. The
// requests arrive together whatever the model: their arrivals are scaled to within a thousandth of
// the model's shortest step. A replay the simulated device cannot hold (a budget over half of
// kMaxSimReplayCapacity: the min-capacity search may probe twice the budget) or of more than
// kMaxCheckSteps steps is skipped, with a note naming the card or the steps and why.
absl::Status CheckPlan(const ModelSpec& model, const PlanOptions& options, const std::vector<Request>& requests,
                       const std::string& model_path, const std::string& requests_path, Plan* plan);

// One GPU's share of the model in the serving dtype with N-way tensor parallelism: its weight
// tensors, heads, KV heads and MLP width per GPU, and the activations' element size. InvalidArgument
// about PlanOption::kDtype or kTensorParallel for a dtype or a degree it cannot split the model by.
absl::StatusOr<ModelSpec> PerGpuModel(const ModelSpec& model, const std::string& dtype, int tensor_parallel);

// The serving options the plan recommends for `layout`.
ServingOptions PlanServingOptions(const Plan& plan, KvLayout layout);

std::string PlanToJson(const Plan& plan);
std::string PlanToText(const Plan& plan);
// A self-contained HTML page (harness/reports/page.h): the budget, the profile, the recommendations and the check.
std::string PlanHtml(const Plan& plan);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_PLANNING_PLANNER_H_
