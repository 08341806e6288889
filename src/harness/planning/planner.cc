// src/harness/planning/planner.cc — the card's budget and its check (harness/planning/planner.h).
#include "harness/planning/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/units.h"
#include "harness/replay/policies.h"
#include "harness/replay/replay.h"
#include "harness/reports/page.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr int kBlockTokens = 16;          // vLLM's default block, the paged layout's
constexpr int kLengthRounding = 256;      // max_model_len and tiers are whole multiples of this
constexpr int kQuantGroup = 128;          // int4: parameters per group
constexpr double kCheckTimeScale = 1e-6;  // the check's arrivals: together (a burst), at most this
// The check's arrivals all fall within this share of the model's shortest step (a burst for any model).
constexpr double kBurstShareOfStep = 1e-2;
// The largest budget the check replays: min-capacity may probe twice it on the simulated device.
constexpr std::uint64_t kMaxCheckBudget = kMaxSimReplayCapacity / 2;
// The margin the check keeps: 1% of the budget, at least 256 MiB.
constexpr double kHeadroomShare = 0.01;
constexpr std::size_t kHeadroomFloor = 256 * kMiB;
constexpr int kCheckRounds = 6;  // checks of the recommended settings, at most
constexpr const char* kBucketNames[] = {"S", "M", "L", "XL"};
// The bucket bounds: input <= kInputBound[b] and output <= kOutputBound[b] (XL: beyond L's).
constexpr int kInputBound[] = {512, 2048, 8192};
constexpr int kOutputBound[] = {128, 256, 512};

// Each option's name (PlanOptionName), and the payload of an error about one: its name.
constexpr std::pair<PlanOption, absl::string_view> kOptionNames[] = {
    {PlanOption::kCardBytes, "card_bytes"},
    {PlanOption::kDtype, "dtype"},
    {PlanOption::kTensorParallel, "tensor_parallel"},
    {PlanOption::kGpuMemoryUtilization, "gpu_memory_utilization"},
    {PlanOption::kMaxModelLen, "max_model_len"},
    {PlanOption::kRuntimeReserveBytes, "runtime_reserve_bytes"},
    {PlanOption::kMaxBatchedTokens, "max_batched_tokens"},
    {PlanOption::kMaxNumSeqsLimit, "max_num_seqs_limit"},
    {PlanOption::kCheckRequests, "check_requests"},
};
constexpr absl::string_view kPlanOptionPayload = "bucketalloc.harness.PlanOption";

// InvalidArgument about `option`: "NAME VALUE...: accepted ...", with `value_and_why` after the name,
// and the option as the payload (PlanOptionOf).
absl::Status OptionError(PlanOption option, absl::string_view value_and_why) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat(PlanOptionName(option), " ", value_and_why));
  s.SetPayload(kPlanOptionPayload, absl::Cord(PlanOptionName(option)));
  return s;
}

std::int64_t RoundDown(std::int64_t n, std::int64_t to) { return n <= 0 ? 0 : n / to * to; }

