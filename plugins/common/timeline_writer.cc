// plugins/common/timeline_writer.cc — the timeline of a process (plugins/common/timeline_writer.h).
#include "plugins/common/timeline_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bucketalloc/options.h"
#include "bucketalloc/timeline.h"

namespace bucketalloc::plugins {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollSliceMs = 50;  // a wait for a reader looks at stop_waiting_ this often

absl::Status BadInterval(int interval_ms) {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: timeline interval ", interval_ms,
                                                 " ms is invalid; accepted: 1 to ", kMaxTimelineIntervalMs, " ms"));
}

}  // namespace

absl::StatusOr<int> TimelineWriter::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead of waiting for one, and a
  // FIFO's writes never wait for its reader; a regular file is not affected.
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd >= 0) return fd;
  const int error = errno;
  const std::string what = absl::StrCat("bucketalloc: cannot open the timeline ", path, " for appending: ");
  struct stat st {};
  if (error == ENXIO && stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        "it is a FIFO that no process has open for reading (the timeline does not wait for one); start its "
        "reader first; accepted: a regular file, a device, or a FIFO with a reader"));
  }
  if (error == ENXIO && stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "it is a socket; accepted: a regular file, a device, or a FIFO with a reader"));
  }
  return absl::FailedPreconditionError(absl::StrCat(what, std::strerror(error)));
}

absl::StatusOr<std::unique_ptr<TimelineWriter>> TimelineWriter::Start(const std::string& path, int interval_ms,
                                                                      const Allocator* allocator,
                                                                      std::map<int, std::uint64_t> listed) {
  if (interval_ms < 1 || interval_ms > kMaxTimelineIntervalMs) return BadInterval(interval_ms);
  absl::StatusOr<int> fd = Open(path);
  if (!fd.ok()) return fd.status();
  try {
    return std::unique_ptr<TimelineWriter>(new TimelineWriter(path, *fd, interval_ms, allocator, std::move(listed)));
  } catch (...) {
    close(*fd);
    throw;
  }
}

TimelineWriter::TimelineWriter(std::string path, int fd, int interval_ms, const Allocator* allocator,
                               std::map<int, std::uint64_t> listed, std::string report_prefix)
    : path_(std::move(path)),
      report_prefix_(std::move(report_prefix)),
      fd_(fd),
      interval_ms_(interval_ms),
      allocator_(allocator),
      last_oom_(std::move(listed)) {
  thread_ = std::thread([this] { Run(); });
}

std::map<int, std::uint64_t> TimelineWriter::Stop() {
  if (!stopped_) {
    stopped_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      stop_waiting_.store(true);
    }
    wake_.notify_all();
    thread_.join();  // after the last line, which waits at most kTimelineWriteWaitMs
    if (fd_ >= 0) close(fd_);
  }
  return last_oom_;
}

TimelineWriter::~TimelineWriter() { Stop(); }

void TimelineWriter::Run() {
  // A write to a FIFO whose reader is gone fails with EPIPE here instead of killing the process.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  if (fd_ < 0) {  // started on an allocating thread: the file is opened here, not there
    absl::StatusOr<int> fd = Open(path_);
    if (!fd.ok()) {
      std::fprintf(stderr, "%s%s; no timeline is written (nothing else changes)\n", report_prefix_.c_str(),
                   std::string(absl::StripPrefix(fd.status().message(), "bucketalloc: ")).c_str());
      return;
    }
    fd_ = *fd;
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    WriteSample(/*last=*/false);
    lock.lock();
    wake_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [this] { return stopping_; });
  }
  lock.unlock();
  WriteSample(/*last=*/true);
}

void TimelineWriter::WriteSample(bool last) {
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  std::string lines;
  for (const DeviceMetrics& m : allocator_->Metrics()) {
    std::uint64_t& seen = last_oom_[m.device];
    TimelineSample s = TimelineSampleOf(m, now, seen);
    if (!s.ooms.empty()) seen = s.ooms.back().seq;
    absl::StrAppend(&lines, TimelineToJsonLine(s), "\n");
  }
  if (lines.empty()) return;
  const int wait_ms = last ? kTimelineWriteWaitMs : std::min(interval_ms_, kTimelineWriteWaitMs);
  WriteLines(lines, Clock::now() + std::chrono::milliseconds(wait_ms), last);
}

