// src/harness/workload/serving.cc — the serving workload generator (see serving.h for the model).
#include "harness/workload/serving.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <numeric>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/units.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

constexpr double kReferenceWeightBytes = 16.0 * kGiB;  // the model the step times are for
constexpr std::uint64_t kPointerBase = 0x7f0000000000;

// One request's share of a step.
struct Work {
  int request = 0;
  int tokens = 0;        // prompt chunk, or 1 for a decode step: the tokens whose KV the step writes
  bool samples = false;  // the step produces a token for it (decode, or the prompt's last chunk)
  bool decode = false;   // the prompt was prefilled in earlier steps
};

struct StepPlan {
  double start_s = 0.0;
  std::vector<Work> work;
  std::vector<int> finished;  // requests whose last token this step produced
};

struct Schedule {
  std::vector<StepPlan> steps;
  std::vector<bool> rejected;          // longer than max_model_len, or than max_kv_tokens
  std::int64_t peak_block_tokens = 0;  // the most tokens held, counting whole blocks of block_tokens
  double end_s = 0.0;                  // when the last step ends
};

absl::Status Validate(const ServingOptions& o) {
  auto bad = [](absl::string_view what, auto value, absl::string_view accepted) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", value, ": accepted ", accepted));
  };
  if (o.max_num_seqs < 1) return bad("--max-num-seqs", o.max_num_seqs, "a whole number >= 1");
  if (o.max_batched_tokens < o.max_num_seqs) {
    return bad("--max-batched-tokens", o.max_batched_tokens,
               absl::StrCat("a whole number >= --max-num-seqs (", o.max_num_seqs, "), so every sequence can decode"));
  }
  if (o.max_kv_tokens < 0) return bad("--max-kv-tokens", o.max_kv_tokens, "0 (no limit) or a whole number");
  if (o.max_model_len < 0) return bad("--max-model-len", o.max_model_len, "0 (the config's) or a whole number");
  if (o.tiers_tokens.empty()) return bad("--tiers", "[]", "a non-empty ascending list of token counts");
  for (std::size_t i = 0; i < o.tiers_tokens.size(); ++i) {
    if (o.tiers_tokens[i] < 1 || (i > 0 && o.tiers_tokens[i] <= o.tiers_tokens[i - 1])) {
      return bad("--tiers entry", o.tiers_tokens[i], "ascending whole numbers >= 1");
    }
  }
  if (o.growth_tokens < 1) return bad("--growth-tokens", o.growth_tokens, "a whole number >= 1");
  if (o.block_tokens < 1) return bad("--block-tokens", o.block_tokens, "a whole number >= 1");
  if (o.kv_pool_tokens < 0 || o.kv_pool_tokens > (std::int64_t{1} << 40)) {
    return bad("--kv-pool-tokens", o.kv_pool_tokens, "0 (what the schedule needs) to 2^40");
  }
  if (o.max_kv_tokens > (std::int64_t{1} << 40)) return bad("--max-kv-tokens", o.max_kv_tokens, "0 to 2^40");
  // At most 1e6 (a step of over 1000 s would be no server): the clock stays a finite number of seconds.
  if (!(o.step_base_ms >= 0 && o.step_base_ms <= 1e6)) return bad("--step-base-ms", o.step_base_ms, "0 to 1e6");
  if (!(o.step_us_per_token >= 0 && o.step_us_per_token <= 1e6)) {
    return bad("--step-us-per-token", o.step_us_per_token, "0 to 1e6");
  }
  return absl::OkStatus();
}

