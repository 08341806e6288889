// tools/bench_tune.cc — `bucketalloc-bench tune`.
#include "bench_tune.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketalloc/units.h"
#include "harness/planning/tuner.h"
#include "harness/replay/importers.h"

namespace bucketalloc::bench {
namespace {

void PrintChoice(const char* family, const char* variable, const harness::TuneResult& r, const harness::TuneChoice& c) {
  const harness::TunePoint& p = r.points[c.point];
  const harness::TunePoint& d = r.points[c.default_point];
  std::printf("\nrecommended %s: %s\n", family, p.allocator.c_str());
  std::printf("  %s=%s\n", variable, c.conf.c_str());
  std::printf("  why: %s\n", c.why.c_str());
  std::printf("  %-22s %-48s %s\n", "", "tuning part", r.held_out_name.c_str());
  std::printf("  %-22s %-48s %s\n", "recommended", harness::TuneFiguresText(p.tune).c_str(),
              harness::TuneFiguresText(p.held_out).c_str());
  std::printf("  %-22s %-48s %s\n", absl::StrCat("default (", d.allocator, ")").c_str(),
              harness::TuneFiguresText(d.tune).c_str(), harness::TuneFiguresText(d.held_out).c_str());
  if (c.ooms.has_value()) {
    std::printf("  OOMs at %s: %llu (fragmentation %llu); the default %llu (fragmentation %llu)\n",
                FormatBytes(r.capacity).c_str(), static_cast<unsigned long long>(*c.ooms),
                static_cast<unsigned long long>(*c.fragmentation_ooms),
                static_cast<unsigned long long>(*c.default_ooms),
                static_cast<unsigned long long>(*c.default_fragmentation_ooms));
  }
}

}  // namespace

struct TuneCommand::Flags {
  std::string input, capacity_text, validate, json_path, html_path;
  double budget_s = 0;
  int jobs = 0;
  int device = -1;
  DeviceFlags device_flags;
};

TuneCommand::TuneCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand(
      "tune",
      "the allocator settings that need the least memory for a recorded workload (bucketalloc's and PyTorch's), "
      "checked on data the search did not see");
  sub_->add_option("recording", f.input,
                   "the workload: a trace (RMM CSV), a profiler trace (Kineto JSON, JSON.gz or CSV) or a memory "
                   "snapshot with its history (torch.cuda.memory._dump_snapshot's pickle, or JSON)")
      ->required();
  sub_->add_option("--capacity", f.capacity_text, "the card: report the OOMs of each recommendation at it, e.g. 80GiB");
  sub_->add_option("--validate", f.validate,
                   "another recording of the same service to check on (default: the recording's second half, the "
                   "first half then being tuned on)");
  sub_->add_option("--budget-s", f.budget_s, "seconds the search may take (default: what it needs)")
      ->check(FiniteRange(0.0, harness::kMaxTuneBudgetSeconds));
  sub_->add_option("--jobs", f.jobs, "threads for replays (default: the machine's cores)")->check(CLI::Range(0, 1024));
  sub_->add_option("--device", f.device, "the CUDA device of a profiler trace or snapshot (default: the first)");
  sub_->add_option("--json", f.json_path, "also write the front, both parts' figures and the recommendations as JSON");
  sub_->add_option("--html", f.html_path,
                   "also write a self-contained page: the front as a plot, the recommendations marked, their settings "
                   "as text to copy");
  f.device_flags.AddTo(sub_, /*with_device=*/false);
}

TuneCommand::~TuneCommand() = default;

