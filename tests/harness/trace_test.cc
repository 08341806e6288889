// RMM replay-log CSV reading and writing (src/harness/replay/trace.cc).
#include "harness/replay/trace.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bucketalloc::harness {
namespace {

constexpr char kHeader[] = "Thread,Time,Action,Pointer,Size,Stream\n";

TEST(TraceTest, ParsesRmmLogs) {
  absl::StatusOr<Trace> t = ParseTrace(absl::StrCat(kHeader,
                                                    "140202,13:45:01.123456,allocate,0x7f5e40000000,1048576,0x0\n"
                                                    "140202,13:45:01.123460,allocate failure,(nil),99999999999,0x1a\n"
                                                    "7,13:45:01.123470,free,139920404381696,1048576,3\n"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 3u);
  EXPECT_EQ(t->events[0].action, TraceAction::kAllocate);
  EXPECT_EQ(t->events[0].pointer, 0x7f5e40000000u);
  EXPECT_EQ(t->events[0].size, 1048576u);
  EXPECT_EQ(t->events[0].thread, 140202u);
  EXPECT_EQ(t->events[0].line, 2);
  EXPECT_EQ(t->events[1].action, TraceAction::kAllocateFailure);
  EXPECT_EQ(t->events[1].pointer, 0u);
  EXPECT_EQ(t->events[1].stream, 0x1au);
  EXPECT_EQ(t->events[2].action, TraceAction::kFree);
  EXPECT_EQ(t->events[2].pointer, 139920404381696u);
  EXPECT_EQ(t->events[2].stream, 3u);
}

TEST(TraceTest, FormatThenParseIsTheSameTrace) {
  Trace t;
  t.events.push_back({1, "00:00:01.000000", TraceAction::kAllocate, 0x1000, 512, 0x2, 0});
  t.events.push_back({1, "", TraceAction::kAllocateFailure, 0, 1 << 30, 0, 0});
  t.events.push_back({2, "00:00:02.000000", TraceAction::kFree, 0x1000, 512, 0x2, 0});
  absl::StatusOr<Trace> back = ParseTrace(FormatTrace(t));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->events.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->events[i].action, t.events[i].action);
    EXPECT_EQ(back->events[i].pointer, t.events[i].pointer);
    EXPECT_EQ(back->events[i].size, t.events[i].size);
    EXPECT_EQ(back->events[i].stream, t.events[i].stream);
    EXPECT_EQ(back->events[i].thread, t.events[i].thread);
  }
}

TEST(TraceTest, BadLinesAreNamedByNumberWithWhatIsAccepted) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const Case cases[] = {
      {"Pointer,Size\n", "trace:1: expected the header"},
      {absl::StrCat(kHeader, "1,t,allocate,0x10,16\n"), "trace:2: has 5 fields; accepted: 6"},
      {absl::StrCat(kHeader, "1,t,allocate,0x10,16,0\n1,t,realloc,0x10,16,0\n"),
       "trace:3: Action \"realloc\" is unknown; accepted: allocate, free, allocate failure"},
      {absl::StrCat(kHeader, "1,t,allocate,0xZZ,16,0\n"), "trace:2: Pointer \"0xZZ\" is not an address"},
      {absl::StrCat(kHeader, "1,t,allocate,0x10,-16,0\n"), "trace:2: Size \"-16\" is not a non-negative integer"},
      {absl::StrCat(kHeader, "1,t,free,(nil),16,0\n"), "trace:2: Pointer is null"},
      {"", "trace: empty"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Trace> t = ParseTrace(c.text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(t.status()));
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.expected)) << t.status();
  }
  EXPECT_TRUE(absl::IsNotFound(ReadTraceFile("/nonexistent/trace.csv").status()));
}

}  // namespace
}  // namespace bucketalloc::harness
