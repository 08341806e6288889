// tools/bench_compare.h — `bucketalloc-bench compare`: allocators side by side on one or more traces
// at one capacity, min-capacity included, as a table and optionally as JSON and an HTML report
// (src/harness/replay/replay.h, src/harness/reports/report.h; docs/harness.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_COMPARE_H_
#define BUCKETALLOC_TOOLS_BENCH_COMPARE_H_

#include <memory>

#include "CLI/CLI.hpp"
#include "bench_common.h"

namespace bucketalloc::bench {

class CompareCommand : public Command {
 public:
  // Adds `compare` to `app`.
  explicit CompareCommand(CLI::App& app);
  ~CompareCommand() override;
  // Prints the table, a row per allocator as it is measured (and writes --json, --html).
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_COMPARE_H_