int TuneCommand::Run() const {
  const Flags& f = *flags_;
  const std::string prefix = "bucketalloc-bench tune";
  if (!CheckOutputs({f.json_path, f.html_path}, prefix)) return 1;
  std::vector<std::string> warnings;
  absl::StatusOr<harness::Trace> trace = harness::ReadRecording(f.input, f.device, &warnings);
  if (!trace.ok()) return Fail(trace.status(), prefix);
  harness::TuneOptions o;
  absl::StatusOr<harness::CostModel> costs = f.device_flags.Costs();
  if (!costs.ok()) return Fail(costs.status(), prefix);
  o.cost = *std::move(costs);
  o.budget_s = f.budget_s;
  o.jobs = f.jobs;
  if (!f.capacity_text.empty()) {
    absl::StatusOr<std::size_t> c = ParseCapacity(f.capacity_text);
    if (!c.ok()) return Fail(c.status(), prefix);
    o.capacity = *c;
  }
  if (!f.validate.empty()) {
    absl::StatusOr<harness::Trace> v = harness::ReadRecording(f.validate, f.device, &warnings);
    if (!v.ok()) return Fail(v.status(), prefix);
    o.validate = std::move(*v);
    o.validate_name = f.validate;
  }
  for (const std::string& w : warnings) std::fprintf(stderr, "%s: warning: %s\n", prefix.c_str(), w.c_str());
  const bool tty = isatty(fileno(stderr)) != 0;
  o.progress = [tty](int done, int total, const std::string& line) {
    constexpr int kWidth = 30;
    const int filled = total > 0 ? done * kWidth / total : 0;
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    if (tty) {
      std::fprintf(stderr, "\r\033[K[%s] %d/%d %.60s", bar.c_str(), done, total, line.c_str());
    } else {
      std::fprintf(stderr, "[%s] %d/%d %s\n", bar.c_str(), done, total, line.c_str());
    }
  };
  absl::StatusOr<harness::TuneResult> r = harness::Tune(*trace, o);
  if (tty) std::fprintf(stderr, "\n");
  if (!r.ok()) return Fail(r.status(), prefix);
  const harness::TraceShape& s = r->shape;
  std::printf("%s: %llu allocations, %llu above 1 MiB; peak live %s\n", f.input.c_str(),
              static_cast<unsigned long long>(s.allocations), static_cast<unsigned long long>(s.large_allocations),
              FormatBytes(s.peak_live_bytes).c_str());
  if (s.recurring_sizes.empty()) {
    std::printf("recurring large sizes: none (no tiers tried)\n");
  } else {
    std::printf(
        "recurring large sizes: %zu, %.0f%% of the large allocations; %zu of them divide one another (tiers), "
        "quantum %s\n",
        s.recurring_sizes.size(), 100 * s.recurring_share, s.tier_sizes.size(), FormatBytes(s.quantum_bytes).c_str());
  }
  std::printf("tuned on %s of live peak %s; checked on %s, live peak %s\n\n",
              r->held_out_is_second_half ? "the first half" : "the whole recording",
              FormatBytes(r->tune_peak_live_bytes).c_str(), r->held_out_name.c_str(),
              FormatBytes(r->held_out_peak_live_bytes).c_str());
  std::printf("%-62s %5s %-48s %s\n", "allocator", "front", "tuning part: min capacity, backend at it",
              "held-out part");
  for (const harness::TunePoint& p : r->points) {
    const std::string tuned = harness::TunePointText(p);
    std::printf("%-62s %5s %-48s %s\n", p.allocator.c_str(), p.on_front ? "*" : "", tuned.c_str(),
                harness::TuneFiguresText(p.held_out).c_str());
  }
  PrintChoice("bucketalloc", "BUCKETALLOC_CONF", *r, r->bucketalloc);
  PrintChoice("PyTorch", "PYTORCH_CUDA_ALLOC_CONF", *r, r->pytorch);
  std::printf("\n%d replays in %.1f s%s\n", r->replays, r->seconds,
              r->budget_ran_out ? " (the budget ran out: some candidates were not measured)" : "");
  if (!WriteText(f.json_path, r->ToJson(), prefix)) return 1;
  return WriteText(f.html_path, r->ToHtml(f.input), prefix) ? 0 : 1;
}

}  // namespace bucketalloc::bench
