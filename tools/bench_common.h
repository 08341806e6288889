// tools/bench_common.h — what the subcommands of bucketalloc-bench share: the shape of a command
// (`Command`: flags declared when made, run when parsed; tools/bucketalloc_bench.cc's main() makes
// them), their errors and files on output, and for those that replay (replay, min-capacity, compare,
// doctor) the --capacity and --allocator flags' reading and help and the simulated device's flags
// (--device, the cost model).
#ifndef BUCKETALLOC_TOOLS_BENCH_COMMON_H_
#define BUCKETALLOC_TOOLS_BENCH_COMMON_H_

#include <cstddef>
#include <string>

#include <initializer_list>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "harness/replay/replay.h"

namespace bucketalloc::bench {

// Prints "PREFIX: MESSAGE" to stderr (the program, or the program and its subcommand). Returns the
// exit status of a failure (1).
int Fail(const absl::Status& s, const std::string& prefix = "bucketalloc-bench");

// Writes `text` and a newline to `path`; nothing when `path` is empty. A file that cannot be
// written, to its close (a full disk, /dev/full), is said on stderr (prefixed "PREFIX: ") and
// returns false.
bool WriteText(const std::string& path, const std::string& text, const std::string& prefix = "bucketalloc-bench");

// A flag's number from `lo` to `hi`, NaN refused (CLI::Range lets NaN through: a NaN budget read
// as no budget, a NaN interval as no sampling).
CLI::Validator FiniteRange(double lo, double hi);

// Before any work: each of `paths` (empty: not asked for) can be opened for writing (a missing one
// is created and removed again). A path that cannot be is said on stderr and returns false, so a
// long search is not lost to a typo in --json; a write that fails later (a full disk) is still said
// then (WriteText).
bool CheckOutputs(std::initializer_list<std::string> paths, const std::string& prefix = "bucketalloc-bench");

// `rc`, or 1 when the standard output could not be written (flushed here; a full disk, a closed
// pipe, /dev/full), said on stderr: what main returns.
int FinishOutput(int rc, const std::string& prefix = "bucketalloc-bench");

// --capacity's SIZE (e.g. 24GiB); InvalidArgument names the flag and the text.
absl::StatusOr<std::size_t> ParseCapacity(const std::string& text);

// --allocator's help: the policies by name, each with its help.
std::string AllocatorHelp();

// A subcommand of bucketalloc-bench: it declares its flags when made, and runs when parsed.
class Command {
 public:
  virtual ~Command() = default;
  // Whether the command line named this subcommand.
  bool parsed() const { return sub_->parsed(); }
  // Runs it (printing, writing its files). Returns the process's exit status.
  virtual int Run() const = 0;

 protected:
  CLI::App* sub_ = nullptr;
};

// The simulated device's flags of one subcommand: --device (`with_device`: where a replay runs) and
// the driver calls' prices: --costs (a built-in profile or a JSON file, harness/replay/driver_costs.h)
// and --malloc-us, --free-us and --vmm-call-us, which set one price for every size of their calls.
class DeviceFlags {
 public:
  // Adds them to `sub`, in that order (after the subcommand's own flags).
  void AddTo(CLI::App* sub, bool with_device);
  // --device, read (InvalidArgument names the flag).
  absl::StatusOr<harness::ReplayDeviceKind> Device() const;
  // --costs, read, with the prices given on the command line over it (InvalidArgument names the
  // flag, the file's field, or the profiles accepted).
  absl::StatusOr<harness::CostModel> Costs() const;
  // ReplayOptions of `allocator` at `capacity` on this device, at these costs.
  absl::StatusOr<harness::ReplayOptions> Options(const std::string& allocator, std::size_t capacity,
                                                 harness::ReplayDeviceKind device) const;

 private:
  std::string device_name_ = "sim";
  std::string costs_ = "a100-published";
  double malloc_us_ = 0.0, free_us_ = 0.0, vmm_call_us_ = 0.0;
  CLI::Option* malloc_flag_ = nullptr;
  CLI::Option* free_flag_ = nullptr;
  CLI::Option* vmm_flag_ = nullptr;
};

}  // namespace bucketalloc::bench

#endif  // BUCKETALLOC_TOOLS_BENCH_COMMON_H_
