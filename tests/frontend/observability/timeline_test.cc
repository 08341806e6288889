// The memory timeline's line and reader (src/frontend/observability/timeline.cc): a sample survives its line,
// the reader skips what is not a sample with a warning naming the line (and refuses a text with no
// sample), a device's time never goes back, the spec PATH[,interval_ms], and a sample of metrics
// lists the OOMs after the last one seen.
#include "bucketalloc/timeline.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace bucketalloc {
namespace {

TimelineSample Sample(double t, int device) {
  TimelineSample s;
  s.time_s = t;
  s.device = device;
  s.capacity_bytes = 1 << 30;
  s.reserved_bytes = 3 << 20;
  s.allocated_bytes = 2 << 20;
  s.active_bytes = 2 << 20;
  s.cached_bytes = 1 << 20;
  s.requested_bytes = (2 << 20) - 100;
  s.largest_free_block_bytes = 1 << 19;
  s.external_fragmentation = 0.5;
  s.internal_fragmentation = 0.25;
  s.live_allocations = 3;
  s.allocations_total = 10;
  s.frees_total = 7;
  s.cache_hits_total = 6;
  s.alloc_retries_total = 1;
  s.ooms_total = {1, 2, 0, 0, 0};
  s.ooms.push_back(OomEvent{3, t - 0.5, 4096, OomCause::kFragmentation});
  return s;
}

TEST(TimelineTest, ASampleSurvivesItsLine) {
  const TimelineSample s = Sample(12.5, 1);
  const std::string line = TimelineToJsonLine(s);
  EXPECT_FALSE(absl::StrContains(line, "\n"));
  absl::StatusOr<std::vector<TimelineSample>> read = ReadTimeline(absl::StrCat(line, "\n\n", line, "\n"), "t.jsonl");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u) << "blank lines are skipped";
  const TimelineSample& r = (*read)[0];
  EXPECT_EQ(r.time_s, 12.5);
  EXPECT_EQ(r.device, 1);
  EXPECT_EQ(r.reserved_bytes, s.reserved_bytes);
  EXPECT_EQ(r.requested_bytes, s.requested_bytes);
  EXPECT_EQ(r.external_fragmentation, 0.5);
  EXPECT_EQ(r.frees_total, 7);
  EXPECT_EQ(r.ooms_total, s.ooms_total);
  ASSERT_EQ(r.ooms.size(), 1u);
  EXPECT_EQ(r.ooms[0].seq, 3u);
  EXPECT_EQ(r.ooms[0].size, 4096u);
  EXPECT_EQ(r.ooms[0].cause, OomCause::kFragmentation);
  EXPECT_TRUE(absl::StrContains(line,
                                "\"ooms_total\":{\"capacity\":1,\"fragmentation\":2,\"cache_held\":0,"
                                "\"device_exhausted\":0,\"tenant_cap\":0}"))
      << line;
}

// A line lists every memory figure under its key (BUCKETALLOC_MEMORY_FIGURES), in the figures'
// order after the cap, and SetMemoryFigures fills each.
TEST(TimelineTest, ALineListsEveryMemoryFigureUnderItsKey) {
  MemoryFigures m;  // figure i of the list (from 1) is 10 * i
  std::int64_t i = 0;
  ForEachMemoryFigure([&](const MemoryFigureName&, auto member) { m.*member = 10 * ++i; });
  TimelineSample s;
  SetMemoryFigures(m, &s);
  EXPECT_EQ(s.reserved_bytes, 10);
  EXPECT_EQ(s.largest_free_block_bytes, 60);
  EXPECT_EQ(s.live_allocations, 70);
  const std::string line = TimelineToJsonLine(s);
  std::string figures = "\"capacity_bytes\":0";
  ForEachMemoryFigure(
      [&](const MemoryFigureName& n, auto member) { absl::StrAppend(&figures, ",\"", n.key, "\":", m.*member); });
  EXPECT_TRUE(absl::StrContains(line, figures)) << line << "\n" << figures;
  absl::StatusOr<std::vector<TimelineSample>> read = ReadTimeline(line, "t.jsonl");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(TimelineToJsonLine(read->at(0)), line);
}

