// tools/bench_replay.cc — `bucketalloc-bench replay`, `min-capacity` and `import-kineto`.
#include "bench_replay.h"

#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bucketalloc/options.h"
#include "bucketalloc/timeline.h"
#include "harness/replay/importers.h"
#include "harness/replay/replay.h"
#include "harness/replay/trace.h"
#include "harness/workload/serving.h"

namespace bucketalloc::bench {
namespace {

void PrintResult(const harness::ReplayResult& r) {
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
  for (const TenantStats& t : r.tenants) {
    std::printf("%-28s peak reserved %s of its cap %s, %lld OOMs\n", absl::StrCat("tenant ", t.name).c_str(),
                FormatBytes(t.peak_reserved).c_str(), FormatBytes(t.cap).c_str(), static_cast<long long>(t.ooms));
  }
  std::printf("%-28s p50 %.0f ns, p99 %.0f ns\n", "latency per operation", r.p50_ns, r.p99_ns);
  std::printf("%-28s %llu (simulated %.1f ms)\n", "backend calls", static_cast<unsigned long long>(r.backend_calls),
              r.simulated_backend_ms);
  const harness::DriverTime& d = r.driver_time;
  std::printf("%-28s %.1f ms on requests' path, %.1f ms off it; %.1f ms until reserved peaked, %.1f ms after (%s)\n",
              "driver time", d.request_path_ms, d.background_ms, d.warmup_ms, d.steady_ms, d.profile.c_str());
  std::printf("%-28s p99 %.0f us, max %.0f us, over the %llu requests that called the driver\n",
              "a request's driver time", d.p99_request_us, d.max_request_us,
              static_cast<unsigned long long>(d.requests_calling_driver));
  std::printf("%-28s %llu (%llu after reserved peaked)\n", "synchronizations",
              static_cast<unsigned long long>(d.synchronizations),
              static_cast<unsigned long long>(d.steady_synchronizations));
  std::printf("%-28s %llu\n", "granules stitched", static_cast<unsigned long long>(r.granules_stitched));
  if (r.per_round_peak_reserved_bytes.size() > 1) {
    std::string rounds;
    for (std::size_t b : r.per_round_peak_reserved_bytes) rounds += FormatBytes(b) + " ";
    std::printf("%-28s %s-> %s\n", "peak reserved per round", rounds.c_str(), r.verdict.c_str());
  }
}

// --timeline PATH[,interval_ms]: the file and the sampling interval in seconds of the trace's time.
absl::Status ParseTimelineFlag(const std::string& spec, std::string* path, double* interval_s) {
  int interval_ms = 0;
  if (absl::Status s = ParseTimelineSpec(spec, path, &interval_ms); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--timeline \"", spec,
                                                   "\": ", absl::StripPrefix(s.message(), "bucketalloc: "),
                                                   " (PATH: the file to write; interval_ms: of the trace's time, "
                                                   "default ",
                                                   kDefaultTimelineIntervalMs, ")"));
  }
  *interval_s = interval_ms / 1000.0;
  return absl::OkStatus();
}

// The samples as the JSON lines a process writes with BUCKETALLOC_TIMELINE.
std::string TimelineLines(const std::vector<TimelineSample>& samples) {
  std::string lines;
  for (const TimelineSample& s : samples) absl::StrAppend(&lines, TimelineToJsonLine(s), "\n");
  return lines;
}

}  // namespace

struct ReplayCommand::Flags {
  std::string trace_path, allocator = "bucketalloc", capacity_text, json_path, timeline_spec;
  int repeat = 1;
  CLI::Option* timeline = nullptr;
  DeviceFlags device;
};

ReplayCommand::ReplayCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand("replay", "replay a trace at one capacity");
  sub_->add_option("trace", f.trace_path, "the trace (RMM CSV)")->required();
  sub_->add_option("--allocator", f.allocator, AllocatorHelp())->capture_default_str();
  sub_->add_option("--capacity", f.capacity_text, "the simulated card's memory, e.g. 24GiB")->required();
  sub_->add_option("--repeat", f.repeat, "rounds of the trace on one allocator (a rising peak is a leak)")
      ->check(CLI::Range(1, 1000));
  sub_->add_option("--json", f.json_path, "also write the result as JSON");
  f.timeline =
      sub_->add_option("--timeline", f.timeline_spec,
                       "also write the memory timeline, PATH[,interval_ms] (default 1000 ms of the trace's time): the "
                       "JSON lines a process writes with BUCKETALLOC_TIMELINE (docs/operations.md)");
  f.device.AddTo(sub_, /*with_device=*/true);
}

ReplayCommand::~ReplayCommand() = default;

int ReplayCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.json_path})) return 1;
  absl::StatusOr<harness::ReplayDeviceKind> device = f.device.Device();
  if (!device.ok()) return Fail(device.status());
  absl::StatusOr<harness::Trace> trace = harness::ReadTraceFile(f.trace_path);
  if (!trace.ok()) return Fail(trace.status());
  absl::StatusOr<std::size_t> capacity = ParseCapacity(f.capacity_text);
  if (!capacity.ok()) return Fail(capacity.status());
  absl::StatusOr<harness::ReplayOptions> options = f.device.Options(f.allocator, *capacity, *device);
  if (!options.ok()) return Fail(options.status());
  harness::ReplayOptions& o = *options;
  o.repeat = f.repeat;
  std::string timeline_path;
  if (f.timeline->count() > 0) {  // given, even empty: an empty PATH is an error, not "no timeline"
    if (absl::Status s = ParseTimelineFlag(f.timeline_spec, &timeline_path, &o.sample_interval_s); !s.ok()) {
      return Fail(s);
    }
    if (!CheckOutputs({timeline_path})) return 1;
  }
  absl::StatusOr<harness::ReplayResult> r = harness::Replay(*trace, o);
  if (!r.ok()) return Fail(r.status());
  PrintResult(*r);
  if (!timeline_path.empty()) {
    if (!WriteText(timeline_path, TimelineLines(r->samples))) return 1;
    std::printf("%-28s %zu samples in %s\n", "timeline", r->samples.size(), timeline_path.c_str());
  }
  return WriteText(f.json_path, r->ToJson()) ? 0 : 1;
}

struct MinCapacityCommand::Flags {
  std::string trace_path, allocator = "bucketalloc", json_path;
  DeviceFlags device;
};

MinCapacityCommand::MinCapacityCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand("min-capacity", "the smallest card that serves the trace");
  sub_->add_option("trace", f.trace_path, "the trace (RMM CSV)")->required();
  sub_->add_option("--allocator", f.allocator, AllocatorHelp())->capture_default_str();
  sub_->add_option("--json", f.json_path, "also write the result as JSON");
  f.device.AddTo(sub_, /*with_device=*/false);
}

MinCapacityCommand::~MinCapacityCommand() = default;

int MinCapacityCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.json_path})) return 1;
  absl::StatusOr<harness::Trace> trace = harness::ReadTraceFile(f.trace_path);
  if (!trace.ok()) return Fail(trace.status());
  absl::StatusOr<std::optional<std::uint64_t>> need = harness::ReadTrueNeed(f.trace_path, trace->events.size());
  if (!need.ok()) return Fail(need.status());
  absl::StatusOr<harness::CostModel> costs = f.device.Costs();
  if (!costs.ok()) return Fail(costs.status());
  absl::StatusOr<harness::MinCapacityResult> m = harness::MinCapacity(
      *trace, f.allocator, *costs, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (!m.ok()) return Fail(m.status());
  m->true_need_bytes = *need;
  if (absl::Status s = harness::MeasurePeakAtMin(*trace, f.allocator, *costs, &*m); !s.ok()) return Fail(s);
  PrintResult(m->at_min);
  std::printf("%-28s %s (%.3f x peak live)\n", "min capacity", FormatBytes(m->min_capacity_bytes).c_str(),
              m->min_capacity_over_live);
  if (m->peak_at_min.has_value()) {
    std::printf("%-28s %s\n",
                m->peak_at_min->moment == harness::BreakdownMoment::kDecidingEvent ? "where it binds (x peak live)"
                                                                                   : "at its peak (x peak live)",
                m->peak_at_min->breakdown.Text(m->at_min.peak_live_bytes).c_str());
  }
  if (m->true_need_bytes.has_value()) {
    std::printf("%-28s %s; min capacity is %.3f x that\n", "true need (meta file)",
                FormatBytes(*m->true_need_bytes).c_str(), m->min_capacity_over_true_need());
  }
  return WriteText(f.json_path, m->ToJson()) ? 0 : 1;
}

struct ImportKinetoCommand::Flags {
  std::string file, output;
  int device = -1;
};

ImportKinetoCommand::ImportKinetoCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  sub_ = app.add_subcommand("import-kineto", "PyTorch profiler memory events (JSON, JSON.gz or CSV) to a trace");
  sub_->add_option("file", f.file, "the Kineto trace or its memory-event CSV")->required();
  sub_->add_option("--device", f.device, "the CUDA device to keep (default: the first one seen)");
  sub_->add_option("-o,--output", f.output, "the trace to write (RMM CSV)")->required();
}

ImportKinetoCommand::~ImportKinetoCommand() = default;

int ImportKinetoCommand::Run() const {
  const Flags& f = *flags_;
  if (!CheckOutputs({f.output})) return 1;
  absl::StatusOr<harness::Trace> t = harness::ImportKinetoFile(f.file, f.device);
  if (!t.ok()) return Fail(t.status());
  if (absl::Status s = harness::WriteTraceFile(*t, f.output); !s.ok()) return Fail(s);
  std::printf("%s: %zu events, peak live %s\n", f.output.c_str(), t->events.size(),
              FormatBytes(harness::PeakLiveBytes(*t)).c_str());
  return 0;
}

}  // namespace bucketalloc::bench
