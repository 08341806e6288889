// The planner (src/harness/planning/planner.cc): its formulas against hand-computed cases (Llama-3.1-8B:
// 8,030,261,248 parameters, 14.96 GiB of weights in bf16, 128 KiB of KV per token), the length
// profile of the vendored Azure conversation trace against counts computed apart from this code
// (a Python reading of the same CSV), and the plan's recommendations served by replay with no OOM.
#include "harness/planning/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/units.h"
#include "harness/replay/replay.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

std::string Data(const std::string& path) { return absl::StrCat(BUCKETALLOC_SOURCE_DIR, "/data/", path); }

ModelSpec Llama8B() {
  absl::StatusOr<ModelSpec> m = ReadModelConfig(Data("models/Llama-3.1-8B-Instruct.config.json"));
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

constexpr std::uint64_t kTiB = 1024 * kGiB;
std::uint64_t RoundUpToGib(std::uint64_t b) { return (b + kGiB - 1) / kGiB * kGiB; }

std::vector<Request> AzureConv() {
  absl::StatusOr<RequestSet> r = ReadRequestsFile(Data("requests/azure_llm_inference_trace_2023_conv.csv"), {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r->requests;
}

// Llama-3.1-8B by hand: per layer q (4096 x 4096), k and v (4096 x 1024 each), o (4096 x 4096),
// gate, up and down (4096 x 14336 each): 218,103,808 linear parameters; two norms of 4096; 32
// layers; the final norm; embed_tokens and an untied lm_head of 128,256 x 4096 each.
constexpr std::uint64_t kLinear = 32ull * 218103808;                   // 6,979,321,856
constexpr std::uint64_t kNorms = 32ull * 2 * 4096 + 4096;              // 266,240
constexpr std::uint64_t kEmbeddings = 2ull * 128256 * 4096;            // 1,050,673,152
constexpr std::uint64_t kParameters = kLinear + kNorms + kEmbeddings;  // 8,030,261,248

TEST(PlannerTest, Llama8BWeightsAndKvByHand) {
  static_assert(kParameters == 8030261248ull);
  const ModelSpec m = Llama8B();
  absl::StatusOr<Plan> p = MakePlan(m, PlanOptions{.card_bytes = 80 * kGiB}, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->parameters, kParameters);
  EXPECT_EQ(p->weights_bytes, 2 * kParameters);
  EXPECT_EQ(FormatBytes(p->weights_bytes), "14.96 GiB");
  EXPECT_EQ(p->kv_bytes_per_token, 2u * 32 * 8 * 128 * 2);  // 131,072: 128 KiB
  // fp8: the linear layers' weights in one byte, the embeddings, lm_head and norms in two.
  absl::StatusOr<ModelSpec> fp8 = PerGpuModel(m, "fp8", 1);
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->weight_bytes(), kLinear + 2 * (kNorms + kEmbeddings));  // 9,081,200,640
  EXPECT_EQ(fp8->kv_bytes_per_token(), 131072u) << "quantization changes the weights only";
  // int4: half a byte a parameter plus a 16-bit scale and a 4-bit zero per 128 (133/256 a parameter).
  absl::StatusOr<ModelSpec> int4 = PerGpuModel(m, "int4", 1);
  ASSERT_TRUE(int4.ok());
  EXPECT_EQ(int4->weight_bytes(), kLinear / 256 * 133 + 2 * (kNorms + kEmbeddings));  // 5,727,854,592
  // Tensor parallelism: every tensor but the norms split; KV heads split (8 / 2), then replicated
  // past 8 GPUs (one per GPU).
  absl::StatusOr<ModelSpec> tp2 = PerGpuModel(m, "", 2);
  ASSERT_TRUE(tp2.ok());
  EXPECT_EQ(tp2->weight_bytes(), (kLinear + kEmbeddings) + 2 * kNorms);
  EXPECT_EQ(tp2->kv_bytes_per_token(), 65536u);
  absl::StatusOr<ModelSpec> tp16 = PerGpuModel(m, "", 16);
  ASSERT_TRUE(tp16.ok());
  EXPECT_EQ(tp16->kv_bytes_per_token(), 2u * 32 * 1 * 128 * 2);
  EXPECT_EQ(tp16->heads, 2);
}

TEST(PlannerTest, BadOptionsNameWhatIsAccepted) {
  const ModelSpec m = Llama8B();
  auto error = [&](PlanOptions o) {
    absl::StatusOr<Plan> p = MakePlan(m, o, {});
    EXPECT_FALSE(p.ok());
    return std::string(p.status().message());
  };
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .dtype = "fp4"}), "accepted bf16, fp16, fp8 or int4"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .tensor_parallel = 3}), "32 attention heads"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .gpu_memory_utilization = 1.5}), "from 0.01 to 1"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 0}), "above 0"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .max_model_len = -1}), "max_model_len -1: accepted"));
}