// Nearest rank: the smallest value with at least q of the values at or below it.
int Quantile(std::vector<int> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

bool IsNorm(const std::string& name) { return absl::StrContains(name, "norm"); }
// The linear layers' weights, which quantized checkpoints store in the quantized format.
bool IsQuantizedLinear(const std::string& name) {
  return absl::StrContains(name, "model.layers.") && absl::EndsWith(name, "_proj.weight");
}

// The weights' bytes per parameter for a linear layer in `dtype`; the other tensors keep 16 bits.
double LinearBytesPerParameter(const std::string& dtype) {
  if (dtype == "fp8") return 1.0;
  if (dtype == "int4") return 0.5 + (2.0 + 0.5) / kQuantGroup;  // 4-bit weights, 16-bit scale and 4-bit zero per group
  return 2.0;
}

std::int64_t TotalTokens(const Request& r) { return static_cast<std::int64_t>(r.input_tokens) + r.output_tokens; }

double TierWaste(const std::vector<Request>& requests, const ServingOptions& tiers) {
  double tokens = 0, held = 0;
  for (const Request& r : requests) {
    tokens += static_cast<double>(TotalTokens(r));
    held += static_cast<double>(KvCapacityTokens(tiers, TotalTokens(r)));
  }
  return held > 0 ? 1.0 - tokens / held : 0.0;
}

// The largest ratio of a tier to the tokens it holds, past the first tier: a request of t tokens
// holds at most max(first tier, ratio x t).
double WorstTierRatio(const std::vector<int>& tiers) {
  double r = 2.0;  // past the last tier, doubling: last + 1 tokens take 2 x last
  for (std::size_t i = 1; i < tiers.size(); ++i) r = std::max(r, tiers[i] / (tiers[i - 1] + 1.0));
  return r;
}

// The KV cache tokens the budget leaves beside the weights and the activations of `seqs` rows.
std::int64_t KvTokensFor(const Plan& p, const ModelSpec& gpu, int seqs) {
  const std::uint64_t act =
      ActivationPeakBytes(gpu, static_cast<std::uint64_t>(p.max_batched_tokens), static_cast<std::uint64_t>(seqs));
  const std::int64_t left = static_cast<std::int64_t>(p.budget_bytes) - static_cast<std::int64_t>(p.weights_bytes) -
                            static_cast<std::int64_t>(act);
  if (left <= 0 || p.kv_bytes_per_token == 0) return 0;
  return RoundDown(left / static_cast<std::int64_t>(p.kv_bytes_per_token), kBlockTokens);
}

// The sequences of `length` tokens (whole blocks each) that `kv_tokens` hold at once.
int SeqsHeld(std::int64_t kv_tokens, int length) {
  return static_cast<int>(
      std::min<std::int64_t>(kv_tokens / RoundUp(std::max(length, 1) + kBlockTokens, kBlockTokens), 1 << 30));
}

// The recommendation from the KV cache tokens (the formulas', or the check's lowered ones).
void Recommend(const ModelSpec& model, const ModelSpec& gpu, const PlanOptions& o, const std::vector<Request>& requests,
               std::int64_t kv_cache_cap, Plan* p) {
  // The largest max_num_seqs whose activations leave room for that many P99-long sequences.
  const int limit = std::min(o.max_num_seqs_limit, p->max_batched_tokens);
  const int length = p->max_model_len > 0 ? std::min(p->p99_total, p->max_model_len) : p->p99_total;
  auto kv = [&](int seqs) { return std::min(KvTokensFor(*p, gpu, seqs), kv_cache_cap); };
  int lo = 0, hi = limit;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (SeqsHeld(kv(mid), length) >= mid) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  p->max_num_seqs = lo;
  p->fits = lo >= 1;
  p->kv_cache_tokens = kv(std::max(lo, 1));
  p->activation_bytes = ActivationPeakBytes(gpu, static_cast<std::uint64_t>(p->max_batched_tokens),
                                            static_cast<std::uint64_t>(std::max(lo, 1)));
  // max_model_len: asked, or the longest request; within the config and the KV cache.
  std::int64_t len = o.max_model_len > 0 ? o.max_model_len : RoundUp(std::max(p->longest_total, 1), kLengthRounding);
  if (o.max_model_len == 0) len = std::min<std::int64_t>(len, model.max_position_embeddings);
  // One request of max_model_len must pass the paged admission (the pool less a block a sequence).
  len = std::min<std::int64_t>(len, p->kv_cache_tokens - static_cast<std::int64_t>(kBlockTokens) * std::max(lo, 1));
  p->max_model_len = p->fits ? static_cast<int>(std::max<std::int64_t>(len, 0)) : 0;
  p->rejected_too_long = 0;
  for (const Request& r : requests) p->rejected_too_long += TotalTokens(r) > p->max_model_len;
  if (!p->fits) {
    p->max_kv_tokens_paged = p->max_kv_tokens_tiered = 0;
    return;
  }
  p->max_kv_tokens_paged = p->kv_cache_tokens - static_cast<std::int64_t>(kBlockTokens) * p->max_num_seqs;
  const double ratio = WorstTierRatio(p->tiers_tokens);
  p->max_kv_tokens_tiered = static_cast<std::int64_t>(std::floor(
      static_cast<double>(p->kv_cache_tokens - static_cast<std::int64_t>(p->tiers_tokens.front()) * p->max_num_seqs) /
      ratio));
  p->max_kv_tokens_tiered = std::max<std::int64_t>(p->max_kv_tokens_tiered, 0);
}

std::string Gib(std::uint64_t b) { return FormatBytes(static_cast<std::size_t>(b)); }
std::string SignedBytes(std::int64_t b) {
  return b < 0 ? "-" + Gib(static_cast<std::uint64_t>(-b)) : Gib(static_cast<std::uint64_t>(b));
}

// The requests the check serves: the profile's first, arriving together.
std::vector<Request> CheckRequests(const std::vector<Request>& requests, std::int64_t limit, const Plan& plan,
                                   double time_scale) {
  std::vector<Request> out;
  if (requests.empty()) {
    // No profile: twice max_num_seqs requests of max_model_len tokens.
    const int len = std::max(plan.max_model_len, 2);
    const int output = std::max(1, std::min(512, len / 4));
    for (int i = 0; i < 2 * std::max(plan.max_num_seqs, 1); ++i) out.push_back({0.0, len - output, output});
    return out;
  }
  const std::size_t n =
      limit > 0 ? std::min<std::size_t>(requests.size(), static_cast<std::size_t>(limit)) : requests.size();
  for (std::size_t i = 0; i < n; ++i) {
    Request r = requests[i];
    r.arrival_s *= time_scale;
    out.push_back(r);
  }
  return out;
}

std::string Command(const std::string& model_path, const std::string& requests_path, const PlanOptions& o,
                    const std::string& time_scale, const ServingOptions& s) {
  if (requests_path.empty()) return "";  // synthetic requests: no file to name
  std::string c =
      absl::StrCat("bucketalloc-bench generate serving --requests ", requests_path, " --model ", model_path);
  if (!o.dtype.empty()) absl::StrAppend(&c, " --dtype ", o.dtype);
  if (o.tensor_parallel > 1) absl::StrAppend(&c, " --tensor-parallel ", o.tensor_parallel);
  if (o.check_requests > 0) absl::StrAppend(&c, " --limit ", o.check_requests);
  absl::StrAppend(&c, " --time-scale ", time_scale, " --kv-layout ", KvLayoutName(s.kv_layout), " --max-num-seqs ",
                  s.max_num_seqs, " --max-batched-tokens ", s.max_batched_tokens, " --max-model-len ", s.max_model_len,
                  " --max-kv-tokens ", s.max_kv_tokens);
  if (s.kv_layout == KvLayout::kPaged) absl::StrAppend(&c, " --kv-pool-tokens ", s.kv_pool_tokens);
  if (s.kv_layout == KvLayout::kTiered) absl::StrAppend(&c, " --tiers ", absl::StrJoin(s.tiers_tokens, ","));
  return absl::StrCat(c, " -o TRACE.csv");
}

// The time scale that makes the check's requests a burst on `gpu`: kCheckTimeScale, or less so that
// their arrivals span at most kBurstShareOfStep of the shortest step (a small model's steps are
// short: its requests, a microsecond apart, would otherwise be served one at a time). A power of
// ten, so that the printed command (`--time-scale`) reproduces it exactly.
std::string CheckTimeScale(const ModelSpec& gpu, const std::vector<Request>& requests, std::int64_t limit) {
  double span = 0.0;
  const std::size_t n =
      limit > 0 ? std::min<std::size_t>(requests.size(), static_cast<std::size_t>(limit)) : requests.size();
  for (std::size_t i = 0; i < n; ++i) span = std::max(span, requests[i].arrival_s);
  double scale = kCheckTimeScale;
  const double step = StepSeconds(gpu, ServingOptions{}, 0);
  if (span > 0.0 && step > 0.0) scale = std::min(scale, kBurstShareOfStep * step / span);
  const int exponent = std::max(static_cast<int>(std::floor(std::log10(scale))), -300);
  return absl::StrCat("1e", exponent);
}

// The steps of serving `requests` with `s`, estimated before the trace is generated (an upper bound
// up to the scheduler's admission order): the prompts in chunks of max_batched_tokens, the outputs
// max_num_seqs at a time, and the longest output once more (the last wave's tail).
std::int64_t EstimatedSteps(const std::vector<Request>& requests, const ServingOptions& s) {
  std::int64_t prompts = 0, outputs = 0, longest = 0;
  for (const Request& r : requests) {
    if (TotalTokens(r) > s.max_model_len) continue;  // rejected
    prompts += r.input_tokens;
    outputs += r.output_tokens;
    longest = std::max<std::int64_t>(longest, r.output_tokens);
  }
  return RoundUp(prompts, s.max_batched_tokens) / s.max_batched_tokens +
         RoundUp(outputs, s.max_num_seqs) / s.max_num_seqs + longest;
}

// The smallest card (a whole number of GiB) whose budget holds `need` bytes; 0 past kMaxPlanCardBytes.
std::uint64_t CardFor(std::uint64_t need, const PlanOptions& o) {
  const double card =
      std::ceil((static_cast<double>(need) + static_cast<double>(o.runtime_reserve_bytes)) / o.gpu_memory_utilization);
  if (!(card <= static_cast<double>(kMaxPlanCardBytes))) return 0;
  return static_cast<std::uint64_t>(RoundUp(static_cast<std::int64_t>(card), static_cast<std::int64_t>(kGiB)));
}

std::string CardText(std::uint64_t card) {
  return card == 0 ? absl::StrCat("none up to ", Gib(kMaxPlanCardBytes)) : Gib(card);
}

}  // namespace

int LengthBucketOf(int input, int output) {
  int in = 3, out = 3;
  for (int b = 2; b >= 0; --b) {
    if (input <= kInputBound[b]) in = b;
    if (output <= kOutputBound[b]) out = b;
  }
  return std::max(in, out);
}

