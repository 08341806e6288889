// Kineto memory events to traces (src/harness/importers.cc): CSV, JSON (out of time order), gzip,
// device selection, frees of memory allocated before the log, and errors.
#include "harness/importers.h"

#include <zlib.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "harness/replay.h"

namespace bucketalloc::harness {
namespace {

constexpr char kCsv[] =
    "ts_us,ev_idx,device_type,device_id,addr,bytes,total_allocated,total_reserved\n"
    "100,1,1,0,4096,-512,0,0\n"  // a free of memory allocated before the log: dropped
    "101,2,1,0,8192,1048576,0,0\n"
    "102,3,0,-1,777,64,0,0\n"    // a CPU event: dropped
    "103,4,1,1,9999,2048,0,0\n"  // another device: dropped
    "104,5,1,0,16384,2097152,0,0\n"
    "105,6,1,0,8192,-1048576,0,0\n";

TEST(ImportersTest, KinetoCsvKeepsOneCudaDevicesMatchedEvents) {
  absl::StatusOr<Trace> t = ImportKinetoCsv(kCsv);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 3u);
  EXPECT_EQ(t->events[0].action, TraceAction::kAllocate);
  EXPECT_EQ(t->events[0].pointer, 8192u);
  EXPECT_EQ(t->events[2].action, TraceAction::kFree);
  EXPECT_EQ(t->events[2].size, 1048576u);
  EXPECT_EQ(PeakLiveBytes(*t), 3u << 20);
  absl::StatusOr<Trace> other = ImportKinetoCsv(kCsv, /*device=*/1);
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(other->events.size(), 1u);
  EXPECT_EQ(other->events[0].pointer, 9999u);
}

TEST(ImportersTest, KinetoJsonIsSortedByTimeAndMatchesTheCsv) {
  // The same events as kCsv's device 0, listed out of time order among other events.
  const std::string json = R"({"traceEvents": [
    {"ph": "X", "name": "aten::mm", "ts": 50, "args": {}},
    {"ph": "i", "name": "[memory]", "ts": 105, "args": {"Ev Idx": 6, "Device Type": 1, "Device Id": 0, "Addr": 8192, "Bytes": -1048576}},
    {"ph": "i", "name": "[memory]", "ts": 101, "args": {"Ev Idx": 2, "Device Type": 1, "Device Id": 0, "Addr": 8192, "Bytes": 1048576}},
    {"ph": "i", "name": "[memory]", "ts": 104, "args": {"Ev Idx": 5, "Device Type": 1, "Device Id": 0, "Addr": 16384, "Bytes": 2097152}}
  ]})";
  absl::StatusOr<Trace> t = ImportKinetoJson(json);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Trace> csv = ImportKinetoCsv(kCsv);
  EXPECT_EQ(FormatTrace(*t), FormatTrace(*csv));
}

TEST(ImportersTest, GzipFilesAreRead) {
  const std::string path = ::testing::TempDir() + "/memory_events.csv.gz";
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, kCsv, sizeof kCsv - 1), static_cast<int>(sizeof kCsv - 1));
  gzclose(f);
  absl::StatusOr<Trace> t = ImportKinetoFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 3u);
  std::remove(path.c_str());
}

TEST(ImportersTest, ErrorsNameTheProblem) {
  EXPECT_TRUE(absl::StrContains(ImportKinetoCsv("a,b\n1,2\n").status().message(), "needs the columns ts_us"));
  EXPECT_TRUE(absl::StrContains(
      ImportKinetoCsv("ts_us,device_type,device_id,addr,bytes\n1,1,0,x,5\n").status().message(), "kineto csv:2:"));
  EXPECT_TRUE(
      absl::StrContains(ImportKinetoCsv("ts_us,device_type,device_id,addr,bytes\n1,0,0,5,5\n").status().message(),
                        "no CUDA memory events"));
  EXPECT_TRUE(absl::StrContains(ImportKinetoJson("[1, 2]").status().message(), "not a Kineto trace"));
  EXPECT_TRUE(absl::IsNotFound(ImportKinetoFile("/nonexistent.json").status()));
}

TEST(ReplayTest, APointerLoggedTwiceWithoutAFreeReplacesTheEarlierBlock) {
  Trace t;
  t.events.push_back({1, "", TraceAction::kAllocate, 0x1, 8u << 20, 0, 0});
  t.events.push_back({1, "", TraceAction::kAllocate, 0x1, 8u << 20, 0, 0});
  EXPECT_EQ(PeakLiveBytes(t), 8u << 20);
  ReplayOptions o;
  o.allocator = "nocache";
  o.capacity = 12u << 20;
  absl::StatusOr<ReplayResult> r = Replay(t, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ooms, 1u) << "the second block needs a second 8 MiB before the first is dropped";
  o.capacity = 16u << 20;
  r = Replay(t, o);
  EXPECT_EQ(r->ooms, 0u);
}

}  // namespace
}  // namespace bucketalloc::harness