TEST(PlannerTest, BucketsAndTheirRules) {
  EXPECT_EQ(LengthBucketOf(512, 128), 0);
  EXPECT_EQ(LengthBucketOf(513, 1), 1);
  EXPECT_EQ(LengthBucketOf(100, 129), 1) << "a request is in the larger of its input's and output's bucket";
  EXPECT_EQ(LengthBucketOf(2049, 512), 2);
  EXPECT_EQ(LengthBucketOf(8192, 256), 2);
  EXPECT_EQ(LengthBucketOf(8193, 1), 3);
  EXPECT_EQ(LengthBucketOf(10, 513), 3);
  // The vendored Azure conversation trace (19,366 requests), counted by a separate Python reading of
  // the CSV with the same rules and nearest-rank quantiles.
  const std::vector<LengthBucket> b = LengthProfile(AzureConv());
  ASSERT_EQ(b.size(), 4u);
  const struct {
    const char* name;
    std::int64_t n;
    int p50_in, p99_in, p50_out, p99_out;
  } want[] = {{"S", 5533, 393, 460, 90, 127},
              {"M", 4621, 843, 2002, 142, 238},
              {"L", 8649, 1113, 4941, 395, 498},
              {"XL", 563, 1078, 1520, 573, 1000}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b[i].name, want[i].name);
    EXPECT_EQ(b[i].requests, want[i].n) << b[i].name;
    EXPECT_NEAR(b[i].share, static_cast<double>(want[i].n) / 19366, 1e-12);
    EXPECT_EQ(b[i].p50_input, want[i].p50_in) << b[i].name;
    EXPECT_EQ(b[i].p99_input, want[i].p99_in) << b[i].name;
    EXPECT_EQ(b[i].p50_output, want[i].p50_out) << b[i].name;
    EXPECT_EQ(b[i].p99_output, want[i].p99_out) << b[i].name;
  }
}

TEST(PlannerTest, TheBudgetAddsUpAndTooSmallIsSaid) {
  const ModelSpec m = Llama8B();
  const std::vector<Request> requests = AzureConv();
  absl::StatusOr<Plan> p = MakePlan(m, PlanOptions{.card_bytes = 80 * kGiB}, requests);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->budget_bytes, 71 * kGiB);  // 80 GiB x 0.9 - 1 GiB
  EXPECT_EQ(p->p99_total, 4259);
  EXPECT_EQ(p->longest_total, 14089);
  ASSERT_TRUE(p->fits);
  // Weights, activations and the KV cache stay within the budget; the KV cache holds max_num_seqs
  // sequences of the P99 length in whole blocks of 16, and not one more.
  EXPECT_LE(p->weights_bytes + p->activation_bytes + p->kv_cache_tokens * p->kv_bytes_per_token, p->budget_bytes);
  EXPECT_GT(p->weights_bytes + p->activation_bytes + (p->kv_cache_tokens + 16) * p->kv_bytes_per_token,
            p->budget_bytes);
  EXPECT_GE(p->kv_cache_tokens, p->max_num_seqs * 4272);  // 4259 + 16, rounded up to 16
  EXPECT_LT(p->kv_cache_tokens, (p->max_num_seqs + 1) * 4288);
  EXPECT_EQ(p->max_model_len, 14336);  // the longest request, rounded up to 256
  EXPECT_EQ(p->rejected_too_long, 0);
  EXPECT_LT(p->tier_waste, p->default_tier_waste) << "tiers from the profile waste less than the default ones";
  // A 16 GiB card cannot hold the weights and one request: too small, and the smallest card is
  // the budget of weights, one step's activations (one row) and one P99 request, over 0.9.
  absl::StatusOr<Plan> small = MakePlan(m, PlanOptions{.card_bytes = 16 * kGiB}, requests);
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(small->fits);
  EXPECT_EQ(small->max_num_seqs, 0);
  const double need =
      static_cast<double>(2 * kParameters + ActivationPeakBytes(m, 8192, 1) + 4288ull * 131072 + kGiB) / 0.9;
  EXPECT_EQ(small->smallest_card_bytes, static_cast<std::uint64_t>(std::ceil(need / kGiB)) * kGiB);
  EXPECT_EQ(small->smallest_card_bytes, 20 * kGiB);
  absl::StatusOr<Plan> exact = MakePlan(m, PlanOptions{.card_bytes = small->smallest_card_bytes}, requests);
  ASSERT_TRUE(exact.ok());
  EXPECT_TRUE(exact->fits);
  EXPECT_GE(exact->max_num_seqs, 1);
}

