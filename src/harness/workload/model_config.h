// src/harness/workload/model_config.h — a transformer's shapes from its Hugging Face config.json (layer L5,
// the benchmark harness; input of the serving workload generator, harness/workload/serving.h).
//
// Owns: ModelSpec — the dimensions the generator needs (hidden size, layers, heads, KV heads, head
// dim, MLP width, vocabulary, dtype) and the model's weight tensors, one per real tensor of the
// checkpoint, in load order:
//   llama, mistral:  embed_tokens; per layer q/k/v/o_proj, gate/up/down_proj, two RMSNorms; norm;
//                    lm_head (unless tie_word_embeddings). llama's attention_bias / mlp_bias add
//                    biases; mistral has none.
//   qwen2:           as llama, with q/k/v biases (always present in Qwen2).
//   qwen3:           as llama, with per-head q_norm and k_norm (head_dim defaults to 128, as in
//                    transformers); attention_bias adds q/k/v/o biases.
//   phi3 (phi-4):    fused qkv_proj and gate_up_proj.
// Other model types are refused with the list above: their tensors would be guesses.
// Thread-safety: none (values).
//
// Example:
//   absl::StatusOr<ModelSpec> m = ReadModelConfig("Llama-3.1-8B-Instruct.config.json");
//   m->kv_bytes_per_token();  // 131072
#ifndef BUCKETALLOC_HARNESS_WORKLOAD_MODEL_CONFIG_H_
#define BUCKETALLOC_HARNESS_WORKLOAD_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bucketalloc::harness {

struct WeightTensor {
  std::string name;
  std::uint64_t bytes = 0;
};

// A model's dimensions in 128 bits, so that products of up to three (each at most 2^30) never
// wrap: element bytes, hidden size, q and kv widths (heads x head_dim), intermediate, vocabulary.
struct WideDims {
  absl::uint128 e, h, q, kv, inter, vocab;
};

struct ModelSpec {
  std::string model_type;  // config's model_type
  std::string name;        // the config's first architecture, or its model_type
  std::string source;      // where the config was read (ParseModelConfig's `source`), for errors
  int hidden = 0;
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  int vocab = 0;
  int max_position_embeddings = 0;
  int dtype_bytes = 2;     // torch_dtype: bfloat16/float16 2, float32 4
  bool fused_qkv = false;  // phi3: one qkv_proj and one gate_up_proj
  std::vector<WeightTensor> weights;

  std::uint64_t weight_bytes() const;
  std::uint64_t parameters() const { return weight_bytes() / static_cast<std::uint64_t>(dtype_bytes); }
  // K and V of every layer, in the model's dtype: 2 x layers x kv_heads x head_dim x dtype_bytes.
  std::uint64_t kv_bytes_per_token() const;
  // One layer's K (or V) tensor, per token: kv_heads x head_dim x dtype_bytes.
  std::uint64_t kv_tensor_bytes_per_token() const;
  WideDims wide() const;
};

// Parses a config.json; errors (InvalidArgument) name `source`, the key, the value given and what is
// accepted. A key of the wrong JSON type is reported as that type ("\"model_type\" must be a
// string (...), got a number (7)"), never as missing and never defaulted; null is "not set" for
// the optional keys (num_key_value_heads, head_dim, max_position_embeddings, torch_dtype/dtype,
// architectures and the boolean flags), as transformers' configuration classes take it, and an
// error for the required ones.
absl::StatusOr<ModelSpec> ParseModelConfig(absl::string_view json, absl::string_view source = "config.json");
absl::StatusOr<ModelSpec> ReadModelConfig(const std::string& path);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_WORKLOAD_MODEL_CONFIG_H_