std::vector<LengthBucket> LengthProfile(const std::vector<Request>& requests) {
  std::vector<LengthBucket> out;
  std::vector<std::vector<const Request*>> by(4);
  for (const Request& r : requests) by[LengthBucketOf(r.input_tokens, r.output_tokens)].push_back(&r);
  for (int b = 0; b < 4; ++b) {
    LengthBucket x;
    x.name = kBucketNames[b];
    x.requests = static_cast<std::int64_t>(by[b].size());
    x.share = requests.empty() ? 0.0 : static_cast<double>(x.requests) / static_cast<double>(requests.size());
    std::vector<int> in, outp, total;
    for (const Request* r : by[b]) {
      in.push_back(r->input_tokens);
      outp.push_back(r->output_tokens);
      total.push_back(static_cast<int>(std::min<std::int64_t>(TotalTokens(*r), 1 << 30)));
    }
    x.p50_input = Quantile(in, 0.5);
    x.p99_input = Quantile(in, 0.99);
    x.p50_output = Quantile(outp, 0.5);
    x.p99_output = Quantile(outp, 0.99);
    x.p50_total = Quantile(total, 0.5);
    x.p99_total = Quantile(total, 0.99);
    out.push_back(x);
  }
  return out;
}

absl::string_view PlanOptionName(PlanOption option) {
  for (const auto& [o, name] : kOptionNames) {
    if (o == option) return name;
  }
  return "unknown";
}

std::optional<PlanOption> PlanOptionOf(const absl::Status& status) {
  const auto name = status.GetPayload(kPlanOptionPayload);  // absl::optional<absl::Cord>
  if (!name.has_value()) return std::nullopt;
  for (const auto& [option, option_name] : kOptionNames) {
    if (*name == option_name) return option;
  }
  return std::nullopt;
}

absl::StatusOr<ModelSpec> PerGpuModel(const ModelSpec& model, const std::string& dtype, int tp) {
  if (!dtype.empty() && dtype != "bf16" && dtype != "fp16" && dtype != "fp8" && dtype != "int4") {
    return OptionError(PlanOption::kDtype, absl::StrCat(dtype, ": accepted bf16, fp16, fp8 or int4"));
  }
  if (tp < 1 || tp > 1024) {
    return OptionError(PlanOption::kTensorParallel, absl::StrCat(tp, ": accepted 1 to 1024"));
  }
  if (model.heads % tp != 0) {
    return OptionError(PlanOption::kTensorParallel, absl::StrCat(tp, ": ", model.name, " has ", model.heads,
                                                                 " attention heads; accepted a divisor of them"));
  }
  if (model.kv_heads % tp != 0 && tp % model.kv_heads != 0) {
    return OptionError(
        PlanOption::kTensorParallel,
        absl::StrCat(tp, ": ", model.name, " has ", model.kv_heads,
                     " KV heads; accepted a divisor or a multiple of them (vLLM splits or replicates KV heads whole)"));
  }
  ModelSpec g = model;
  g.dtype_bytes = dtype.empty() ? model.dtype_bytes : 2;  // activations and KV: 16 bits
  g.heads = model.heads / tp;
  g.kv_heads = std::max(1, model.kv_heads / tp);
  g.intermediate = static_cast<int>(RoundUp(model.intermediate, tp) / tp);
  const double linear = dtype.empty() ? static_cast<double>(model.dtype_bytes) : LinearBytesPerParameter(dtype);
  for (WeightTensor& w : g.weights) {
    const double params = static_cast<double>(w.bytes) / model.dtype_bytes;
    const double bytes = params * (IsQuantizedLinear(w.name) ? linear : g.dtype_bytes);
    w.bytes = static_cast<std::uint64_t>(std::ceil(IsNorm(w.name) ? bytes : bytes / tp));
  }
  return g;
}

ServingOptions PlanServingOptions(const Plan& plan, KvLayout layout) {
  ServingOptions s;
  s.kv_layout = layout;
  s.max_num_seqs = std::max(plan.max_num_seqs, 1);
  s.max_batched_tokens = plan.max_batched_tokens;
  s.max_model_len = std::max(plan.max_model_len, 1);
  s.block_tokens = kBlockTokens;
  if (layout == KvLayout::kPaged) {
    s.kv_pool_tokens = plan.kv_cache_tokens;
    s.max_kv_tokens = plan.max_kv_tokens_paged;
  } else {
    s.tiers_tokens = plan.tiers_tokens;
    s.max_kv_tokens = plan.max_kv_tokens_tiered;
  }
  return s;
}

