// The C ABI (plugins/c_abi/c_abi.cc) in process, on the simulated device. ctest runs every test in
// its own process, so each starts with no allocator and configures its own.
#include "bucketalloc/bucketalloc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bucketalloc/timeline.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace {

cudaStream_t StreamOf(int i) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(0x1000 + i)); }

std::string Text(ssize_t (*fn)(int, char*, size_t), int device) {
  std::vector<char> buf(256);
  ssize_t n = fn(device, buf.data(), buf.size());
  EXPECT_GE(n, 0) << bucketalloc_last_error();
  if (n >= static_cast<ssize_t>(buf.size())) {
    buf.resize(static_cast<std::size_t>(n) + 1);
    EXPECT_EQ(fn(device, buf.data(), buf.size()), n);
  }
  return std::string(buf.data());
}

nlohmann::json Stats() { return nlohmann::json::parse(Text(bucketalloc_stats_json, 0)); }

class CAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(bucketalloc_is_initialized(), 0) << "each test runs in a fresh process";
    ASSERT_EQ(bucketalloc_configure("backend:sim,capacity:256MiB,debug_check_invariants:true"), 0)
        << bucketalloc_last_error();
  }
  void TearDown() override { EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error(); }
};

// No driver here (the toolkit's libcuda.so is a link stub, never loaded): the driver's version is
// -1 with the loader's reason; with a driver, a CUDA 12 or newer version. The headers' version is
// the toolkit's this library was compiled with.
TEST(CAbiVersionTest, CudaVersionsAreReportedWithOrWithoutADriver) {
  const int driver = bucketalloc_cuda_driver_version();
  if (driver == -1) {
    EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "no CUDA driver: cannot load libcuda.so.1"))
        << bucketalloc_last_error();
  } else {
    EXPECT_GE(driver, 12000);
  }
  EXPECT_GE(bucketalloc_cuda_headers_version(), 12000);
  EXPECT_EQ(bucketalloc_cuda_headers_version() % 10, 0);  // 1000 * major + 10 * minor
  EXPECT_STREQ(bucketalloc_version(), BUCKETALLOC_TEST_VERSION);
}

TEST_F(CAbiTest, MallocFreeAndStatsMatchTheOperations) {
  void* p = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  void* q = bucketalloc_malloc(1000, 0, StreamOf(1));
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(bucketalloc_is_initialized(), 1);
  nlohmann::json s = Stats();
  EXPECT_EQ(s["allocation.all.current"], 2);
  EXPECT_EQ(s["requested_bytes.all.current"], (3 << 20) + 1000);
  EXPECT_GE(s["allocated_bytes.all.current"].get<std::int64_t>(), (3 << 20) + 1000);
  EXPECT_GT(s["reserved_bytes.all.current"].get<std::int64_t>(), 0);
  bucketalloc_free(p, 3 << 20, 0, StreamOf(1));
  bucketalloc_free(q, -1, 0, StreamOf(1));  // size unknown
  s = Stats();
  EXPECT_EQ(s["allocation.all.current"], 0);
  EXPECT_EQ(s["allocated_bytes.all.current"], 0);
  EXPECT_EQ(s["allocated_bytes.all.peak"].get<std::int64_t>(), (3 << 20) + 1024);
  ASSERT_EQ(bucketalloc_reset_peak_stats(0), 0);
  EXPECT_EQ(Stats()["allocated_bytes.all.peak"], 0);
  bucketalloc_empty_cache();
  EXPECT_EQ(Stats()["reserved_bytes.all.current"], 0);
}

TEST_F(CAbiTest, SizeZeroAndNegativeSizes) {
  EXPECT_EQ(bucketalloc_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(bucketalloc_malloc(-5, 0, nullptr), nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "size -5 on device 0 is negative"))
      << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_malloc(16, 7, nullptr), nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "device 7 is invalid")) << bucketalloc_last_error();
  bucketalloc_free(nullptr, 0, 0, nullptr);  // a no-op
}

