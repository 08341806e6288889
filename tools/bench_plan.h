// tools/bench_plan.h — `bucketalloc-bench plan`: the card's budget before serving, checked by replay
// (src/harness/planning/planner.h, docs/planner.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_PLAN_H_
#define BUCKETALLOC_TOOLS_BENCH_PLAN_H_

#include <memory>

#include "CLI/CLI.hpp"

namespace bucketalloc::bench {

class PlanCommand {
 public:
  // Adds `plan` to `app`.
  explicit PlanCommand(CLI::App& app);
  ~PlanCommand();
  bool parsed() const;
  // Prints the plan (and writes --json, --html). Returns the process's exit status.
  int Run() const;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
  CLI::App* plan_ = nullptr;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_PLAN_H_