namespace {

// The shortest max_model_len a plan on a too-small card offers (a block more is a sequence).
constexpr int kMinCardModelLen = 2 * kBlockTokens;
// Rounds of CheckPlan on the card's plan, each shortening max_model_len by a tenth when one
// sequence of it does not fit by the check.
constexpr int kCardCheckRounds = 6;

// The longest max_model_len one sequence fits in on the card: the KV cache tokens the budget
// leaves beside the weights and one row's activations, less the paged admission's block; at most
// the config's max_position_embeddings and the asked max_model_len.
int LongestOnCard(const Plan& p, const ModelSpec& model, const ModelSpec& gpu, const PlanOptions& o) {
  std::int64_t len = KvTokensFor(p, gpu, 1) - kBlockTokens;
  len = std::min<std::int64_t>(len, model.max_position_embeddings);
  if (o.max_model_len > 0) len = std::min<std::int64_t>(len, o.max_model_len);
  return static_cast<int>(std::max<std::int64_t>(len, 0));
}

// The profile's requests no longer than `len`.
std::vector<Request> NoLongerThan(const std::vector<Request>& requests, int len) {
  std::vector<Request> out;
  for (const Request& r : requests) {
    if (TotalTokens(r) <= len) out.push_back(r);
  }
  return out;
}

absl::StatusOr<Plan> MakePlanImpl(const ModelSpec& model, const PlanOptions& o, const std::vector<Request>& requests,
                                  bool with_card_plan);

// The plan of `max_model_len` for the profile's requests no longer (itself without a card plan).
absl::StatusOr<Plan> PlanOnCard(const ModelSpec& model, const PlanOptions& o, const std::vector<Request>& requests,
                                int max_model_len) {
  PlanOptions card = o;
  card.max_model_len = max_model_len;
  return MakePlanImpl(model, card, NoLongerThan(requests, max_model_len), /*with_card_plan=*/false);
}

CardPlan CardPlanOf(const Plan& plan, const std::vector<Request>& requests) {
  CardPlan c;
  c.max_model_len = plan.max_model_len;
  c.max_num_seqs = plan.max_num_seqs;
  c.kv_cache_tokens = plan.kv_cache_tokens;
  for (const Request& r : requests) c.rejected += TotalTokens(r) > plan.max_model_len;
  c.rejected_share = requests.empty() ? 0.0 : static_cast<double>(c.rejected) / static_cast<double>(requests.size());
  c.checked = plan.checked;
  c.measured_margin_bytes = plan.measured_margin_bytes;
  c.checks = plan.checks;
  return c;
}

absl::StatusOr<Plan> MakePlanImpl(const ModelSpec& model, const PlanOptions& o, const std::vector<Request>& requests,
                                  bool with_card_plan) {
  const std::string config = model.source.empty() ? "the model config" : model.source;
  if (o.card_bytes == 0 || o.card_bytes > kMaxPlanCardBytes) {
    return OptionError(
        PlanOption::kCardBytes,
        absl::StrCat(o.card_bytes, ": accepted a size in bytes above 0 and up to ", Gib(kMaxPlanCardBytes)));
  }
  if (!(o.gpu_memory_utilization >= kMinGpuMemoryUtilization && o.gpu_memory_utilization <= 1.0)) {  // NaN fails
    return OptionError(PlanOption::kGpuMemoryUtilization,
                       absl::StrCat(o.gpu_memory_utilization, ": accepted a fraction from ", kMinGpuMemoryUtilization,
                                    " to 1 (the share of the card the server may use)"));
  }
  if (o.runtime_reserve_bytes > kMaxPlanCardBytes) {
    return OptionError(
        PlanOption::kRuntimeReserveBytes,
        absl::StrCat(o.runtime_reserve_bytes, ": accepted a size in bytes from 0 to ", Gib(kMaxPlanCardBytes)));
  }
  if (model.max_position_embeddings < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        config, ": \"max_position_embeddings\" is ", model.max_position_embeddings,
        "; the plan needs at least 2 (one prompt token and one output token): accepted a whole number from 2"));
  }
  if (o.max_model_len != 0 && (o.max_model_len < 2 || o.max_model_len > model.max_position_embeddings)) {
    return OptionError(PlanOption::kMaxModelLen,
                       absl::StrCat(o.max_model_len, ": accepted 0 (from the profile) or 2 to the model's ",
                                    "max_position_embeddings (", model.max_position_embeddings, " in ", config, ")"));
  }
  if (o.max_batched_tokens < 1 || o.max_batched_tokens > kMaxPlanBatchedTokens) {
    return OptionError(PlanOption::kMaxBatchedTokens,
                       absl::StrCat(o.max_batched_tokens, ": accepted 1 to ", kMaxPlanBatchedTokens));
  }
  if (o.max_num_seqs_limit < 1) {
    return OptionError(PlanOption::kMaxNumSeqsLimit,
                       absl::StrCat(o.max_num_seqs_limit, ": accepted a whole number >= 1"));
  }
  if (o.check_requests < 0) {
    return OptionError(PlanOption::kCheckRequests,
                       absl::StrCat(o.check_requests, ": accepted 0 (all) or a whole number"));
  }
  absl::StatusOr<ModelSpec> gpu = PerGpuModel(model, o.dtype, o.tensor_parallel);
  if (!gpu.ok()) return gpu.status();
  {
    // One step's largest tensors, in 128 bits: an activation of max_batched_tokens rows and the
    // float32 logits of the most sampled rows. Over what an allocator accepts, no budget is sane.
    const WideDims d = gpu->wide();
    const absl::uint128 T = static_cast<std::uint64_t>(o.max_batched_tokens);
    const absl::uint128 S = static_cast<std::uint64_t>(std::min(o.max_num_seqs_limit, o.max_batched_tokens));
    const absl::uint128 widest = std::max({d.h, d.q + 2 * d.kv, 2 * d.inter});
    if (T * widest * d.e > kMaxRequestBytes || S * d.vocab * 4 > kMaxRequestBytes) {
      return OptionError(
          PlanOption::kMaxBatchedTokens,
          absl::StrCat(o.max_batched_tokens, " with ", model.name, " (", config,
                       ") gives one step's activations of over 64 TiB, more than an allocator accepts; accepted "
                       "fewer tokens per step or a model of real dimensions"));
    }
  }
  // A profile that the length limit rejects whole: name the limit given (the option, else the config's key).
  if (!requests.empty()) {
    std::int64_t shortest = TotalTokens(requests.front());
    for (const Request& r : requests) shortest = std::min(shortest, TotalTokens(r));
    const std::int64_t cap = o.max_model_len > 0 ? o.max_model_len : model.max_position_embeddings;
    if (shortest > cap) {
      const std::string why = absl::StrCat(": every request of the profile is longer (the shortest is ", shortest,
                                           " tokens), so none could be served; accepted at least ", shortest);
      if (o.max_model_len > 0) return OptionError(PlanOption::kMaxModelLen, absl::StrCat(o.max_model_len, why));
      return absl::InvalidArgumentError(
          absl::StrCat(config, ": \"max_position_embeddings\" ", model.max_position_embeddings, why));
    }
  }
  Plan p;
  p.model = model.name;
  p.dtype = o.dtype.empty() ? (model.dtype_bytes == 4 ? "fp32" : "bf16") : o.dtype;
  p.tensor_parallel = o.tensor_parallel;
  p.gpu_memory_utilization = o.gpu_memory_utilization;
  p.card_bytes = o.card_bytes;
  p.runtime_reserve_bytes = o.runtime_reserve_bytes;
  const auto usable =
      static_cast<std::uint64_t>(std::floor(static_cast<double>(o.card_bytes) * o.gpu_memory_utilization));
  p.budget_bytes = usable > o.runtime_reserve_bytes ? usable - o.runtime_reserve_bytes : 0;
  p.max_batched_tokens = o.max_batched_tokens;
  p.parameters = model.parameters();
  p.weights_bytes = gpu->weight_bytes();
  p.kv_bytes_per_token = gpu->kv_bytes_per_token();
  // The profile.
  p.requests = static_cast<std::int64_t>(requests.size());
  if (!requests.empty()) {
    p.buckets = LengthProfile(requests);
    std::vector<int> totals;
    for (const Request& r : requests)
      totals.push_back(static_cast<int>(std::min<std::int64_t>(TotalTokens(r), 1 << 30)));
    p.p99_total = Quantile(totals, 0.99);
    p.longest_total = *std::max_element(totals.begin(), totals.end());
  } else {
    p.p99_total = p.longest_total = o.max_model_len > 0 ? o.max_model_len : model.max_position_embeddings;
    p.notes.push_back("no --requests: every request is taken as long as max_model_len");
  }
  // Tiers: the P50 and P99 of each bucket's length, in whole 256-token steps, then doubling.
  std::vector<int> tiers;
  for (const LengthBucket& b : p.buckets) {
    if (b.requests == 0) continue;
    for (int t : {b.p50_total, b.p99_total}) tiers.push_back(static_cast<int>(RoundUp(t, kLengthRounding)));
  }
  if (tiers.empty()) tiers.push_back(static_cast<int>(RoundUp(p.p99_total, kLengthRounding)));
  std::sort(tiers.begin(), tiers.end());
  tiers.erase(std::unique(tiers.begin(), tiers.end()), tiers.end());
  // Doubling steps between two tiers more than twice apart (a request just past a tier would
  // otherwise round up to one many times its length).
  std::vector<int> filled;
  for (int t : tiers) {
    while (!filled.empty() && t > 2 * filled.back()) filled.push_back(2 * filled.back());
    filled.push_back(t);
  }
  ServingOptions recommended, defaults;
  recommended.tiers_tokens = filled;
  p.tier_waste = TierWaste(requests, recommended);
  p.default_tier_waste = TierWaste(requests, defaults);
  p.tiers_tokens = filled;
  if (p.default_tier_waste < p.tier_waste) {  // the default tiers waste less over this profile
    p.tiers_tokens = defaults.tiers_tokens;
    p.tier_waste = p.default_tier_waste;
  }

  Recommend(model, *gpu, o, requests, std::int64_t{1} << 40, &p);
  // The smallest card whose budget holds the weights, one step's activations (one sampled row) and
  // one request of the P99 length.
  const std::uint64_t one =
      p.weights_bytes + ActivationPeakBytes(*gpu, static_cast<std::uint64_t>(p.max_batched_tokens), 1) +
      static_cast<std::uint64_t>(RoundUp(p.p99_total + kBlockTokens, kBlockTokens)) * p.kv_bytes_per_token;
  p.smallest_card_bytes = CardFor(one, o);
  if (!p.fits) {
    p.notes.push_back(absl::StrCat("the card is too small: its budget (", Gib(p.budget_bytes),
                                   ") does not hold the weights (", Gib(p.weights_bytes),
                                   "), one step's activations and one request of ", p.p99_total,
                                   " tokens; the smallest card that does: ", CardText(p.smallest_card_bytes)));
    const int longest = LongestOnCard(p, model, *gpu, o);
    if (!with_card_plan) {
      // The card's own plan, which fits by its construction unless a check shortened it.
    } else if (longest < kMinCardModelLen) {
      p.notes.push_back(
          absl::StrCat("does not fit: the weights and one step's activations alone leave no room for a "
                       "sequence of ",
                       kMinCardModelLen, " tokens"));
    } else {
      absl::StatusOr<Plan> card = PlanOnCard(model, o, requests, longest);
      if (!card.ok()) return card.status();
      p.on_this_card = CardPlanOf(*card, requests);
      p.notes.push_back(absl::StrCat("on this card: max_model_len ", p.on_this_card->max_model_len, ", max_num_seqs ",
                                     p.on_this_card->max_num_seqs, "; ", p.on_this_card->rejected,
                                     " requests of the profile are longer and would be rejected"));
    }
  }
  if (p.fits && p.rejected_too_long > 0) {
    p.notes.push_back(absl::StrCat(p.rejected_too_long, " requests of the profile are longer than max_model_len ",
                                   p.max_model_len, " and would be rejected"));
  }
  return p;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const PlanOptions& o, const std::vector<Request>& requests) {
  return MakePlanImpl(model, o, requests, /*with_card_plan=*/true);
}

