// The serving workload generator (src/harness/workload/serving.cc): balanced, deterministic traces; the
// scheduler's limits; each KV layout's allocation sizes; the true need; meta files.
#include "harness/workload/serving.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/units.h"
#include "harness/operations/doctor.h"
#include "harness/replay/replay.h"

namespace bucketalloc::harness {
namespace {

// A tiny llama: K or V of one layer is 2 x 16 x 2 = 64 B per token; 2 layers -> 256 B per token.
ModelSpec TinyModel() {
  absl::StatusOr<ModelSpec> m = ParseModelConfig(
      R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,)"
      R"("num_key_value_heads":2,"intermediate_size":128,"vocab_size":1000,"max_position_embeddings":8192})");
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

std::vector<Request> SomeRequests() {
  std::vector<Request> r;
  for (int i = 0; i < 40; ++i) {
    r.push_back({.arrival_s = 1e-9 * i,  // the tiny model steps in nanoseconds
                 .input_tokens = 50 + 97 * (i % 13),
                 .output_tokens = 5 + 31 * (i % 7)});
  }
  return r;
}

struct Checked {
  std::uint64_t allocs = 0;
  std::uint64_t peak_live = 0;
};

// Every allocation is freed once with its size, pointers are unique while live, and nothing is left.
Checked CheckBalanced(const Trace& t) {
  absl::flat_hash_map<std::uint64_t, std::uint64_t> live;
  Checked c;
  std::uint64_t bytes = 0;
  for (const TraceEvent& e : t.events) {
    if (e.action == TraceAction::kAllocate) {
      EXPECT_GT(e.size, 0u);
      EXPECT_TRUE(live.emplace(e.pointer, e.size).second) << "pointer reused while live";
      bytes += e.size;
      c.peak_live = std::max(c.peak_live, bytes);
      ++c.allocs;
    } else {
      auto it = live.find(e.pointer);
      EXPECT_TRUE(it != live.end()) << "free of an unknown pointer";
      if (it == live.end()) continue;
      EXPECT_EQ(it->second, e.size);
      bytes -= e.size;
      live.erase(it);
    }
  }
  EXPECT_TRUE(live.empty()) << live.size() << " allocations never freed";
  return c;
}

TEST(ServingTest, EveryLayoutGivesABalancedDeterministicTraceWithTheSameTrueNeed) {
  const ModelSpec m = TinyModel();
  std::uint64_t need = 0;
  for (KvLayout layout : {KvLayout::kTiered, KvLayout::kGrowth, KvLayout::kPaged}) {
    SCOPED_TRACE(std::string(KvLayoutName(layout)));
    ServingOptions o;
    o.kv_layout = layout;
    o.max_num_seqs = 8;
    o.max_batched_tokens = 512;
    absl::StatusOr<ServingTrace> a = GenerateServingTrace(SomeRequests(), m, o);
    absl::StatusOr<ServingTrace> b = GenerateServingTrace(SomeRequests(), m, o);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(FormatTrace(a->trace), FormatTrace(b->trace));
    const Checked c = CheckBalanced(a->trace);
    EXPECT_EQ(c.peak_live, a->summary.peak_live_bytes);
    EXPECT_EQ(PeakLiveBytes(a->trace), a->summary.peak_live_bytes);
    // Weights first, one per tensor.
    for (std::size_t i = 0; i < m.weights.size(); ++i) ASSERT_EQ(a->trace.events[i].size, m.weights[i].bytes);
    EXPECT_EQ(a->summary.served, 40);
    EXPECT_LE(a->summary.max_running, 8);
    EXPECT_GT(a->summary.max_running, 1);
    EXPECT_LE(a->summary.true_peak_need_bytes, a->summary.peak_live_bytes);
    EXPECT_GT(a->summary.true_peak_need_bytes, m.weight_bytes());
    if (need == 0) need = a->summary.true_peak_need_bytes;
    EXPECT_EQ(a->summary.true_peak_need_bytes, need) << "the schedule must not depend on the layout";
  }
}

// One request of 100 prompt tokens and 20 output tokens, alone: its KV sizes per layout.
std::vector<std::uint64_t> KvSizes(KvLayout layout, int growth_tokens = 16) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  o.kv_layout = layout;
  o.growth_tokens = growth_tokens;
  o.tiers_tokens = {64, 128};
  absl::StatusOr<ServingTrace> t =
      GenerateServingTrace({{.arrival_s = 0, .input_tokens = 100, .output_tokens = 60}}, m, o);
  EXPECT_TRUE(t.ok()) << t.status();
  std::vector<std::uint64_t> sizes;  // in tokens, one per layer's K/V pair
  for (std::size_t i = 0; i < t->trace.events.size(); ++i) {
    const TraceEvent& e = t->trace.events[i];
    if (t->kinds[i] != TensorKind::kKv || e.action != TraceAction::kAllocate) continue;
    EXPECT_EQ(e.size % 64, 0u);
    sizes.push_back(e.size / 64);
  }
  // K and V of a layer come in pairs of equal size.
  std::vector<std::uint64_t> pairs;
  for (std::size_t i = 0; i + 1 < sizes.size(); i += 2) {
    EXPECT_EQ(sizes[i], sizes[i + 1]);
    pairs.push_back(sizes[i]);
  }
  return pairs;
}

TEST(ServingTest, OneLayerPassHasTheBytesOfEveryLayerInFewerEvents) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  absl::StatusOr<ServingTrace> one = GenerateServingTrace(SomeRequests(), m, o);
  o.every_layer = true;
  absl::StatusOr<ServingTrace> all = GenerateServingTrace(SomeRequests(), m, o);
  ASSERT_TRUE(one.ok() && all.ok());
  CheckBalanced(all->trace);
  EXPECT_EQ(one->summary.peak_live_bytes, all->summary.peak_live_bytes);
  EXPECT_EQ(one->summary.true_peak_need_bytes, all->summary.true_peak_need_bytes);
  EXPECT_EQ(one->summary.peak_kv_layout_bytes, all->summary.peak_kv_layout_bytes);
  EXPECT_GT(all->trace.events.size(), one->trace.events.size() + 20u * static_cast<std::size_t>(one->summary.steps));
}