// A card too small for the profile's P99 request (Llama-3.1-8B's 4259 tokens on 19 GiB: 16.1 GiB of
// budget beside 14.96 GiB of weights) still gets a plan: the longest max_model_len one sequence
// fits in, the concurrency then, the share of the profile rejected; replayed with no OOM.
TEST(PlannerTest, ACardTooSmallForTheP99RequestGetsTheBestPlanOnIt) {
  const ModelSpec m = Llama8B();
  const std::vector<Request> requests = AzureConv();
  const PlanOptions o{.card_bytes = 19 * kGiB, .check_requests = 24};
  absl::StatusOr<Plan> p = MakePlan(m, o, requests);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_FALSE(p->fits);
  ASSERT_TRUE(p->on_this_card.has_value()) << PlanToText(*p);
  const CardPlan& c = *p->on_this_card;
  EXPECT_LT(c.max_model_len, p->p99_total);
  EXPECT_GE(c.max_model_len, 32);
  EXPECT_GE(c.max_num_seqs, 1);
  std::int64_t longer = 0;
  for (const Request& r : requests) longer += r.input_tokens + r.output_tokens > c.max_model_len;
  EXPECT_EQ(c.rejected, longer);
  EXPECT_DOUBLE_EQ(c.rejected_share, static_cast<double>(longer) / static_cast<double>(requests.size()));
  // One sequence of max_model_len (whole blocks) fits beside the weights and one row's activations,
  // and the KV cache is within the budget.
  const std::uint64_t one_row = ActivationPeakBytes(m, 8192, 1);
  EXPECT_LE(p->weights_bytes + one_row + static_cast<std::uint64_t>(c.kv_cache_tokens) * p->kv_bytes_per_token,
            p->budget_bytes);
  EXPECT_GE(c.kv_cache_tokens, c.max_model_len + 16);
  ASSERT_TRUE(CheckPlan(m, o, requests, "model.json", "requests.csv", &*p).ok());
  ASSERT_TRUE(p->on_this_card.has_value()) << PlanToText(*p);
  EXPECT_TRUE(p->on_this_card->checked) << PlanToText(*p);
  EXPECT_FALSE(p->on_this_card->checks.empty());
  for (const PlanCheck& k : p->on_this_card->checks) EXPECT_GE(k.margin_bytes, 0) << k.layout << " " << k.allocator;
  const nlohmann::json j = nlohmann::json::parse(PlanToJson(*p));
  for (const char* key : {"max_model_len", "max_num_seqs", "rejected_share", "kv_cache_tokens"}) {
    EXPECT_TRUE(j["on_this_card"].contains(key)) << key;
  }
  EXPECT_TRUE(absl::StrContains(PlanToText(*p), "on this card: max_model_len")) << PlanToText(*p);
  // A card whose budget does not hold the weights: no plan on it, and said so.
  absl::StatusOr<Plan> none = MakePlan(m, PlanOptions{.card_bytes = 16 * kGiB}, requests);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->on_this_card.has_value());
  EXPECT_TRUE(absl::StrContains(PlanToText(*none), "does not fit: the weights and one step's activations alone"))
      << PlanToText(*none);
  EXPECT_TRUE(nlohmann::json::parse(PlanToJson(*none))["on_this_card"].is_null());
}