// The largest tensor a step can allocate, computed in 128 bits before any is listed: the model
// passed its own checks, but a step of --max-batched-tokens tokens, --max-num-seqs sampled rows or a
// KV tensor of the longest admitted request could still exceed what any allocator accepts, and its
// size must not wrap.
absl::Status CheckTensorSizes(const ModelSpec& m, const ServingOptions& o, std::int64_t admit_len) {
  const WideDims d = m.wide();  // not a structured binding: clang 14 lambdas cannot capture one
  const absl::uint128 e = d.e, h = d.h, q = d.q, kv = d.kv, inter = d.inter, vocab = d.vocab;
  const absl::uint128 T = static_cast<std::uint64_t>(o.max_batched_tokens);
  const absl::uint128 S = static_cast<std::uint64_t>(o.max_num_seqs);
  // The longest KV tensor: the tier (or growth step) of the longest admitted request, or the pool.
  absl::uint128 kv_tokens = static_cast<std::uint64_t>(admit_len);
  if (o.kv_layout == KvLayout::kGrowth) kv_tokens += static_cast<std::uint64_t>(o.growth_tokens);
  if (o.kv_layout == KvLayout::kTiered) kv_tokens = 2 * std::max<absl::uint128>(kv_tokens, o.tiers_tokens.back());
  if (o.kv_layout == KvLayout::kPaged) {
    kv_tokens = 2 *
                absl::uint128(static_cast<std::uint64_t>(std::max<std::int64_t>(o.kv_pool_tokens, admit_len)) +
                              static_cast<std::uint64_t>(o.block_tokens)) *
                static_cast<std::uint64_t>(std::max(o.max_num_seqs, 1));
  }
  const struct {
    const char* what;
    absl::uint128 bytes;
  } largest[] = {{"an activation of --max-batched-tokens tokens", T * std::max({h, q + 2 * kv, 2 * inter}) * e},
                 {"the logits of --max-num-seqs sequences", S * vocab * 4},
                 {"a KV tensor of the longest admitted request", kv_tokens * kv * e}};
  for (const auto& t : largest) {
    if (t.bytes > kMaxRequestBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model (", m.name, ") and the serving options give ", t.what, " of over ", kMaxRequestBytes,
          " bytes (64 TiB, the largest request an allocator accepts); accepted: a smaller model or fewer tokens"));
    }
  }
  return absl::OkStatus();
}

// Continuous batching; independent of the KV layout, so every layout sees the same steps.
Schedule MakeSchedule(const std::vector<Request>& requests, const std::vector<int>& order, const ServingOptions& o,
                      std::int64_t max_len, double time_factor) {
  struct State {
    int prefilled = 0;
    int produced = 0;
  };
  Schedule s;
  s.rejected.assign(requests.size(), false);
  std::vector<State> state(requests.size());
  std::deque<int> queue;
  std::vector<int> running;
  std::size_t next = 0;                   // into `order`
  std::int64_t running_total_tokens = 0;  // prompt + output of the running requests
  double clock = 0.0;
  auto held = [&](int r) { return static_cast<std::int64_t>(state[r].prefilled) + std::max(0, state[r].produced - 1); };
  while (next < order.size() || !queue.empty() || !running.empty()) {
    if (running.empty() && queue.empty()) clock = std::max(clock, requests[order[next]].arrival_s);
    while (next < order.size() && requests[order[next]].arrival_s <= clock) {
      const int r = order[next++];
      if (static_cast<std::int64_t>(requests[r].input_tokens) + requests[r].output_tokens > max_len) {
        s.rejected[r] = true;
      } else {
        queue.push_back(r);
      }
    }
    StepPlan step;
    step.start_s = clock;
    std::int64_t budget = o.max_batched_tokens;
    for (int r : running) {
      const int left = requests[r].input_tokens - state[r].prefilled;
      const int tokens = left > 0 ? static_cast<int>(std::min<std::int64_t>(left, budget)) : 1;
      if (tokens == 0 || budget == 0) continue;  // a chunked prompt waits for budget
      step.work.push_back({r, tokens, left == 0 || tokens == left, left == 0});
      budget -= tokens;
    }
    while (!queue.empty() && static_cast<int>(running.size()) < o.max_num_seqs && budget > 0) {
      const int r = queue.front();
      const std::int64_t total = static_cast<std::int64_t>(requests[r].input_tokens) + requests[r].output_tokens;
      if (o.max_kv_tokens > 0 && running_total_tokens + total > o.max_kv_tokens) break;
      queue.pop_front();
      running.push_back(r);
      running_total_tokens += total;
      const int tokens = static_cast<int>(std::min<std::int64_t>(requests[r].input_tokens, budget));
      step.work.push_back({r, tokens, tokens == requests[r].input_tokens, false});
      budget -= tokens;
    }
    if (step.work.empty()) continue;  // nothing arrived yet: the clock jumps at the top
    std::int64_t block_tokens = 0;
    for (const Work& w : step.work) {
      State& st = state[w.request];
      if (st.prefilled < requests[w.request].input_tokens) {
        st.prefilled += w.tokens;
      }
      if (w.samples) ++st.produced;
      if (st.produced == requests[w.request].output_tokens) step.finished.push_back(w.request);
    }
    for (int r : running) block_tokens += RoundUp(held(r), o.block_tokens);
    s.peak_block_tokens = std::max(s.peak_block_tokens, block_tokens);
    for (int r : step.finished) {
      running.erase(std::find(running.begin(), running.end(), r));
      running_total_tokens -= static_cast<std::int64_t>(requests[r].input_tokens) + requests[r].output_tokens;
    }
    const std::int64_t tokens = std::accumulate(step.work.begin(), step.work.end(), std::int64_t{0},
                                                [](std::int64_t a, const Work& w) { return a + w.tokens; });
    clock += (o.step_base_ms + o.step_us_per_token * static_cast<double>(tokens) / 1000.0) / 1000.0 * time_factor;
    s.steps.push_back(std::move(step));
  }
  s.end_s = clock;
  return s;
}

