// plugins/common/timeline_writer.h — the memory timeline of a process (layer L5):
// BUCKETALLOC_TIMELINE=PATH[,interval_ms], bucketalloc_timeline_start/stop (C ABI) and
// bucketalloc_torch.start_timeline append one JSON line per device and interval to PATH
// (bucketalloc/timeline.h has the line; docs/operations.md the format).
//
// Owns: `TimelineWriter`, a thread that samples the allocator's metrics every interval (copies of
// figures the pools keep as blocks move, taken under each device's lock: no walk over the blocks;
// nothing runs on the allocation path itself) and appends the lines to the file; and the
// process's one writer (StartTimeline, StopTimeline), which an atexit handler stops with a last line.
// A device appears from its first use; each line lists the OOMs since the device's previous line
// (at most the last 64 between two lines).
// The file: opened O_WRONLY|O_APPEND|O_CREAT|O_NONBLOCK on the starting thread, which then does no
// other I/O (the first line is the thread's): a regular file, a device, or a FIFO that a reader
// has open (one with no reader is refused at once, ENXIO, instead of waiting for one). Every write
// is one write(2) of whole lines on the writer's thread; a FIFO or pipe whose reader does not take
// them is waited for at most kTimelineWriteWaitMs per interval, then the lines are dropped. The
// first write that fails (a full disk, a FIFO's reader gone) is reported once on stderr, naming the
// file and the error; a line cut by it is ended by the next write's newline, so it never runs into
// the next line (ReadTimeline skips it with a warning). Stop and the atexit handler therefore wait
// at most about kTimelineWriteWaitMs.
// Thread-safety: StartTimeline and StopTimeline from any thread (one lock); the writer's thread
// only samples and writes. fork(2): the child has no writer thread.
//
// Example:
//   absl::Status s = StartTimeline("/var/log/gpu0.jsonl", 1000, allocator);  // then, at the end:
//   StopTimeline();
#ifndef BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_
#define BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/timeline.h"

namespace bucketalloc::plugins {

// How long a write waits for a FIFO's or pipe's reader to make room, per interval and for the last
// line at stop.
inline constexpr int kTimelineWriteWaitMs = 1000;

class TimelineWriter {
 public:
  // Opens `path` for appending (created if missing; without waiting, see above) and starts
  // sampling `allocator` every `interval_ms` (1 to 3,600,000); the thread writes a first line at
  // once. InvalidArgument for a bad interval; FailedPrecondition with the OS's reason when the file
  // cannot be opened (naming what is accepted for a FIFO without a reader or a socket).
  // `listed`: per device, the last OOM already written (by a writer this one replaces).
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Start(const std::string& path, int interval_ms,
                                                               const Allocator* allocator,
                                                               std::map<int, std::uint64_t> listed = {});
  ~TimelineWriter();  // writes a last line, stops the thread and closes the file
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  const std::string& path() const { return path_; }
  // Stops the thread after its last line (waiting at most about kTimelineWriteWaitMs for a reader);
  // returns the last OOM each device's lines listed.
  std::map<int, std::uint64_t> Stop();

 private:
  friend absl::Status StartProcessTimeline(const std::string& path, int interval_ms, const Allocator* allocator,
                                           const std::string* report_prefix);
  // The file, opened without waiting: its descriptor, or FailedPrecondition naming why not.
  static absl::StatusOr<int> Open(const std::string& path);
  // `fd` -1: the thread opens `path` first, and prints `report_prefix` and why on stderr if it
  // cannot (then it writes nothing).
  TimelineWriter(std::string path, int fd, int interval_ms, const Allocator* allocator,
                 std::map<int, std::uint64_t> listed, std::string report_prefix = "");
  void Run();
  // On the writer's thread; `last`: the line at stop (its wait for a reader is not cut short).
  void WriteSample(bool last);
  // Writes `lines` (whole lines) with write(2), waiting for room until `deadline` unless stopping
  // (and not `last`).
  void WriteLines(const std::string& lines, std::chrono::steady_clock::time_point deadline, bool last);

  const std::string path_;
  const std::string report_prefix_;
  int fd_;  // -1 until the thread opened it (when it opens it); read by Stop after the join
  const int interval_ms_;
  const Allocator* const allocator_;
  // The writer thread's (then Stop's, after the join):
  std::map<int, std::uint64_t> last_oom_;  // per device: the last OOM a line listed
  bool mid_line_ = false;                  // a failed write cut a line: the next write starts with "\n"
  bool reported_ = false;                  // the first failed write was reported
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;                  // guarded by mu_
  std::atomic<bool> stop_waiting_{false};  // set with stopping_: a wait for a reader ends
  bool stopped_ = false;
  std::thread thread_;
};

// The process's one timeline: starts it (a new file opened first: a bad path or interval leaves one
// running as it was; one it replaces writes its last line, and the new one lists only later OOMs),
// or stops it (nothing when none runs).
absl::Status StartTimeline(const std::string& path, int interval_ms, const Allocator* allocator);
void StopTimeline();
// When BUCKETALLOC_TIMELINE is set, starts (once per process) the process's timeline for
// `allocator`; `who` names the library in the one line printed when it cannot start (a bad value,
// a file that cannot be opened, no thread); nothing else changes then. Called on the allocating
// thread (the first allocation), it opens nothing there: the writer's thread opens the file, and
// reports from there if it cannot.
void StartTimelineFromEnv(const Allocator* allocator, const char* who);

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_