absl::Status CheckPlan(const ModelSpec& model, const PlanOptions& o, const std::vector<Request>& requests,
                       const std::string& model_path, const std::string& requests_path, Plan* p) {
  absl::StatusOr<ModelSpec> gpu = PerGpuModel(model, o.dtype, o.tensor_parallel);
  if (!gpu.ok()) return gpu.status();
  const CostModel cost;
  const std::string time_scale_text = CheckTimeScale(*gpu, requests, o.check_requests);
  const double time_scale = std::strtod(time_scale_text.c_str(), nullptr);  // exactly what the command says
  // Why a replay is skipped ("" when it is not): its budget is more than the simulated device can
  // hold, or its schedule is too long to replay in bounded time.
  auto skipped = [&](std::uint64_t budget, const std::string& card, const std::vector<Request>& reqs,
                     const ServingOptions& s) -> std::string {
    if (budget > kMaxCheckBudget) {
      return absl::StrCat(card, " has a budget of ", Gib(budget),
                          ", more than the simulated device replays (a budget of up to ", Gib(kMaxCheckBudget),
                          ": the min-capacity search may probe twice the budget, and the device holds ",
                          Gib(kMaxSimReplayCapacity), ")");
    }
    if (const std::int64_t steps = EstimatedSteps(reqs, s); steps > kMaxCheckSteps) {
      return absl::StrCat("its trace of ", reqs.size(), " requests would take about ", steps, " steps (more than ",
                          kMaxCheckSteps, "); fewer --check-requests or a shorter --max-model-len bound it");
    }
    return "";
  };
  // Measures one trace's min-capacity for both allocators.
  auto measure = [&](const ServingOptions& s, const std::vector<Request>& reqs, const std::string& what,
                     std::vector<PlanCheck>* out) -> absl::Status {
    absl::StatusOr<ServingTrace> t = GenerateServingTrace(reqs, *gpu, s);
    if (!t.ok()) return t.status();
    std::string tiers_conf = TieredBucketallocConf(*t, *gpu, s);
    for (const std::string& allocator : {tiers_conf.empty() ? std::string("bucketalloc") : "bucketalloc:" + tiers_conf,
                                         std::string("pytorch-policy")}) {
      absl::StatusOr<MinCapacityResult> m = MinCapacity(t->trace, allocator, cost);
      if (!m.ok()) return m.status();
      PlanCheck c;
      c.layout = std::string(KvLayoutName(s.kv_layout));
      c.allocator = allocator;
      c.what = what;
      c.budget_bytes = p->budget_bytes;
      c.min_capacity_bytes = m->min_capacity_bytes;
      c.margin_bytes = static_cast<std::int64_t>(p->budget_bytes) - static_cast<std::int64_t>(m->min_capacity_bytes);
      c.true_need_bytes = t->summary.true_peak_need_bytes;
      c.served = t->summary.served;
      c.rejected = t->summary.rejected_too_long + t->summary.rejected_over_kv_limit;
      c.steps = t->summary.steps;
      c.command = Command(model_path, requests_path, o, time_scale_text, s);
      out->push_back(std::move(c));
    }
    return absl::OkStatus();
  };

  std::string skip_recommended;
  if (p->fits) {
    skip_recommended =
        skipped(p->budget_bytes, absl::StrCat("--card ", Gib(p->card_bytes)),
                CheckRequests(requests, o.check_requests, *p, time_scale), PlanServingOptions(*p, KvLayout::kPaged));
    if (!skip_recommended.empty()) {
      p->notes.push_back(absl::StrCat("the recommended settings are not checked by replay: ", skip_recommended,
                                      "; they are the formulas'"));
    }
  }
  if (p->fits && skip_recommended.empty()) {
    // The tiers: the profile's or the default ones, whichever wastes less in the check's tiered
    // trace (measured: 1 - the exact KV bytes over the tiers' at the trace's peak need).
    const std::vector<Request> burst = CheckRequests(requests, o.check_requests, *p, time_scale);
    auto waste = [&](const std::vector<int>& tiers) -> absl::StatusOr<double> {
      Plan q = *p;
      q.tiers_tokens = tiers;
      Recommend(model, *gpu, o, requests, p->kv_cache_tokens, &q);
      absl::StatusOr<ServingTrace> t = GenerateServingTrace(burst, *gpu, PlanServingOptions(q, KvLayout::kTiered));
      if (!t.ok()) return t.status();
      const ServingSummary& sum = t->summary;
      if (sum.peak_kv_layout_bytes == 0) return 0.0;
      return 1.0 - static_cast<double>(sum.need_kv_bytes) / static_cast<double>(sum.peak_kv_layout_bytes);
    };
    const std::vector<int> defaults = ServingOptions{}.tiers_tokens;
    absl::StatusOr<double> own = waste(p->tiers_tokens);
    if (!own.ok()) return own.status();
    absl::StatusOr<double> standard = waste(defaults);
    if (!standard.ok()) return standard.status();
    p->measured_tier_waste = *own;
    p->measured_default_tier_waste = *standard;
    if (*standard < *own && p->tiers_tokens != defaults) {
      p->notes.push_back(absl::StrFormat(
          "tiers: the default ones (%s) waste %.1f%% of the KV bytes in the check's trace, the profile's (%s) %.1f%%: "
          "the default ones are recommended",
          absl::StrJoin(defaults, ","), 100 * *standard, absl::StrJoin(p->tiers_tokens, ","), 100 * *own));
      p->tiers_tokens = defaults;
      p->measured_tier_waste = *standard;
      p->tier_waste = p->default_tier_waste;
      Recommend(model, *gpu, o, requests, p->kv_cache_tokens, p);
    }
    // The recommended settings. A margin under the headroom (what other requests' step shapes may
    // fragment beyond these) lowers the KV cache tokens by the difference, and the check runs again.
    const std::int64_t headroom =
        std::max<std::int64_t>(static_cast<std::int64_t>(kHeadroomShare * static_cast<double>(p->budget_bytes)),
                               static_cast<std::int64_t>(kHeadroomFloor));
    const std::int64_t formula_tokens = p->kv_cache_tokens;
    std::int64_t first_margin = 0, step = 0, previous = 0;
    bool tiered_skipped = false;
    int round = 0;
    for (;; ++round) {
      std::vector<PlanCheck> checks;
      const std::vector<Request> reqs = CheckRequests(requests, o.check_requests, *p, time_scale);
      for (KvLayout layout : {KvLayout::kPaged, KvLayout::kTiered}) {
        if (layout == KvLayout::kTiered && p->max_kv_tokens_tiered < p->p99_total) {
          tiered_skipped = true;
          continue;
        }
        if (absl::Status s = measure(PlanServingOptions(*p, layout), reqs, "recommended", &checks); !s.ok()) return s;
      }
      std::int64_t least = checks.front().margin_bytes;
      for (const PlanCheck& c : checks) least = std::min(least, c.margin_bytes);
      p->checks = std::move(checks);
      p->measured_margin_bytes = least;
      p->checked = true;
      if (round == 0) first_margin = least;
      if (least >= headroom || round == kCheckRounds - 1) break;
      // Lower the KV cache by the shortfall; when that did not move the margin (the allocators
      // round each layer's pool up to whole pages), by twice the last step.
      std::int64_t tokens =
          RoundUp((headroom - least) / static_cast<std::int64_t>(p->kv_bytes_per_token) + 1, kBlockTokens);
      if (round > 0 && least <= previous) tokens = std::max(tokens, 2 * step);
      step = tokens;
      previous = least;
      if (p->kv_cache_tokens - tokens <= 0) break;
      Recommend(model, *gpu, o, requests, p->kv_cache_tokens - tokens, p);
      if (!p->fits) break;
    }
    if (p->kv_cache_tokens != formula_tokens) {
      p->notes.push_back(absl::StrCat("the formulas' KV cache of ", formula_tokens, " tokens left a margin of ",
                                      SignedBytes(first_margin), " in the check; lowered to ", p->kv_cache_tokens,
                                      " tokens (", round + 1, " checks) to keep ",
                                      Gib(static_cast<std::uint64_t>(headroom)), " of headroom"));
    }
    if (tiered_skipped) {
      p->notes.push_back(
          absl::StrCat("the tiered layout is not checked: within its worst rounding the KV cache "
                       "admits ",
                       p->max_kv_tokens_tiered, " tokens, less than one P99 request"));
    }
  }
  // The plan on this card, checked as a fitting plan is; max_model_len shortened by a tenth while
  // one sequence of it does not fit by the check.
  if (p->on_this_card.has_value()) {
    int len = p->on_this_card->max_model_len;
    for (int round = 0; round < kCardCheckRounds && len >= kMinCardModelLen; ++round) {
      absl::StatusOr<Plan> card = PlanOnCard(model, o, requests, len);
      if (!card.ok()) return card.status();
      if (card->fits) {
        if (absl::Status s = CheckPlan(model, o, NoLongerThan(requests, len), model_path, requests_path, &*card);
            !s.ok()) {
          return s;
        }
      }
      if (card->fits) {
        const int formula = p->on_this_card->max_model_len;
        p->on_this_card = CardPlanOf(*card, requests);
        if (p->on_this_card->max_model_len != formula) {
          p->notes.push_back(absl::StrCat("on this card, checked by replay: max_model_len ",
                                          p->on_this_card->max_model_len, " (the formulas' ", formula,
                                          "), max_num_seqs ", p->on_this_card->max_num_seqs, "; ",
                                          p->on_this_card->rejected, " requests of the profile are longer"));
        }
        break;
      }
      len = static_cast<int>(RoundDown(len - std::max(len / 10, kBlockTokens), kBlockTokens));
      if (round == kCardCheckRounds - 1 || len < kMinCardModelLen) {
        p->notes.push_back("on this card: no max_model_len was found that one sequence fits in by the check");
        p->on_this_card.reset();
      }
    }
  }
  // The smallest card, measured: one sequence of up to the P99 length on the paged layout.
  if (p->smallest_card_bytes == 0) return absl::OkStatus();  // no card up to kMaxPlanCardBytes: nothing to check
  Plan one = *p;
  const auto one_usable =
      static_cast<std::uint64_t>(std::floor(static_cast<double>(p->smallest_card_bytes) * o.gpu_memory_utilization));
  one.budget_bytes = one_usable > o.runtime_reserve_bytes ? one_usable - o.runtime_reserve_bytes : 0;
  one.max_num_seqs = 1;
  one.max_model_len = std::max(p->p99_total, 1);
  one.kv_cache_tokens = RoundUp(p->p99_total + kBlockTokens, kBlockTokens);
  one.max_kv_tokens_paged = one.kv_cache_tokens - kBlockTokens;
  std::vector<Request> shorter;  // the requests up to the P99 length (the longer are rejected anyway)
  for (const Request& r : CheckRequests(requests, o.check_requests, one, time_scale)) {
    if (TotalTokens(r) <= one.max_model_len) shorter.push_back(r);
  }
  if (!shorter.empty()) {
    if (const std::string why =
            skipped(one.budget_bytes, absl::StrCat("the smallest card, ", Gib(p->smallest_card_bytes), ","), shorter,
                    PlanServingOptions(one, KvLayout::kPaged));
        !why.empty()) {
      p->notes.push_back(absl::StrCat("the smallest card is not checked by replay: ", why));
      return absl::OkStatus();
    }
  }
  if (!shorter.empty()) {
    std::vector<PlanCheck> checks;
    one.max_model_len = static_cast<int>(std::max<std::int64_t>(one.max_model_len, 1));
    if (absl::Status s = measure(PlanServingOptions(one, KvLayout::kPaged), shorter, "smallest card", &checks);
        !s.ok()) {
      return s;
    }
    std::uint64_t need = 0;
    for (PlanCheck& c : checks) {
      c.budget_bytes = one.budget_bytes;
      c.margin_bytes = static_cast<std::int64_t>(one.budget_bytes) - static_cast<std::int64_t>(c.min_capacity_bytes);
      need = std::max<std::uint64_t>(need, c.min_capacity_bytes);
    }
    const std::uint64_t measured = CardFor(need, o);
    if (measured == 0) {
      p->notes.push_back(absl::StrCat("by its check no card fits: one sequence needed ", Gib(need),
                                      ", and no card up to ", Gib(kMaxPlanCardBytes), " has that budget"));
      p->smallest_card_bytes = 0;
    } else if (measured > p->smallest_card_bytes) {
      p->notes.push_back(absl::StrCat("the smallest card is raised to ", Gib(measured),
                                      " by its check (one sequence needed ", Gib(need), ")"));
      p->smallest_card_bytes = measured;
    }
    if (need > p->budget_bytes && p->fits) {
      p->fits = false;
      p->notes.push_back(absl::StrCat("the card is too small: one sequence needed ", Gib(need), ", its budget is ",
                                      Gib(p->budget_bytes)));
    }
    p->checks.insert(p->checks.end(), checks.begin(), checks.end());
  }
  return absl::OkStatus();
}