void TimelineWriter::WriteLines(const std::string& whole_lines, Clock::time_point deadline, bool last) {
  // A line cut by a failed write is ended first, so that it cannot run into this one.
  const std::string lines = mid_line_ ? absl::StrCat("\n", whole_lines) : whole_lines;
  std::size_t done = 0;
  std::string error;
  while (done < lines.size()) {
    const ssize_t n = write(fd_, lines.data() + done, lines.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // a FIFO or pipe that is full
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (!last && stop_waiting_.load()) break;  // stopping: the last line comes next
      if (left <= 0) {
        error = "its reader does not read: lines are dropped while it does not";
        break;
      }
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, kPollSliceMs)));
      continue;
    }
    const int e = n < 0 ? errno : ENOSPC;  // a write of 0 bytes: no room
    if (e == EPIPE) {                      // consume the SIGPIPE blocked in Run
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      sigtimedwait(&pipe, nullptr, &zero);
    }
    error = absl::StrCat("cannot write: ", std::strerror(e), "; lines are dropped while writes fail");
    break;
  }
  if (done > 0) mid_line_ = lines[done - 1] != '\n';
  if (!error.empty() && !reported_) {
    reported_ = true;
    std::fprintf(stderr, "bucketalloc: timeline %s: %s (reported once)\n", path_.c_str(), error.c_str());
  }
}

namespace {

// The process's writer and its lock (leaked: the atexit handler uses them). In a child of fork the
// writer's thread does not exist: the child forgets the writer without joining it (its file stays
// the parent's) and gets a free lock.
struct Slot {
  std::mutex* mu = new std::mutex;
  std::unique_ptr<TimelineWriter> writer;
};
Slot& TheSlot() {
  static auto* slot = [] {
    auto* s = new Slot;
    pthread_atfork(nullptr, nullptr, [] {
      TheSlot().mu = new std::mutex;
      (void)TheSlot().writer.release();
    });
    return s;
  }();
  return *slot;
}

}  // namespace

// StartTimeline, or with `report_prefix` (StartTimelineFromEnv) the file opened on the writer's
// thread, which reports a failure after that prefix.
absl::Status StartProcessTimeline(const std::string& path, int interval_ms, const Allocator* allocator,
                                  const std::string* report_prefix) {
  static const int registered = std::atexit(&StopTimeline);  // the last line at exit
  (void)registered;
  Slot& slot = TheSlot();
  std::lock_guard<std::mutex> lock(*slot.mu);
  if (interval_ms < 1 || interval_ms > kMaxTimelineIntervalMs) return BadInterval(interval_ms);
  // The new file must open before the old one stops; opening it does not wait (see the header).
  int fd = -1;
  if (report_prefix == nullptr) {
    absl::StatusOr<int> opened = TimelineWriter::Open(path);
    if (!opened.ok()) return opened.status();
    fd = *opened;
  }
  // The running one writes its last line; the new one lists only the OOMs after those it listed.
  std::map<int, std::uint64_t> listed = slot.writer != nullptr ? slot.writer->Stop() : std::map<int, std::uint64_t>{};
  slot.writer.reset();
  try {
    slot.writer.reset(new TimelineWriter(path, fd, interval_ms, allocator, std::move(listed),
                                         report_prefix != nullptr ? *report_prefix : std::string()));
  } catch (...) {
    if (fd >= 0) close(fd);
    throw;
  }
  return absl::OkStatus();
}

absl::Status StartTimeline(const std::string& path, int interval_ms, const Allocator* allocator) {
  return StartProcessTimeline(path, interval_ms, allocator, nullptr);
}

void StopTimeline() {
  Slot& slot = TheSlot();
  std::lock_guard<std::mutex> lock(*slot.mu);
  slot.writer.reset();
}

void StartTimelineFromEnv(const Allocator* allocator, const char* who) {
  const char* spec = ReadEnv("BUCKETALLOC_TIMELINE");
  if (spec == nullptr || allocator == nullptr) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    std::string path;
    int interval_ms = 0;
    absl::Status s = ParseTimelineSpec(spec, &path, &interval_ms);
    const std::string prefix = absl::StrCat(who, ": BUCKETALLOC_TIMELINE=", spec, ": ");
    try {
      if (s.ok()) s = StartProcessTimeline(path, interval_ms, allocator, &prefix);
    } catch (const std::exception& e) {  // no thread or no memory for it
      s = absl::ResourceExhaustedError(e.what());
    }
    if (!s.ok()) {
      std::fprintf(stderr, "%s: BUCKETALLOC_TIMELINE=%s: %s; no timeline is written (nothing else changes)\n", who,
                   spec, std::string(absl::StripPrefix(s.message(), "bucketalloc: ")).c_str());
    }
  });
}

}  // namespace bucketalloc::plugins
