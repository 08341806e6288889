// tools/bench_doctor.h — `bucketalloc-bench doctor`: the verdicts of a timeline, a snapshot or a
// trace, with their evidence and first levers (src/harness/operations/doctor.h, docs/operations.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_DOCTOR_H_
#define BUCKETALLOC_TOOLS_BENCH_DOCTOR_H_

#include <memory>

#include "CLI/CLI.hpp"
#include "bench_common.h"

namespace bucketalloc::bench {

class DoctorCommand : public Command {
 public:
  // Adds `doctor` to `app`.
  explicit DoctorCommand(CLI::App& app);
  ~DoctorCommand() override;
  // Prints the verdicts (and writes --json, --html); the input's skipped lines go to stderr. Exits
  // 1 when a device's samples contradict themselves (not a diagnosis), after writing the files.
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_DOCTOR_H_
