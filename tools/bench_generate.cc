// tools/bench_generate.cc — `bucketalloc-bench generate serving`.
#include "bench_generate.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench_plan.h"
#include "bucketalloc/options.h"
#include "harness/planning/planner.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"
#include "harness/workload/serving.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::bench {
namespace {

constexpr std::int64_t kMaxTokenCount = std::int64_t{1} << 40;  // the serving generator's bound on token counts
constexpr std::int64_t kMaxInt = 2147483647;                    // an int flag

// Digits with an optional sign: a whole number in decimal, whatever its size.
bool IsDecimal(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  if (!s.empty() && (s.front() == '-' || s.front() == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

}  // namespace

CLI::Validator WholeNumberIn(std::int64_t min, std::int64_t max, const std::string& accepted) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        std::int64_t v = 0;
        if (!IsDecimal(input)) return absl::StrCat(input, " is not a whole number; accepted ", accepted);
        if (!absl::SimpleAtoi(input, &v) || v < min || v > max) {
          return absl::StrCat(input, " is out of range; accepted ", accepted);
        }
        input = absl::StrCat(v);
        return std::string();
      },
      absl::StrCat("INT in [", min, " - ", max, "]"));
}

CLI::Validator Unsigned64() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        std::uint64_t v = 0;
        if (!IsDecimal(input) || !absl::SimpleAtoi(input, &v)) {
          return absl::StrCat(input, " is not accepted; accepted a whole number from 0 to 18446744073709551615");
        }
        input = absl::StrCat(v);
        return std::string();
      },
      "UINT64");
}

CLI::Validator RealNumber(const std::string& accepted) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        const std::string text(absl::StripAsciiWhitespace(input));
        char* end = nullptr;
        errno = 0;
        const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || std::isnan(v)) {
          return absl::StrCat(input, " is not a number; accepted ", accepted);
        }
        if (errno == ERANGE || std::isinf(v)) {
          return absl::StrCat(input, " is out of the range of a double; accepted ", accepted);
        }
        return std::string();
      },
      "FLOAT");
}

struct GenerateCommand::Flags {
  std::string requests_path, model_path, output, kv_layout = "tiered", dtype;
  int tensor_parallel = 1;
  harness::RequestOptions requests;
  harness::ServingOptions serving;
  CLI::App* serving_app = nullptr;
};