TEST(PlannerTest, TheRecommendationServesItsTraceWithNoOom) {
  const ModelSpec m = Llama8B();
  const std::vector<Request> requests = AzureConv();
  const PlanOptions o{.card_bytes = 24 * kGiB, .check_requests = 60};
  absl::StatusOr<Plan> p = MakePlan(m, o, requests);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->fits);
  ASSERT_TRUE(CheckPlan(m, o, requests, "model.json", "requests.csv", &*p).ok());
  ASSERT_TRUE(p->checked);
  EXPECT_GE(p->measured_margin_bytes, 256 * static_cast<std::int64_t>(kMiB)) << PlanToText(*p);
  int recommended = 0;
  for (const PlanCheck& c : p->checks) {
    EXPECT_GE(c.margin_bytes, 0) << c.what << " " << c.layout << " " << c.allocator;
    recommended += c.what == "recommended";
  }
  EXPECT_EQ(recommended, 4) << "paged and tiered, bucketalloc and pytorch-policy: " << PlanToText(*p);
  // Independently of the check's min-capacity: the recommended paged trace replayed at the budget
  // by both allocators has no OOM.
  std::vector<Request> burst(requests.begin(), requests.begin() + 60);
  for (Request& r : burst) r.arrival_s *= 1e-6;
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(burst, m, PlanServingOptions(*p, KvLayout::kPaged));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->summary.served, 60);
  for (const char* allocator : {"bucketalloc", "pytorch-policy"}) {
    ReplayOptions ro;
    ro.allocator = allocator;
    ro.capacity = p->budget_bytes;
    absl::StatusOr<ReplayResult> r = Replay(t->trace, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->ooms, 0u) << allocator;
  }
  // The JSON carries what scripts act on.
  const nlohmann::json j = nlohmann::json::parse(PlanToJson(*p));
  for (const char* key : {"fits", "smallest_card_bytes", "max_num_seqs", "max_model_len", "kv_bytes_per_token",
                          "weights_bytes", "measured_margin_bytes", "buckets", "tiers_tokens", "checks"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(absl::StrContains(j["checks"][0]["command"].get<std::string>(), "--max-num-seqs"));
  EXPECT_TRUE(absl::StrContains(PlanHtml(*p), "<section id=\"plan\">"));
}

// A model whose every dimension is 1 (24 bytes of weights), with `extra` keys.
ModelSpec Degenerate(const std::string& extra = "") {
  absl::StatusOr<ModelSpec> m = ParseModelConfig(
      absl::StrCat(R"({"model_type":"llama","hidden_size":1,"num_hidden_layers":1,"num_attention_heads":1,)",
                   R"("num_key_value_heads":1,"intermediate_size":1,"vocab_size":1)", extra, "}"),
      "degenerate.json");
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// Issue 27: values past what the planner can size wrapped (--max-model-len 2147483647 failed naming
// --max-kv-tokens -2147483632, a utilization of 1e-300 recommended an 8 EiB card); each is refused
// naming the option (as PlanOptions does: the command line names its flag), the value given and what
// is accepted.
TEST(PlannerTest, OutOfRangeOptionsNameTheOptionTheValueAndTheRange) {
  const ModelSpec m = Llama8B();
  auto error = [&](PlanOptions o) {
    absl::StatusOr<Plan> p = MakePlan(m, o, {});
    EXPECT_FALSE(p.ok()) << PlanToText(*p);
    return p.ok() ? std::string() : std::string(p.status().message());
  };
  const std::string len = error({.card_bytes = 80 * kGiB, .max_model_len = 2147483647});
  EXPECT_TRUE(absl::StrContains(len,
                                "max_model_len 2147483647: accepted 0 (from the profile) or 2 to the model's "
                                "max_position_embeddings (131072 in "))
      << len;
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .max_model_len = 131073}), "max_model_len 131073"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .max_model_len = 1}), "max_model_len 1"));
  const std::string util = error({.card_bytes = 80 * kGiB, .gpu_memory_utilization = 1e-300});
  EXPECT_TRUE(absl::StrContains(util, "gpu_memory_utilization 1e-300: accepted a fraction from 0.01 to 1")) << util;
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = kMaxPlanCardBytes + 1}),
                                "card_bytes 70368744177665: accepted a size in bytes above 0 and up to "));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .runtime_reserve_bytes = ~std::uint64_t{0}}),
                                "runtime_reserve_bytes 18446744073709551615: accepted a size in bytes from 0 to "));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .max_batched_tokens = kMaxPlanBatchedTokens + 1}),
                                "max_batched_tokens 1048577: accepted 1 to 1048576"));
  // The boundaries themselves are planned, with figures that did not wrap.
  absl::StatusOr<Plan> p = MakePlan(m, {.card_bytes = 80 * kGiB, .gpu_memory_utilization = 0.01}, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  EXPECT_LE(p->smallest_card_bytes, kMaxPlanCardBytes);
  EXPECT_GT(p->smallest_card_bytes, 80 * kGiB);
  p = MakePlan(m, {.card_bytes = 80 * kGiB, .max_model_len = 131072}, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->max_model_len, 131072);
  EXPECT_GT(p->max_kv_tokens_paged, 0);
}

