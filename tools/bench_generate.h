// tools/bench_generate.h — `bucketalloc-bench generate serving`: the serving workload generator's
// command line (src/harness/workload/serving.h, docs/harness.md).
#ifndef BUCKETALLOC_TOOLS_BENCH_GENERATE_H_
#define BUCKETALLOC_TOOLS_BENCH_GENERATE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "bench_common.h"

namespace bucketalloc::bench {

// Checked numeric flags, shared by `generate serving` and `plan`. CLI11's own conversion saturates
// (strtoll: 99999999999999999999 becomes 2^63 - 1), wraps unsigned values (-1 becomes 2^64 - 1),
// reads a leading 0 as octal and 1e-999 as 0; these transforms run first and make each of those an
// error that CLI11 prints as "--flag: VALUE is ...; accepted ACCEPTED".
//
// A whole number in decimal from `min` to `max`, rewritten in plain decimal for CLI11 to read.
CLI::Validator WholeNumberIn(std::int64_t min, std::int64_t max, const std::string& accepted);
// Any unsigned 64-bit whole number in decimal (a seed).
CLI::Validator Unsigned64();
// A real number that a double holds without overflow or underflow (the command checks its range).
CLI::Validator RealNumber(const std::string& accepted);

class GenerateCommand : public Command {
 public:
  // Adds `generate` (with its `serving` subcommand) to `app`.
  explicit GenerateCommand(CLI::App& app);
  ~GenerateCommand() override;
  // Writes the trace and its meta file; prints a summary.
  int Run() const override;

 private:
  struct Flags;
  std::unique_ptr<Flags> flags_;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_GENERATE_H_
