// The planner (src/harness/planner.cc): its formulas against hand-computed cases (Llama-3.1-8B:
// 8,030,261,248 parameters, 14.96 GiB of weights in bf16, 128 KiB of KV per token), the length
// profile of the vendored Azure conversation trace against counts computed apart from this code
// (a Python reading of the same CSV), and the plan's recommendations served by replay with no OOM.
#include "harness/planner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "bucketalloc/units.h"
#include "harness/replay.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

std::string Data(const std::string& path) { return std::string(BUCKETALLOC_SOURCE_DIR) + "/data/" + path; }

ModelSpec Llama8B() {
  absl::StatusOr<ModelSpec> m = ReadModelConfig(Data("models/Llama-3.1-8B-Instruct.config.json"));
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

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
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .gpu_memory_utilization = 1.5}), "(0, 1]"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 0}), "above 0"));
  EXPECT_TRUE(absl::StrContains(error({.card_bytes = 80 * kGiB, .max_model_len = -1}), "--max-model-len"));
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

}  // namespace
}  // namespace bucketalloc::harness
