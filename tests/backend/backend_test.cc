// The Backend interface's defaults: a backend without virtual memory says so for every VMM call.
#include "bucketalloc/backend.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "bucketalloc/options.h"

namespace bucketalloc {
namespace {

TEST(BackendTest, VirtualMemoryDefaultsAreUnimplementedAndNameTheBackend) {
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend({.total_memory = 8 * kMiB});
  ASSERT_TRUE(sim.ok());
  Backend* b = sim->get();
  EXPECT_FALSE(b->SupportsVirtualMemory());
  for (absl::Status s : {b->ReserveAddressRange(2 * kMiB, 2 * kMiB).status(), b->ReleaseAddressRange(0, 0),
                         b->CreatePhysical(2 * kMiB).status(), b->ReleasePhysical(0), b->Map(0, 0, 0),
                         b->Unmap(0, 0)}) {
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'sim'")) << s;
  }
  EXPECT_EQ(AsSim(b), sim->get());
}

}  // namespace
}  // namespace bucketalloc
