// tools/bench_tune.h — `bucketalloc-bench tune`: the allocator settings that need the least memory for
// a recorded workload, bucketalloc's and PyTorch's, checked on a part of it the search did not see
// (src/harness/planning/tuner.h; docs/harness.md, "Tune").
#ifndef BUCKETALLOC_TOOLS_BENCH_TUNE_H_
#define BUCKETALLOC_TOOLS_BENCH_TUNE_H_

#include <memory>

#include "CLI/CLI.hpp"
#include "bench_common.h"

namespace bucketalloc::bench {

class TuneCommand : public Command {
 public:
  // Adds `tune` to `app`.
  explicit TuneCommand(CLI::App& app);
  ~TuneCommand() override;
  // Prints a progress bar on stderr, then the front and both recommendations (and writes --json, --html).
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_TUNE_H_