// The config's max_position_embeddings is named as the config's key, not as command-line flags.
TEST(PlannerTest, AConfigLimitIsNamedByItsKey) {
  absl::StatusOr<Plan> p = MakePlan(Degenerate(R"(,"max_position_embeddings":1)"), {.card_bytes = 80 * kGiB}, {});
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "degenerate.json: \"max_position_embeddings\" is 1"))
      << p.status();
  EXPECT_FALSE(absl::StrContains(p.status().message(), "--max-kv-tokens")) << p.status();
  p = MakePlan(Degenerate(R"(,"max_position_embeddings":16)"), {.card_bytes = 80 * kGiB}, AzureConv());
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "degenerate.json: \"max_position_embeddings\" 16: every request"))
      << p.status();
  EXPECT_EQ(PlanOptionOf(p.status()), std::nullopt) << "a config's key is no option";
  // The same limit given as the option is named as the option.
  p = MakePlan(Llama8B(), {.card_bytes = 80 * kGiB, .max_model_len = 16}, AzureConv());
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StartsWith(p.status().message(), "max_model_len 16: every request of the profile is longer"))
      << p.status();
  EXPECT_EQ(PlanOptionOf(p.status()), PlanOption::kMaxModelLen);
}

// A degenerate model's steps last femtoseconds: with the check's arrivals a microsecond apart its
// requests were served one at a time (101,661 steps, 81 s for the check of 400 requests). The
// check's arrivals now fall within 1% of the model's shortest step: a burst, as for a real model.
TEST(PlannerTest, ADegenerateModelIsCheckedAsABurst) {
  const ModelSpec m = Degenerate();
  const std::vector<Request> requests = AzureConv();
  const PlanOptions o{.card_bytes = 8 * kGiB, .check_requests = 100};
  absl::StatusOr<Plan> p = MakePlan(m, o, requests);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->fits);
  ASSERT_TRUE(CheckPlan(m, o, requests, "degenerate.json", "requests.csv", &*p).ok());
  int recommended = 0;
  for (const PlanCheck& c : p->checks) {
    if (c.what != "recommended") continue;
    ++recommended;
    // 100 requests together, max_num_seqs of them at once: the longest prompt in chunks and the
    // longest output (at most 1000 tokens), not the sum of every output (about 25,000 steps).
    EXPECT_LT(c.steps, 2000) << c.layout << " " << c.allocator << "\n" << PlanToText(*p);
    EXPECT_TRUE(absl::StrContains(c.command, "--time-scale 1e-")) << c.command;
  }
  EXPECT_EQ(recommended, 4) << PlanToText(*p);
}

// A card the planner accepts but the simulated device cannot replay (issue 27: --card 3TiB failed
// with "capacity 5660264MiB is more than the simulated device can hold") is planned, and its check
// is skipped by a note naming the card; a schedule too long to replay is skipped the same way.
TEST(PlannerTest, TheCheckSaysWhyItSkipsAHugeCardOrAnEndlessSchedule) {
  const ModelSpec m = Llama8B();
  for (std::uint64_t card : {3 * kTiB, kMaxPlanCardBytes}) {
    const PlanOptions o{.card_bytes = card, .check_requests = 20};
    absl::StatusOr<Plan> p = MakePlan(m, o, AzureConv());
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(p->fits);
    absl::Status s = CheckPlan(m, o, AzureConv(), "model.json", "requests.csv", &*p);
    ASSERT_TRUE(s.ok()) << s;
    const std::string text = PlanToText(*p);
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("not checked by replay: --card ", FormatBytes(card)))) << text;
    for (const PlanCheck& c : p->checks) EXPECT_EQ(c.what, "smallest card") << text;
  }
  // No profile and a context of 2^30 tokens: the synthetic requests of the check would take
  // millions of steps.
  const ModelSpec huge = Degenerate(R"(,"max_position_embeddings":1073741824)");
  const PlanOptions o{.card_bytes = 80 * kGiB};
  absl::StatusOr<Plan> p = MakePlan(huge, o, {});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(CheckPlan(huge, o, {}, "degenerate.json", "", &*p).ok());
  const std::string text = PlanToText(*p);
  EXPECT_TRUE(absl::StrContains(text, "steps (more than 250000)")) << text;
  EXPECT_TRUE(p->checks.empty()) << text;
}