namespace {

nlohmann::ordered_json CheckJson(const PlanCheck& c) {
  return {{"what", c.what},
          {"layout", c.layout},
          {"allocator", c.allocator},
          {"budget_bytes", c.budget_bytes},
          {"min_capacity_bytes", c.min_capacity_bytes},
          {"margin_bytes", c.margin_bytes},
          {"true_need_bytes", c.true_need_bytes},
          {"served", c.served},
          {"rejected", c.rejected},
          {"steps", c.steps},
          {"command", c.command}};
}

nlohmann::ordered_json CardPlanJson(const std::optional<CardPlan>& c) {
  if (!c.has_value()) return nullptr;
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const PlanCheck& x : c->checks) checks.push_back(CheckJson(x));
  return {{"max_model_len", c->max_model_len},
          {"max_num_seqs", c->max_num_seqs},
          {"rejected_share", c->rejected_share},
          {"kv_cache_tokens", c->kv_cache_tokens},
          {"rejected_too_long", c->rejected},
          {"checked", c->checked},
          {"measured_margin_bytes", c->measured_margin_bytes},
          {"checks", checks}};
}

}  // namespace

std::string PlanToJson(const Plan& p) {
  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  for (const LengthBucket& b : p.buckets) {
    buckets.push_back({{"bucket", b.name},
                       {"requests", b.requests},
                       {"share", b.share},
                       {"p50_input", b.p50_input},
                       {"p99_input", b.p99_input},
                       {"p50_output", b.p50_output},
                       {"p99_output", b.p99_output},
                       {"p50_total", b.p50_total},
                       {"p99_total", b.p99_total}});
  }
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const PlanCheck& c : p.checks) checks.push_back(CheckJson(c));
  nlohmann::ordered_json j = {
      {"model", p.model},
      {"dtype", p.dtype},
      {"tensor_parallel", p.tensor_parallel},
      {"gpu_memory_utilization", p.gpu_memory_utilization},
      {"card_bytes", p.card_bytes},
      {"runtime_reserve_bytes", p.runtime_reserve_bytes},
      {"budget_bytes", p.budget_bytes},
      {"parameters", p.parameters},
      {"weights_bytes", p.weights_bytes},
      {"kv_bytes_per_token", p.kv_bytes_per_token},
      {"activation_bytes", p.activation_bytes},
      {"max_batched_tokens", p.max_batched_tokens},
      {"kv_cache_tokens", p.kv_cache_tokens},
      {"requests", p.requests},
      {"buckets", buckets},
      {"p99_total_tokens", p.p99_total},
      {"longest_total_tokens", p.longest_total},
      {"fits", p.fits},
      {"smallest_card_bytes", p.smallest_card_bytes},
      {"max_num_seqs", p.max_num_seqs},
      {"max_model_len", p.max_model_len},
      {"rejected_too_long", p.rejected_too_long},
      {"max_kv_tokens_paged", p.max_kv_tokens_paged},
      {"max_kv_tokens_tiered", p.max_kv_tokens_tiered},
      {"on_this_card", CardPlanJson(p.on_this_card)},
      {"tiers_tokens", p.tiers_tokens},
      {"tier_waste", p.tier_waste},
      {"default_tier_waste", p.default_tier_waste},
      {"measured_tier_waste",
       p.measured_tier_waste < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(p.measured_tier_waste)},
      {"measured_default_tier_waste", p.measured_default_tier_waste < 0
                                          ? nlohmann::ordered_json()
                                          : nlohmann::ordered_json(p.measured_default_tier_waste)},
      {"checked", p.checked},
      {"measured_margin_bytes", p.measured_margin_bytes},
      {"checks", checks},
      {"notes", p.notes},
  };
  return j.dump(2);
}