TEST_F(CAbiTest, BadFreesSetAClearErrorAndChangeNothing) {
  void* p = bucketalloc_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const nlohmann::json before = Stats();
  bucketalloc_free(p, 4000, 0, nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "size mismatch")) << bucketalloc_last_error();
  int local = 0;
  bucketalloc_free(&local, 4, 0, nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "not allocated by bucketalloc")) << bucketalloc_last_error();
  nlohmann::json after = Stats();
  EXPECT_EQ(after["allocated_bytes.all.current"], before["allocated_bytes.all.current"]);
  EXPECT_EQ(after["num_invalid_frees"], 2);
  bucketalloc_free(p, 4096, 0, nullptr);
  bucketalloc_free(p, 4096, 0, nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "double free")) << bucketalloc_last_error();
  EXPECT_EQ(Stats()["allocation.all.current"], 0);
}

TEST_F(CAbiTest, RecordStreamDelaysReuseUntilTheOtherStreamIsDone) {
  void* p = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  bucketalloc_record_stream(p, StreamOf(2));
  ASSERT_EQ(bucketalloc_sim_enqueue_work(0, StreamOf(2)), 0);
  bucketalloc_free(p, 3 << 20, 0, StreamOf(1));
  void* q = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  EXPECT_NE(q, p);
  ASSERT_EQ(bucketalloc_sim_complete_work(0, StreamOf(2)), 0);
  bucketalloc_free(q, 3 << 20, 0, StreamOf(1));
  void* r = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  void* t = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  EXPECT_TRUE(r == p || t == p);
  bucketalloc_free(r, 3 << 20, 0, StreamOf(1));
  bucketalloc_free(t, 3 << 20, 0, StreamOf(1));
  int local = 0;
  bucketalloc_record_stream(&local, StreamOf(2));
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "not a live allocation")) << bucketalloc_last_error();
}

TEST_F(CAbiTest, MemoryFractionCapsTheDeviceAndAnOomSaysWhy) {
  bucketalloc_set_memory_fraction(1.5, 0);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: a number in (0, 1]")) << bucketalloc_last_error();
  bucketalloc_set_memory_fraction(0.001, 0);  // 16 GiB simulated card: ~16 MiB
  EXPECT_EQ(bucketalloc_malloc(64 << 20, 0, nullptr), nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "capacity")) << bucketalloc_last_error();
  EXPECT_EQ(Stats()["num_ooms"], 1);
  EXPECT_TRUE(absl::StrContains(Text(bucketalloc_last_oom_report, 0), "capacity"));
}

TEST_F(CAbiTest, MallocOrThrowThrowsBadAllocWithTheReportAndStaysConsistent) {
  bucketalloc_set_memory_fraction(0.001, 0);
  try {
    bucketalloc_malloc_or_throw(64 << 20, 0, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const std::bad_alloc& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "out of memory on device 0: capacity")) << e.what();
  }
  EXPECT_EQ(bucketalloc_malloc_or_throw(0, 0, nullptr), nullptr);  // size 0 is no failure
  void* p = bucketalloc_malloc_or_throw(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  bucketalloc_free(p, 4096, 0, nullptr);
}

TEST_F(CAbiTest, TextFunctionsReportTheLengthTheyNeed) {
  char small[8];
  const ssize_t n = bucketalloc_stats_json(0, small, sizeof small);
  ASSERT_GT(n, static_cast<ssize_t>(sizeof small));
  EXPECT_EQ(std::strlen(small), sizeof small - 1) << "truncated and NUL-terminated";
  EXPECT_EQ(bucketalloc_stats_json(0, nullptr, 0), n);
  EXPECT_EQ(bucketalloc_stats_json(0, nullptr, 10), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "buffer is NULL")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_stats_json(3, small, sizeof small), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "device 3 is invalid")) << bucketalloc_last_error();
  for (auto fn : {bucketalloc_fragmentation_json, bucketalloc_snapshot_json}) {
    EXPECT_NO_THROW(nlohmann::json::parse(Text(fn, 0)));
  }
  EXPECT_TRUE(absl::StrContains(Text(bucketalloc_summary, 0), "allocated"));
  EXPECT_EQ(Text(bucketalloc_last_oom_report, 0), "");
  std::vector<char> conf(512);
  ASSERT_GT(bucketalloc_config_string(conf.data(), conf.size()), 0);
  EXPECT_TRUE(absl::StrContains(conf.data(), "backend:sim")) << conf.data();
}