// The sane figures of a plan: nothing wrapped, everything within the budget it reports.
void ExpectSane(const Plan& p, const PlanOptions& o, const ModelSpec& m, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_LE(p.budget_bytes, p.card_bytes);
  EXPECT_LE(p.card_bytes, kMaxPlanCardBytes);
  EXPECT_LE(p.smallest_card_bytes, kMaxPlanCardBytes);
  EXPECT_EQ(p.smallest_card_bytes % kGiB, 0u);
  EXPECT_GE(p.kv_cache_tokens, 0);
  EXPECT_GE(p.max_model_len, 0);
  EXPECT_LE(p.max_model_len, m.max_position_embeddings);
  EXPECT_GE(p.max_num_seqs, 0);
  EXPECT_LE(p.max_num_seqs, 256);
  EXPECT_GE(p.max_kv_tokens_paged, 0);
  EXPECT_GE(p.max_kv_tokens_tiered, 0);
  EXPECT_LE(p.max_kv_tokens_paged, p.kv_cache_tokens);
  for (std::size_t i = 0; i < p.tiers_tokens.size(); ++i) {
    EXPECT_GE(p.tiers_tokens[i], 1);
    if (i > 0) {
      EXPECT_GT(p.tiers_tokens[i], p.tiers_tokens[i - 1]);
    }
  }
  if (p.fits) {
    EXPECT_GE(p.max_num_seqs, 1);
    EXPECT_GE(p.max_model_len, 1);
    EXPECT_LE(
        p.weights_bytes + p.activation_bytes + static_cast<std::uint64_t>(p.kv_cache_tokens) * p.kv_bytes_per_token,
        p.budget_bytes);
    EXPECT_LE(p.smallest_card_bytes, RoundUpToGib(p.card_bytes));
  } else if (p.smallest_card_bytes != 0) {
    EXPECT_GT(p.smallest_card_bytes + kGiB, p.card_bytes);
  }
  const std::string text = PlanToText(p);
  for (std::size_t i = 1; i + 1 < text.size(); ++i) {  // no negative figure (a wrapped one)
    EXPECT_FALSE(text[i] == '-' && (text[i - 1] == ' ' || text[i - 1] == '(') && absl::ascii_isdigit(text[i + 1]))
        << text;
  }
  (void)o;
}

