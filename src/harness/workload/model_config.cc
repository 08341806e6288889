// src/harness/workload/model_config.cc — Hugging Face config.json to ModelSpec.
#include "harness/workload/model_config.h"

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "harness/replay/trace.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr int kMaxLayers = 4096;
constexpr std::uint64_t kMaxWeightBytes = std::uint64_t{1} << 50;      // 1 PiB
constexpr std::uint64_t kMaxKvBytesPerToken = std::uint64_t{1} << 30;  // 1 GiB (Llama-3.1-70B: 320 KiB)

constexpr const char* kModelTypes[] = {"llama", "mistral", "qwen2", "qwen3", "phi3"};

absl::Status KeyError(absl::string_view source, absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": \"", key, "\" ", what));
}

// What a JSON value is, for an error: "a string (\"64\")", "a number (7)", "null", ...
std::string Described(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::string:
      return absl::StrCat("a string (", text, ")");
    case nlohmann::json::value_t::boolean:
      return absl::StrCat("a boolean (", text, ")");
    case nlohmann::json::value_t::number_float:
      return absl::StrCat("a number with a fraction or exponent (", text, ")");
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return absl::StrCat("a number (", text, ")");
    case nlohmann::json::value_t::array:
      return absl::StrCat("an array (", text, ")");
    case nlohmann::json::value_t::object:
      return absl::StrCat("an object (", text, ")");
    default:
      return text;
  }
}

// Whether `key` is given: present and not null. Transformers' configuration classes take null as
// "not set" (num_key_value_heads=None is multi-head attention), so null is absent for optional keys.
bool Given(const nlohmann::json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

// A positive integer key; `fallback` (> 0) when the key is absent or null. A required key
// (`fallback` 0) that is null is reported as null, a value of another type as that type: neither is
// "missing", and neither is defaulted.
absl::StatusOr<int> PositiveInt(const nlohmann::json& j, absl::string_view source, const char* key, int fallback = 0) {
  constexpr const char* kAccepted = "a whole number from 1 to 2^30";
  if (!j.contains(key)) {
    if (fallback > 0) return fallback;
    return KeyError(source, key, "is missing; a Hugging Face config.json of a decoder model has it");
  }
  const nlohmann::json& v = j[key];
  if (v.is_null()) {
    if (fallback > 0) return fallback;
    return KeyError(source, key, absl::StrCat("is null; accepted ", kAccepted));
  }
  if (!v.is_number_integer()) return KeyError(source, key, absl::StrCat("must be ", kAccepted, ", got ", Described(v)));
  const bool in_range = v.is_number_unsigned() ? v.get<std::uint64_t>() <= (std::uint64_t{1} << 30)
                                               : v.get<std::int64_t>() >= 1 && v.get<std::int64_t>() <= (1 << 30);
  if (!in_range || v.get<std::int64_t>() < 1) {
    return KeyError(source, key, absl::StrCat("is ", v.dump(), "; accepted ", kAccepted));
  }
  return static_cast<int>(v.get<std::int64_t>());
}

// A boolean key: false when absent or null; another type is an error (a string "true" is not true).
absl::StatusOr<bool> Flag(const nlohmann::json& j, absl::string_view source, const char* key) {
  if (!Given(j, key)) return false;
  if (!j[key].is_boolean())
    return KeyError(source, key, absl::StrCat("must be true or false, got ", Described(j[key])));
  return j[key].get<bool>();
}

}  // namespace

WideDims ModelSpec::wide() const {
  auto u = [](int v) { return absl::uint128(static_cast<std::uint64_t>(v)); };
  return {u(dtype_bytes), u(hidden), u(heads) * u(head_dim), u(kv_heads) * u(head_dim), u(intermediate), u(vocab)};
}

std::uint64_t ModelSpec::weight_bytes() const {
  std::uint64_t total = 0;
  for (const WeightTensor& w : weights) total += w.bytes;
  return total;
}

std::uint64_t ModelSpec::kv_tensor_bytes_per_token() const {
  return static_cast<std::uint64_t>(kv_heads) * static_cast<std::uint64_t>(head_dim) *
         static_cast<std::uint64_t>(dtype_bytes);
}

std::uint64_t ModelSpec::kv_bytes_per_token() const {
  return 2 * static_cast<std::uint64_t>(layers) * kv_tensor_bytes_per_token();
}

