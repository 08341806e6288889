// tools/bucketalloc_bench.cc — bucketalloc-bench: replays allocation traces (RMM's replay-log CSV)
// against allocators on the simulated device and reports bytes, OOMs, latency and backend calls
// (docs/harness.md).
//
//   bucketalloc-bench replay TRACE --allocator NAME[:CONF] --capacity SIZE [--repeat K] [--json OUT] [--timeline PATH]
//   bucketalloc-bench min-capacity TRACE --allocator NAME[:CONF] [--json OUT]
//   bucketalloc-bench compare TRACE [TRACE...] --allocators A,B,... --capacity SIZE [--html REPORT] [--json OUT]
//   bucketalloc-bench import-kineto FILE [--device N] -o TRACE
//   bucketalloc-bench doctor TIMELINE|TRACE|SNAPSHOT [--capacity SIZE] [--allocator NAME[:CONF]] [--json OUT] [--html
//   OUT]
//   bucketalloc-bench generate serving --requests FILE --model CONFIG.json [options] -o TRACE
//   bucketalloc-bench plan --model CONFIG.json --card SIZE [--requests FILE] [--dtype D] [--tensor-parallel N] [...]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "bench_generate.h"
#include "bench_plan.h"
#include "bucketalloc/options.h"
#include "bucketalloc/timeline.h"
#include "harness/operations/doctor.h"
#include "harness/replay/importers.h"
#include "harness/replay/policies.h"
#include "harness/replay/replay.h"
#include "harness/replay/trace.h"
#include "harness/reports/report.h"
#include "harness/workload/serving.h"