// Writes the events and keeps the books: live bytes by kind, and the true need.
class Emitter {
 public:
  using Kind = TensorKind;
  static constexpr Kind kWeight = TensorKind::kWeight, kKv = TensorKind::kKv, kActivation = TensorKind::kActivation;

  std::uint64_t Alloc(std::uint64_t bytes, Kind kind, std::uint64_t stream = 0) {
    const std::uint64_t ptr = kPointerBase + (next_id_++) * 0x1000;
    Push(TraceAction::kAllocate, ptr, bytes, kind, stream);
    Live(kind) += bytes;
    const std::uint64_t live = Live(kWeight) + Live(kKv) + Live(kActivation);
    summary_.peak_live_bytes = std::max(summary_.peak_live_bytes, live);
    summary_.peak_kv_layout_bytes = std::max(summary_.peak_kv_layout_bytes, Live(kKv));
    const std::uint64_t need = Live(kWeight) + exact_kv_ + Live(kActivation);
    if (need > summary_.true_peak_need_bytes) {
      summary_.true_peak_need_bytes = need;
      summary_.need_kv_bytes = exact_kv_;
      summary_.need_activation_bytes = Live(kActivation);
    }
    return ptr;
  }
  void Free(std::uint64_t ptr, std::uint64_t bytes, Kind kind, std::uint64_t stream = 0) {
    Push(TraceAction::kFree, ptr, bytes, kind, stream);
    Live(kind) -= bytes;
  }
  void SetTime(double seconds) {
    const auto us = static_cast<std::int64_t>(std::llround(seconds * 1e6));
    time_ =
        absl::StrFormat("%02d:%02d:%02d.%06d", us / 3600000000, us / 60000000 % 60, us / 1000000 % 60, us % 1000000);
  }
  void AddExactKv(std::int64_t bytes) {
    exact_kv_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(exact_kv_) + bytes);
  }
  ServingSummary& summary() { return summary_; }
  Trace& trace() { return trace_; }
  std::vector<TensorKind>& kinds() { return kinds_; }

 private:
  std::uint64_t& Live(Kind kind) { return live_[static_cast<int>(kind)]; }
  void Push(TraceAction action, std::uint64_t ptr, std::uint64_t bytes, Kind kind, std::uint64_t stream) {
    kinds_.push_back(kind);
    TraceEvent e;
    e.thread = 1;
    e.time = time_;
    e.action = action;
    e.pointer = ptr;
    e.size = bytes;
    e.stream = stream;
    trace_.events.push_back(std::move(e));
  }

  Trace trace_;
  std::vector<TensorKind> kinds_;
  ServingSummary summary_;
  std::string time_ = "00:00:00.000000";
  std::uint64_t next_id_ = 1;
  std::uint64_t live_[3] = {0, 0, 0};
  std::uint64_t exact_kv_ = 0;
};

