// tools/bench_generate.h — `bucketalloc-bench generate serving`: the serving workload generator's
// command line (src/harness/serving.h, docs/harness.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_GENERATE_H_
#define BUCKETALLOC_TOOLS_BENCH_GENERATE_H_

#include <memory>

#include "CLI/CLI.hpp"

namespace bucketalloc::bench {

class GenerateCommand {
 public:
  // Adds `generate` (with its `serving` subcommand) to `app`.
  explicit GenerateCommand(CLI::App& app);
  ~GenerateCommand();
  bool parsed() const;
  // Writes the trace and its meta file; prints a summary. Returns the process's exit status.
  int Run() const;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
  CLI::App* generate_ = nullptr;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_GENERATE_H_