namespace {

using bucketalloc::FormatBytes;
using bucketalloc::harness::MinCapacityResult;
using bucketalloc::harness::ReplayResult;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "bucketalloc-bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

// Writes `text` and a newline to `path`; nothing when `path` is empty.
bool WriteText(const std::string& path, const std::string& text) {
  if (path.empty()) return true;
  std::ofstream out(path);
  out << text << "\n";
  if (!out) {
    std::fprintf(stderr, "bucketalloc-bench: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

void PrintResult(const ReplayResult& r) {
  std::printf("%-28s %s\n", "allocator", r.allocator.c_str());
  std::printf("%-28s %s\n", "capacity", FormatBytes(r.capacity).c_str());
  std::printf("%-28s %llu\n", "allocations", static_cast<unsigned long long>(r.allocations));
  std::printf("%-28s %s\n", "peak live", FormatBytes(r.peak_live_bytes).c_str());
  std::printf("%-28s %s (%.3f x live)\n", "peak reserved", FormatBytes(r.peak_reserved_bytes).c_str(),
              r.reserved_over_live);
  std::printf("%-28s %llu (capacity %llu, fragmentation %llu", "OOMs", static_cast<unsigned long long>(r.ooms),
              static_cast<unsigned long long>(r.capacity_ooms), static_cast<unsigned long long>(r.fragmentation_ooms));
  if (r.tenant_cap_ooms > 0) {
    std::printf(", tenant cap %llu: a tenant's own cap refused them, a bigger card would not serve them",
                static_cast<unsigned long long>(r.tenant_cap_ooms));
  }
  std::printf(")\n");
  if (!r.ooms_by_stream.empty()) {
    std::string by_stream;
    for (const auto& [stream, n] : r.ooms_by_stream) {
      absl::StrAppend(&by_stream, by_stream.empty() ? "" : ", ", "stream ", stream, ": ", n);
    }
    std::printf("%-28s %s\n", "OOMs by trace stream", by_stream.c_str());
  }
  if (!r.tenants.empty()) {
    std::printf("%-28s %s\n", "", "(each tenant's OOMs below are its own: against its cap, or the card's)");
  }
  for (const bucketalloc::TenantStats& t : r.tenants) {
    std::printf("%-28s peak reserved %s of its cap %s, %lld OOMs\n", absl::StrCat("tenant ", t.name).c_str(),
                FormatBytes(t.peak_reserved).c_str(), FormatBytes(t.cap).c_str(), static_cast<long long>(t.ooms));
  }
  std::printf("%-28s p50 %.0f ns, p99 %.0f ns\n", "latency per operation", r.p50_ns, r.p99_ns);
  std::printf("%-28s %llu (simulated %.1f ms)\n", "backend calls", static_cast<unsigned long long>(r.backend_calls),
              r.simulated_backend_ms);
  std::printf("%-28s %llu\n", "granules stitched", static_cast<unsigned long long>(r.granules_stitched));
  if (r.per_round_peak_reserved_bytes.size() > 1) {
    std::string rounds;
    for (std::size_t b : r.per_round_peak_reserved_bytes) rounds += FormatBytes(b) + " ";
    std::printf("%-28s %s-> %s\n", "peak reserved per round", rounds.c_str(), r.verdict.c_str());
  }
}

bucketalloc::harness::ReplayOptions Options(const std::string& allocator, std::size_t capacity,
                                            const bucketalloc::harness::CostModel& cost,
                                            bucketalloc::harness::ReplayDeviceKind device) {
  bucketalloc::harness::ReplayOptions o;
  o.allocator = allocator;
  o.capacity = capacity;
  o.cost = cost;
  o.device = device;
  return o;
}

absl::StatusOr<std::size_t> ParseCapacity(const std::string& text) {
  absl::StatusOr<std::size_t> c = bucketalloc::ParseSize(text);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--capacity ", text, ": ", c.status().message()));
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bucketalloc-bench: replay allocation traces (RMM replay-log CSV) against allocators on the "
      "simulated device"};
  app.require_subcommand(1);
  std::string trace_path, allocator = "bucketalloc", capacity_text, json_path, html_path;
  int repeat = 1;
  bucketalloc::harness::CostModel cost;

  CLI::App* replay = app.add_subcommand("replay", "replay a trace at one capacity");
  replay->add_option("trace", trace_path, "the trace (RMM CSV)")->required();
  const std::string policies = bucketalloc::harness::PolicySpecsText();
  const std::string allocator_help = absl::StrCat("one of: ", policies, bucketalloc::harness::PolicyHelpText());
  replay->add_option("--allocator", allocator, allocator_help)->capture_default_str();
  replay->add_option("--capacity", capacity_text, "the simulated card's memory, e.g. 24GiB")->required();
  replay->add_option("--repeat", repeat, "rounds of the trace on one allocator (a rising peak is a leak)")
      ->check(CLI::Range(1, 1000));
  replay->add_option("--json", json_path, "also write the result as JSON");
  std::string timeline_spec;
  CLI::Option* timeline_option = replay->add_option(
      "--timeline", timeline_spec,
      "also write the memory timeline, PATH[,interval_ms] (default 1000 ms of the trace's time): the "
      "JSON lines a process writes with BUCKETALLOC_TIMELINE (docs/operations.md)");

  CLI::App* min_capacity = app.add_subcommand("min-capacity", "the smallest card that serves the trace");
  min_capacity->add_option("trace", trace_path, "the trace (RMM CSV)")->required();
  min_capacity->add_option("--allocator", allocator, allocator_help)->capture_default_str();
  min_capacity->add_option("--json", json_path, "also write the result as JSON");

  std::string allocator_list;
  std::vector<std::string> compare_traces;
  CLI::App* compare = app.add_subcommand(
      "compare",
      "allocators side by side at one capacity, min-capacity included; several traces (e.g. one per KV "
      "layout of the same requests) go in one table");
  compare->add_option("traces", compare_traces, "the traces (RMM CSV)")->required();
  compare
      ->add_option("--allocators", allocator_list,
                   absl::StrCat("comma-separated, each one of: ", policies, " (a CONF keeps its own commas)",
                                bucketalloc::harness::PolicyHelpText()))
      ->required();
  compare->add_option("--capacity", capacity_text, "the simulated card's memory, e.g. 24GiB")->required();
  compare->add_option("--json", json_path, "also write the results as a JSON array (with timelines and histograms)");
  compare->add_option("--html", html_path,
                      "also write a self-contained HTML report: the table, live vs reserved bytes over time and "
                      "the free-block histogram at peak reserved, per allocator");

  std::string doctor_input;
  double doctor_interval_ms = 0;
  int doctor_device = 0;
  CLI::App* doctor = app.add_subcommand(
      "doctor",
      "classify a memory timeline as the operators' runbook does (full at start, climbing, leak, spike, "
      "fragmentation, cache held, healthy), with the evidence and the first lever (docs/operations.md)");
  doctor
      ->add_option("input", doctor_input,
                   "a timeline (BUCKETALLOC_TIMELINE's JSON lines), a snapshot (JSON) or a trace (RMM CSV)")
      ->required();
  doctor->add_option("--capacity", capacity_text, "a trace's or snapshot history's card, to replay it on, e.g. 80GiB");
  doctor->add_option("--allocator", allocator, allocator_help)->capture_default_str();
  doctor->add_option("--repeat", repeat, "rounds of a trace (the peak over rounds: settling or a leak)")
      ->check(CLI::Range(1, 1000));
  doctor
      ->add_option("--interval-ms", doctor_interval_ms,
                   "a replay's sampling interval in ms of the trace's time (default: a 500th of it)")
      ->check(CLI::Range(0.001, 3600000.0));
  doctor->add_option("--snapshot-device", doctor_device, "a snapshot's device")->check(CLI::Range(0, 65535));
  doctor->add_option("--json", json_path, "also write {\"verdicts\": [...]} as JSON");
  doctor->add_option("--html", html_path, "also write an HTML report: the verdicts first, then the curves marked");

  std::string output;
  int kineto_device = -1;
  CLI::App* import =
      app.add_subcommand("import-kineto", "PyTorch profiler memory events (JSON, JSON.gz or CSV) to a trace");
  import->add_option("file", trace_path, "the Kineto trace or its memory-event CSV")->required();
  import->add_option("--device", kineto_device, "the CUDA device to keep (default: the first one seen)");
  import->add_option("-o,--output", output, "the trace to write (RMM CSV)")->required();

  bucketalloc::bench::GenerateCommand generate(app);
  bucketalloc::bench::PlanCommand plan(app);

  std::string device_name = "sim";
  for (CLI::App* sub : {replay, compare}) {
    sub->add_option("--device", device_name,
                    "sim (the simulated device) or cuda (GPU 0, capped at --capacity); min-capacity always bisects "
                    "on the simulated device")
        ->capture_default_str();
  }
  for (CLI::App* sub : {replay, min_capacity, compare}) {
    sub->add_option("--malloc-us", cost.malloc_us, "simulated cost of a backend allocation (us)")
        ->capture_default_str();
    sub->add_option("--free-us", cost.free_us, "simulated cost of a backend free (us)")->capture_default_str();
    sub->add_option("--vmm-call-us", cost.vmm_call_us,
                    "simulated cost of one virtual-memory call: create, release, map or unmap of a granule (us)")
        ->capture_default_str();
  }
  CLI11_PARSE(app, argc, argv);

  if (generate.parsed()) return generate.Run();
  if (plan.parsed()) return plan.Run();
  absl::StatusOr<bucketalloc::harness::ReplayDeviceKind> device =
      bucketalloc::harness::ParseReplayDeviceKind(device_name);
  if (!device.ok()) return Fail(device.status());
  if (import->parsed()) {
    absl::StatusOr<bucketalloc::harness::Trace> t = bucketalloc::harness::ImportKinetoFile(trace_path, kineto_device);
    if (!t.ok()) return Fail(t.status());
    if (absl::Status s = bucketalloc::harness::WriteTraceFile(*t, output); !s.ok()) return Fail(s);
    std::printf("%s: %zu events, peak live %s\n", output.c_str(), t->events.size(),
                FormatBytes(bucketalloc::harness::PeakLiveBytes(*t)).c_str());
    return 0;
  }

  if (compare->parsed()) {
    absl::StatusOr<std::size_t> capacity = ParseCapacity(capacity_text);
    if (!capacity.ok()) return Fail(capacity.status());
    // The timelines and histograms cost a second replay per allocator: only for the files.
    const bool record = !json_path.empty() || !html_path.empty();
    const bool several = compare_traces.size() > 1;
    absl::StatusOr<std::vector<std::string>> split = bucketalloc::harness::SplitAllocatorList(allocator_list);
    if (!split.ok()) return Fail(split.status());
    const std::vector<std::string>& allocators = *split;
    if (absl::Status s = bucketalloc::harness::CheckAllocators(allocators, *capacity, *device); !s.ok()) return Fail(s);
    int width = 14;  // the allocator column: as wide as the longest name
    for (const std::string& a : allocators) width = std::max(width, static_cast<int>(a.size()));
    std::printf("%s%-*s %10s %10s %8s %8s %6s %6s %6s %8s %8s %10s %12s %8s %8s\n", several ? "trace\n  " : "", width,
                "allocator", "reserved", "min cap", "min/live", "min/need", "OOMs", "cap", "frag", "p50 ns", "p99 ns",
                "backend", "backend ms", "stitched", "verdict");
    std::vector<bucketalloc::harness::CompareReport> reports;
    for (const std::string& path : compare_traces) {
      absl::StatusOr<bucketalloc::harness::Trace> trace = bucketalloc::harness::ReadTraceFile(path);
      if (!trace.ok()) return Fail(trace.status());
      bucketalloc::harness::CompareReport& report = reports.emplace_back();
      report.trace_name = path;
      report.capacity = *capacity;
      report.peak_live_bytes = bucketalloc::harness::PeakLiveBytes(*trace);
      absl::StatusOr<std::optional<std::uint64_t>> need =
          bucketalloc::harness::ReadTrueNeed(path, trace->events.size());
      if (!need.ok()) return Fail(need.status());
      if (several) std::printf("%s (peak live %s)\n", path.c_str(), FormatBytes(report.peak_live_bytes).c_str());
      for (const std::string& name : allocators) {
        bucketalloc::harness::ReplayOptions o = Options(name, *capacity, cost, *device);
        o.record_timeline = record;
        absl::StatusOr<ReplayResult> r = bucketalloc::harness::Replay(*trace, o);
        if (!r.ok()) return Fail(r.status());
        absl::StatusOr<MinCapacityResult> m = bucketalloc::harness::MinCapacity(*trace, name, cost);
        if (!m.ok()) return Fail(m.status());
        m->true_need_bytes = *need;
        const std::string over_need =
            m->true_need_bytes.has_value() ? absl::StrFormat("%.3f", m->min_capacity_over_true_need()) : "-";
        std::printf("%s%-*s %10s %10s %8.3f %8s %6llu %6llu %6llu %8.0f %8.0f %10llu %12.1f %8llu %8s\n",
                    several ? "  " : "", width, r->allocator.c_str(), FormatBytes(r->peak_reserved_bytes).c_str(),
                    FormatBytes(m->min_capacity_bytes).c_str(), m->min_capacity_over_live, over_need.c_str(),
                    static_cast<unsigned long long>(r->ooms), static_cast<unsigned long long>(r->capacity_ooms),
                    static_cast<unsigned long long>(r->fragmentation_ooms), r->p50_ns, r->p99_ns,
                    static_cast<unsigned long long>(r->backend_calls), r->simulated_backend_ms,
                    static_cast<unsigned long long>(r->granules_stitched), r->verdict.c_str());
        report.capacity = r->capacity;  // rounded down to the 2 MiB granularity, as replayed
        report.rows.push_back({std::move(*r), std::move(*m)});
      }
    }
    if (!several) {
      std::printf("peak live %s; capacity %s\n", FormatBytes(reports[0].peak_live_bytes).c_str(),
                  FormatBytes(reports[0].capacity).c_str());
    } else {
      std::printf("capacity %s\n", FormatBytes(reports[0].capacity).c_str());
    }
    const bool json_ok = WriteText(json_path, bucketalloc::harness::CompareToJson(reports));
    const bool html_ok = WriteText(html_path, bucketalloc::harness::CompareReportHtml(reports));
    if (html_ok && !html_path.empty()) std::printf("report: %s\n", html_path.c_str());
    return json_ok && html_ok ? 0 : 1;
  }

  if (doctor->parsed()) {
    bucketalloc::harness::DoctorOptions o;
    if (!capacity_text.empty()) {
      absl::StatusOr<std::size_t> capacity = ParseCapacity(capacity_text);
      if (!capacity.ok()) return Fail(capacity.status());
      o.capacity = *capacity;
    }
    o.allocator = allocator;
    o.repeat = repeat;
    o.interval_s = doctor_interval_ms / 1000.0;
    o.device = doctor_device;
    absl::StatusOr<bucketalloc::harness::DoctorInput> in = bucketalloc::harness::ReadDoctorInput(doctor_input, o);
    if (!in.ok()) return Fail(in.status());
    for (const std::string& w : in->warnings) std::fprintf(stderr, "bucketalloc-bench: doctor: %s\n", w.c_str());
    const std::vector<bucketalloc::harness::Verdict> verdicts = bucketalloc::harness::DiagnoseInput(*in);
    std::printf("doctor: %s (%s, %zu samples)\n%s", doctor_input.c_str(), in->kind.c_str(), in->samples.size(),
                bucketalloc::harness::VerdictsToText(verdicts).c_str());
    const bool json_ok = WriteText(json_path, bucketalloc::harness::VerdictsToJson(verdicts));
    const bool html_ok = WriteText(
        html_path, bucketalloc::harness::DoctorHtml(verdicts, in->samples, "bucketalloc doctor: " + doctor_input));
    // Figures that contradict themselves are not a diagnosis: said, and the exit status says it.
    const int inconsistent = bucketalloc::harness::InconsistentDevices(verdicts);
    if (inconsistent > 0) {
      std::fprintf(stderr,
                   "bucketalloc-bench: doctor: %s: the samples of %lld device(s) contradict themselves (verdict "
                   "inconsistent): not a bucketalloc timeline, or a corrupted one\n",
                   doctor_input.c_str(), static_cast<long long>(inconsistent));
      return 1;
    }
    return json_ok && html_ok ? 0 : 1;
  }

  absl::StatusOr<bucketalloc::harness::Trace> trace = bucketalloc::harness::ReadTraceFile(trace_path);
  if (!trace.ok()) return Fail(trace.status());

  if (replay->parsed()) {
    absl::StatusOr<std::size_t> capacity = ParseCapacity(capacity_text);
    if (!capacity.ok()) return Fail(capacity.status());
    bucketalloc::harness::ReplayOptions o = Options(allocator, *capacity, cost, *device);
    o.repeat = repeat;
    std::string timeline_path;
    if (timeline_option->count() > 0) {  // given, even empty: an empty PATH is an error, not "no timeline"
      int interval_ms = 0;
      if (absl::Status s = bucketalloc::ParseTimelineSpec(timeline_spec, &timeline_path, &interval_ms); !s.ok()) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("--timeline \"", timeline_spec, "\": ", absl::StripPrefix(s.message(), "bucketalloc: "),
                         " (PATH: the file to write; interval_ms: of the trace's time, default ",
                         bucketalloc::kDefaultTimelineIntervalMs, ")")));
      }
      o.sample_interval_s = interval_ms / 1000.0;
    }
    absl::StatusOr<ReplayResult> r = bucketalloc::harness::Replay(*trace, o);
    if (!r.ok()) return Fail(r.status());
    PrintResult(*r);
    if (!timeline_path.empty()) {
      std::string lines;
      for (const bucketalloc::TimelineSample& s : r->samples) {
        absl::StrAppend(&lines, bucketalloc::TimelineToJsonLine(s), "\n");
      }
      if (!WriteText(timeline_path, lines)) return 1;
      std::printf("%-28s %zu samples in %s\n", "timeline", r->samples.size(), timeline_path.c_str());
    }
    return WriteText(json_path, r->ToJson()) ? 0 : 1;
  }
  absl::StatusOr<std::optional<std::uint64_t>> need =
      bucketalloc::harness::ReadTrueNeed(trace_path, trace->events.size());
  if (!need.ok()) return Fail(need.status());
  absl::StatusOr<MinCapacityResult> m = bucketalloc::harness::MinCapacity(
      *trace, allocator, cost, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (!m.ok()) return Fail(m.status());
  m->true_need_bytes = *need;
  PrintResult(m->at_min);
  std::printf("%-28s %s (%.3f x peak live)\n", "min capacity", FormatBytes(m->min_capacity_bytes).c_str(),
              m->min_capacity_over_live);
  if (m->true_need_bytes.has_value()) {
    std::printf("%-28s %s; min capacity is %.3f x that\n", "true need (meta file)",
                FormatBytes(*m->true_need_bytes).c_str(), m->min_capacity_over_true_need());
  }
  return WriteText(json_path, m->ToJson()) ? 0 : 1;
}