// The metrics text: empty before the allocator exists (asking does not create it), then every
// created device's series, OOMs counted by cause.
TEST_F(CAbiTest, MetricsTextNeverCreatesTheAllocatorAndCountsOomsByCause) {
  EXPECT_EQ(bucketalloc_metrics_text(nullptr, 0), 0);
  EXPECT_EQ(bucketalloc_is_initialized(), 0);
  void* p = bucketalloc_malloc(3 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(bucketalloc_malloc(ssize_t{1} << 30, 0, nullptr), nullptr);  // over the 256 MiB cap
  const ssize_t n = bucketalloc_metrics_text(nullptr, 0);
  ASSERT_GT(n, 0) << bucketalloc_last_error();
  std::vector<char> buf(static_cast<std::size_t>(n) + 1);
  ASSERT_EQ(bucketalloc_metrics_text(buf.data(), buf.size()), n);
  const std::string text(buf.data());
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_allocated_bytes{device=\"0\",pool=\"all\"} 3145728\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_ooms_total{device=\"0\",cause=\"capacity\"} 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "bucketalloc_ooms_total{device=\"0\",cause=\"fragmentation\"} 0\n"));
  EXPECT_EQ(Stats()["num_ooms_capacity"], 1);
  EXPECT_EQ(bucketalloc_metrics_text(nullptr, 5), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "buffer is NULL")) << bucketalloc_last_error();
  bucketalloc_free(p, 3 << 20, 0, nullptr);
}

