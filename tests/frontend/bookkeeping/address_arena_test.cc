// The address arena (src/frontend/bookkeeping/address_arena.cc) over the simulated device: ranges carved top
// down from few reservations, coalescing of what comes back, a range larger than a reservation, a
// refused large reservation, and the trim.
#include "frontend/bookkeeping/address_arena.h"

#include <gtest/gtest.h>

#include "bucketalloc/testing/sim_backend.h"
#include "bucketalloc/units.h"

namespace bucketalloc::internal {
namespace {

class AddressArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimBackend>> made = MakeSimBackend({.total_memory = 64 * kMiB});
    ASSERT_TRUE(made.ok());
    sim_ = std::move(*made);
    arena_ = std::make_unique<AddressArena>(sim_.get(), 2 * kMiB);
  }
  void Check() { ASSERT_TRUE(arena_->CheckInvariants().ok()) << arena_->CheckInvariants(); }
  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<AddressArena> arena_;
};

TEST_F(AddressArenaTest, RangesComeTopDownFromOneReservationAndCoalesceWhenReturned) {
  absl::StatusOr<std::uintptr_t> a = arena_->Carve(4 * kMiB, 16 * kMiB);
  absl::StatusOr<std::uintptr_t> b = arena_->Carve(4 * kMiB, 16 * kMiB);
  absl::StatusOr<std::uintptr_t> c = arena_->Carve(8 * kMiB, 16 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*b + 4 * kMiB, *a);
  EXPECT_EQ(*c + 8 * kMiB, *b);
  EXPECT_EQ(sim_->counters().address_reserves, 1);
  EXPECT_EQ(arena_->reservations(), 1u);
  Check();
  // Full: a fourth range needs a second reservation.
  absl::StatusOr<std::uintptr_t> d = arena_->Carve(2 * kMiB, 16 * kMiB);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(sim_->counters().address_reserves, 2);
  // a and c come back, then b between them: one free range of 16 MiB, which a 16 MiB range takes.
  arena_->Return(*a, 4 * kMiB);
  arena_->Return(*c, 8 * kMiB);
  Check();
  arena_->Return(*b, 4 * kMiB);
  Check();
  absl::StatusOr<std::uintptr_t> whole = arena_->Carve(16 * kMiB, 16 * kMiB);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, *c) << "the first reservation, whole again";
  EXPECT_EQ(sim_->counters().address_reserves, 2);
  arena_->Return(*whole, 16 * kMiB);
  arena_->Return(*d, 2 * kMiB);
  EXPECT_TRUE(arena_->Trim());
  EXPECT_EQ(arena_->reservations(), 0u);
  EXPECT_EQ(sim_->counters().address_releases, 2);
  Check();
}

TEST_F(AddressArenaTest, ALargerRangeGetsItsOwnReservationAndATrimKeepsWhatIsInUse) {
  absl::StatusOr<std::uintptr_t> small = arena_->Carve(2 * kMiB, 8 * kMiB);
  absl::StatusOr<std::uintptr_t> big = arena_->Carve(32 * kMiB, 8 * kMiB);
  ASSERT_TRUE(small.ok() && big.ok());
  EXPECT_EQ(arena_->reservations(), 2u);
  arena_->Return(*big, 32 * kMiB);
  EXPECT_TRUE(arena_->Trim());
  EXPECT_EQ(arena_->reservations(), 1u) << "the one holding the small range stays";
  arena_->Return(*small, 2 * kMiB);
  EXPECT_TRUE(arena_->Trim());
  EXPECT_EQ(arena_->reservations(), 0u);
  Check();
}

// A reservation larger than the process's address space (256 TiB; user space is 128 TiB) is
// refused, and the arena then reserves the range's own size.
TEST_F(AddressArenaTest, ARefusedLargeReservationFallsBackToTheRangesSize) {
  absl::StatusOr<std::uintptr_t> a = arena_->Carve(4 * kMiB, std::size_t{1} << 48);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(arena_->reservations(), 1u);
  EXPECT_EQ(sim_->counters().address_reserves, 1) << "the refused one is not counted by the sim";
  arena_->Return(*a, 4 * kMiB);
  EXPECT_TRUE(arena_->Trim());
  Check();
}

}  // namespace
}  // namespace bucketalloc::internal