// One sweep (issue 27): each plan option at its boundaries and past them, and each numeric key of
// the model's config mutated, one at a time, with and without a profile. Each plan either has sane
// figures or fails naming the option (first, as PlanOptions does, and as PlanOptionOf; never a
// command line's flag) or the config key that was changed. Formulas only (no replay):
// a few hundred plans, well under a few seconds.
TEST(PlannerTest, SweepOfOptionsAndConfigsPlansSanelyOrNamesTheCause) {
  const ModelSpec llama = Llama8B();
  const std::vector<Request> azure = AzureConv();
  const std::vector<Request> few(azure.begin(), azure.begin() + 200);
  constexpr int kIntMax = 2147483647, kIntMin = -2147483647 - 1;
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Case {
    PlanOption option;
    PlanOptions options;
  };
  std::vector<Case> cases;
  const PlanOptions base{.card_bytes = 80 * kGiB};
  for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1}, kMiB, kGiB, 16 * kGiB, 80 * kGiB, kTiB, 2 * kTiB,
                          kMaxPlanCardBytes, kMaxPlanCardBytes + 1, ~std::uint64_t{0}}) {
    PlanOptions o = base;
    o.card_bytes = v;
    cases.push_back({PlanOption::kCardBytes, o});
  }
  for (double v : {kNan, -1.0, 0.0, 1e-300, 0.0099, 0.01, 0.5, 1.0, 1.0000001, kInf}) {
    PlanOptions o = base;
    o.gpu_memory_utilization = v;
    cases.push_back({PlanOption::kGpuMemoryUtilization, o});
  }
  for (int v : {kIntMin, -1, 0, 1, 2, 3, 4096, 131072, 131073, kIntMax}) {
    PlanOptions o = base;
    o.max_model_len = v;
    cases.push_back({PlanOption::kMaxModelLen, o});
  }
  for (int v : {kIntMin, 0, 1, 2, 255, 256, kMaxPlanBatchedTokens, kMaxPlanBatchedTokens + 1, kIntMax}) {
    PlanOptions o = base;
    o.max_batched_tokens = v;
    cases.push_back({PlanOption::kMaxBatchedTokens, o});
  }
  for (std::uint64_t v :
       {std::uint64_t{0}, kGiB, 79 * kGiB, 80 * kGiB, kMaxPlanCardBytes, kMaxPlanCardBytes + 1, ~std::uint64_t{0}}) {
    PlanOptions o = base;
    o.runtime_reserve_bytes = v;
    cases.push_back({PlanOption::kRuntimeReserveBytes, o});
  }
  for (int v : {kIntMin, -1, 0, 1, 2, 3, 8, 16, 32, 64, 1024, 1025, kIntMax}) {
    PlanOptions o = base;
    o.tensor_parallel = v;
    cases.push_back({PlanOption::kTensorParallel, o});
  }
  for (const char* v : {"", "bf16", "fp16", "fp8", "int4", "fp4", "BF16"}) {
    PlanOptions o = base;
    o.dtype = v;
    cases.push_back({PlanOption::kDtype, o});
  }
  for (std::int64_t v :
       {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::numeric_limits<std::int64_t>::max()}) {
    PlanOptions o = base;
    o.check_requests = v;
    cases.push_back({PlanOption::kCheckRequests, o});
  }
  int planned = 0, refused = 0;
  for (const Case& c : cases) {
    for (const std::vector<Request>* requests : {&few, static_cast<const std::vector<Request>*>(nullptr)}) {
      const std::vector<Request> none;
      absl::StatusOr<Plan> p = MakePlan(llama, c.options, requests ? *requests : none);
      const std::string what = absl::StrCat(PlanOptionName(c.option), " case ", &c - cases.data(),
                                            requests ? " with" : " without", " a profile");
      if (p.ok()) {
        ++planned;
        ExpectSane(*p, c.options, llama, what);
      } else {
        ++refused;
        EXPECT_EQ(PlanOptionOf(p.status()), c.option) << what << ": " << p.status();
        EXPECT_TRUE(absl::StartsWith(p.status().message(), absl::StrCat(PlanOptionName(c.option), " ")))
            << what << ": " << p.status();
        EXPECT_FALSE(absl::StrContains(p.status().message(), "--")) << what << ": " << p.status();
      }
    }
  }
  EXPECT_GT(planned, 60);
  EXPECT_GT(refused, 30);

  // The model's config: each numeric key of a small llama at its boundaries (parsed configs only:
  // model_config_test sweeps the refused ones), planned on an 80 GiB card.
  const char* const keys[] = {
      "hidden_size",       "num_hidden_layers", "num_attention_heads",     "num_key_value_heads",
      "intermediate_size", "vocab_size",        "max_position_embeddings", "head_dim"};
  const std::string small =
      R"({"model_type":"llama","hidden_size":512,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":2,)"
      R"("intermediate_size":1024,"vocab_size":32000,"max_position_embeddings":4096,"head_dim":64})";
  int configs = 0;
  for (const char* key : keys) {
    for (std::int64_t v : {1, 2, 3, 16, 4096, 1 << 20, 1 << 30}) {
      nlohmann::json j = nlohmann::json::parse(small);
      j[key] = v;
      absl::StatusOr<ModelSpec> m = ParseModelConfig(j.dump(), "sweep.json");
      if (!m.ok()) continue;
      ++configs;
      for (const std::vector<Request>* requests : {&few, static_cast<const std::vector<Request>*>(nullptr)}) {
        const std::vector<Request> none;
        absl::StatusOr<Plan> p = MakePlan(*m, base, requests ? *requests : none);
        const std::string what = absl::StrCat(key, " = ", v, requests ? " with" : " without", " a profile");
        if (p.ok()) {
          ExpectSane(*p, base, *m, what);
        } else {
          const std::string message(p.status().message());
          EXPECT_TRUE(absl::StrContains(message, "sweep.json") &&
                      (absl::StrContains(message, key) || absl::StrContains(message, "max_batched_tokens")))
              << what << ": " << message;
        }
      }
    }
  }
  EXPECT_GT(configs, 30);
}

}  // namespace
}  // namespace bucketalloc::harness
