#include "internal/live_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace bucketalloc::internal {
namespace {

TEST(LiveMapTest, InsertFindErase) {
  LiveMap<int> m;
  EXPECT_TRUE(m.empty());
  m.Insert(0x1000, 1);
  m.Insert(0x2000, 2);
  ASSERT_NE(m.Find(0x1000), nullptr);
  EXPECT_EQ(*m.Find(0x2000), 2);
  EXPECT_EQ(m.Find(0x3000), nullptr);
  m.Erase(m.Find(0x1000));
  EXPECT_EQ(m.Find(0x1000), nullptr);
  EXPECT_TRUE(m.contains(0x2000));
  EXPECT_EQ(m.size(), 1u);
}

// Key 0 marks an empty slot; a null pointer must not match one (it once returned an empty slot's
// value, so the allocator took nullptr for a live block of device 0).
TEST(LiveMapTest, ZeroIsNeverFound) {
  LiveMap<int> m;
  EXPECT_EQ(m.Find(0), nullptr);
  for (std::uintptr_t k = 1; k <= 20; ++k) m.Insert(k << 12, 1);
  EXPECT_EQ(m.Find(0), nullptr);
  EXPECT_FALSE(m.contains(0));
}

// A long random sequence of inserts and erases against std::unordered_map: backward-shift deletion
// must keep every remaining key reachable, through growth and through colliding keys.
TEST(LiveMapTest, MatchesAReferenceMapUnderChurn) {
  LiveMap<std::uint64_t> m;
  std::unordered_map<std::uintptr_t, std::uint64_t> ref;
  std::vector<std::uintptr_t> keys;
  std::mt19937_64 rng(3);
  for (int op = 0; op < 200000; ++op) {
    if (keys.empty() || rng() % 100 < 55) {
      // Keys of 512-byte aligned addresses, many of them close together (collisions).
      const std::uintptr_t key = ((rng() % 4096) + 1) * 512 + (rng() % 2) * (std::uintptr_t{1} << 40);
      if (ref.count(key)) continue;
      m.Insert(key, op);
      ref[key] = op;
      keys.push_back(key);
    } else {
      const std::size_t i = rng() % keys.size();
      const std::uintptr_t key = keys[i];
      keys[i] = keys.back();
      keys.pop_back();
      std::uint64_t* found = m.Find(key);
      ASSERT_NE(found, nullptr);
      EXPECT_EQ(*found, ref[key]);
      m.Erase(found);
      ref.erase(key);
    }
    if (op % 10000 == 0) {
      ASSERT_EQ(m.size(), ref.size());
      for (const auto& [k, v] : ref) {
        const std::uint64_t* f = m.Find(k);
        ASSERT_NE(f, nullptr) << k;
        ASSERT_EQ(*f, v);
      }
      std::size_t visited = 0;
      m.ForEach([&](std::uintptr_t k, std::uint64_t v) {
        ++visited;
        EXPECT_EQ(ref.at(k), v);
      });
      EXPECT_EQ(visited, ref.size());
    }
  }
}

}  // namespace
}  // namespace bucketalloc::internal
