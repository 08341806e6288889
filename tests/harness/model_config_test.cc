// Hugging Face config.json to ModelSpec (src/harness/model_config.cc): the weight tensors of each
// modelled architecture against known parameter counts, KV bytes per token, and errors.
#include "harness/model_config.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace bucketalloc::harness {
namespace {

TEST(ModelConfigTest, Llama31_8BHasItsPublishedShape) {
  absl::StatusOr<ModelSpec> m =
      ReadModelConfig(std::string(BUCKETALLOC_SOURCE_DIR) + "/data/models/Llama-3.1-8B-Instruct.config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "LlamaForCausalLM");
  EXPECT_EQ(m->head_dim, 128);
  // 8,030,261,248 parameters: the figure Hugging Face shows for meta-llama/Llama-3.1-8B.
  EXPECT_EQ(m->parameters(), 8030261248u);
  EXPECT_EQ(m->weights.size(), 1u + 32u * 9u + 1u + 1u);  // embeddings, 9 per layer, norm, lm_head
  EXPECT_EQ(m->weights.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(m->weights.back().name, "lm_head.weight");
  EXPECT_EQ(m->kv_bytes_per_token(), 131072u);  // 2 x 32 x 8 x 128 x 2 (data/SOURCES.md)
  EXPECT_EQ(m->kv_tensor_bytes_per_token(), 2048u);
}

TEST(ModelConfigTest, Qwen25_7BHasQkvBiases) {
  absl::StatusOr<ModelSpec> m =
      ReadModelConfig(std::string(BUCKETALLOC_SOURCE_DIR) + "/data/models/Qwen2.5-7B-Instruct.config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  // 7,615,616,512 parameters: Qwen's published count for Qwen2.5-7B-Instruct.
  EXPECT_EQ(m->parameters(), 7615616512u);
  EXPECT_EQ(m->kv_bytes_per_token(), 57344u);
}

std::string Config(absl::string_view model_type, absl::string_view extra = "") {
  return absl::StrCat(R"({"model_type":")", model_type,
                      R"(","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,)",
                      R"("intermediate_size":128,"vocab_size":1000,"max_position_embeddings":2048)", extra, "}");
}

TEST(ModelConfigTest, Phi3FusesProjectionsAndTiedEmbeddingsHaveNoLmHead) {
  absl::StatusOr<ModelSpec> phi = ParseModelConfig(Config("phi3"));
  ASSERT_TRUE(phi.ok()) << phi.status();
  EXPECT_TRUE(phi->fused_qkv);
  // embed + 2 x (2 norms, qkv, o, gate_up, down) + norm + lm_head
  EXPECT_EQ(phi->weights.size(), 1u + 2u * 6u + 1u + 1u);
  const std::uint64_t per_layer = 64 * (64 + 2 * 32) + 64 * 64 + 2 * 128 * 64 + 64 * 128 + 2 * 64;
  EXPECT_EQ(phi->parameters(), 2 * 1000 * 64 + 2 * per_layer + 64);

  absl::StatusOr<ModelSpec> tied = ParseModelConfig(Config("llama", R"(,"tie_word_embeddings":true)"));
  ASSERT_TRUE(tied.ok());
  EXPECT_EQ(tied->weights.back().name, "model.norm.weight");
  absl::StatusOr<ModelSpec> qwen3 = ParseModelConfig(Config("qwen3", R"(,"head_dim":32,"torch_dtype":"float32")"));
  ASSERT_TRUE(qwen3.ok());
  EXPECT_EQ(qwen3->head_dim, 32);
  EXPECT_EQ(qwen3->kv_bytes_per_token(), 2u * 2u * 2u * 32u * 4u);
}

TEST(ModelConfigTest, Qwen3HeadDimDefaultsTo128AndMistralHasNoBiases) {
  // Qwen3-32B: hidden 5120, 64 heads; its head_dim is 128, not 5120 / 64 = 80.
  absl::StatusOr<ModelSpec> qwen3 = ParseModelConfig(
      R"({"model_type":"qwen3","hidden_size":5120,"num_hidden_layers":64,"num_attention_heads":64,)"
      R"("num_key_value_heads":8,"intermediate_size":25600,"vocab_size":151936,"tie_word_embeddings":false})");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->head_dim, 128);
  EXPECT_EQ(qwen3->parameters(), 32762123264u);  // Qwen's published count for Qwen3-32B
  EXPECT_EQ(qwen3->kv_bytes_per_token(), 262144u);
  absl::StatusOr<ModelSpec> plain = ParseModelConfig(Config("mistral"));
  absl::StatusOr<ModelSpec> flagged = ParseModelConfig(Config("mistral", R"(,"attention_bias":true,"mlp_bias":true)"));
  ASSERT_TRUE(plain.ok() && flagged.ok());
  EXPECT_EQ(plain->parameters(), flagged->parameters()) << "mistral's code has no biases";
  absl::StatusOr<ModelSpec> llama = ParseModelConfig(Config("llama", R"(,"attention_bias":true)"));
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->parameters(), plain->parameters() + 2u * (64u + 32u + 32u + 64u));  // q, k, v, o biases
}

TEST(ModelConfigTest, ErrorsNameTheKeyAndWhatIsAccepted) {
  absl::StatusOr<ModelSpec> m = ParseModelConfig(Config("gemma"), "g.json");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "g.json: \"model_type\" is \"gemma\"; modelled: llama"))
      << m.status();
  m = ParseModelConfig(R"({"model_type":"llama","hidden_size":64})");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "\"num_hidden_layers\" is missing")) << m.status();
  m = ParseModelConfig(Config("llama", R"(,"torch_dtype":"int8")"));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "accepted bfloat16, float16, float32")) << m.status();
  m = ParseModelConfig(
      absl::StrReplaceAll(Config("llama"), {{"\"num_key_value_heads\":2", "\"num_key_value_heads\":3"}}));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "divisor of num_attention_heads")) << m.status();
  m = ParseModelConfig(absl::StrReplaceAll(Config("llama"), {{"\"vocab_size\":1000", "\"vocab_size\":-5"}}));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "\"vocab_size\" is -5; accepted a whole number")) << m.status();
  EXPECT_FALSE(ParseModelConfig("[1,2]").ok());
  EXPECT_FALSE(ReadModelConfig("/nonexistent/config.json").ok());
}

// Dimensions inside each key's range whose products are not a model: a billion layers (it once
// listed 13 billion tensors, 3.4 GB, before the weight check) and every dimension 2^30 (the sizes
// wrapped, and 16 GiB of weights was reported). Each is refused at once, naming the key.
TEST(ModelConfigTest, HugeDimensionsAreRefusedBeforeAnythingIsBuilt) {
  absl::StatusOr<ModelSpec> m = ParseModelConfig(
      absl::StrReplaceAll(Config("llama"), {{"\"num_hidden_layers\":2", "\"num_hidden_layers\":1073741824"}}));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "\"num_hidden_layers\" is 1073741824; accepted 1 to 4096"))
      << m.status();
  m = ParseModelConfig(R"({"model_type":"llama","hidden_size":1073741824,"num_hidden_layers":2,)"
                       R"("num_attention_heads":1073741824,"head_dim":1073741824,"intermediate_size":8,)"
                       R"("vocab_size":8})");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "over 1 PiB of weights")) << m.status();
  m = ParseModelConfig(R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":4096,)"
                       R"("num_attention_heads":1048576,"head_dim":1048576,"intermediate_size":8,"vocab_size":8,)"
                       R"("num_key_value_heads":1048576})");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "over 1 PiB of weights")) << m.status();
}

}  // namespace
}  // namespace bucketalloc::harness
