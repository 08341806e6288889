// tools/bench_replay.h — `bucketalloc-bench replay`, `min-capacity` and `import-kineto`: a trace
// replayed at one capacity, the smallest card that serves it, and a profiler's memory events made a
// trace (src/harness/replay/replay.h, importers.h; docs/harness.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_REPLAY_H_
#define BUCKETALLOC_TOOLS_BENCH_REPLAY_H_

#include <memory>

#include "CLI/CLI.hpp"
#include "bench_common.h"

namespace bucketalloc::bench {

class ReplayCommand : public Command {
 public:
  // Adds `replay` to `app`.
  explicit ReplayCommand(CLI::App& app);
  ~ReplayCommand() override;
  // Prints the result (and writes --json, --timeline).
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

class MinCapacityCommand : public Command {
 public:
  // Adds `min-capacity` to `app`.
  explicit MinCapacityCommand(CLI::App& app);
  ~MinCapacityCommand() override;
  // Prints the search's progress on stderr, then the result at the smallest card (and writes --json).
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

class ImportKinetoCommand : public Command {
 public:
  // Adds `import-kineto` to `app`.
  explicit ImportKinetoCommand(CLI::App& app);
  ~ImportKinetoCommand() override;
  // Writes the trace; prints its events and peak of live bytes.
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_REPLAY_H_