TEST(ServingTest, TieredKvGrowsThroughTheTiersThenDoubles) {
  // 100 tokens -> tier 128 for both layers; 100 + 59 decoded = 159 held at most -> 256 (doubling).
  EXPECT_EQ(KvSizes(KvLayout::kTiered), (std::vector<std::uint64_t>{128, 128, 256, 256}));
}

TEST(ServingTest, TheTieredConfNamesTheTiersAboveTheSmallPool) {
  const ModelSpec m = TinyModel();  // 64 B per token per K or V tensor: 1 MiB is 16384 tokens
  ServingOptions o;
  o.tiers_tokens = {8192, 16384};
  o.max_model_len = 100000;
  absl::StatusOr<ServingTrace> t = GenerateServingTrace({{.arrival_s = 0, .input_tokens = 7000, .output_tokens = 1},
                                                         {.arrival_s = 0, .input_tokens = 40000, .output_tokens = 1}},
                                                        m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  // The largest tensor is 65536 tokens (16384, then doubling); 8192 and 16384 tokens are <= 1 MiB.
  EXPECT_EQ(TieredBucketallocConf(*t, m, o), "tiers_tokens:[32768,65536],bytes_per_token:64");
  o.kv_layout = KvLayout::kPaged;
  EXPECT_EQ(TieredBucketallocConf(*t, m, o), "");
}

TEST(ServingTest, GrowthKvConcatenatesEveryNTokens) {
  EXPECT_EQ(KvSizes(KvLayout::kGrowth, 32), (std::vector<std::uint64_t>{128, 128, 160, 160}));
  const std::vector<std::uint64_t> every_token = KvSizes(KvLayout::kGrowth, 1);
  ASSERT_EQ(every_token.size(), 2u * 60u);  // the prompt, then one growth per decoded token but the last
  EXPECT_EQ(every_token.front(), 100u);
  EXPECT_EQ(every_token.back(), 159u);
}

TEST(ServingTest, PagedKvIsOnePoolPerLayerSizedToTheSchedule) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  o.kv_layout = KvLayout::kPaged;
  absl::StatusOr<ServingTrace> t =
      GenerateServingTrace({{.arrival_s = 0, .input_tokens = 100, .output_tokens = 60}}, m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->summary.kv_pool_tokens, 160);  // 159 tokens held at most, in blocks of 16
  const std::size_t w = m.weights.size();
  EXPECT_EQ(t->trace.events[w].size, 2u * 160u * 64u);
  EXPECT_EQ(t->trace.events[w + 1].size, 2u * 160u * 64u);
  EXPECT_EQ(t->summary.peak_kv_layout_bytes, 2u * 2u * 160u * 64u);
  o.kv_pool_tokens = 100;
  absl::StatusOr<ServingTrace> small =
      GenerateServingTrace({{.arrival_s = 0, .input_tokens = 100, .output_tokens = 60}}, m, o);
  ASSERT_FALSE(small.ok());
  EXPECT_TRUE(absl::StrContains(small.status().message(), "--kv-pool-tokens 100 is less than")) << small.status();
}

