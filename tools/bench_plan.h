// tools/bench_plan.h — `bucketalloc-bench plan`: the card's budget before serving, checked by replay
// (src/harness/planning/planner.h, docs/planner.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_PLAN_H_
#define BUCKETALLOC_TOOLS_BENCH_PLAN_H_

#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "bench_common.h"

namespace bucketalloc::bench {

// `s`, when it is an error of the planner about one of its options (harness::PlanOptionOf), with
// the option named as this command line's flag ("max_model_len 1: ..." becomes "--max-model-len 1:
// ..."); any other status as it is. Also for `generate serving`'s --dtype and --tensor-parallel.
absl::Status NamingTheFlag(const absl::Status& s);

class PlanCommand : public Command {
 public:
  // Adds `plan` to `app`.
  explicit PlanCommand(CLI::App& app);
  ~PlanCommand() override;
  // Prints the plan (and writes --json, --html).
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_PLAN_H_
