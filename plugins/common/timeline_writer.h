// plugins/common/timeline_writer.h — the memory timeline of a process (layer L5):
// BUCKETALLOC_TIMELINE=PATH[,interval_ms], bucketalloc_timeline_start/stop (C ABI) and
// bucketalloc_torch.start_timeline append one JSON line per device and interval to PATH
// (bucketalloc/timeline.h has the line; docs/operations.md the format).
//
// Owns: `TimelineWriter`, a thread that samples the allocator's metrics every interval (copies taken
// under each device's lock, while the fragmentation report walks its blocks: an allocation may wait
// that long; nothing runs on the allocation path itself) and appends the lines,
// flushed, to the file; and the process's one writer (StartTimeline, StopTimeline), which an atexit
// handler stops with a last line. A device appears from its first use; each line lists the OOMs
// since the device's previous line (at most the last 64 between two lines).
// Thread-safety: StartTimeline and StopTimeline from any thread (one lock); the writer's thread
// only samples and writes. fork(2): the child has no writer thread.
//
// Example:
//   absl::Status s = StartTimeline("/var/log/gpu0.jsonl", 1000, allocator);  // then, at the end:
//   StopTimeline();
#ifndef BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_
#define BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_

#include <condition_variable>
#include <cstdint>
#include <cstdio>
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

class TimelineWriter {
 public:
  // Opens `path` for appending (created if missing) and starts sampling `allocator` every
  // `interval_ms` (1 to 3,600,000), writing a first line at once. InvalidArgument for a bad
  // interval; the OS's reason when the file cannot be opened.
  // `listed`: per device, the last OOM already written (by a writer this one replaces).
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Start(const std::string& path, int interval_ms,
                                                               const Allocator* allocator,
                                                               std::map<int, std::uint64_t> listed = {});
  ~TimelineWriter();  // writes a last line, stops the thread and closes the file
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  const std::string& path() const { return path_; }
  // Stops the thread and writes the last line; returns the last OOM each device's lines listed.
  std::map<int, std::uint64_t> Stop();

 private:
  TimelineWriter(std::string path, std::FILE* file, int interval_ms, const Allocator* allocator,
                 std::map<int, std::uint64_t> listed);
  void Run();
  void WriteSample();  // on the writer's thread, or by the destructor after it stopped

  const std::string path_;
  std::FILE* const file_;
  const int interval_ms_;
  const Allocator* const allocator_;
  std::map<int, std::uint64_t> last_oom_;  // per device: the last OOM a line listed
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
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
// a file that cannot be opened, no thread); nothing else changes then.
void StartTimelineFromEnv(const Allocator* allocator, const char* who);

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_TIMELINE_WRITER_H_
