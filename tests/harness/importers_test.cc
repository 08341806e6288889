// Kineto memory events to traces (src/harness/replay/importers.cc): CSV, JSON (out of time order), gzip,
// device selection, frees of memory allocated before the log, and errors.
#include "harness/replay/importers.h"

#include <zlib.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "harness/replay/replay.h"

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
    {"ph": "i", "name": "[memory]", "ts": 104, "args": {"Ev Idx": 5, "Device Type": 1, "Device Id": 0, "Addr": 16384, "Bytes": 2097152}},
    {"ph": "i", "name": "[memory]", "ts": 103, "args": {"Ev Idx": 4, "Device Type": 0, "Device Id": -1, "Addr": 77, "Bytes": 64}}
  ]})";
  absl::StatusOr<Trace> t = ImportKinetoJson(json);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Trace> csv = ImportKinetoCsv(kCsv);
  EXPECT_EQ(FormatTrace(*t), FormatTrace(*csv));
}

// The real trace of data/traces (SOURCES.md): a V100 training job's Kineto trace, with CPU memory
// events (Device Id -1) among the GPU's. Its GPU events are 13,385 allocations and as many frees.
TEST(ImportersTest, TheVendoredRealKinetoTraceImports) {
  absl::StatusOr<Trace> t =
      ImportKinetoFile(BUCKETALLOC_SOURCE_DIR "/data/traces/hta_kineto_trace_v100_rank1_profile_memory.json.gz");
  ASSERT_TRUE(t.ok()) << t.status();
  std::size_t allocations = 0, frees = 0;
  for (const TraceEvent& e : t->events) ++(e.action == TraceAction::kAllocate ? allocations : frees);
  EXPECT_EQ(allocations, 13385u);
  EXPECT_EQ(frees, 13385u);
  EXPECT_GT(PeakLiveBytes(*t), std::size_t{2} << 30);
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

// Wrongly typed or out-of-range fields are errors naming the event and the field (a type error
// once escaped as an uncaught nlohmann::type_error and aborted), and an event no replay can take
// (bytes at address 0, a size no allocator accepts) is refused here rather than written.
TEST(ImportersTest, JsonFieldsOfTheWrongTypeOrRangeAreClearErrors) {
  const std::string mem = R"("name":"[memory]","ts":1,"args":{"Device Type":1,"Device Id":0,)";
  const struct {
    std::string event;
    const char* says;
  } cases[] = {
      {R"({"name":5,"ts":1,"args":{"Addr":4096,"Bytes":1}})", "traceEvents[0]: \"name\" is 5; accepted: a string"},
      {R"({"name":"[memory]","ts":"abc","args":{"Addr":4096,"Bytes":1}})", "\"ts\" is \"abc\""},
      {R"({"name":"[memory]","ts":1e400,"args":{"Addr":4096,"Bytes":1}})", "not a Kineto trace"},
      {"{" + mem + R"("Addr":"4096","Bytes":1}})", "\"Addr\" is \"4096\"; accepted: an integer"},
      {"{" + mem + R"("Addr":4096,"Bytes":1.5}})", "\"Bytes\" is 1.5"},
      {"{" + mem + R"("Addr":-4096,"Bytes":1}})", "\"Addr\" is -4096"},
      {"{" + mem + R"("Addr":18446744073709551615,"Bytes":1}})", "\"Addr\" is 18446744073709551615"},
      {"{" + mem + R"("Addr":4096,"Bytes":9223372036854775807}})", "\"Bytes\" is 9223372036854775807"},
      {"{" + mem + R"("Addr":0,"Bytes":4096}})", "4096 bytes at address 0"},
      {R"({"name":"[memory]","ts":1,"args":{"Device Type":"cuda","Addr":1,"Bytes":1}})", "\"Device Type\""},
      {R"({"name":"[memory]","ts":1,"args":{"Device Type":1,"Device Id":-2,"Addr":1,"Bytes":1}})",
       "\"Device Id\" is -2; accepted: an integer from -1 to"},
      {R"({"name":"[memory]","ts":1,"args":[1]})", "without an \"args\" object"},
      {R"({"name":"[memory]","ts":1,"args":{"Bytes":1}})", "without \"Addr\""},
  };
  for (const auto& c : cases) {
    const std::string json = R"({"traceEvents":[)" + c.event + "]}";
    absl::StatusOr<Trace> t = ImportKinetoJson(json, -1, "t.json");
    ASSERT_FALSE(t.ok()) << json;
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.says)) << json << "\n" << t.status();
  }
  // A fractional timestamp (Chrome's trace format allows one) is taken.
  absl::StatusOr<Trace> t = ImportKinetoJson(
      R"({"traceEvents":[{"name":"[memory]","ts":1.5,"args":{"Device Type":1,"Addr":4096,"Bytes":8}}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 1u);
  // The CSV form: address 0, a size no allocator accepts, a binary line escaped.
  const std::string header = "ts_us,device_type,device_id,addr,bytes\n";
  EXPECT_TRUE(absl::StrContains(ImportKinetoCsv(header + "1,1,0,0,5\n").status().message(),
                                "kineto csv:2: a memory "
                                "event of 5 bytes at "
                                "address 0"));
  EXPECT_TRUE(absl::StrContains(ImportKinetoCsv(header + "1,1,0,8,9223372036854775807\n").status().message(),
                                "accepted: at most 70368744177664"));
  const absl::Status binary = ImportKinetoCsv(std::string("\x01\xff\x7f,zz\n1,2\n", 11)).status();
  EXPECT_TRUE(absl::StrContains(binary.message(), "\\x01\\xff\\x7f,zz")) << binary;
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