TEST(ServingTest, TrueNeedCountsExactTokensNotTheLayoutsRounding) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  o.tiers_tokens = {4096};
  absl::StatusOr<ServingTrace> t =
      GenerateServingTrace({{.arrival_s = 0, .input_tokens = 100, .output_tokens = 1}}, m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->summary.peak_kv_layout_bytes, 4096u * 256u);
  EXPECT_EQ(t->summary.need_kv_bytes, 100u * 256u);
  EXPECT_GT(t->summary.need_activation_bytes, 0u);
  EXPECT_EQ(t->summary.true_peak_need_bytes,
            m.weight_bytes() + t->summary.need_kv_bytes + t->summary.need_activation_bytes);
  EXPECT_LT(t->summary.true_peak_need_bytes + 3000u * 256u, t->summary.peak_live_bytes);
}

// A model within its limits, but a step whose logits would exceed what any allocator accepts:
// refused before any event is written, naming the option (the size once wrapped).
TEST(ServingTest, ATensorNoAllocatorAcceptsIsRefusedUpFront) {
  absl::StatusOr<ModelSpec> m =
      ParseModelConfig(R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,)"
                       R"("num_key_value_heads":2,"intermediate_size":128,"vocab_size":1073741824})");
  ASSERT_TRUE(m.ok()) << m.status();
  ServingOptions o;
  o.max_num_seqs = 1 << 20;
  o.max_batched_tokens = 1 << 20;
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(SomeRequests(), *m, o);
  ASSERT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_TRUE(absl::StrContains(t.status().message(), "the logits of --max-num-seqs sequences")) << t.status();
  EXPECT_TRUE(absl::StrContains(t.status().message(), "64 TiB")) << t.status();
}

TEST(ServingTest, SchedulerLimitsChunkingAndRejections) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  o.max_num_seqs = 2;
  o.max_batched_tokens = 64;
  o.max_model_len = 1000;
  std::vector<Request> r = {{.arrival_s = 0, .input_tokens = 300, .output_tokens = 3},   // 5 chunks
                            {.arrival_s = 0, .input_tokens = 990, .output_tokens = 20},  // too long
                            {.arrival_s = 0, .input_tokens = 10, .output_tokens = 3},
                            {.arrival_s = 50, .input_tokens = 10, .output_tokens = 3}};  // after an idle gap
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(r, m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->summary.rejected_too_long, 1);
  EXPECT_EQ(t->summary.served, 3);
  EXPECT_EQ(t->summary.max_running, 2);
  EXPECT_EQ(t->summary.tokens_prefilled, 320);
  EXPECT_EQ(t->summary.tokens_decoded, 6);
  EXPECT_GT(t->summary.simulated_seconds, 50.0);
  CheckBalanced(t->trace);

  o.max_batched_tokens = 1;
  EXPECT_TRUE(absl::StrContains(GenerateServingTrace(r, m, o).status().message(), "--max-batched-tokens 1"));
  o = ServingOptions{};
  o.tiers_tokens = {512, 256};
  EXPECT_TRUE(absl::StrContains(GenerateServingTrace(r, m, o).status().message(), "ascending"));
  o = ServingOptions{};
  o.step_base_ms = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(absl::StrContains(GenerateServingTrace(r, m, o).status().message(), "--step-base-ms inf: accepted 0"));
  o.step_base_ms = 1e300;  // finite, but the clock would overflow: refused
  EXPECT_TRUE(absl::StrContains(GenerateServingTrace(r, m, o).status().message(), "--step-base-ms 1e+300"));
  o = ServingOptions{};
  o.max_kv_tokens = 500;  // the 300-token prompt fits; the 990 + 20 one never could
  o.max_model_len = 2000;
  absl::StatusOr<ServingTrace> limited = GenerateServingTrace(r, m, o);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->summary.rejected_over_kv_limit, 1);
  EXPECT_EQ(limited->summary.rejected_too_long, 0);
  o = ServingOptions{};
  o.max_model_len = 5;
  EXPECT_TRUE(absl::StrContains(GenerateServingTrace(r, m, o).status().message(), "none can be served"));
  EXPECT_FALSE(ParseKvLayout("blocks").ok());
}

