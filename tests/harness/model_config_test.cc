// Hugging Face config.json to ModelSpec (src/harness/workload/model_config.cc): the weight tensors of each
// modelled architecture against known parameter counts, KV bytes per token, and errors.
#include "harness/workload/model_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

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

// A value of the wrong JSON type is reported as that type, never as missing and never read as a
// default (issue 27: "model_type": 7 was reported missing, "torch_dtype": 16 silently read as bf16).
TEST(ModelConfigTest, WrongJsonTypesAreNamedAsSuch) {
  const struct {
    const char* from;
    const char* to;
    const char* want;
  } cases[] = {
      {R"("model_type":"llama")", R"("model_type":7)",
       R"("model_type" must be a string (llama, mistral, qwen2, qwen3, phi3), got a number (7))"},
      {R"("model_type":"llama")", R"("model_type":null)", R"("model_type" must be a string)"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"torch_dtype":16)",
       R"("torch_dtype" must be a string (bfloat16, float16, float32), got a number (16))"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"dtype":true)", R"("dtype" must be a string)"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"dtype":"int8")", R"("dtype" is "int8"; accepted bfloat16)"},
      {R"("hidden_size":64)", R"("hidden_size":"64")",
       R"("hidden_size" must be a whole number from 1 to 2^30, got a string ("64"))"},
      {R"("hidden_size":64)", R"("hidden_size":64.5)",
       R"("hidden_size" must be a whole number from 1 to 2^30, got a number with a fraction)"},
      {R"("hidden_size":64)", R"("hidden_size":null)", R"("hidden_size" is null; accepted a whole number)"},
      {R"("num_key_value_heads":2)", R"("num_key_value_heads":[2])", R"("num_key_value_heads" must be a whole number)"},
      {R"("max_position_embeddings":2048)", R"("max_position_embeddings":"2048")",
       R"("max_position_embeddings" must be a whole number)"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"tie_word_embeddings":"true")",
       R"("tie_word_embeddings" must be true or false, got a string ("true"))"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"attention_bias":1)", R"("attention_bias" must be true or false)"},
      {R"("vocab_size":1000)", R"("vocab_size":1000,"architectures":"LlamaForCausalLM")",
       R"("architectures" must be an array of class names)"},
  };
  for (const auto& c : cases) {
    const std::string json = absl::StrReplaceAll(Config("llama"), {{c.from, c.to}});
    ASSERT_NE(json, Config("llama")) << c.from;
    absl::StatusOr<ModelSpec> m = ParseModelConfig(json, "m.json");
    ASSERT_FALSE(m.ok()) << c.to << " was accepted";
    EXPECT_TRUE(absl::StrContains(m.status().message(), c.want)) << c.to << ": " << m.status();
    EXPECT_FALSE(absl::StrContains(m.status().message(), "missing")) << c.to << ": " << m.status();
  }
  // null is "not set" for the optional keys, as transformers takes it: the documented defaults.
  absl::StatusOr<ModelSpec> m = ParseModelConfig(Config("llama", R"(,"head_dim":null,"torch_dtype":null)"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->head_dim, 16);
  EXPECT_EQ(m->dtype_bytes, 2);
  EXPECT_EQ(m->source, "config.json");
}

// One sweep: each numeric key of a config set to boundary values and to values of other JSON types
// (and removed); each parse either gives a sane model or an error that names the key (or, for a
// relation between keys, the keys related). Bounded: a few hundred parses of a two-layer model.
TEST(ModelConfigTest, SweepOfMutatedKeysParsesSanelyOrNamesTheKey) {
  const char* const keys[] = {
      "hidden_size",       "num_hidden_layers", "num_attention_heads",     "num_key_value_heads",
      "intermediate_size", "vocab_size",        "max_position_embeddings", "head_dim"};
  const char* const values[] = {
      "0",    "1",    "-1",   "2",      "3",    "1073741824", "1073741825", "2147483648", "18446744073709551615",
      "1e20", "64.5", "64.0", "\"64\"", "null", "true",       "[]",         "{}"};
  const std::string base =
      R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,)"
      R"("intermediate_size":128,"vocab_size":1000,"max_position_embeddings":2048,"head_dim":16})";
  int parsed = 0, refused = 0;
  for (const char* key : keys) {
    nlohmann::json original = nlohmann::json::parse(base);
    std::vector<std::string> configs;
    for (const char* v : values) {
      nlohmann::json j = original;
      j[key] = nlohmann::json::parse(v);
      configs.push_back(j.dump());
    }
    nlohmann::json removed = original;
    removed.erase(key);
    configs.push_back(removed.dump());
    for (const std::string& json : configs) {
      absl::StatusOr<ModelSpec> m = ParseModelConfig(json, "sweep.json");
      if (m.ok()) {
        ++parsed;
        EXPECT_GT(m->weight_bytes(), 0u) << json;
        EXPECT_LE(m->weight_bytes(), std::uint64_t{1} << 50) << json;
        EXPECT_GT(m->kv_bytes_per_token(), 0u) << json;
        EXPECT_LE(m->kv_bytes_per_token(), std::uint64_t{1} << 30) << json;
        for (int d : {m->hidden, m->layers, m->heads, m->kv_heads, m->head_dim, m->intermediate, m->vocab,
                      m->max_position_embeddings}) {
          EXPECT_GE(d, 1) << json;
          EXPECT_LE(d, 1 << 30) << json;
        }
        EXPECT_EQ(m->heads % m->kv_heads, 0) << json;
        continue;
      }
      ++refused;
      const std::string message(m.status().message());
      EXPECT_TRUE(absl::StartsWith(message, "sweep.json: ")) << message;
      // The key, or (a relation) the two keys it concerns; heads and KV heads relate, as do the
      // sizes that multiply into the weights and the KV cache.
      bool named = absl::StrContains(message, absl::StrCat("\"", key, "\"")) || absl::StrContains(message, key);
      for (const char* related : {"num_key_value_heads", "num_hidden_layers", "hidden_size"}) {
        named = named || absl::StrContains(message, absl::StrCat("\"", related, "\""));
      }
      EXPECT_TRUE(named) << json << ": " << message;
      EXPECT_FALSE(absl::StrContains(message, "is missing") && json != removed.dump())
          << json << ": reported missing: " << message;
    }
  }
  EXPECT_GT(parsed, 8);
  EXPECT_GT(refused, 80);
}

}  // namespace
}  // namespace bucketalloc::harness