std::string PlanToText(const Plan& p) {
  std::string s = absl::StrFormat("plan: %s, %s, tensor parallel %d, card %s x %.2f - reserve %s = budget %s\n",
                                  p.model, p.dtype, p.tensor_parallel, Gib(p.card_bytes), p.gpu_memory_utilization,
                                  Gib(p.runtime_reserve_bytes), Gib(p.budget_bytes));
  absl::StrAppendFormat(&s, "  parameters %.2f billion; weights per GPU %s; KV per token per GPU %s\n",
                        static_cast<double>(p.parameters) / 1e9, Gib(p.weights_bytes), Gib(p.kv_bytes_per_token));
  absl::StrAppendFormat(&s, "  activations of a step (%d tokens, %d rows) %s; KV cache %lld tokens (%s)\n",
                        p.max_batched_tokens, std::max(p.max_num_seqs, 1), Gib(p.activation_bytes),
                        static_cast<long long>(p.kv_cache_tokens),
                        Gib(static_cast<std::uint64_t>(p.kv_cache_tokens) * p.kv_bytes_per_token));
  if (!p.buckets.empty()) {
    absl::StrAppendFormat(&s, "  profile: %lld requests; P99 length %d tokens, longest %d\n",
                          static_cast<long long>(p.requests), p.p99_total, p.longest_total);
    absl::StrAppend(&s, "    bucket  share  prompt P50/P99  output P50/P99\n");
    for (const LengthBucket& b : p.buckets) {
      absl::StrAppendFormat(&s, "    %-6s %5.1f%%  %6d/%-7d  %6d/%-7d\n", b.name, 100.0 * b.share, b.p50_input,
                            b.p99_input, b.p50_output, b.p99_output);
    }
  }
  if (p.fits) {
    absl::StrAppendFormat(&s,
                          "  fits: max_num_seqs %d, max_model_len %d (%lld requests longer), max_batched_tokens %d, "
                          "KV cache %lld tokens\n",
                          p.max_num_seqs, p.max_model_len, static_cast<long long>(p.rejected_too_long),
                          p.max_batched_tokens, static_cast<long long>(p.kv_cache_tokens));
  } else if (p.on_this_card.has_value()) {
    const CardPlan& c = *p.on_this_card;
    absl::StrAppendFormat(
        &s,
        "  does not fit the profile's P99 request (%d tokens); on this card: max_model_len %d "
        "(%lld requests, %.1f%% of the profile, longer and rejected), max_num_seqs %d, KV cache %lld "
        "tokens%s\n",
        p.p99_total, c.max_model_len, static_cast<long long>(c.rejected), 100 * c.rejected_share, c.max_num_seqs,
        static_cast<long long>(c.kv_cache_tokens),
        c.checked ? absl::StrCat("; checked by replay, margin ", SignedBytes(c.measured_margin_bytes)) : "");
  } else {
    absl::StrAppend(&s, "  does not fit\n");
  }
  absl::StrAppendFormat(&s, "  smallest card that fits: %s\n", CardText(p.smallest_card_bytes));
  absl::StrAppendFormat(&s,
                        "  tiers (tokens) %s: rounding waste %.1f%% (default tiers 512, 1024, 2048, 4096: %.1f%%)\n",
                        absl::StrJoin(p.tiers_tokens, ","), 100.0 * p.tier_waste, 100.0 * p.default_tier_waste);
  for (const PlanCheck& c : p.checks) {
    absl::StrAppendFormat(&s, "  check (%s, %s layout, %s): min capacity %s of budget %s, margin %s; %lld served\n",
                          c.what, c.layout, c.allocator, Gib(c.min_capacity_bytes), Gib(c.budget_bytes),
                          SignedBytes(c.margin_bytes), static_cast<long long>(c.served));
  }
  if (p.checked) absl::StrAppendFormat(&s, "  measured margin: %s\n", SignedBytes(p.measured_margin_bytes));
  for (const std::string& n : p.notes) absl::StrAppend(&s, "  note: ", n, "\n");
  absl::StrAppend(&s,
                  "  allocator settings for this service's fragmentation: bucketalloc-bench tune on a recording of it "
                  "(docs/harness.md, \"Tune\")\n");
  return s;
}

