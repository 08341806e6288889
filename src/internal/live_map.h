// src/internal/live_map.h — the map from a live allocation's address to its metadata (layer L0).
//
// Owns: `LiveMap<V>`, an open-addressing hash table keyed by non-zero addresses: multiplicative
// hashing, linear probing, and backward-shift deletion (no tombstones, so a table that sees
// millions of insert/erase pairs never degrades or rehashes in place). Every allocation inserts
// and every free erases, so this is on the fast path: neither allocates heap memory unless the
// table must grow to a new high-water mark of live allocations (load factor 1/2).
// Invariants: capacity is a power of two >= 64; size <= capacity / 2; every key is reachable from
// its home slot without crossing an empty slot.
// Thread-safety: none; the device lock guards it.
//
// Example:
//   LiveMap<Entry> live;  live.Insert(addr, entry);  if (Entry* e = live.Find(addr)) ...;  live.Erase(addr);
#ifndef BUCKETALLOC_INTERNAL_LIVE_MAP_H_
#define BUCKETALLOC_INTERNAL_LIVE_MAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/check.h"

namespace bucketalloc::internal {

template <typename V>
class LiveMap {
  static_assert(std::is_trivially_destructible_v<V>, "a slot's value is overwritten in place");

 public:
  LiveMap() { Rebuild(kMinCapacity); }
  LiveMap(const LiveMap&) = delete;
  LiveMap& operator=(const LiveMap&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Returns the entry of `key`, or nullptr. Key 0 (a null pointer) is never present: it marks an
  // empty slot, so it is answered before probing rather than matching the first empty slot.
  V* Find(std::uintptr_t key) {
    if (key == 0) return nullptr;
    for (std::size_t i = Home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }
  const V* Find(std::uintptr_t key) const { return const_cast<LiveMap*>(this)->Find(key); }
  bool contains(std::uintptr_t key) const { return Find(key) != nullptr; }

  // Inserts `key` (non-zero, not present) with the value V(args...), made in its slot (no
  // temporary: the fast path writes each field once).
  template <typename... Args>
  V* Emplace(std::uintptr_t key, Args&&... args) {
    BA_DCHECK(key != 0, "LiveMap keys are non-zero addresses");
    if ((size_ + 1) * 2 > capacity_) Rebuild(capacity_ * 2);
    std::size_t i = Home(key);
    while (slots_[i].key != 0) {
      BA_DCHECK(slots_[i].key != key, "LiveMap::Insert of a present key");
      i = (i + 1) & mask_;
    }
    slots_[i].key = key;
    V* value;
    if constexpr (std::is_constructible_v<V, Args...>) {
      value = std::construct_at(&slots_[i].value, std::forward<Args>(args)...);
    } else {  // an aggregate: clang 14 has no parenthesized aggregate initialization (P0960)
      value = ::new (static_cast<void*>(&slots_[i].value)) V{std::forward<Args>(args)...};
    }
    ++size_;
    return value;
  }
  void Insert(std::uintptr_t key, const V& value) { Emplace(key, value); }

  // Removes the entry `found` (a pointer returned by Find).
  void Erase(V* found) {
    Slot* slot = reinterpret_cast<Slot*>(reinterpret_cast<char*>(found) - offsetof(Slot, value));
    std::size_t hole = static_cast<std::size_t>(slot - slots_.get());
    // Backward-shift: move later entries of the probe run into the hole when their home allows.
    for (std::size_t i = (hole + 1) & mask_; slots_[i].key != 0; i = (i + 1) & mask_) {
      const std::size_t home = Home(slots_[i].key);
      // Entry i may move to `hole` iff hole lies cyclically in [home, i).
      if (((i - home) & mask_) >= ((i - hole) & mask_)) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole].key = 0;
    --size_;
  }

  // Checks the load factor and that every key is found from its home slot.
  absl::Status CheckInvariants() const {
    if (size_ * 2 > capacity_)
      return absl::InternalError(absl::StrCat("live map: ", size_, " keys in ", capacity_, " slots"));
    std::size_t keys = 0;
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key == 0) continue;
      ++keys;
      if (Find(slots_[i].key) != &slots_[i].value) {
        return absl::InternalError(absl::StrCat("live map: key ", absl::Hex(slots_[i].key), " is unreachable"));
      }
    }
    if (keys != size_) return absl::InternalError("live map: size does not match its keys");
    return absl::OkStatus();
  }

  template <typename F>
  void ForEach(F&& f) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != 0) f(slots_[i].key, slots_[i].value);
    }
  }

 private:
  static constexpr std::size_t kMinCapacity = 64;
  struct Slot {
    std::uintptr_t key = 0;  // 0 = empty
    V value{};
  };

  std::size_t Home(std::uintptr_t key) const {
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  void Rebuild(std::size_t capacity) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const std::size_t old_capacity = capacity_;
    slots_ = std::make_unique<Slot[]>(capacity);
    capacity_ = capacity;
    mask_ = capacity - 1;
    shift_ = 64 - __builtin_ctzll(capacity);
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key != 0) Emplace(old[i].key, old[i].value);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t capacity_ = 0;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_LIVE_MAP_H_