// A live tensor of the trace.
struct Tensor {
  std::uint64_t ptr = 0;
  std::uint64_t bytes = 0;
};

class Forward {
 public:
  Forward(const ModelSpec& m, Emitter& out) : m_(m), out_(out), e_(static_cast<std::uint64_t>(m.dtype_bytes)) {}

  Tensor A(std::uint64_t elements, std::uint64_t element_bytes) {
    const std::uint64_t bytes = elements * element_bytes;
    return {out_.Alloc(bytes, Emitter::kActivation), bytes};
  }
  void F(const Tensor& t) { out_.Free(t.ptr, t.bytes, Emitter::kActivation); }

  // One step of T tokens of which S sequences sample; `kv_update(layer)` runs where a model writes
  // that layer's KV. With `every_layer` false one pass stands for all layers: it writes the KV of
  // every layer.
  template <typename KvUpdate>
  void Run(std::uint64_t T, std::uint64_t S, bool every_layer, KvUpdate&& kv_update) {
    const std::uint64_t h = static_cast<std::uint64_t>(m_.hidden);
    const std::uint64_t q = static_cast<std::uint64_t>(m_.heads) * static_cast<std::uint64_t>(m_.head_dim);
    const std::uint64_t kv = static_cast<std::uint64_t>(m_.kv_heads) * static_cast<std::uint64_t>(m_.head_dim);
    const std::uint64_t inter = static_cast<std::uint64_t>(m_.intermediate);
    const std::uint64_t vocab = static_cast<std::uint64_t>(m_.vocab);
    const Tensor ids = A(T, 8), pos = A(T, 8);
    Tensor hidden = A(T * h, e_);
    for (int l = 0; l < (every_layer ? m_.layers : 1); ++l) {
      const Tensor n1 = A(T * h, e_);
      std::vector<Tensor> qkv;
      if (m_.fused_qkv) {
        qkv = {A(T * (q + 2 * kv), e_)};
      } else {
        qkv = {A(T * q, e_), A(T * kv, e_), A(T * kv, e_)};
      }
      F(n1);
      if (every_layer) {
        kv_update(l);
      } else {
        for (int layer = 0; layer < m_.layers; ++layer) kv_update(layer);
      }
      const Tensor attn = A(T * q, e_);
      for (const Tensor& t : qkv) F(t);
      const Tensor o = A(T * h, e_);
      F(attn);
      Tensor h2 = A(T * h, e_);
      F(o);
      F(hidden);
      hidden = h2;
      const Tensor n2 = A(T * h, e_);
      std::vector<Tensor> gate_up;
      if (m_.fused_qkv) {
        gate_up = {A(T * 2 * inter, e_)};
      } else {
        gate_up = {A(T * inter, e_), A(T * inter, e_)};
      }
      F(n2);
      const Tensor act = A(T * inter, e_);   // silu(gate)
      const Tensor prod = A(T * inter, e_);  // silu(gate) * up
      F(act);
      for (const Tensor& t : gate_up) F(t);
      const Tensor down = A(T * h, e_);
      F(prod);
      const Tensor h3 = A(T * h, e_);
      F(down);
      F(hidden);
      hidden = h3;
    }
    const Tensor norm = A(T * h, e_);
    F(hidden);
    if (S > 0) {
      const Tensor last = A(S * h, e_);
      F(norm);
      const Tensor logits = A(S * vocab, e_);
      F(last);
      const Tensor logits32 = A(S * vocab, 4);
      F(logits);
      const Tensor probs = A(S * vocab, 4);
      const Tensor tokens = A(S, 8);
      F(probs);
      F(logits32);
      F(tokens);
    } else {
      F(norm);
    }
    F(ids);
    F(pos);
  }

