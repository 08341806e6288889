// tools/bucketalloc_bench.cc — bucketalloc-bench: replays allocation traces (RMM's replay-log CSV)
// against allocators on the simulated device and reports bytes, OOMs, latency and backend calls
// (docs/harness.md). Each subcommand is a command of its own (tools/bench_*.h): main() declares
// them and runs the one the command line names.
//
//   bucketalloc-bench replay TRACE --allocator NAME[:CONF] --capacity SIZE [--repeat K] [--json OUT] [--timeline PATH]
//   bucketalloc-bench min-capacity TRACE --allocator NAME[:CONF] [--json OUT]
//   bucketalloc-bench compare TRACE [TRACE...] --allocators A,B,... --capacity SIZE [--html REPORT] [--json OUT]
//   bucketalloc-bench import-kineto FILE [--device N] -o TRACE
//   bucketalloc-bench doctor TIMELINE|TRACE|SNAPSHOT [--capacity SIZE] [--allocator NAME[:CONF]] [--json OUT] [--html
//   OUT]
//   bucketalloc-bench generate serving --requests FILE --model CONFIG.json [options] -o TRACE
//   bucketalloc-bench plan --model CONFIG.json --card SIZE [--requests FILE] [--dtype D] [--tensor-parallel N] [...]
//   bucketalloc-bench tune TRACE|PROFILE|SNAPSHOT [--capacity SIZE] [--validate TRACE2] [--budget-s S] [--json OUT]
#include "CLI/CLI.hpp"
#include "bench_common.h"
#include "bench_compare.h"
#include "bench_doctor.h"
#include "bench_generate.h"
#include "bench_plan.h"
#include "bench_replay.h"
#include "bench_tune.h"

int main(int argc, char** argv) {
  CLI::App app{
      "bucketalloc-bench: replay allocation traces (RMM replay-log CSV) against allocators on the "
      "simulated device"};
  app.require_subcommand(1);
  // In the order of the help's list.
  const bucketalloc::bench::ReplayCommand replay(app);
  const bucketalloc::bench::MinCapacityCommand min_capacity(app);
  const bucketalloc::bench::CompareCommand compare(app);
  const bucketalloc::bench::DoctorCommand doctor(app);
  const bucketalloc::bench::ImportKinetoCommand import(app);
  const bucketalloc::bench::GenerateCommand generate(app);
  const bucketalloc::bench::PlanCommand plan(app);
  const bucketalloc::bench::TuneCommand tune(app);
  CLI11_PARSE(app, argc, argv);
  const bucketalloc::bench::Command* const commands[] = {&replay, &min_capacity, &compare, &doctor,
                                                         &import, &generate,     &plan,    &tune};
  for (const bucketalloc::bench::Command* command : commands) {
    if (command->parsed()) return bucketalloc::bench::FinishOutput(command->Run());
  }
  return 1;  // not reached: CLI11 requires one subcommand
}