std::string PlanHtml(const Plan& p) {
  std::string h = absl::StrCat("<section id=\"plan\"><h1>Plan: ", EscapeHtml(p.model), "</h1>");
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&h, "<tr><th>", EscapeHtml(k), "</th><td>", EscapeHtml(v), "</td></tr>");
  };
  absl::StrAppend(&h, "<h2>Budget</h2><table class=\"facts\">");
  row("card", Gib(p.card_bytes));
  row("gpu-memory-utilization", absl::StrFormat("%.2f", p.gpu_memory_utilization));
  row("runtime reserve", Gib(p.runtime_reserve_bytes));
  row("allocator budget", Gib(p.budget_bytes));
  row("weights per GPU", Gib(p.weights_bytes));
  row("KV per token per GPU", Gib(p.kv_bytes_per_token));
  row("activations of a step", Gib(p.activation_bytes));
  row("KV cache tokens", absl::StrCat(p.kv_cache_tokens));
  absl::StrAppend(&h,
                  "</table><h2>Request profile</h2><table><tr><th>bucket</th><th>share</th><th>prompt P50</th>"
                  "<th>prompt P99</th><th>output P50</th><th>output P99</th></tr>");
  for (const LengthBucket& b : p.buckets) {
    absl::StrAppendFormat(&h, "<tr><td>%s</td><td>%.1f%%</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td></tr>",
                          EscapeHtml(b.name), 100.0 * b.share, b.p50_input, b.p99_input, b.p50_output, b.p99_output);
  }
  absl::StrAppend(&h, "</table><h2>Recommendations</h2><table class=\"facts\">");
  row("fits", p.fits ? "yes" : "no");
  if (p.on_this_card.has_value()) {
    const CardPlan& c = *p.on_this_card;
    row("on this card: max_model_len", absl::StrCat(c.max_model_len));
    row("on this card: max_num_seqs", absl::StrCat(c.max_num_seqs));
    row("on this card: rejected", absl::StrFormat("%lld requests (%.1f%% of the profile)",
                                                  static_cast<long long>(c.rejected), 100 * c.rejected_share));
    row("on this card: KV cache tokens", absl::StrCat(c.kv_cache_tokens));
    if (c.checked) row("on this card: measured margin", SignedBytes(c.measured_margin_bytes));
  }
  row("smallest card", CardText(p.smallest_card_bytes));
  row("max_num_seqs", absl::StrCat(p.max_num_seqs));
  row("max_model_len", absl::StrCat(p.max_model_len));
  row("tiers (tokens)", absl::StrJoin(p.tiers_tokens, ", "));
  row("tier rounding waste",
      absl::StrFormat("%.1f%% (default tiers %.1f%%)", 100 * p.tier_waste, 100 * p.default_tier_waste));
  absl::StrAppend(&h,
                  "</table><h2>Checked by replay</h2><table><tr><th>what</th><th>layout</th><th>allocator</th>"
                  "<th>min capacity</th><th>budget</th><th>margin</th></tr>");
  for (const PlanCheck& c : p.checks) {
    absl::StrAppend(&h, "<tr data-margin=\"", c.margin_bytes, "\"><td>", EscapeHtml(c.what), "</td><td>",
                    EscapeHtml(c.layout), "</td><td>", EscapeHtml(c.allocator), "</td><td>", Gib(c.min_capacity_bytes),
                    "</td><td>", Gib(c.budget_bytes), "</td><td>", EscapeHtml(SignedBytes(c.margin_bytes)),
                    "</td></tr>");
  }
  absl::StrAppend(&h, "</table><ul>");
  for (const std::string& n : p.notes) absl::StrAppend(&h, "<li>", EscapeHtml(n), "</li>");
  absl::StrAppend(&h, "</ul></section>");
  return HtmlPage(absl::StrCat("bucketalloc plan: ", p.model), h);
}

}  // namespace bucketalloc::harness