TEST(ServingTest, MetaFileRecordsTheTrueNeedBesideTheTrace) {
  EXPECT_EQ(MetaPathFor("/tmp/x.csv"), "/tmp/x.meta.json");
  EXPECT_EQ(MetaPathFor("x.trace"), "x.trace.meta.json");
  const ModelSpec m = TinyModel();
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(SomeRequests(), m, ServingOptions{});
  ASSERT_TRUE(t.ok());
  const std::string path = ::testing::TempDir() + "/serving_meta_test.csv";
  ASSERT_TRUE(WriteServingTrace(*t, m, ServingOptions{}, R"({"requests_file":"x.csv"})", path).ok());
  const std::size_t events = t->trace.events.size();
  absl::StatusOr<std::optional<std::uint64_t>> need = ReadTrueNeed(path, events);
  ASSERT_TRUE(need.ok()) << need.status();
  ASSERT_TRUE(need->has_value());
  EXPECT_EQ(**need, t->summary.true_peak_need_bytes);
  absl::StatusOr<Trace> back = ReadTraceFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->events.size(), t->trace.events.size());

  // A meta file of another trace (another number of events) is refused, not believed.
  absl::StatusOr<std::optional<std::uint64_t>> other = ReadTrueNeed(path, events + 1);
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::StrContains(other.status().message(), "written for a trace of")) << other.status();
  std::ofstream(MetaPathFor(path)) << "{\"something\": 1}";
  EXPECT_FALSE(ReadTrueNeed(path, events).ok());
  std::remove(MetaPathFor(path).c_str());
  need = ReadTrueNeed(path, events);
  ASSERT_TRUE(need.ok());
  EXPECT_FALSE(need->has_value());
  std::remove(path.c_str());
}

// --tenant-split: long requests' KV tensors on their own stream, everything else on stream 0.
TEST(ServingTest, ATenantSplitPutsLongRequestsKvTensorsOnTheirOwnStream) {
  const ModelSpec m = TinyModel();
  ServingOptions o;
  o.tenant_split_tokens = 500;
  const std::vector<Request> requests = SomeRequests();
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(requests, m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  CheckBalanced(t->trace);
  std::int64_t long_requests = 0;
  for (const Request& r : requests) long_requests += r.input_tokens + r.output_tokens > 500 ? 1 : 0;
  EXPECT_EQ(t->summary.long_requests, long_requests);
  ASSERT_GT(long_requests, 0);
  std::size_t on_split = 0;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> stream_of;  // pointer -> its allocation's stream
  for (std::size_t i = 0; i < t->trace.events.size(); ++i) {
    const TraceEvent& e = t->trace.events[i];
    ASSERT_TRUE(e.stream == 0 || e.stream == kLongRequestStream) << i;
    if (e.stream == kLongRequestStream) {
      ++on_split;
      EXPECT_EQ(t->kinds[i], TensorKind::kKv) << "only KV tensors go on the split stream";
    }
    if (e.action == TraceAction::kAllocate) {
      stream_of[e.pointer] = e.stream;
    } else {
      EXPECT_EQ(stream_of[e.pointer], e.stream) << "a tensor is freed on its allocation's stream";
    }
  }
  EXPECT_GT(on_split, 0u);
  // The same schedule as without the split: the same events but for their streams.
  absl::StatusOr<ServingTrace> plain = GenerateServingTrace(requests, m, ServingOptions{});
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->trace.events.size(), t->trace.events.size());
  EXPECT_EQ(plain->summary.true_peak_need_bytes, t->summary.true_peak_need_bytes);
  // The paged layout has no per-request tensors to split.
  o.kv_layout = KvLayout::kPaged;
  absl::StatusOr<ServingTrace> paged = GenerateServingTrace(requests, m, o);
  EXPECT_TRUE(absl::IsInvalidArgument(paged.status())) << paged.status();
  EXPECT_TRUE(absl::StrContains(paged.status().message(), "tiered or growth")) << paged.status();
}