// The timeline: lines every interval (the allocator created by the start), each OOM listed once,
// a last line at stop; a bad interval or path is refused and changes nothing.
TEST_F(CAbiTest, TimelineLinesListEachOomOnceAndStopWritesTheLast) {
  const std::string path = ::testing::TempDir() + "/c_abi_timeline.jsonl";
  std::remove(path.c_str());
  EXPECT_EQ(bucketalloc_timeline_start(path.c_str(), 0), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: 1 to 3600000 ms")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_timeline_start("/nonexistent-dir/t.jsonl", 100), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "cannot open the timeline")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_timeline_start(nullptr, 100), -1);
  ASSERT_EQ(bucketalloc_timeline_start(path.c_str(), 20), 0) << bucketalloc_last_error();
  void* p = bucketalloc_malloc(3 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(bucketalloc_malloc(ssize_t{1} << 30, 0, nullptr), nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  ASSERT_EQ(bucketalloc_timeline_stop(), 0);
  EXPECT_EQ(bucketalloc_timeline_stop(), 0) << "nothing to stop: no error";
  std::FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  int lines = 0, listed = 0;
  nlohmann::json last;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    last = nlohmann::json::parse(line.begin(), line.end());
    ++lines;
    listed += static_cast<int>(last["ooms"].size());
    EXPECT_EQ(last["device"], 0);
  }
  EXPECT_GE(lines, 3) << text;
  EXPECT_EQ(listed, 1) << text;
  EXPECT_EQ(last["ooms_total"]["capacity"], 1);
  EXPECT_EQ(last["allocated_bytes"], 3 << 20);
  bucketalloc_free(p, 3 << 20, 0, nullptr);
}

std::string ReadAll(const std::string& path) {
  std::string text;
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// Runs `body` in a child (its stderr into `stderr_path`) that SIGALRM kills after `seconds`, and
// returns its wait status: a call that hangs fails the test instead of hanging it.
template <typename F>
int InChild(int seconds, const std::string& stderr_path, F&& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(static_cast<unsigned>(seconds));
    const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(err, 2);
    _exit(body());
  }
  int status = -1;
  waitpid(pid, &status, 0);
  return status;
}

// Issue 27 (1): BUCKETALLOC_TIMELINE naming a FIFO without a reader made the first allocation wait
// forever (a blocking fopen under the timeline's lock). It is refused at once, saying why.
TEST_F(CAbiTest, TimelineOnAFifoWithoutAReaderIsRefusedAtOnceNotWaitedFor) {
  const std::string fifo = ::testing::TempDir() + "/c_abi_no_reader.fifo";
  const std::string err = ::testing::TempDir() + "/c_abi_no_reader.stderr";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int status = InChild(5, err, [&] {
    setenv("BUCKETALLOC_TIMELINE", fifo.c_str(), 1);
    void* p = bucketalloc_malloc(1000, 0, nullptr);  // creates the allocator and its observers
    if (p == nullptr) return 2;
    if (bucketalloc_timeline_start(fifo.c_str(), 10) != -1) return 3;
    std::fprintf(stderr, "start: %s\n", bucketalloc_last_error());
    return bucketalloc_timeline_stop() == 0 ? 0 : 4;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status << " (SIGALRM 14: it hung)";
  const std::string text = ReadAll(err);
  EXPECT_TRUE(
      absl::StrContains(text, absl::StrCat("bucketalloc: BUCKETALLOC_TIMELINE=", fifo, ": cannot open the timeline ",
                                           fifo, " for appending: it is a FIFO that no process has open for reading")))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "start: bucketalloc: cannot open the timeline")) << text;
  EXPECT_TRUE(absl::StrContains(text, "accepted: a regular file, a device, or a FIFO with a reader")) << text;
  std::remove(fifo.c_str());
}

// Issue 27 (1): a FIFO whose reader stops reading blocked the writer's thread in fwrite, and
// timeline_stop (and exit) waited for it forever. Stop returns within about a second, the stall is
// reported once, and what the reader gets is whole lines.
TEST_F(CAbiTest, TimelineStopReturnsWhenTheFifosReaderStopsReading) {
  const std::string fifo = ::testing::TempDir() + "/c_abi_stalled.fifo";
  const std::string err = ::testing::TempDir() + "/c_abi_stalled.stderr";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // open, and never read until the end
  ASSERT_GE(reader, 0);
  const int status = InChild(5, err, [&] {
    if (bucketalloc_timeline_start(fifo.c_str(), 1) != 0) return 2;
    void* p = bucketalloc_malloc(1000, 0, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the FIFO fills (64 KiB)
    const auto start = std::chrono::steady_clock::now();
    bucketalloc_timeline_stop();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "stop took %.3f s\n", took);
    bucketalloc_free(p, 1000, 0, nullptr);
    return took < 2.5 ? 0 : 3;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status << " (SIGALRM 14: it hung)";
  const std::string text = ReadAll(err);
  EXPECT_TRUE(absl::StrContains(text, absl::StrCat("bucketalloc: timeline ", fifo, ": its reader does not read")))
      << text;
  EXPECT_EQ(text.find("bucketalloc: timeline "), text.rfind("bucketalloc: timeline ")) << "reported once: " << text;
  std::string lines;
  char buf[4096];
  for (ssize_t n; (n = read(reader, buf, sizeof buf)) > 0;) lines.append(buf, static_cast<std::size_t>(n));
  close(reader);
  EXPECT_GT(lines.size(), 16384u);
  EXPECT_TRUE(absl::EndsWith(lines, "\n"));
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<bucketalloc::TimelineSample>> samples = bucketalloc::ReadTimeline(lines, fifo, &warnings);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_GT(samples->size(), 10u);
  EXPECT_TRUE(warnings.empty()) << "whole lines only: " << warnings[0];
  std::remove(fifo.c_str());
}

// Issue 27 (6): write errors were ignored: a full disk reported nothing. The first one is reported
// once, naming the file and the error.
TEST_F(CAbiTest, TimelineWriteErrorsAreReportedOnceNamingTheFile) {
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(bucketalloc_timeline_start("/dev/full", 5), 0) << bucketalloc_last_error();
  void* p = bucketalloc_malloc(1000, 0, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(bucketalloc_timeline_stop(), 0);
  const std::string text = ::testing::internal::GetCapturedStderr();
  const std::string report = "bucketalloc: timeline /dev/full: cannot write: No space left on device";
  EXPECT_TRUE(absl::StrContains(text, report)) << text;
  EXPECT_EQ(text.find(report), text.rfind(report)) << "once: " << text;
  bucketalloc_free(p, 1000, 0, nullptr);
}

// Issue 27 (6): a line cut by a failed write ran into the next one, and the reader refused the
// whole file. RLIMIT_FSIZE cuts the file's second line (EFBIG); once writes succeed again the next
// line starts on a line of its own, and the reader skips only the cut one, with a warning.
TEST_F(CAbiTest, ALineCutByAFailedWriteNeverRunsIntoTheNext) {
  const std::string path = ::testing::TempDir() + "/c_abi_cut.jsonl";
  const std::string err = ::testing::TempDir() + "/c_abi_cut.stderr";
  std::remove(path.c_str());
  constexpr rlim_t kLimit = 1000;  // a line is about 600 bytes
  const int status = InChild(5, err, [&] {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    const rlim_t unlimited = limit.rlim_cur;
    limit.rlim_cur = kLimit;
    setrlimit(RLIMIT_FSIZE, &limit);
    // Waits (at most 2 s: a loaded or sanitized run is slow) until the file holds more than
    // `bytes`; false when it never does.
    auto grows_past = [&](std::size_t bytes) {
      for (int i = 0; i < 400; ++i) {
        struct stat st {};
        if (stat(path.c_str(), &st) == 0 && static_cast<std::size_t>(st.st_size) > bytes) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return false;
    };
    if (bucketalloc_timeline_start(path.c_str(), 5) != 0) return 2;
    void* p = bucketalloc_malloc(1000, 0, nullptr);
    if (!grows_past(kLimit - 1)) return 3;  // a line was cut at the limit
    limit.rlim_cur = unlimited;
    setrlimit(RLIMIT_FSIZE, &limit);
    if (!grows_past(kLimit + 2 * 700)) return 4;  // whole lines again after it
    bucketalloc_timeline_stop();
    bucketalloc_free(p, 1000, 0, nullptr);
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  const std::string report = ReadAll(err);
  EXPECT_TRUE(absl::StrContains(report, absl::StrCat("bucketalloc: timeline ", path, ": cannot write: File too large")))
      << report;
  const std::string text = ReadAll(path);
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<bucketalloc::TimelineSample>> samples = bucketalloc::ReadTimeline(text, path, &warnings);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_GE(samples->size(), 3u) << text;
  ASSERT_EQ(warnings.size(), 1u) << "only the cut line: " << text;
  EXPECT_TRUE(absl::StrContains(warnings[0], "not a timeline sample")) << warnings[0];
  std::size_t cut = 0;  // the damaged line is the cut one, shorter than a whole line
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (!nlohmann::json::accept(line.begin(), line.end())) cut = line.size();
  }
  EXPECT_GT(cut, 0u);
  EXPECT_LT(cut, kLimit) << text;
}

// Connects to 127.0.0.1 (or ::1) on `port` and returns the answer to GET /metrics (3 s at most).
std::string Scrape(int port) {
  for (int family : {AF_INET, AF_INET6}) {
    const int fd = socket(family, SOCK_STREAM, 0);
    const timeval timeout{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_storage a{};
    socklen_t len = 0;
    if (family == AF_INET) {
      auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
      v4->sin_family = AF_INET;
      v4->sin_port = htons(static_cast<std::uint16_t>(port));
      v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof *v4;
    } else {
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(static_cast<std::uint16_t>(port));
      v6->sin6_addr = in6addr_loopback;
      len = sizeof *v6;
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
      close(fd);
      continue;
    }
    const std::string request = "GET /metrics HTTP/1.1\r\n\r\n";
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    close(fd);
    return out;
  }
  return "connect failed";
}

// Issue 27 (14): port 0 picked a port nobody could learn. It is printed (one line) and given by
// bucketalloc_metrics_port, which says why when there is none and never creates the allocator.
TEST_F(CAbiTest, MetricsPortSaysWhyUntilTheServerListensAndNeverCreatesTheAllocator) {
  unsetenv("BUCKETALLOC_METRICS_ADDR");
  EXPECT_EQ(bucketalloc_metrics_port(), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "BUCKETALLOC_METRICS_ADDR is not set"))
      << bucketalloc_last_error();
  setenv("BUCKETALLOC_METRICS_ADDR", "127.0.0.1:0", 1);
  EXPECT_EQ(bucketalloc_metrics_port(), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "starts with the allocator, at the first allocation"))
      << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_is_initialized(), 0) << "asking never creates the allocator";
  ::testing::internal::CaptureStderr();
  void* p = bucketalloc_malloc(1000, 0, nullptr);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  const int port = bucketalloc_metrics_port();
  ASSERT_GT(port, 0) << bucketalloc_last_error();
  EXPECT_TRUE(absl::StrContains(
      said, absl::StrCat("bucketalloc: BUCKETALLOC_METRICS_ADDR=127.0.0.1:0: serving metrics on port ", port,
                         " (http://127.0.0.1:", port, "/metrics)\n")))
      << said;
  EXPECT_TRUE(absl::StrContains(Scrape(port), "bucketalloc_allocated_bytes{device=\"0\",pool=\"all\"}"));
  // A child of fork has no server, and says so; the parent's still answers.
  const int status = InChild(5, ::testing::TempDir() + "/c_abi_port_child.stderr", [] {
    return bucketalloc_metrics_port() == -1 && absl::StrContains(bucketalloc_last_error(), "child of fork") ? 0 : 1;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(absl::StartsWith(Scrape(port), "HTTP/1.1 200 OK"));
  unsetenv("BUCKETALLOC_METRICS_ADDR");
  EXPECT_EQ(bucketalloc_metrics_port(), port) << "the server started stays";
  bucketalloc_free(p, 1000, 0, nullptr);
}

// Issue 27 (4): a host name is resolved on the server's thread: the first allocation does not
// wait for it, and the port comes once it is bound.
TEST_F(CAbiTest, MetricsPortOfAHostNameComesFromTheServersThread) {
  setenv("BUCKETALLOC_METRICS_ADDR", "localhost:0", 1);
  void* p = bucketalloc_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  int port = -1;
  for (int i = 0; i < 500 && (port = bucketalloc_metrics_port()) < 0; ++i) {
    EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "still resolving the host name localhost"))
        << bucketalloc_last_error();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(port, 0) << bucketalloc_last_error();
  EXPECT_TRUE(absl::StartsWith(Scrape(port), "HTTP/1.1 200 OK"));
  unsetenv("BUCKETALLOC_METRICS_ADDR");
  bucketalloc_free(p, 1000, 0, nullptr);
}

TEST_F(CAbiTest, SnapshotAndHistoryThroughTheAbi) {
  ASSERT_EQ(bucketalloc_record_history(1, 3), 0);
  void* p = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  bucketalloc_free(p, 3 << 20, 0, StreamOf(1));
  nlohmann::json snap = nlohmann::json::parse(Text(bucketalloc_snapshot_json, -1));
  ASSERT_EQ(snap["device_traces"].size(), 1u);
  ASSERT_EQ(snap["device_traces"][0].size(), 3u) << "a ring of 3 keeps the last 3 of 4 entries";
  EXPECT_EQ(snap["device_traces"][0][0]["action"], "alloc");
  EXPECT_EQ(snap["device_traces"][0][2]["action"], "free_completed");
  EXPECT_EQ(snap["segments"].size(), 1u);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["state"], "inactive");
  EXPECT_EQ(bucketalloc_record_history(1, 0), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "max_entries 0 is invalid")) << bucketalloc_last_error();
}

TEST_F(CAbiTest, BaseAllocIsTheHoldingSegment) {
  void* p = bucketalloc_malloc(3 << 20, 0, nullptr);
  size_t size = 0;
  void* base = bucketalloc_base_alloc(p, &size);
  ASSERT_NE(base, nullptr) << bucketalloc_last_error();
  EXPECT_LE(base, p);
  EXPECT_LT(static_cast<char*>(p), static_cast<char*>(base) + size);
  EXPECT_EQ(bucketalloc_base_alloc(static_cast<char*>(p) + 1, &size), nullptr);
  bucketalloc_free(p, 3 << 20, 0, nullptr);
}

// A null pointer once a segment exists: it was taken for a live block of device 0 (the live map's
// empty key is 0) and the registry lookup stepped before its first range.
TEST_F(CAbiTest, BaseAllocOfNullIsAClearError) {
  void* p = bucketalloc_malloc(3 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  size_t size = 123;
  EXPECT_EQ(bucketalloc_base_alloc(nullptr, &size), nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "is not a live allocation")) << bucketalloc_last_error();
  EXPECT_EQ(size, 123u);
  bucketalloc_free(p, 3 << 20, 0, nullptr);
}

TEST_F(CAbiTest, ConfigureIsRefusedOnceTheAllocatorExistsUnlessItIsTheSame) {
  ASSERT_EQ(bucketalloc_configure("no_such_key:1"), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "no_such_key")) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_device_count(), 1);
  EXPECT_EQ(bucketalloc_configure("backend:sim,capacity:256MiB,debug_check_invariants:true"), 0);
  EXPECT_EQ(bucketalloc_configure("backend:sim,capacity:1GiB"), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "already exists")) << bucketalloc_last_error();
}

TEST_F(CAbiTest, ACaptureGrowsItsPoolAndEmptyCacheDuringCaptureIsRefused) {
  ASSERT_EQ(bucketalloc_capture_begin(0, 42, StreamOf(1)), 0) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_sim_set_capturing(0, StreamOf(1), 1), 0);
  void* p = bucketalloc_malloc(3 << 20, 0, StreamOf(1));  // a miss grows the graph's pool
  ASSERT_NE(p, nullptr) << bucketalloc_last_error();
  const std::int64_t reserved = Stats()["reserved_bytes.all.current"];
  bucketalloc_empty_cache();
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "empty_cache on device 0 during CUDA graph capture"))
      << bucketalloc_last_error();
  EXPECT_EQ(Stats()["reserved_bytes.all.current"], reserved) << "nothing released during capture";
  bucketalloc_free(p, 3 << 20, 0, StreamOf(1));  // back to the graph's pool
  void* q = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  EXPECT_EQ(q, p) << "reused inside the pool, in the same capture";
  ASSERT_EQ(bucketalloc_sim_set_capturing(0, StreamOf(1), 0), 0);
  ASSERT_EQ(bucketalloc_capture_end(0, 42), 0) << bucketalloc_last_error();
  bucketalloc_free(q, 3 << 20, 0, StreamOf(1));
  ASSERT_EQ(bucketalloc_release_pool(0, 42), 0);
  EXPECT_EQ(Stats()["active_bytes.all.current"], 0);
  EXPECT_EQ(Stats()["num_capture_refusals"], 0);
  bucketalloc_empty_cache();
  EXPECT_EQ(Stats()["reserved_bytes.all.current"], 0);
  EXPECT_EQ(bucketalloc_capture_end(0, 42), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "no such pool is in use")) << bucketalloc_last_error();
}

