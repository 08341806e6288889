// tools/bench_compare.cc — `bucketalloc-bench compare`.
#include "bench_compare.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "harness/replay/policies.h"
#include "harness/replay/replay.h"
#include "harness/replay/trace.h"
#include "harness/reports/report.h"
#include "harness/workload/serving.h"

namespace bucketalloc::bench {
namespace {

// The table's allocator column: as wide as the longest name, at least 14.
int AllocatorWidth(const std::vector<std::string>& allocators) {
  int width = 14;
  for (const std::string& a : allocators) width = std::max(width, static_cast<int>(a.size()));
  return width;
}

void PrintHeader(bool several, int width) {
  std::printf("%s%-*s %10s %10s %8s %8s %6s %6s %6s %8s %8s %10s %10s %10s %10s %7s %8s %8s\n",
              several ? "trace\n  " : "", width, "allocator", "reserved", "min cap", "min/live", "min/need", "OOMs",
              "cap", "frag", "p50 ns", "p99 ns", "backend", "driver ms", "request ms", "p99 req us", "syncs",
              "stitched", "verdict");
}

void PrintRow(bool several, int width, const harness::ReplayResult& r, const harness::MinCapacityResult& m) {
  const std::string over_need =
      m.true_need_bytes.has_value() ? absl::StrFormat("%.3f", m.min_capacity_over_true_need()) : "-";
  const harness::DriverTime& d = r.driver_time;
  std::printf("%s%-*s %10s %10s %8.3f %8s %6llu %6llu %6llu %8.0f %8.0f %10llu %10.1f %10.1f %10.0f %7llu %8llu %8s\n",
              several ? "  " : "", width, r.allocator.c_str(), FormatBytes(r.peak_reserved_bytes).c_str(),
              FormatBytes(m.min_capacity_bytes).c_str(), m.min_capacity_over_live, over_need.c_str(),
              static_cast<unsigned long long>(r.ooms), static_cast<unsigned long long>(r.capacity_ooms),
              static_cast<unsigned long long>(r.fragmentation_ooms), r.p50_ns, r.p99_ns,
              static_cast<unsigned long long>(r.backend_calls), d.total_ms, d.request_path_ms, d.p99_request_us,
              static_cast<unsigned long long>(d.synchronizations), static_cast<unsigned long long>(r.granules_stitched),
              r.verdict.c_str());
}

}  // namespace

struct CompareCommand::Flags {
  std::vector<std::string> traces;
  std::string allocator_list, capacity_text, json_path, html_path;
  DeviceFlags device;
};

CompareCommand::CompareCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand(
      "compare",
      "allocators side by side at one capacity, min-capacity included; several traces (e.g. one per KV "
      "layout of the same requests) go in one table");
  sub_->add_option("traces", f.traces, "the traces (RMM CSV)")->required();
  sub_->add_option("--allocators", f.allocator_list,
                   absl::StrCat("comma-separated, each one of: ", harness::PolicySpecsText(),
                                " (a CONF keeps its own commas)", harness::PolicyHelpText()))
      ->required();
  sub_->add_option("--capacity", f.capacity_text, "the simulated card's memory, e.g. 24GiB")->required();
  sub_->add_option("--json", f.json_path, "also write the results as a JSON array (with timelines and histograms)");
  sub_->add_option("--html", f.html_path,
                   "also write a self-contained HTML report: the table, live vs reserved bytes over time and "
                   "the free-block histogram at peak reserved, per allocator");
  f.device.AddTo(sub_, /*with_device=*/true);
}

CompareCommand::~CompareCommand() = default;

int CompareCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.json_path, f.html_path})) return 1;
  absl::StatusOr<harness::ReplayDeviceKind> device = f.device.Device();
  if (!device.ok()) return Fail(device.status());
  absl::StatusOr<std::size_t> capacity = ParseCapacity(f.capacity_text);
  if (!capacity.ok()) return Fail(capacity.status());
  absl::StatusOr<std::vector<std::string>> allocators = harness::SplitAllocatorList(f.allocator_list);
  if (!allocators.ok()) return Fail(allocators.status());
  if (absl::Status s = harness::CheckAllocators(*allocators, *capacity, *device); !s.ok()) return Fail(s);
  // The timelines and histograms cost a second replay per allocator: only for the files.
  const bool record = !f.json_path.empty() || !f.html_path.empty();
  const bool several = f.traces.size() > 1;
  const int width = AllocatorWidth(*allocators);
  PrintHeader(several, width);
  std::vector<harness::CompareReport> reports;
  for (const std::string& path : f.traces) {
    absl::StatusOr<harness::Trace> trace = harness::ReadTraceFile(path);
    if (!trace.ok()) return Fail(trace.status());
    harness::CompareReport& report = reports.emplace_back();
    report.trace_name = path;
    report.capacity = *capacity;
    report.peak_live_bytes = harness::PeakLiveBytes(*trace);
    absl::StatusOr<std::optional<std::uint64_t>> need = harness::ReadTrueNeed(path, trace->events.size());
    if (!need.ok()) return Fail(need.status());
    if (several) std::printf("%s (peak live %s)\n", path.c_str(), FormatBytes(report.peak_live_bytes).c_str());
    for (const std::string& name : *allocators) {
      absl::StatusOr<harness::ReplayOptions> o = f.device.Options(name, *capacity, *device);
      if (!o.ok()) return Fail(o.status());
      o->record_timeline = record;
      absl::StatusOr<harness::ReplayResult> r = harness::Replay(*trace, *o);
      if (!r.ok()) return Fail(r.status());
      absl::StatusOr<harness::MinCapacityResult> m = harness::MinCapacity(*trace, name, o->cost);
      if (!m.ok()) return Fail(m.status());
      if (absl::Status s = harness::MeasurePeakAtMin(*trace, name, o->cost, &*m); !s.ok()) return Fail(s);
      m->true_need_bytes = *need;
      PrintRow(several, width, *r, *m);
      report.capacity = r->capacity;  // rounded down to the 2 MiB granularity, as replayed
      report.rows.push_back({std::move(*r), std::move(*m)});
    }
  }
  // Where each allocator's bytes are at its own min capacity, at the event that decides it (the first
  // to fail 2 MiB below; where none does, when its reserved bytes peak: marked).
  std::printf("at min capacity, after the event that fails 2 MiB below it (x peak live):\n");
  for (const harness::CompareReport& report : reports) {
    for (const harness::CompareRow& row : report.rows) {
      if (!row.min_capacity.peak_at_min.has_value()) continue;
      std::printf("  %-*s %s%s\n", width, row.at_capacity.allocator.c_str(),
                  row.min_capacity.peak_at_min->breakdown.Text(report.peak_live_bytes).c_str(),
                  row.min_capacity.peak_at_min->moment == harness::BreakdownMoment::kPeakReserved
                      ? " (none fails below: where reserved peaks)"
                      : "");
    }
  }
  if (several) {
    std::printf("capacity %s\n", FormatBytes(reports[0].capacity).c_str());
  } else {
    std::printf("peak live %s; capacity %s\n", FormatBytes(reports[0].peak_live_bytes).c_str(),
                FormatBytes(reports[0].capacity).c_str());
  }
  const bool json_ok = WriteText(f.json_path, harness::CompareToJson(reports));
  const bool html_ok = WriteText(f.html_path, harness::CompareReportHtml(reports));
  if (html_ok && !f.html_path.empty()) std::printf("report: %s\n", f.html_path.c_str());
  return json_ok && html_ok ? 0 : 1;
}

}  // namespace bucketalloc::bench
