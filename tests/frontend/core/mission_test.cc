// The mission in one test: a variable-length serving workload (batch size and sequence lengths
// change every step) under a capacity cap makes a plain best-fit-with-splitting configuration fail
// with a fragmentation OOM, and bucketalloc with tiers configured for that workload serves it.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "test_util.h"
#include "workload/kv_workload.h"

namespace bucketalloc {
namespace {

constexpr const char* kBase = "backend:sim,sim_memory:unbacked,sim_total_memory:80GiB,capacity:13GiB";

workload::KvWorkloadResult RunServing(const std::string& extra) {
  absl::StatusOr<Options> o = ParseOptions(absl::StrCat(kBase, extra));
  EXPECT_TRUE(o.ok()) << o.status();
  auto allocator = std::move(*Allocator::Create(*o));
  workload::KvWorkloadConfig config;  // seed 1, 300 steps, 32-4096 tokens, batch 1-48, 128 KiB/token
  workload::KvWorkloadResult r = workload::RunKvWorkload(*allocator, config);
  EXPECT_TRUE(allocator->CheckInvariants(0).ok());
  EXPECT_EQ(allocator->GetStats(0)->allocated_bytes[kAllPools].current, 0);
  return r;
}

TEST(MissionTest, TiersServeAWorkloadThatFragmentsBestFitWithSplitting) {
  const workload::KvWorkloadResult plain = RunServing("");
  ASSERT_TRUE(plain.oom.has_value()) << plain.ToString();
  EXPECT_EQ(plain.oom->cause, OomCause::kFragmentation) << plain.oom->ToString();
  // It failed although the live data was well under the cap.
  EXPECT_LT(plain.oom->allocated + plain.oom->rounded, plain.oom->capacity);
  EXPECT_LT(plain.steps_completed, 300);

  const workload::KvWorkloadResult tiered =
      RunServing(",tiers_tokens:[64,128,256,384,512,768,1024,1536,2048,3072,4096],bytes_per_token:128KiB");
  EXPECT_FALSE(tiered.oom.has_value()) << tiered.oom->ToString();
  EXPECT_EQ(tiered.failures, 0);
  EXPECT_EQ(tiered.steps_completed, 300);
  std::cout << "plain:  " << plain.ToString() << "\ntiered: " << tiered.ToString() << "\n";
}

}  // namespace
}  // namespace bucketalloc