TEST_F(CAbiTest, PyTorchGraphPoolHooksKeepTheGraphsBlocksInItsPool) {
  // What PyTorch's CUDAGraph.capture_begin / capture_end / reset call, with a std::function filter.
  const bucketalloc_mempool_id pool{0, 7};
  bucketalloc_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t s) { return s == StreamOf(1); });
  void* other = bucketalloc_malloc(3 << 20, 0, StreamOf(2));  // another stream: the device's own pools
  ASSERT_NE(other, nullptr) << bucketalloc_last_error();
  void* g = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  ASSERT_NE(g, nullptr) << bucketalloc_last_error();
  bucketalloc_torch_end_allocate_to_pool(0, pool);
  bucketalloc_free(g, 3 << 20, 0, StreamOf(1));
  bucketalloc_free(other, 3 << 20, 0, StreamOf(2));
  void* eager = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  EXPECT_NE(eager, g) << "the graph's block stays in its pool while the graph lives";
  bucketalloc_free(eager, 3 << 20, 0, StreamOf(1));
  // A second graph sharing the pool reuses the first one's block.
  bucketalloc_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t s) { return s == StreamOf(1); });
  void* g2 = bucketalloc_malloc(3 << 20, 0, StreamOf(1));
  EXPECT_EQ(g2, g);
  bucketalloc_torch_end_allocate_to_pool(0, pool);
  bucketalloc_free(g2, 3 << 20, 0, StreamOf(1));
  bucketalloc_torch_release_pool(0, pool);
  bucketalloc_torch_release_pool(0, pool);
  bucketalloc_empty_cache();  // both graphs gone: the pool's memory goes back
  EXPECT_EQ(Stats()["reserved_bytes.all.current"], 0);
  EXPECT_STREQ(bucketalloc_last_error(), "");
}

