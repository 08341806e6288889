// tests/test_util.h — shared test helpers: the configurations the allocator suites run over, and
// a fake MemorySource for pool tests.
#ifndef BUCKETALLOC_TESTS_TEST_UTIL_H_
#define BUCKETALLOC_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bucketalloc/allocator.h"
#include "bucketalloc/options.h"
#include "bucketalloc/testing/sim_backend.h"
#include "internal/stat_ledger.h"
#include "pool/memory_source.h"

// GCC 12's AddressSanitizer runtime (Debian 12) has no fork handlers for its own allocator (LLVM
// added them in 18: llvm-project pull request 75290): a child forked while another thread is in
// malloc can deadlock inside ASan itself, whatever the code under test does. Tests that fork beside
// busy threads skip under ASan, saying so; the release suite runs them.
#if defined(__SANITIZE_ADDRESS__)
#define BUCKETALLOC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUCKETALLOC_TEST_ASAN 1
#endif
#endif
#ifdef BUCKETALLOC_TEST_ASAN
#define BUCKETALLOC_SKIP_BUSY_FORK_UNDER_ASAN()                                                           \
  GTEST_SKIP() << "SKIPPED under ASan: its runtime here has no fork handlers (LLVM 18 added them), so a " \
                  "child forked beside threads in malloc can deadlock in ASan itself; the release suite " \
                  "runs this test"
#else
#define BUCKETALLOC_SKIP_BUSY_FORK_UNDER_ASAN() static_cast<void>(0)
#endif

namespace bucketalloc::testing {

// One named configuration of the allocator (BUCKETALLOC_CONF syntax, on top of backend:sim).
struct Config {
  std::string name;
  std::string conf;
};

inline void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

// The configurations every allocator suite runs over.
inline std::vector<Config> AllConfigs() {
  return {
      {"default_tiers", "tiers_tokens:[16,32,64,128],bytes_per_token:128KiB"},
      {"no_tiers", ""},
      {"tiny_capacity", "capacity:64MiB,sim_total_memory:128MiB"},
      // With tiny requests in slabs and the other small ones packed (the default packs them all).
      {"small_max_split",
       "max_split_size_mb:24,max_non_split_rounding_mb:4,roundup_power2_divisions:4,slab_limit:4KiB"},
      // Stitching on the simulated device's virtual memory, at a small cap so that it stitches.
      {"vmm_stitching",
       "expandable_segments:true,capacity:64MiB,sim_total_memory:128MiB,"
       "tiers_tokens:[16,32,64,128],bytes_per_token:128KiB"},
      // Tenants configured: every request takes the tenant routing (the default tenant's, the
      // device's own pools, unless a suite binds a stream or sets the thread's tenant).
      {"tenants", "tenants:[short:256MiB,long:512MiB]"},
  };
}

// Creates a sim allocator with `conf`, checking invariants after every slow-path event.
inline std::unique_ptr<Allocator> MakeAllocator(const std::string& conf, bool backed = true) {
  std::string full =
      absl::StrCat("backend:sim,debug_check_invariants:true,sim_memory:", backed ? "backed" : "unbacked");
  if (!conf.empty()) absl::StrAppend(&full, ",", conf);
  absl::StatusOr<Options> o = ParseOptions(full);
  if (!o.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(*o);
  return a.ok() ? std::move(*a) : nullptr;
}

// A suite over every configuration: a fresh sim allocator per test, invariants checked after every
// slow-path event. Instantiate with BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(Suite).
class ConfiguredAllocatorTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    allocator_ = MakeAllocator(GetParam().conf);
    ASSERT_NE(allocator_, nullptr) << GetParam().conf;
  }
  DeviceStats Stats(int device = 0) { return *allocator_->GetStats(device); }
  std::unique_ptr<Allocator> allocator_;
};

#define BUCKETALLOC_INSTANTIATE_OVER_CONFIGS(suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Configs, suite, ::testing::ValuesIn(::bucketalloc::testing::AllConfigs()), \
                           [](const auto& info) { return info.param.name; })

// Streams as the sim backend sees them: any distinct pointer values.
inline Stream TestStream(int i) { return reinterpret_cast<Stream>(static_cast<std::uintptr_t>(0x1000 + i)); }

