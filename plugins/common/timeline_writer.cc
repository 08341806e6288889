// plugins/common/timeline_writer.cc — the timeline of a process (plugins/common/timeline_writer.h).
#include "plugins/common/timeline_writer.h"

#include <pthread.h>

#include <cerrno>
#include <chrono>
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
#include "bucketalloc/timeline.h"

namespace bucketalloc::plugins {

absl::StatusOr<std::unique_ptr<TimelineWriter>> TimelineWriter::Start(const std::string& path, int interval_ms,
                                                                      const Allocator* allocator,
                                                                      std::map<int, std::uint64_t> listed) {
  if (interval_ms < 1 || interval_ms > kMaxTimelineIntervalMs) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: timeline interval ", interval_ms,
                                                   " ms is invalid; accepted: 1 to ", kMaxTimelineIntervalMs, " ms"));
  }
  std::FILE* file = std::fopen(path.c_str(), "ae");
  if (file == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: cannot open the timeline ", path, " for appending: ", std::strerror(errno)));
  }
  return std::unique_ptr<TimelineWriter>(new TimelineWriter(path, file, interval_ms, allocator, std::move(listed)));
}

TimelineWriter::TimelineWriter(std::string path, std::FILE* file, int interval_ms, const Allocator* allocator,
                               std::map<int, std::uint64_t> listed)
    : path_(std::move(path)),
      file_(file),
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
    }
    wake_.notify_all();
    thread_.join();
    WriteSample();  // the last line
    std::fclose(file_);
  }
  return last_oom_;
}

TimelineWriter::~TimelineWriter() { Stop(); }

void TimelineWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    WriteSample();
    lock.lock();
    wake_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [this] { return stopping_; });
  }
}

void TimelineWriter::WriteSample() {
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  std::string lines;
  for (const DeviceMetrics& m : allocator_->Metrics()) {
    std::uint64_t& last = last_oom_[m.device];
    TimelineSample s = TimelineSampleOf(m, now, last);
    if (!s.ooms.empty()) last = s.ooms.back().seq;
    absl::StrAppend(&lines, TimelineToJsonLine(s), "\n");
  }
  if (lines.empty()) return;
  std::fwrite(lines.data(), 1, lines.size(), file_);
  std::fflush(file_);
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

absl::Status StartTimeline(const std::string& path, int interval_ms, const Allocator* allocator) {
  static const int registered = std::atexit(&StopTimeline);  // the last line at exit
  (void)registered;
  Slot& slot = TheSlot();
  std::lock_guard<std::mutex> lock(*slot.mu);
  if (interval_ms < 1 || interval_ms > kMaxTimelineIntervalMs) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: timeline interval ", interval_ms,
                                                   " ms is invalid; accepted: 1 to ", kMaxTimelineIntervalMs, " ms"));
  }
  std::FILE* probe = std::fopen(path.c_str(), "ae");  // the new file must open before the old stops
  if (probe == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: cannot open the timeline ", path, " for appending: ", std::strerror(errno)));
  }
  std::fclose(probe);
  // The running one writes its last line; the new one lists only the OOMs after those it listed.
  std::map<int, std::uint64_t> listed = slot.writer != nullptr ? slot.writer->Stop() : std::map<int, std::uint64_t>{};
  slot.writer.reset();
  absl::StatusOr<std::unique_ptr<TimelineWriter>> w = TimelineWriter::Start(path, interval_ms, allocator, listed);
  if (!w.ok()) return w.status();
  slot.writer = std::move(*w);
  return absl::OkStatus();
}

void StopTimeline() {
  Slot& slot = TheSlot();
  std::lock_guard<std::mutex> lock(*slot.mu);
  slot.writer.reset();
}

void StartTimelineFromEnv(const Allocator* allocator, const char* who) {
  const char* spec = std::getenv("BUCKETALLOC_TIMELINE");
  if (spec == nullptr || allocator == nullptr) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    std::string path;
    int interval_ms = 0;
    absl::Status s = ParseTimelineSpec(spec, &path, &interval_ms);
    try {
      if (s.ok()) s = StartTimeline(path, interval_ms, allocator);
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