// fork(2) while four threads are inside the allocator: every child allocates, frees and finds the
// invariants true (before the pthread_atfork handlers, 4 of 10 children deadlocked on a device
// lock a parent thread held at the fork).
TEST_F(CAbiTest, ForkWhileOtherThreadsAllocateGivesWorkingChildren) {
  BUCKETALLOC_SKIP_BUSY_FORK_UNDER_ASAN();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<void*, ssize_t>> held;
      for (unsigned i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const ssize_t size = static_cast<ssize_t>(((i * 2654435761u + t) % 4096) * 512 + 1);
        if (void* p = bucketalloc_malloc(size, 0, StreamOf(t)); p != nullptr) held.emplace_back(p, size);
        if (held.size() > 8) {
          bucketalloc_free(held.front().first, held.front().second, 0, StreamOf(t));
          held.erase(held.begin());
        }
      }
      for (const auto& [p, size] : held) bucketalloc_free(p, size, 0, StreamOf(t));
    });
  }
  int ok = 0;
  for (int child = 0; child < 10; ++child) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(30);  // a hung child dies of SIGALRM
      void* p = bucketalloc_malloc(5 << 20, 0, StreamOf(9));
      if (p == nullptr) _exit(2);
      bucketalloc_free(p, 5 << 20, 0, StreamOf(9));
      _exit(bucketalloc_check_invariants(0) == 0 ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << child << ": wait status " << status << " (SIGALRM is 14: it hung)";
    ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok, 10);
}

