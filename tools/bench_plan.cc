// tools/bench_plan.cc — `bucketalloc-bench plan`.
#include "bench_plan.h"

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench_generate.h"
#include "bucketalloc/options.h"
#include "harness/planning/planner.h"
#include "harness/workload/model_config.h"
#include "harness/workload/requests.h"

namespace bucketalloc::bench {
namespace {

constexpr char kPlanPrefix[] = "bucketalloc-bench plan";

// The flag of each planner option (max_num_seqs_limit, the planner's own bound, has none).
constexpr std::pair<harness::PlanOption, absl::string_view> kFlags[] = {
    {harness::PlanOption::kCardBytes, "--card"},
    {harness::PlanOption::kDtype, "--dtype"},
    {harness::PlanOption::kTensorParallel, "--tensor-parallel"},
    {harness::PlanOption::kGpuMemoryUtilization, "--gpu-memory-utilization"},
    {harness::PlanOption::kMaxModelLen, "--max-model-len"},
    {harness::PlanOption::kRuntimeReserveBytes, "--runtime-reserve"},
    {harness::PlanOption::kMaxBatchedTokens, "--max-batched-tokens"},
    {harness::PlanOption::kCheckRequests, "--check-requests"},
};

}  // namespace

absl::Status NamingTheFlag(const absl::Status& s) {
  const std::optional<harness::PlanOption> option = harness::PlanOptionOf(s);
  absl::string_view message = s.message();
  if (!option.has_value() || !absl::ConsumePrefix(&message, harness::PlanOptionName(*option))) return s;
  for (const auto& [o, flag] : kFlags) {
    if (o == *option) return absl::Status(s.code(), absl::StrCat(flag, message));
  }
  return s;
}

struct PlanCommand::Flags {
  std::string model_path, requests_path, card, reserve = "1GiB", json_path, html_path;
  harness::PlanOptions plan;
  bool no_check = false;
};

PlanCommand::PlanCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand(
      "plan",
      "the card's memory budget before serving (weights, KV per token, the request profile in S/M/L/XL buckets) and "
      "the settings that fit, checked by replaying them (docs/planner.md)");
  sub_->add_option("--model", f.model_path, "a Hugging Face config.json (llama, mistral, qwen2, qwen3, phi3)")
      ->required();
  sub_->add_option("--card", f.card, "the card's memory, e.g. 80GiB")->required();
  sub_->add_option("--requests", f.requests_path,
                   "request trace: Azure CSV, Mooncake JSON lines, or a sarathi/vidur length CSV (.gz accepted)");
  sub_->add_option("--dtype", f.plan.dtype, "bf16, fp16, fp8 or int4 (default: the config's)");
  sub_->add_option("--tensor-parallel", f.plan.tensor_parallel, "GPUs the model is split over")
      ->transform(WholeNumberIn(1, 1024, "1 to 1024, a divisor of the attention heads"))
      ->capture_default_str();
  sub_->add_option("--gpu-memory-utilization", f.plan.gpu_memory_utilization,
                   "the share of the card the server may use (vLLM's), 0.01 to 1")
      ->transform(RealNumber("a fraction from 0.01 to 1"))
      ->capture_default_str();
  sub_->add_option("--max-model-len", f.plan.max_model_len,
                   "0: the profile's longest request; else 2 to the config's max_position_embeddings")
      ->transform(WholeNumberIn(0, 2147483647, "0 (from the profile) or 2 to the model's max_position_embeddings"))
      ->capture_default_str();
  sub_->add_option("--max-batched-tokens", f.plan.max_batched_tokens, "tokens per step")
      ->transform(
          WholeNumberIn(1, harness::kMaxPlanBatchedTokens, absl::StrCat("1 to ", harness::kMaxPlanBatchedTokens)))
      ->capture_default_str();
  sub_->add_option("--runtime-reserve", f.reserve,
                   "memory outside the allocator: CUDA context, library workspaces, CUDA graphs")
      ->capture_default_str();
  sub_->add_option("--check-requests", f.plan.check_requests, "the profile's first requests the check serves (0: all)")
      ->transform(WholeNumberIn(0, 1000000000, "0 (all) to 1000000000"))
      ->capture_default_str();
  sub_->add_flag("--no-check", f.no_check, "the formulas only: no replay");
  sub_->add_option("--json", f.json_path, "also write the plan as JSON");
  sub_->add_option("--html", f.html_path, "also write the plan as an HTML page");
}

PlanCommand::~PlanCommand() = default;

int PlanCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.json_path, f.html_path}, kPlanPrefix)) return 1;
  auto fail = [](const absl::Status& s) { return Fail(NamingTheFlag(s), kPlanPrefix); };
  harness::PlanOptions o = f.plan;
  // Sizes: what the user wrote is named, with what the planner accepts (harness/planning/planner.h).
  const std::string max_card = absl::StrCat(harness::kMaxPlanCardBytes >> 40, "TiB");
  absl::StatusOr<std::size_t> card = ParseSize(f.card);
  if (!card.ok()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--card ", f.card, ": ", card.status().message(), "; accepted a size up to ", max_card)));
  }
  if (*card == 0 || *card > harness::kMaxPlanCardBytes) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--card ", f.card, ": accepted a size above 0 and up to ", max_card, ", e.g. 80GiB")));
  }
  o.card_bytes = *card;
  absl::StatusOr<std::size_t> reserve = ParseSize(f.reserve);
  if (!reserve.ok() || *reserve > harness::kMaxPlanCardBytes) {
    return fail(absl::InvalidArgumentError(absl::StrCat("--runtime-reserve ", f.reserve, ": ",
                                                        reserve.ok() ? "too large" : reserve.status().message(),
                                                        "; accepted a size from 0 to ", max_card)));
  }
  o.runtime_reserve_bytes = *reserve;
  absl::StatusOr<harness::ModelSpec> model = harness::ReadModelConfig(f.model_path);
  if (!model.ok()) return fail(model.status());
  std::vector<harness::Request> requests;
  if (!f.requests_path.empty()) {
    absl::StatusOr<harness::RequestSet> r = harness::ReadRequestsFile(f.requests_path, harness::RequestOptions{});
    if (!r.ok()) return fail(r.status());
    requests = std::move(r->requests);
  }
  absl::StatusOr<harness::Plan> plan = harness::MakePlan(*model, o, requests);
  if (!plan.ok()) return fail(plan.status());
  if (!f.no_check) {
    if (absl::Status s = harness::CheckPlan(*model, o, requests, f.model_path, f.requests_path, &*plan); !s.ok()) {
      return fail(s);
    }
  }
  std::printf("%s", harness::PlanToText(*plan).c_str());
  const bool json_ok = WriteText(f.json_path, harness::PlanToJson(*plan), kPlanPrefix);
  const bool html_ok = WriteText(f.html_path, harness::PlanHtml(*plan), kPlanPrefix);
  return json_ok && html_ok ? 0 : 1;
}

}  // namespace bucketalloc::bench