// Issue 27 (10): an OOM a tenant's own cap refused is cause tenant_cap with the tenant and its cap,
// and survives its line; a line written before tenant_cap existed (no such count) reads as 0.
TEST(TimelineTest, ATenantCapOomNamesTheTenantAndOldLinesReadWithoutIt) {
  TimelineSample s = Sample(3.0, 0);
  s.ooms_total = {0, 0, 0, 0, 2};
  s.ooms = {OomEvent{4, 2.5, 1 << 20, OomCause::kTenantCap, "long", std::size_t{12} << 30}};
  const std::string line = TimelineToJsonLine(s);
  EXPECT_TRUE(absl::StrContains(line, "\"cause\":\"tenant_cap\",\"tenant\":\"long\",\"tenant_cap_bytes\":12884901888"))
      << line;
  absl::StatusOr<std::vector<TimelineSample>> read = ReadTimeline(absl::StrCat(line, "\n"), "t.jsonl");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0].ooms_total, s.ooms_total);
  ASSERT_EQ((*read)[0].ooms.size(), 1u);
  EXPECT_EQ((*read)[0].ooms[0].cause, OomCause::kTenantCap);
  EXPECT_EQ((*read)[0].ooms[0].tenant, "long");
  EXPECT_EQ((*read)[0].ooms[0].tenant_cap, std::size_t{12} << 30);
  const std::string old = absl::StrReplaceAll(TimelineToJsonLine(Sample(4.0, 0)), {{",\"tenant_cap\":0", ""}});
  ASSERT_FALSE(absl::StrContains(old, "tenant_cap")) << old;
  absl::StatusOr<std::vector<TimelineSample>> old_read = ReadTimeline(absl::StrCat(old, "\n"), "old.jsonl");
  ASSERT_TRUE(old_read.ok()) << old_read.status();
  ASSERT_EQ(old_read->size(), 1u);
  EXPECT_EQ((*old_read)[0].ooms_total[static_cast<int>(OomCause::kTenantCap)], 0);
  // A tenant that is not a name is a damaged line.
  const std::string bad = absl::StrReplaceAll(line, {{"\"tenant\":\"long\"", "\"tenant\":7"}});
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<TimelineSample>> bad_read =
      ReadTimeline(absl::StrCat(old, "\n", bad, "\n"), "bad.jsonl", &warnings);
  ASSERT_TRUE(bad_read.ok()) << bad_read.status();
  EXPECT_EQ(bad_read->size(), 1u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(warnings[0], "tenant")) << warnings[0];
}

// Issue 27 (6): a damaged line (a sample cut by a full disk, ended by the writer's next line) made
// the reader, and so the doctor, refuse the whole file. It is skipped with a warning naming it.
TEST(TimelineTest, WhatIsNotASampleIsSkippedWithAWarningNamingTheLine) {
  const std::string good = TimelineToJsonLine(Sample(1.0, 0));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not a JSON object"},
      {absl::StrReplaceAll(good, {{"\"reserved_bytes\":3145728", "\"reserved_bytes\":-1"}}), "reserved_bytes"},
      {absl::StrReplaceAll(good, {{"\"allocated_bytes\":2097152,", ""}}), "allocated_bytes"},
      {absl::StrReplaceAll(good, {{"\"external_fragmentation\":0.5", "\"external_fragmentation\":1.5"}}),
       "external_fragmentation"},
      {absl::StrReplaceAll(good, {{"\"cause\":\"fragmentation\"", "\"cause\":\"bad luck\""}}), "bad luck"},
      {absl::StrReplaceAll(good, {{"\"ooms\":[", "\"ooms\":{\"x\":["}, {"]}", "]}}"}}), "ooms"},
      {absl::StrReplaceAll(good, {{"\"time_s\":1.0", "\"time_s\":\"soon\""}}), "time_s"},
      {good.substr(0, 40), "not a JSON object"},  // a line cut by a failed write
  };
  for (const auto& [line, what] : bad) {
    std::vector<std::string> warnings;
    absl::StatusOr<std::vector<TimelineSample>> r =
        ReadTimeline(absl::StrCat(good, "\n", line, "\n", good, "\n"), "x.jsonl", &warnings);
    ASSERT_TRUE(r.ok()) << line << ": " << r.status();
    EXPECT_EQ(r->size(), 2u) << line;
    ASSERT_EQ(warnings.size(), 1u) << line;
    EXPECT_TRUE(absl::StartsWith(warnings[0], "x.jsonl:2: not a timeline sample: ")) << warnings[0];
    EXPECT_TRUE(absl::StrContains(warnings[0], what)) << warnings[0];
    EXPECT_TRUE(absl::EndsWith(warnings[0], "; skipped")) << warnings[0];
    EXPECT_TRUE(ReadTimeline(absl::StrCat(good, "\n", line, "\n"), "x.jsonl").ok()) << "without warnings asked";
    // Nothing but such lines is not a timeline: refused, naming the first.
    absl::StatusOr<std::vector<TimelineSample>> none = ReadTimeline(absl::StrCat(line, "\n", line, "\n"), "x.jsonl");
    ASSERT_FALSE(none.ok()) << line;
    EXPECT_TRUE(absl::IsInvalidArgument(none.status()));
    EXPECT_TRUE(absl::StartsWith(none.status().message(), "x.jsonl:1: not a timeline sample")) << none.status();
    EXPECT_TRUE(absl::StrContains(none.status().message(), "none of the 2 lines of x.jsonl is a sample"))
        << none.status();
    // The same line last and without its newline was cut off while it was written: left out.
    warnings.clear();
    absl::StatusOr<std::vector<TimelineSample>> cut =
        ReadTimeline(absl::StrCat(good, "\n", line), "x.jsonl", &warnings);
    ASSERT_TRUE(cut.ok()) << cut.status();
    EXPECT_EQ(cut->size(), 1u);
    EXPECT_TRUE(warnings.empty());
  }
  // Empty text is no samples, no error (the doctor says there is nothing to read).
  absl::StatusOr<std::vector<TimelineSample>> empty = ReadTimeline("\n\n", "x.jsonl");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  // At most kMaxTimelineWarnings warnings, then one that counts the rest.
  std::string many = absl::StrCat(good, "\n");
  for (int i = 0; i < 15; ++i) absl::StrAppend(&many, "garbage\n");
  std::vector<std::string> warnings;
  absl::StatusOr<std::vector<TimelineSample>> r = ReadTimeline(many, "x.jsonl", &warnings);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(warnings.size(), kMaxTimelineWarnings + 1);
  EXPECT_EQ(warnings.back(), "x.jsonl: 5 more lines that are not timeline samples skipped (15 in all, of 16)");
  // A device's time that goes back (a wall clock stepped back) stays at its previous line's;
  // another device's time is its own.
  absl::StatusOr<std::vector<TimelineSample>> back =
      ReadTimeline(absl::StrCat(TimelineToJsonLine(Sample(5, 0)), "\n", TimelineToJsonLine(Sample(4, 0)), "\n",
                                TimelineToJsonLine(Sample(4, 1)), "\n", TimelineToJsonLine(Sample(6, 0)), "\n"),
                   "x.jsonl");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 4u);
  EXPECT_EQ((*back)[1].time_s, 5.0);
  EXPECT_EQ((*back)[2].time_s, 4.0);
  EXPECT_EQ((*back)[3].time_s, 6.0);
}