 private:
  const ModelSpec& m_;
  Emitter& out_;
  const std::uint64_t e_;
};

}  // namespace

absl::string_view KvLayoutName(KvLayout layout) {
  switch (layout) {
    case KvLayout::kTiered:
      return "tiered";
    case KvLayout::kGrowth:
      return "growth";
    case KvLayout::kPaged:
      return "paged";
  }
  return "?";
}

absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view name) {
  for (KvLayout l : {KvLayout::kTiered, KvLayout::kGrowth, KvLayout::kPaged}) {
    if (name == KvLayoutName(l)) return l;
  }
  return absl::InvalidArgumentError(absl::StrCat("--kv-layout ", name, ": accepted tiered, growth or paged"));
}

absl::StatusOr<ServingTrace> GenerateServingTrace(const std::vector<Request>& requests, const ModelSpec& model,
                                                  const ServingOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  if (requests.empty()) return absl::InvalidArgumentError("no requests to serve");
  if (model.layers <= 0 || model.weights.empty()) return absl::InvalidArgumentError("the model has no layers");
  const std::int64_t max_len = options.max_model_len > 0 ? options.max_model_len : model.max_position_embeddings;
  std::int64_t admit_len = max_len;
  if (options.max_kv_tokens > 0) admit_len = std::min(admit_len, options.max_kv_tokens);

  if (absl::Status s = CheckTensorSizes(model, options, admit_len); !s.ok()) return s;
  if (options.tenant_split_tokens < 0 || (options.tenant_split_tokens > 0 && options.kv_layout == KvLayout::kPaged)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tenant-split ", options.tenant_split_tokens,
        " is invalid here; accepted: 0 (no split), or a positive token count with the tiered or growth layout (the "
        "paged layout's one pool has no per-request tensors to split)"));
  }

  std::vector<int> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return requests[a].arrival_s < requests[b].arrival_s; });
  const double time_factor = static_cast<double>(model.weight_bytes()) / kReferenceWeightBytes;
  Schedule schedule = MakeSchedule(requests, order, options, admit_len, time_factor);

  Emitter out;
  ServingSummary& sum = out.summary();
  sum.requests = static_cast<std::int64_t>(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    if (!schedule.rejected[r]) continue;
    const std::int64_t total = static_cast<std::int64_t>(requests[r].input_tokens) + requests[r].output_tokens;
    ++(total > max_len ? sum.rejected_too_long : sum.rejected_over_kv_limit);
  }
  sum.served = sum.requests - sum.rejected_too_long - sum.rejected_over_kv_limit;
  if (sum.served == 0) {
    // Name the limit the user gave: a flag, or the config's key when --max-model-len is not given.
    std::string limit;
    if (options.max_kv_tokens > 0 && options.max_kv_tokens < max_len) {
      limit = absl::StrCat("--max-kv-tokens ", options.max_kv_tokens);
    } else if (options.max_model_len > 0) {
      limit = absl::StrCat("--max-model-len ", options.max_model_len);
    } else {
      limit = absl::StrCat("the model's max_position_embeddings (", model.max_position_embeddings,
                           model.source.empty() ? "" : absl::StrCat(", in ", model.source),
                           "; --max-model-len 0 takes it)");
    }
    std::int64_t shortest = std::numeric_limits<std::int64_t>::max();
    for (const Request& r : requests) {
      shortest = std::min(shortest, static_cast<std::int64_t>(r.input_tokens) + r.output_tokens);
    }
    return absl::InvalidArgumentError(absl::StrCat("every request is longer than ", admit_len, " tokens, ", limit,
                                                   "; none can be served: accepted a limit of at least ", shortest,
                                                   " tokens (the shortest request)"));
  }
  sum.steps = static_cast<std::int64_t>(schedule.steps.size());
  sum.weight_bytes = model.weight_bytes();

  std::vector<Tensor> weights;
  weights.reserve(model.weights.size());
  for (const WeightTensor& w : model.weights) weights.push_back({out.Alloc(w.bytes, Emitter::kWeight), w.bytes});

  const std::uint64_t kv_token_bytes = model.kv_tensor_bytes_per_token();
  const std::uint64_t kv_bytes_per_token = model.kv_bytes_per_token();
  std::vector<Tensor> pool;
  if (options.kv_layout == KvLayout::kPaged) {
    sum.kv_pool_tokens =
        options.kv_pool_tokens > 0 ? RoundUp(options.kv_pool_tokens, options.block_tokens) : schedule.peak_block_tokens;
    if (sum.kv_pool_tokens < schedule.peak_block_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-pool-tokens ", options.kv_pool_tokens, " is less than this schedule holds at its peak (",
          schedule.peak_block_tokens, " tokens in blocks of ", options.block_tokens,
          "); the generator does not preempt: give 0 (what the schedule needs), more, or limit admission with "
          "--max-kv-tokens"));
    }
    for (int l = 0; l < model.layers; ++l) {
      const std::uint64_t bytes = 2 * static_cast<std::uint64_t>(sum.kv_pool_tokens) * kv_token_bytes;
      pool.push_back({out.Alloc(bytes, Emitter::kKv), bytes});
    }
  }

  // Per request: tokens held, the KV capacity its tensors have, and those tensors (K, V per layer).
  struct Kv {
    std::int64_t held = 0;
    std::int64_t capacity = 0;
    std::int64_t target = 0;
    std::vector<Tensor> tensors;  // 2 x layers
  };
  std::vector<Kv> kv(requests.size());
  // The stream of request r's KV tensors.
  auto kv_stream = [&](int r) {
    const std::int64_t total = static_cast<std::int64_t>(requests[r].input_tokens) + requests[r].output_tokens;
    return options.tenant_split_tokens > 0 && total > options.tenant_split_tokens ? kLongRequestStream : 0;
  };
  if (options.tenant_split_tokens > 0) {
    for (std::size_t r = 0; r < requests.size(); ++r) {
      if (!schedule.rejected[r] && kv_stream(static_cast<int>(r)) != 0) ++sum.long_requests;
    }
  }
  auto capacity_for = [&](std::int64_t tokens) { return KvCapacityTokens(options, tokens); };
  std::vector<int> growing;  // requests whose KV tensors grow in this step

  Forward forward(model, out);
  for (const StepPlan& step : schedule.steps) {
    out.SetTime(step.start_s);
    std::uint64_t T = 0, S = 0;
    growing.clear();
    for (const Work& w : step.work) {
      T += static_cast<std::uint64_t>(w.tokens);
      S += w.samples ? 1 : 0;
      Kv& k = kv[w.request];
      // A decode step writes the KV of the token sampled by the previous step; a prompt chunk its tokens.
      k.held += w.tokens;
      out.AddExactKv(w.tokens * static_cast<std::int64_t>(kv_bytes_per_token));
      if (options.kv_layout != KvLayout::kPaged && k.held > k.capacity) {
        k.target = capacity_for(k.held);
        growing.push_back(w.request);
      }
      (w.decode ? sum.tokens_decoded : sum.tokens_prefilled) += w.tokens;
    }
    sum.max_running = std::max(sum.max_running, static_cast<int>(step.work.size()));
    forward.Run(T, S, options.every_layer, [&](int layer) {
      for (int r : growing) {
        Kv& k = kv[r];
        if (k.tensors.empty()) k.tensors.resize(2 * static_cast<std::size_t>(model.layers));
        const std::uint64_t bytes = static_cast<std::uint64_t>(k.target) * kv_token_bytes;
        const Tensor old_k = k.tensors[2 * layer], old_v = k.tensors[2 * layer + 1];
        const std::uint64_t stream = kv_stream(r);
        k.tensors[2 * layer] = {out.Alloc(bytes, Emitter::kKv, stream), bytes};
        k.tensors[2 * layer + 1] = {out.Alloc(bytes, Emitter::kKv, stream), bytes};
        if (old_k.ptr != 0) out.Free(old_k.ptr, old_k.bytes, Emitter::kKv, stream);
        if (old_v.ptr != 0) out.Free(old_v.ptr, old_v.bytes, Emitter::kKv, stream);
      }
    });
    for (int r : growing) kv[r].capacity = kv[r].target;
    for (int r : step.finished) {
      for (const Tensor& t : kv[r].tensors) out.Free(t.ptr, t.bytes, Emitter::kKv, kv_stream(r));
      out.AddExactKv(-kv[r].held * static_cast<std::int64_t>(kv_bytes_per_token));
      kv[r] = Kv{};
    }
  }
  sum.simulated_seconds = schedule.end_s;
  for (const Tensor& t : pool) out.Free(t.ptr, t.bytes, Emitter::kKv);
  for (auto it = weights.rbegin(); it != weights.rend(); ++it) out.Free(it->ptr, it->bytes, Emitter::kWeight);

  ServingTrace result;
  result.summary = sum;
  result.trace = std::move(out.trace());
  result.kinds = std::move(out.kinds());
  return result;
}

