// The Backend interface's defaults: a backend without virtual memory says so for every VMM call.
#include "bucketalloc/backend.h"
#include "bucketalloc/testing/sim_backend.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "bucketalloc/options.h"

namespace bucketalloc {
namespace {

// A backend that implements only what every backend must (as the cudaMalloc backend does).
class PlainBackend final : public Backend {
 public:
  absl::string_view Name() const override { return "plain"; }
  int device() const override { return 0; }
  std::size_t Granularity() const override { return 2 * kMiB; }
  absl::StatusOr<void*> Allocate(std::size_t) override { return absl::ResourceExhaustedError("plain"); }
  absl::Status Free(void*, std::size_t) override { return absl::OkStatus(); }
  absl::StatusOr<DeviceMemInfo> GetMemInfo() override { return DeviceMemInfo{}; }
  absl::StatusOr<Event> RecordEvent(Stream) override { return absl::UnimplementedError("plain"); }
  absl::StatusOr<bool> QueryEvent(Event) override { return true; }
  absl::Status SynchronizeEvent(Event) override { return absl::OkStatus(); }
  void DestroyEvent(Event) override {}
  BackendCounters counters() const override { return {}; }
};

TEST(BackendTest, VirtualMemoryDefaultsAreUnimplementedAndNameTheBackend) {
  PlainBackend plain;
  Backend* b = &plain;
  EXPECT_FALSE(b->SupportsVirtualMemory());
  for (absl::Status s :
       {b->ReserveAddressRange(2 * kMiB, 2 * kMiB).status(), b->ReleaseAddressRange(0, 0),
        b->CreatePhysical(2 * kMiB).status(), b->ReleasePhysical(0), b->Map(0, 0, 0), b->Unmap(0, 0)}) {
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'plain'")) << s;
  }
  EXPECT_EQ(AsSim(b), nullptr);
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = MakeSimBackend({.total_memory = 8 * kMiB});
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(AsSim(sim->get()), sim->get());
  EXPECT_TRUE((*sim)->SupportsVirtualMemory()) << "the simulated device has the VMM twin (sim_backend_test)";
}

}  // namespace
}  // namespace bucketalloc
