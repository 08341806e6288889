// src/internal/object_pool.h — recycled metadata objects (layer L0).
//
// Owns: `ObjectPool<T>`, which hands out T objects from chunks and takes them back on a free list,
// so that splitting a block on a cache hit reuses metadata instead of calling the heap. A new
// chunk is allocated only when every object is in use (a slow path).
// Thread-safety: none; the owner's lock guards it.
//
// Example: ObjectPool<Block> pool; Block* b = pool.New(); ...; pool.Delete(b);
#ifndef BUCKETALLOC_INTERNAL_OBJECT_POOL_H_
#define BUCKETALLOC_INTERNAL_OBJECT_POOL_H_

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace bucketalloc::internal {

template <typename T, std::size_t kChunk = 256>
class ObjectPool {
  static_assert(std::is_trivially_destructible_v<T>, "an ObjectPool holds trivially destructible metadata");

 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;
  ~ObjectPool() = default;  // objects are trivially destructible metadata

  // Returns a value-initialized T.
  template <typename... Args>
  T* New(Args&&... args) {
    if (free_ == nullptr) Grow();
    Slot* s = free_;
    free_ = s->next_free;
    ++live_;
    return new (&s->storage) T(std::forward<Args>(args)...);
  }
  void Delete(T* p) {
    p->~T();
    Slot* s = reinterpret_cast<Slot*>(p);
    s->next_free = free_;
    free_ = s;
    --live_;
  }
  std::size_t live() const { return live_; }

 private:
  union Slot {
    Slot* next_free;
    alignas(T) unsigned char storage[sizeof(T)];
  };
  void Grow() {
    chunks_.push_back(std::make_unique<Slot[]>(kChunk));
    Slot* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) {
      chunk[i].next_free = free_;
      free_ = &chunk[i];
    }
  }

  std::vector<std::unique_ptr<Slot[]>> chunks_;
  Slot* free_ = nullptr;
  std::size_t live_ = 0;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_OBJECT_POOL_H_