GenerateCommand::GenerateCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand("generate", "generate an allocation trace from a workload model");
  sub_->require_subcommand(1);
  CLI::App* s = sub_->add_subcommand(
      "serving", "the allocation trace of an LLM server on PyTorch for a request trace and a model (docs/harness.md)");
  f.serving_app = s;
  s->add_option("--requests", f.requests_path,
                "request trace: Azure CSV, Mooncake JSON lines, or a sarathi/vidur length CSV (.gz accepted)")
      ->required();
  s->add_option("--model", f.model_path, "a Hugging Face config.json (llama, mistral, qwen2, qwen3, phi3)")->required();
  s->add_option("-o,--output", f.output, "the trace to write (RMM CSV); its meta file goes beside it (x.meta.json)")
      ->required();
  s->add_option(
      "--dtype", f.dtype,
      "bf16, fp16, fp8 or int4: the weights' format (fp8, int4: the linear layers'; docs/planner.md); default "
      "the config's");
  s->add_option("--tensor-parallel", f.tensor_parallel,
                "one GPU's share of a model split over N GPUs: its weights, heads, KV heads and MLP width")
      ->transform(WholeNumberIn(1, 1024, "1 to 1024"))
      ->capture_default_str();
  s->add_option("--limit", f.requests.limit, "keep the first N requests (0 = all)")
      ->transform(WholeNumberIn(0, kMaxTokenCount, "0 (all) to 1099511627776"))
      ->capture_default_str();
  s->add_option("--sample", f.requests.sample_fraction, "keep each request with this probability (seeded)")
      ->transform(RealNumber("a fraction in (0, 1]"))
      ->capture_default_str();
  s->add_option("--time-scale", f.requests.time_scale, "multiply arrival times (0.5: the same requests twice as fast)")
      ->transform(RealNumber("a number > 0 and at most 1e6"))
      ->capture_default_str();
  s->add_option("--qps", f.requests.qps, "arrival rate drawn for length-only files (Poisson)")
      ->transform(RealNumber("a number > 0"))
      ->capture_default_str();
  s->add_option("--seed", f.requests.seed, "seed of sampling and drawn arrivals")
      ->transform(Unsigned64())
      ->capture_default_str();
  s->add_option("--kv-layout", f.kv_layout, "tiered, growth or paged")->capture_default_str();
  s->add_option("--max-num-seqs", f.serving.max_num_seqs, "sequences per step")
      ->transform(WholeNumberIn(1, kMaxInt, "1 to 2147483647"))
      ->capture_default_str();
  s->add_option("--max-batched-tokens", f.serving.max_batched_tokens, "tokens per step (prompts are chunked)")
      ->transform(WholeNumberIn(1, kMaxInt, "1 to 2147483647 (and at least --max-num-seqs)"))
      ->capture_default_str();
  s->add_option("--max-kv-tokens", f.serving.max_kv_tokens,
                "admit a request only while the running ones' prompt + output tokens stay within this (0 = no limit)")
      ->transform(WholeNumberIn(0, kMaxTokenCount, "0 (no limit) to 1099511627776"))
      ->capture_default_str();
  s->add_option("--max-model-len", f.serving.max_model_len,
                "longer requests are rejected (0 = the config's max_position_embeddings)")
      ->transform(WholeNumberIn(0, kMaxInt, "0 (the config's max_position_embeddings) to 2147483647"))
      ->capture_default_str();
  s->add_option("--tiers", f.serving.tiers_tokens, "tiered: token tiers, then doubling (comma-separated)")
      ->delimiter(',')
      ->transform(WholeNumberIn(1, kMaxInt, "ascending whole numbers from 1 to 2147483647"))
      ->capture_default_str();
  s->add_option("--growth-tokens", f.serving.growth_tokens, "growth: concatenate every N tokens (1 = every token)")
      ->transform(WholeNumberIn(1, kMaxInt, "1 to 2147483647"))
      ->capture_default_str();
  s->add_option("--block-tokens", f.serving.block_tokens, "paged: tokens per block")
      ->transform(WholeNumberIn(1, kMaxInt, "1 to 2147483647"))
      ->capture_default_str();
  s->add_option("--kv-pool-tokens", f.serving.kv_pool_tokens,
                "paged: pool size in tokens (0 = what the schedule holds at its peak)")
      ->transform(WholeNumberIn(0, kMaxTokenCount, "0 (what the schedule needs) to 1099511627776"))
      ->capture_default_str();
  s->add_option("--tenant-split", f.serving.tenant_split_tokens,
                "put the KV tensors of requests longer than N tokens (prompt + output) on their own stream (2), for a "
                "replay with tenants (0 = no split; tiered and growth layouts)")
      ->transform(WholeNumberIn(0, kMaxTokenCount, "0 (no split) to 1099511627776 tokens"))
      ->capture_default_str();
  s->add_flag(
      "--every-layer", f.serving.every_layer,
      "write every layer's temporaries (default: one layer pass per step; the same bytes, L times fewer events)");
  s->add_option("--step-base-ms", f.serving.step_base_ms, "step time of a 16 GiB model: fixed part")
      ->transform(RealNumber("a number from 0 to 1e6"))
      ->capture_default_str();
  s->add_option("--step-us-per-token", f.serving.step_us_per_token, "step time of a 16 GiB model: per batched token")
      ->transform(RealNumber("a number from 0 to 1e6"))
      ->capture_default_str();
}

GenerateCommand::~GenerateCommand() = default;

int GenerateCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.output}, "bucketalloc-bench generate serving")) return 1;
  auto fail = [](const absl::Status& s) { return Fail(s, "bucketalloc-bench generate serving"); };
  if (absl::EndsWith(f.output, ".gz")) {
    return fail(absl::InvalidArgumentError(absl::StrCat("-o ", f.output,
                                                        ": the trace is written as plain CSV; accepted a name "
                                                        "that does not end in .gz (e.g. trace.csv)")));
  }
  harness::ServingOptions serving = f.serving;
  absl::StatusOr<harness::KvLayout> layout = harness::ParseKvLayout(f.kv_layout);
  if (!layout.ok()) return fail(layout.status());
  serving.kv_layout = *layout;
  absl::StatusOr<harness::ModelSpec> model = harness::ReadModelConfig(f.model_path);
  if (!model.ok()) return fail(model.status());
  if (!f.dtype.empty() || f.tensor_parallel != 1) {
    model = harness::PerGpuModel(*model, f.dtype, f.tensor_parallel);
    if (!model.ok()) return fail(NamingTheFlag(model.status()));
  }
  absl::StatusOr<harness::RequestSet> requests = harness::ReadRequestsFile(f.requests_path, f.requests);
  if (!requests.ok()) return fail(requests.status());
  absl::StatusOr<harness::ServingTrace> trace = harness::GenerateServingTrace(requests->requests, *model, serving);
  if (!trace.ok()) return fail(trace.status());
  const nlohmann::ordered_json inputs = {{"requests_file", f.requests_path},
                                         {"requests_format", harness::RequestFormatName(requests->format)},
                                         {"requests_in_file", requests->rows},
                                         {"limit", f.requests.limit},
                                         {"sample", f.requests.sample_fraction},
                                         {"time_scale", f.requests.time_scale},
                                         {"qps", f.requests.qps},
                                         {"seed", f.requests.seed},
                                         {"model_config", f.model_path},
                                         {"dtype", f.dtype.empty() ? "config" : f.dtype},
                                         {"tensor_parallel", f.tensor_parallel}};
  if (absl::Status st = harness::WriteServingTrace(*trace, *model, serving, inputs.dump(), f.output); !st.ok()) {
    return fail(st);
  }
  const harness::ServingSummary& s = trace->summary;
  std::printf("%s: %zu events (%s, %s KV layout); meta in %s\n", f.output.c_str(), trace->trace.events.size(),
              model->name.c_str(), std::string(harness::KvLayoutName(serving.kv_layout)).c_str(),
              harness::MetaPathFor(f.output).c_str());
  std::printf(
      "  requests %lld served, %lld rejected as too long, %lld as over --max-kv-tokens; %lld steps over "
      "%.1f simulated s, up to %d sequences per step\n",
      static_cast<long long>(s.served), static_cast<long long>(s.rejected_too_long),
      static_cast<long long>(s.rejected_over_kv_limit), static_cast<long long>(s.steps), s.simulated_seconds,
      s.max_running);
  if (serving.tenant_split_tokens > 0) {
    std::printf("  %lld requests longer than %lld tokens: their KV tensors on stream %llu (a tenant CONF binds it)\n",
                static_cast<long long>(s.long_requests), static_cast<long long>(serving.tenant_split_tokens),
                static_cast<unsigned long long>(harness::kLongRequestStream));
  }
  std::printf("  weights %s; peak live %s; true peak need %s (KV %s exact, activations %s); KV layout peak %s\n",
              FormatBytes(s.weight_bytes).c_str(), FormatBytes(s.peak_live_bytes).c_str(),
              FormatBytes(s.true_peak_need_bytes).c_str(), FormatBytes(s.need_kv_bytes).c_str(),
              FormatBytes(s.need_activation_bytes).c_str(), FormatBytes(s.peak_kv_layout_bytes).c_str());
  if (const std::string conf = harness::TieredBucketallocConf(*trace, *model, serving); !conf.empty()) {
    std::printf("  bucketalloc tiers for these K/V tensors: bucketalloc:%s\n", conf.c_str());
  }
  return 0;
}

}  // namespace bucketalloc::bench