// Tenants through the ABI: a bound stream and the thread's tenant route requests, the OOM names the
// tenant, a cap lowered at run time holds, the figures come as JSON, and bad names are clear errors.
TEST(CAbiTenantsTest, BindingsCapsOomsAndStats) {
  ASSERT_EQ(
      bucketalloc_configure("backend:sim,capacity:256MiB,debug_check_invariants:true,tenants:[short:32MiB,long:16MiB]"),
      0)
      << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_bind_stream(StreamOf(2), "long"), 0) << bucketalloc_last_error();
  std::vector<void*> held;
  void* p = nullptr;
  while ((p = bucketalloc_malloc(4 << 20, 0, StreamOf(2))) != nullptr) {
    held.push_back(p);
    ASSERT_LE(held.size(), 4u) << "the long tenant's 16 MiB cap did not hold";
  }
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "for tenant 'long' (cap 16.00 MiB)"))
      << bucketalloc_last_error();
  EXPECT_TRUE(absl::StrContains(Text(bucketalloc_last_oom_report, 0), "for tenant 'long'"));
  ASSERT_EQ(bucketalloc_set_thread_tenant("short"), 0);
  std::vector<char> name(16);
  ASSERT_EQ(bucketalloc_thread_tenant(name.data(), name.size()), 5);
  EXPECT_STREQ(name.data(), "short");
  void* s = bucketalloc_malloc(12 << 20, 0, StreamOf(1));  // a segment of its own
  ASSERT_NE(s, nullptr) << bucketalloc_last_error();
  nlohmann::json t = nlohmann::json::parse(Text(bucketalloc_tenant_stats_json, 0))["tenants"];
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0]["tenant"], "default");
  EXPECT_EQ(t[1]["tenant"], "short");
  EXPECT_EQ(t[1]["live_allocations"], 1);
  EXPECT_EQ(t[2]["tenant"], "long");
  EXPECT_EQ(t[2]["ooms"], 1);
  EXPECT_EQ(t[2]["live_allocations"], static_cast<int>(held.size()));
  // Lowering "short" below what it holds live keeps the block and refuses growth.
  ASSERT_EQ(bucketalloc_set_tenant_cap("short", 4 << 20), 0) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_malloc(12 << 20, 0, StreamOf(1)), nullptr);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "for tenant 'short' (cap 4.00 MiB)"))
      << bucketalloc_last_error();
  // Bad input: an error naming what is accepted, nothing changed.
  EXPECT_EQ(bucketalloc_bind_stream(StreamOf(3), "medium"), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: default, short, long"))
      << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_set_thread_tenant(nullptr), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "NULL")) << bucketalloc_last_error();
  EXPECT_EQ(bucketalloc_set_tenant_cap("long", 1), -1);
  EXPECT_TRUE(absl::StrContains(bucketalloc_last_error(), "accepted: 2MiB to 16TiB")) << bucketalloc_last_error();
  ASSERT_EQ(bucketalloc_thread_tenant(name.data(), name.size()), 5);
  EXPECT_STREQ(name.data(), "short");
  // The metrics carry the tenant.
  std::vector<char> metrics(1 << 20);
  ASSERT_GT(bucketalloc_metrics_text(metrics.data(), metrics.size()), 0);
  EXPECT_TRUE(absl::StrContains(metrics.data(), "bucketalloc_tenant_ooms_total{device=\"0\",tenant=\"long\"} 1"));
  bucketalloc_free(s, 12 << 20, 0, StreamOf(1));
  for (void* h : held) bucketalloc_free(h, 4 << 20, 0, StreamOf(2));
  EXPECT_EQ(bucketalloc_check_invariants(0), 0) << bucketalloc_last_error();
}

TEST_F(CAbiTest, RecordStreamOfNullIsANoOp) {
  bucketalloc_record_stream(nullptr, StreamOf(2));  // the storage of an empty tensor
  EXPECT_STREQ(bucketalloc_last_error(), "");
  int local = 0;
  bucketalloc_record_stream(&local, StreamOf(2));
  EXPECT_STRNE(bucketalloc_last_error(), "") << "a real bad pointer is still an error";
}

}  // namespace
