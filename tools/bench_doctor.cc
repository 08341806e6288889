// tools/bench_doctor.cc — `bucketalloc-bench doctor`.
#include "bench_doctor.h"

#include <cstdio>
#include <string>
#include <vector>

#include "harness/operations/doctor.h"

namespace bucketalloc::bench {

struct DoctorCommand::Flags {
  std::string input, capacity_text, json_path, html_path;
  harness::DoctorOptions options;
  double interval_ms = 0;
};

DoctorCommand::DoctorCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand(
      "doctor",
      "classify a memory timeline as the operators' runbook does (full at start, climbing, leak, spike, "
      "fragmentation, cache held, healthy), with the evidence and the first lever (docs/operations.md)");
  sub_->add_option("input", f.input,
                   "a timeline (BUCKETALLOC_TIMELINE's JSON lines), a snapshot (JSON) or a trace (RMM CSV)")
      ->required();
  sub_->add_option("--capacity", f.capacity_text, "a trace's or snapshot history's card, to replay it on, e.g. 80GiB");
  sub_->add_option("--allocator", f.options.allocator, AllocatorHelp())->capture_default_str();
  sub_->add_option("--repeat", f.options.repeat, "rounds of a trace (the peak over rounds: settling or a leak)")
      ->check(CLI::Range(1, 1000));
  sub_->add_option("--interval-ms", f.interval_ms,
                   "a replay's sampling interval in ms of the trace's time (default: a 500th of it)")
      ->check(FiniteRange(0.001, 3600000.0));
  sub_->add_option("--snapshot-device", f.options.device, "a snapshot's device")
      ->check(CLI::Range(0, harness::kMaxDoctorDevice));
  sub_->add_option("--json", f.json_path, "also write {\"verdicts\": [...]} as JSON");
  sub_->add_option("--html", f.html_path, "also write an HTML report: the verdicts first, then the curves marked");
}

DoctorCommand::~DoctorCommand() = default;

int DoctorCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.json_path, f.html_path})) return 1;
  harness::DoctorOptions o = f.options;
  if (!f.capacity_text.empty()) {
    absl::StatusOr<std::size_t> capacity = ParseCapacity(f.capacity_text);
    if (!capacity.ok()) return Fail(capacity.status());
    o.capacity = *capacity;
  }
  o.interval_s = f.interval_ms / 1000.0;
  absl::StatusOr<harness::DoctorInput> in = harness::ReadDoctorInput(f.input, o);
  if (!in.ok()) return Fail(in.status());
  for (const std::string& w : in->warnings) std::fprintf(stderr, "bucketalloc-bench: doctor: %s\n", w.c_str());
  const std::vector<harness::Verdict> verdicts = harness::DiagnoseInput(*in);
  std::printf("doctor: %s (%s, %zu samples)\n%s", f.input.c_str(), in->kind.c_str(), in->samples.size(),
              harness::VerdictsToText(verdicts).c_str());
  const bool json_ok = WriteText(f.json_path, harness::VerdictsToJson(verdicts));
  const bool html_ok =
      WriteText(f.html_path, harness::DoctorHtml(verdicts, in->samples, "bucketalloc doctor: " + f.input));
  // Figures that contradict themselves are not a diagnosis: said, and the exit status says it.
  if (const int inconsistent = harness::InconsistentDevices(verdicts); inconsistent > 0) {
    std::fprintf(stderr,
                 "bucketalloc-bench: doctor: %s: the samples of %lld device(s) contradict themselves (verdict "
                 "inconsistent): not a bucketalloc timeline, or a corrupted one\n",
                 f.input.c_str(), static_cast<long long>(inconsistent));
    return 1;
  }
  return json_ok && html_ok ? 0 : 1;
}

}  // namespace bucketalloc::bench