std::uint64_t ActivationPeakBytes(const ModelSpec& model, std::uint64_t tokens, std::uint64_t sampled) {
  Emitter out;
  Forward(model, out).Run(tokens, sampled, /*every_layer=*/false, [](int) {});
  return out.summary().peak_live_bytes;
}

double StepSeconds(const ModelSpec& model, const ServingOptions& options, std::uint64_t tokens) {
  const double time_factor = static_cast<double>(model.weight_bytes()) / kReferenceWeightBytes;
  return (options.step_base_ms + options.step_us_per_token * static_cast<double>(tokens) / 1000.0) / 1000.0 *
         time_factor;
}

std::int64_t KvCapacityTokens(const ServingOptions& options, std::int64_t tokens) {
  if (options.kv_layout == KvLayout::kPaged) return tokens;
  if (options.kv_layout == KvLayout::kGrowth) return RoundUp(tokens, options.growth_tokens);
  for (int t : options.tiers_tokens) {
    if (tokens <= t) return t;
  }
  std::int64_t tier = options.tiers_tokens.back();
  while (tier < tokens) tier *= 2;
  return tier;
}

std::string TieredBucketallocConf(const ServingTrace& trace, const ModelSpec& model, const ServingOptions& options) {
  if (options.kv_layout != KvLayout::kTiered) return "";
  const std::uint64_t per_token = model.kv_tensor_bytes_per_token();
  std::uint64_t largest = 0;
  for (std::size_t i = 0; i < trace.trace.events.size(); ++i) {
    if (trace.kinds[i] == TensorKind::kKv) largest = std::max(largest, trace.trace.events[i].size);
  }
  const std::uint64_t small_pool_limit = Options{}.small_pool_limit;  // the library's default
  std::vector<std::int64_t> tiers;
  std::int64_t tier = 0;
  for (std::size_t i = 0; tier * per_token < largest; ++i) {
    tier = i < options.tiers_tokens.size() ? options.tiers_tokens[i] : tier * 2;
    if (tier * per_token > small_pool_limit) tiers.push_back(tier);
  }
  if (tiers.empty()) return "";
  return absl::StrCat("tiers_tokens:[", absl::StrJoin(tiers, ","), "],bytes_per_token:", per_token);
}