TEST(TimelineTest, TheSpecIsAPathAndAnOptionalInterval) {
  std::string path;
  int ms = 0;
  ASSERT_TRUE(ParseTimelineSpec("/tmp/t.jsonl", &path, &ms).ok());
  EXPECT_EQ(path, "/tmp/t.jsonl");
  EXPECT_EQ(ms, kDefaultTimelineIntervalMs);
  ASSERT_TRUE(ParseTimelineSpec("a,b.jsonl,250", &path, &ms).ok());
  EXPECT_EQ(path, "a,b.jsonl");
  EXPECT_EQ(ms, 250);
  for (const char* spec : {"", ",100", "t.jsonl,0", "t.jsonl,-5", "t.jsonl,1s", "t.jsonl,3600001"}) {
    absl::Status s = ParseTimelineSpec(spec, &path, &ms);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << spec;
    EXPECT_TRUE(absl::StrContains(s.message(), "accepted: PATH[,interval_ms]")) << s;
  }
  // Issue 27 (14): a path with a comma needs the interval, and the error says so.
  absl::Status comma = ParseTimelineSpec("a,b.jsonl", &path, &ms);
  EXPECT_TRUE(absl::IsInvalidArgument(comma));
  EXPECT_TRUE(absl::StrContains(comma.message(),
                                "the part after the last comma is always the interval, so a PATH that contains a comma "
                                "needs \",interval_ms\" after it (e.g. \"a,b.jsonl,1000\")"))
      << comma;
  EXPECT_FALSE(absl::StrContains(ParseTimelineSpec("t.jsonl,0", &path, &ms).message(), "contains a comma"))
      << "a number out of range is only that";
}

TEST(TimelineTest, ASampleOfMetricsListsTheOomsAfterTheLastOneSeen) {
  DeviceMetrics m;
  m.device = 2;
  m.stats.capacity_bytes = 100;
  m.stats.reserved_bytes[kAllPools].Increase(80);
  m.stats.allocation[kAllPools].Increase(4);
  m.stats.allocation[kAllPools].Decrease(1);
  m.stats.num_ooms_capacity = 2;
  m.recent_ooms = {OomEvent{1, 1.0, 10, OomCause::kCapacity}, OomEvent{2, 2.0, 20, OomCause::kCapacity}};
  const TimelineSample s = TimelineSampleOf(m, 3.0, 1);
  EXPECT_EQ(s.device, 2);
  EXPECT_EQ(s.reserved_bytes, 80);
  EXPECT_EQ(s.allocations_total, 4);
  EXPECT_EQ(s.frees_total, 1);
  EXPECT_EQ(s.live_allocations, 3);
  EXPECT_EQ(s.ooms_total[static_cast<int>(OomCause::kCapacity)], 2);
  ASSERT_EQ(s.ooms.size(), 1u);
  EXPECT_EQ(s.ooms[0].seq, 2u);
  EXPECT_TRUE(TimelineSampleOf(m, 3.0, 2).ooms.empty());
}

}  // namespace
}  // namespace bucketalloc