// The two-tenant replay: steady short requests (one every 0.1 s) and a burst of 16 long ones
// (6000 + 300 tokens) for Llama-3.1-8B on a 28 GiB card. Sharing one pool, the burst takes the
// memory the short requests need; with the long requests in a tenant capped at 4 GiB, the short
// ones (the default tenant) never fail, and the long ones fail against their own cap.
TEST(ServingTest, SplitPoolsKeepShortRequestsServedThroughALongBurstThatBreaksTheSharedPool) {
  absl::StatusOr<ModelSpec> m =
      ReadModelConfig(std::string(BUCKETALLOC_SOURCE_DIR) + "/data/models/Llama-3.1-8B-Instruct.config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<Request> requests;
  for (int i = 0; i < 120; ++i) {
    requests.push_back({.arrival_s = 0.1 * i, .input_tokens = 300 + (i * 37) % 700, .output_tokens = 50 + i % 100});
  }
  for (int i = 0; i < 16; ++i)
    requests.push_back({.arrival_s = 3.0 + 0.01 * i, .input_tokens = 6000, .output_tokens = 300});
  ServingOptions o;
  o.tenant_split_tokens = 4096;
  absl::StatusOr<ServingTrace> t = GenerateServingTrace(requests, *m, o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->summary.long_requests, 16);
  const std::string tiers = TieredBucketallocConf(*t, *m, o);
  ASSERT_FALSE(tiers.empty());
  auto replay = [&](const std::string& conf) {
    ReplayOptions r;
    r.allocator = absl::StrCat("bucketalloc:", conf);
    r.capacity = 28 * kGiB;
    absl::StatusOr<ReplayResult> result = Replay(t->trace, r);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ReplayResult{};
  };
  const ReplayResult shared = replay(tiers);
  const ReplayResult split = replay(absl::StrCat(tiers, ",tenants:[long:4GiB]"));
  auto ooms_on = [](const ReplayResult& r, std::uint64_t stream) {
    auto it = r.ooms_by_stream.find(stream);
    return it == r.ooms_by_stream.end() ? std::uint64_t{0} : it->second;
  };
  EXPECT_GT(ooms_on(shared, 0), 100u) << "the burst should starve the short requests in one pool";
  EXPECT_TRUE(shared.tenants.empty());
  EXPECT_EQ(ooms_on(split, 0), 0u);
  EXPECT_GT(ooms_on(split, kLongRequestStream), 0u);
  ASSERT_EQ(split.tenants.size(), 2u);
  EXPECT_EQ(split.tenants[0].name, "default");
  EXPECT_EQ(split.tenants[0].ooms, 0);
  EXPECT_EQ(split.tenants[1].name, "long");
  EXPECT_EQ(static_cast<std::uint64_t>(split.tenants[1].ooms), ooms_on(split, kLongRequestStream));
  EXPECT_LE(split.tenants[1].peak_reserved, 4 * kGiB);
  EXPECT_LE(split.tenants[0].peak_reserved, split.peak_reserved_bytes);
  EXPECT_LE(split.peak_reserved_bytes, 28 * kGiB);
  // The JSON carries both.
  const std::string json = split.ToJson();
  EXPECT_TRUE(absl::StrContains(json, "\"ooms_by_stream\"")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"tenant\": \"long\"")) << json;

  // Issue 27 (10): the OOMs the long tenant's cap refused are cause tenant_cap, in the replay's
  // counts and its timeline as in a process's (they were "fragmentation" against the card), and the
  // doctor's lever names the tenant's cap, not tiers or stitching.
  EXPECT_EQ(split.tenant_cap_ooms, split.ooms);
  EXPECT_EQ(split.capacity_ooms + split.fragmentation_ooms + split.tenant_cap_ooms, split.ooms);
  EXPECT_EQ(shared.capacity_ooms + shared.fragmentation_ooms, shared.ooms);
  ReplayOptions timed;
  timed.allocator = absl::StrCat("bucketalloc:", tiers, ",tenants:[long:4GiB]");
  timed.capacity = 28 * kGiB;
  timed.sample_interval_s = 1.0;
  absl::StatusOr<ReplayResult> sampled = Replay(t->trace, timed);
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_FALSE(sampled->samples.empty());
  const TimelineSample& last = sampled->samples.back();
  EXPECT_EQ(static_cast<std::uint64_t>(last.ooms_total[static_cast<int>(OomCause::kTenantCap)]), split.tenant_cap_ooms);
  EXPECT_EQ(last.ooms_total[static_cast<int>(OomCause::kFragmentation)], 0);
  bool listed = false;
  for (const TimelineSample& x : sampled->samples) {
    for (const OomEvent& e : x.ooms) {
      EXPECT_EQ(e.cause, OomCause::kTenantCap);
      EXPECT_EQ(e.tenant, "long");
      EXPECT_EQ(e.tenant_cap, 4 * kGiB);
      listed = true;
    }
  }
  EXPECT_TRUE(listed);
  const std::vector<Verdict> verdicts = Diagnose(sampled->samples, 0);
  bool tenant_cap = false;
  for (const Verdict& v : verdicts) {
    EXPECT_NE(v.verdict, Finding::kFragmentation) << v.evidence;
    if (v.verdict == Finding::kTenantCap) {
      tenant_cap = true;
      EXPECT_TRUE(absl::StrContains(v.evidence, "tenant 'long' (cap 4.00 GiB)")) << v.evidence;
      EXPECT_TRUE(absl::StrContains(v.lever, "raise tenant 'long' (cap 4.00 GiB)'s cap")) << v.lever;
    }
  }
  EXPECT_TRUE(tenant_cap) << VerdictsToText(verdicts);
}

}  // namespace
}  // namespace bucketalloc::harness