std::string MetaPathFor(const std::string& trace_path) {
  if (absl::EndsWith(trace_path, ".csv")) return trace_path.substr(0, trace_path.size() - 4) + ".meta.json";
  return trace_path + ".meta.json";
}

absl::Status WriteServingTrace(const ServingTrace& trace, const ModelSpec& model, const ServingOptions& options,
                               const std::string& meta_inputs_json, const std::string& path) {
  nlohmann::ordered_json inputs = nlohmann::ordered_json::object();
  if (!meta_inputs_json.empty()) {
    inputs = nlohmann::ordered_json::parse(meta_inputs_json, nullptr, /*allow_exceptions=*/false);
    if (inputs.is_discarded() || !inputs.is_object()) {
      return absl::InvalidArgumentError("the meta file's inputs must be a JSON object");
    }
  }
  const ServingSummary& s = trace.summary;
  nlohmann::ordered_json meta = {
      {"generator", "bucketalloc-bench generate serving"},
      {"format_version", 1},
      {"inputs", inputs},
      {"model",
       {{"name", model.name},
        {"model_type", model.model_type},
        {"parameters", model.parameters()},
        {"weight_tensors", model.weights.size()},
        {"weight_bytes", model.weight_bytes()},
        {"dtype_bytes", model.dtype_bytes},
        {"kv_bytes_per_token", model.kv_bytes_per_token()},
        {"kv_tensor_bytes_per_token", model.kv_tensor_bytes_per_token()}}},
      {"options",
       {{"kv_layout", KvLayoutName(options.kv_layout)},
        {"max_num_seqs", options.max_num_seqs},
        {"max_batched_tokens", options.max_batched_tokens},
        {"max_kv_tokens", options.max_kv_tokens},
        {"max_model_len", options.max_model_len > 0 ? options.max_model_len : model.max_position_embeddings},
        {"tiers_tokens", options.tiers_tokens},
        {"growth_tokens", options.growth_tokens},
        {"block_tokens", options.block_tokens},
        {"every_layer", options.every_layer},
        {"kv_pool_tokens", s.kv_pool_tokens},
        {"tenant_split_tokens", options.tenant_split_tokens},
        {"step_base_ms", options.step_base_ms},
        {"step_us_per_token", options.step_us_per_token}}},
      {"requests", s.requests},
      {"served", s.served},
      {"rejected_too_long", s.rejected_too_long},
      {"rejected_over_kv_limit", s.rejected_over_kv_limit},
      {"steps", s.steps},
      {"simulated_seconds", s.simulated_seconds},
      {"max_running_seqs", s.max_running},
      {"tokens_prefilled", s.tokens_prefilled},
      {"tokens_decoded", s.tokens_decoded},
      {"long_requests", s.long_requests},
      {"long_request_stream", options.tenant_split_tokens > 0 ? kLongRequestStream : 0},
      {"events", trace.trace.events.size()},
      {"weight_bytes", s.weight_bytes},
      {"peak_live_bytes", s.peak_live_bytes},
      {"peak_kv_layout_bytes", s.peak_kv_layout_bytes},
      {"true_peak_need_bytes", s.true_peak_need_bytes},
      {"bucketalloc_tiers_conf", TieredBucketallocConf(trace, model, options)},
      {"true_need_at_peak",
       {{"weights", s.weight_bytes}, {"kv_exact", s.need_kv_bytes}, {"activations", s.need_activation_bytes}}},
  };
  if (absl::Status st = WriteTraceFile(trace.trace, path); !st.ok()) return st;
  const std::string meta_path = MetaPathFor(path);
  return WriteWholeFile(meta_path, meta.dump(2) + "\n", "the trace's meta file");
}

absl::StatusOr<std::optional<std::uint64_t>> ReadTrueNeed(const std::string& trace_path, std::size_t trace_events) {
  const std::string meta_path = MetaPathFor(trace_path);
  if (!std::filesystem::exists(meta_path)) return std::optional<std::uint64_t>();
  absl::StatusOr<std::string> text = ReadTextFile(meta_path, "the trace's meta file");
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("true_peak_need_bytes") ||
      !j["true_peak_need_bytes"].is_number_unsigned() || j["true_peak_need_bytes"].get<std::uint64_t>() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(meta_path,
                     ": not a trace meta file (a JSON object with a positive \"true_peak_need_bytes\"); move it away "
                     "or regenerate the trace"));
  }
  if (!j.contains("events") || !j["events"].is_number_unsigned() || j["events"].get<std::uint64_t>() != trace_events) {
    return absl::InvalidArgumentError(absl::StrCat(
        meta_path, ": written for a trace of ", j.contains("events") ? j["events"].dump() : "an unknown number of",
        " events, but ", trace_path, " has ", trace_events, "; move the meta file away or regenerate the trace"));
  }
  return std::optional<std::uint64_t>(j["true_peak_need_bytes"].get<std::uint64_t>());
}

}  // namespace bucketalloc::harness