absl::StatusOr<ModelSpec> ParseModelConfig(absl::string_view json, absl::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object (a Hugging Face config.json)"));
  }
  ModelSpec m;
  m.source = std::string(source);
  if (!j.contains("model_type")) return KeyError(source, "model_type", "is missing; a Hugging Face config.json has it");
  if (!j["model_type"].is_string()) {
    return KeyError(
        source, "model_type",
        absl::StrCat("must be a string (", absl::StrJoin(kModelTypes, ", "), "), got ", Described(j["model_type"])));
  }
  m.model_type = j["model_type"].get<std::string>();
  bool known = false;
  for (const char* t : kModelTypes) known = known || m.model_type == t;
  if (!known) {
    return KeyError(source, "model_type",
                    absl::StrCat("is \"", m.model_type, "\"; modelled: ", absl::StrJoin(kModelTypes, ", ")));
  }
  m.name = m.model_type;
  if (Given(j, "architectures")) {
    const nlohmann::json& a = j["architectures"];
    if (!a.is_array() || (!a.empty() && !a[0].is_string())) {
      return KeyError(
          source, "architectures",
          absl::StrCat("must be an array of class names (e.g. [\"LlamaForCausalLM\"]), got ", Described(a)));
    }
    if (!a.empty()) m.name = a[0].get<std::string>();
  }
  const struct {
    int* field;
    const char* key;
    int fallback;  // 0: required
  } keys[] = {{&m.hidden, "hidden_size", 0},        {&m.layers, "num_hidden_layers", 0},
              {&m.heads, "num_attention_heads", 0}, {&m.intermediate, "intermediate_size", 0},
              {&m.vocab, "vocab_size", 0},          {&m.max_position_embeddings, "max_position_embeddings", 4096}};
  absl::StatusOr<int> v;
  for (const auto& k : keys) {
    v = PositiveInt(j, source, k.key, k.fallback);
    if (!v.ok()) return v.status();
    *k.field = *v;
  }
  v = PositiveInt(j, source, "num_key_value_heads", m.heads);  // absent: multi-head attention
  if (!v.ok()) return v.status();
  m.kv_heads = *v;
  if (m.hidden % m.heads != 0 && !Given(j, "head_dim") && m.model_type != "qwen3") {
    return KeyError(source, "hidden_size", "is not a multiple of num_attention_heads and head_dim is missing");
  }
  // Qwen3's configuration class defaults head_dim to 128 (not hidden / heads, which differs for
  // Qwen3-32B); the others derive it.
  v = PositiveInt(j, source, "head_dim", m.model_type == "qwen3" ? 128 : m.hidden / m.heads);
  if (!v.ok()) return v.status();
  m.head_dim = *v;
  if (m.heads % m.kv_heads != 0) {
    return KeyError(source, "num_key_value_heads",
                    absl::StrCat("is ", m.kv_heads, "; accepted a divisor of num_attention_heads (", m.heads, ")"));
  }
  // torch_dtype, or dtype (its name since transformers 4.56; it wins when both are given); absent or
  // null: bfloat16.
  std::string dtype = "bfloat16";
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!Given(j, key)) continue;
    if (!j[key].is_string()) {
      return KeyError(source, key,
                      absl::StrCat("must be a string (bfloat16, float16, float32), got ", Described(j[key])));
    }
    dtype = j[key].get<std::string>();
    if (dtype == "bfloat16" || dtype == "float16") {
      m.dtype_bytes = 2;
    } else if (dtype == "float32") {
      m.dtype_bytes = 4;
    } else {
      return KeyError(source, key, absl::StrCat("is \"", dtype, "\"; accepted bfloat16, float16, float32"));
    }
  }
  m.fused_qkv = m.model_type == "phi3";

  // Sizes are computed in 128 bits: each dimension is at most 2^30, so a product of three fits, and
  // the total is checked against kMaxWeightBytes from one layer before the per-layer tensors are
  // listed (a huge num_hidden_layers must not build a huge vector first).
  if (m.layers > kMaxLayers) {
    return KeyError(source, "num_hidden_layers",
                    absl::StrCat("is ", m.layers, "; accepted 1 to ", kMaxLayers, " (real models have under 200)"));
  }
  const WideDims d = m.wide();  // not a structured binding: clang 14 lambdas cannot capture one
  const absl::uint128 e = d.e, h = d.h, q = d.q, kv = d.kv, inter = d.inter, vocab = d.vocab;
  // Biases as each architecture's modelling code has them: llama honours attention_bias (q, k, v, o)
  // and mlp_bias; qwen3 honours attention_bias (q, k, v, o); qwen2 always has q, k, v biases;
  // mistral and phi3 have none, whatever the config says.
  // Every flag's type is checked, whether the architecture honours it or not.
  absl::StatusOr<bool> flags[3];
  const char* const flag_keys[3] = {"attention_bias", "mlp_bias", "tie_word_embeddings"};
  for (int i = 0; i < 3; ++i) {
    flags[i] = Flag(j, source, flag_keys[i]);
    if (!flags[i].ok()) return flags[i].status();
  }
  const bool attention_bias = (m.model_type == "llama" || m.model_type == "qwen3") && *flags[0];
  const bool qkv_bias = attention_bias || m.model_type == "qwen2";
  const bool mlp_bias = m.model_type == "llama" && *flags[1];
  const bool tied = *flags[2];
  struct Sized {
    std::string name;
    absl::uint128 bytes;
  };
  std::vector<Sized> layer;  // one layer's tensors, named for layer `l`
  auto add = [&](std::vector<Sized>& to, std::string name, absl::uint128 elements) {
    to.push_back({std::move(name), elements * e});
  };
  auto list_layer = [&](int l) {
    layer.clear();
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(layer, p + "input_layernorm.weight", h);
    if (m.fused_qkv) {
      add(layer, p + "self_attn.qkv_proj.weight", (q + 2 * kv) * h);
    } else {
      add(layer, p + "self_attn.q_proj.weight", q * h);
      add(layer, p + "self_attn.k_proj.weight", kv * h);
      add(layer, p + "self_attn.v_proj.weight", kv * h);
      if (qkv_bias) {
        add(layer, p + "self_attn.q_proj.bias", q);
        add(layer, p + "self_attn.k_proj.bias", kv);
        add(layer, p + "self_attn.v_proj.bias", kv);
      }
    }
    if (m.model_type == "qwen3") {
      add(layer, p + "self_attn.q_norm.weight", static_cast<std::uint64_t>(m.head_dim));
      add(layer, p + "self_attn.k_norm.weight", static_cast<std::uint64_t>(m.head_dim));
    }
    add(layer, p + "self_attn.o_proj.weight", h * q);
    if (attention_bias) add(layer, p + "self_attn.o_proj.bias", h);
    add(layer, p + "post_attention_layernorm.weight", h);
    if (m.fused_qkv) {
      add(layer, p + "mlp.gate_up_proj.weight", 2 * inter * h);
    } else {
      add(layer, p + "mlp.gate_proj.weight", inter * h);
      add(layer, p + "mlp.up_proj.weight", inter * h);
      if (mlp_bias) {
        add(layer, p + "mlp.gate_proj.bias", inter);
        add(layer, p + "mlp.up_proj.bias", inter);
      }
    }
    add(layer, p + "mlp.down_proj.weight", h * inter);
    if (mlp_bias) add(layer, p + "mlp.down_proj.bias", h);
  };
  std::vector<Sized> first, last;
  add(first, "model.embed_tokens.weight", vocab * h);
  add(last, "model.norm.weight", h);
  if (!tied) add(last, "lm_head.weight", vocab * h);
  list_layer(0);
  absl::uint128 total = 0, per_layer = 0;
  for (const Sized& w : layer) per_layer += w.bytes;
  for (const std::vector<Sized>* part : {&first, &last}) {
    for (const Sized& w : *part) total += w.bytes;
  }
  total += per_layer * static_cast<std::uint64_t>(m.layers);
  if (total > kMaxWeightBytes) {
    return KeyError(source, "num_hidden_layers",
                    "and the other dimensions give over 1 PiB of weights; accepted a real model");
  }
  if (2 * static_cast<std::uint64_t>(m.layers) * kv * e > kMaxKvBytesPerToken) {
    return KeyError(source, "num_key_value_heads",
                    "and head_dim and num_hidden_layers give over 1 GiB of KV cache per token; accepted a real model");
  }
  auto keep = [&](const std::vector<Sized>& part) {
    for (const Sized& w : part) m.weights.push_back({w.name, static_cast<std::uint64_t>(w.bytes)});
  };
  m.weights.reserve(first.size() + layer.size() * static_cast<std::size_t>(m.layers) + last.size());
  keep(first);
  for (int l = 0; l < m.layers; ++l) {
    if (l > 0) list_layer(l);
    keep(layer);
  }
  keep(last);
  return m;
}

absl::StatusOr<ModelSpec> ReadModelConfig(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "the model config");
  if (!text.ok()) return text.status();
  return ParseModelConfig(*text, path);
}

}  // namespace bucketalloc::harness