// A memory source that hands out fake, never-touched addresses, with an optional byte limit.
class FakeSource : public internal::MemorySource {
 public:
  explicit FakeSource(internal::StatLedger* stats, std::size_t limit = ~std::size_t{0})
      : stats_(stats), limit_(limit) {}
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t bytes, PoolIndex pool) override {
    if (used_ + bytes > limit_) return absl::ResourceExhaustedError("fake source: limit");
    const std::uintptr_t base = next_;
    next_ += bytes + (2 << 20);  // a gap, so that segments are never adjacent
    used_ += bytes;
    live_[base] = bytes;
    stats_->Increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
    ++allocs;
    return base;
  }
  bool ReleaseSegment(std::uintptr_t base, std::size_t bytes, PoolIndex pool) override {
    if (fail_segment_release_in > 0 && --fail_segment_release_in == 0) return false;
    live_.erase(base);
    used_ -= bytes;
    stats_->Decrease(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
    ++frees;
    return true;
  }
  // Virtual memory: 2 MiB granules; ranges and mappings are bookkeeping only.
  absl::StatusOr<std::uintptr_t> ReserveRange(std::size_t bytes, std::size_t, PoolIndex) override {
    const std::uintptr_t base = next_;
    next_ += bytes + (2 << 20);
    ranges_[base] = bytes;
    return base;
  }
  void ReleaseRange(std::uintptr_t va, std::size_t bytes) override {
    EXPECT_EQ(ranges_[va], bytes);
    auto m = mapped_.lower_bound(va);
    EXPECT_TRUE(m == mapped_.end() || m->first >= va + bytes) << "a released range is still mapped";
    ranges_.erase(va);
  }
  void AbandonRange(std::uintptr_t va, std::size_t) override {
    ranges_.erase(va);
    ++abandoned_ranges;
  }
  absl::StatusOr<PhysicalHandle> CreatePhysical(std::size_t bytes, PoolIndex pool) override {
    EXPECT_TRUE(bytes > 0 && bytes % kGranule == 0) << "a physical allocation of " << bytes << " bytes";
    if (used_ + bytes > limit_) return absl::ResourceExhaustedError("fake source: limit");
    used_ += bytes;
    stats_->Increase(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
    handles_.emplace(next_handle_, bytes);
    ++creates;
    return next_handle_++;
  }
  bool ReleasePhysical(const PhysicalPiece& piece, PoolIndex pool) override {
    if (fail_release_in > 0 && --fail_release_in == 0) return false;
    auto it = handles_.find(piece.handle);
    EXPECT_TRUE(it != handles_.end() && it->second == piece.bytes) << "releasing an unknown handle or a wrong size";
    if (it != handles_.end()) handles_.erase(it);
    used_ -= piece.bytes;
    stats_->Decrease(&DeviceStats::reserved_bytes, pool, static_cast<std::int64_t>(piece.bytes));
    return true;
  }
  absl::Status MapPieces(std::uintptr_t va, absl::Span<const PhysicalPiece> pieces, std::size_t* mapped) override {
    for (*mapped = 0; *mapped < pieces.size(); ++*mapped) {
      if (fail_map_in > 0 && --fail_map_in == 0) {
        // The mapped prefix, as a backend that could not make it accessible and could not unmap it
        // either: it stays mapped, and nothing counts as mapped.
        if (map_failure_is_data_loss) {
          abandoned_mappings += *mapped;
          *mapped = 0;
          return absl::DataLossError("fake source: injected map failure that could not be undone");
        }
        return absl::InternalError("fake source: injected map failure");
      }
      auto h = handles_.find(pieces[*mapped].handle);
      EXPECT_TRUE(h != handles_.end() && h->second == pieces[*mapped].bytes) << "mapping a handle not whole";
      EXPECT_TRUE(mapped_.emplace(va, pieces[*mapped]).second) << "a piece mapped twice";
      va += pieces[*mapped].bytes;
      ++maps;
    }
    return absl::OkStatus();
  }
  // One call for whole pieces side by side, as cuMemUnmap takes them.
  absl::Status Unmap(std::uintptr_t va, std::size_t bytes) override {
    if (fail_unmap_in > 0 && --fail_unmap_in == 0) return absl::InternalError("fake source: injected unmap failure");
    for (std::uintptr_t at = va; at < va + bytes;) {
      auto it = mapped_.find(at);
      EXPECT_TRUE(it != mapped_.end()) << "unmapping at " << at << ", where no piece starts";
      if (it == mapped_.end()) break;
      at += it->second.bytes;
      EXPECT_LE(at, va + bytes) << "an unmap cuts a piece";
      mapped_.erase(it);
    }
    ++unmaps;
    return absl::OkStatus();
  }
  absl::Status SynchronizeStream(Stream stream) override {
    synced.push_back(stream);
    return absl::OkStatus();
  }
  std::size_t Headroom() const override { return limit_ > used_ ? limit_ - used_ : 0; }
  std::size_t GrowableRangeBytes() const override { return growable_range; }

  std::size_t used() const { return used_; }
  std::size_t ranges() const { return ranges_.size(); }
  // A plain virtual segment's range (MemorySource::GrowableRangeBytes); 0: just what it maps.
  std::size_t growable_range = 0;
  // Physical allocations that exist, and pieces mapped.
  std::size_t handles() const { return handles_.size(); }
  std::size_t mapped() const { return mapped_.size(); }
  // The handle of the piece mapped at `va`, or 0.
  PhysicalHandle HandleAt(std::uintptr_t va) const {
    auto it = mapped_.find(va);
    return it == mapped_.end() ? 0 : it->second.handle;
  }
  static constexpr std::size_t kGranule = std::size_t{2} << 20;
  int allocs = 0;
  int frees = 0;
  int creates = 0;  // physical allocations created, pieces mapped, unmap calls
  int maps = 0;
  int unmaps = 0;
  int fail_map_in = 0;                    // > 0: the Nth map from now fails
  bool map_failure_is_data_loss = false;  // ... with DataLoss: what it mapped stays mapped
  int abandoned_ranges = 0;
  std::size_t abandoned_mappings = 0;
  int fail_unmap_in = 0;            // > 0: the Nth unmap from now fails
  int fail_release_in = 0;          // > 0: the Nth physical release from now is refused
  int fail_segment_release_in = 0;  // > 0: the Nth segment release from now is refused
  std::vector<Stream> synced;

 private:
  internal::StatLedger* stats_;
  std::size_t limit_;
  std::size_t used_ = 0;
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  std::map<std::uintptr_t, std::size_t> live_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  std::map<std::uintptr_t, PhysicalPiece> mapped_;
  std::map<PhysicalHandle, std::size_t> handles_;  // -> bytes
  PhysicalHandle next_handle_ = 1;
};

}  // namespace bucketalloc::testing

#endif  // BUCKETALLOC_TESTS_TEST_UTIL_H_
