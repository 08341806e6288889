// src/internal/intrusive_list.h — a doubly linked list threaded through its elements (layer L0).
//
// Owns: `ListNode` and `IntrusiveList<T, &T::node>`, used for free lists, slab lists and the
// release order of cached segments. Push, pop and remove are O(1) and never allocate, which is
// what keeps the allocator's fast path free of heap allocation.
// Invariant: a node is in at most one list at a time; `linked()` is true exactly while it is in one.
// An element can be unlinked without naming its list (`Unlink`), so the list keeps no size.
// Thread-safety: none; the owner's lock guards the list.
//
// Example:
//   struct Item { ListNode node; int v; };
//   IntrusiveList<Item, &Item::node> list;  list.PushBack(&item);  Item* first = list.front();
#ifndef BUCKETALLOC_INTERNAL_INTRUSIVE_LIST_H_
#define BUCKETALLOC_INTERNAL_INTRUSIVE_LIST_H_

#include <cstddef>

namespace bucketalloc::internal {

struct ListNode {
  ListNode* prev = nullptr;
  ListNode* next = nullptr;
  bool linked() const { return next != nullptr; }
};

template <typename T, ListNode T::*Member>
class IntrusiveList {
 public:
  IntrusiveList() { head_.prev = head_.next = &head_; }
  IntrusiveList(const IntrusiveList&) = delete;
  IntrusiveList& operator=(const IntrusiveList&) = delete;

  bool empty() const { return head_.next == &head_; }
  T* front() const { return empty() ? nullptr : FromNode(head_.next); }
  T* back() const { return empty() ? nullptr : FromNode(head_.prev); }
  // Returns the element after `item`, or nullptr at the end.
  T* next(const T* item) const {
    const ListNode* n = (item->*Member).next;
    return n == &head_ ? nullptr : FromNode(const_cast<ListNode*>(n));
  }

  void PushFront(T* item) { InsertAfter(&head_, &(item->*Member)); }
  void PushBack(T* item) { InsertAfter(head_.prev, &(item->*Member)); }
  // Removes `item` from whichever list holds it.
  static void Unlink(T* item) {
    ListNode* n = &(item->*Member);
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = nullptr;
  }
  T* PopFront() {
    T* item = front();
    if (item != nullptr) Unlink(item);
    return item;
  }

 private:
  static T* FromNode(ListNode* node) {
    // offsetof for a pointer-to-member: the distance of Member inside T.
    const std::ptrdiff_t offset = reinterpret_cast<std::ptrdiff_t>(&(static_cast<T*>(nullptr)->*Member));
    return reinterpret_cast<T*>(reinterpret_cast<char*>(node) - offset);
  }
  void InsertAfter(ListNode* pos, ListNode* n) {
    n->prev = pos;
    n->next = pos->next;
    pos->next->prev = n;
    pos->next = n;
  }

  ListNode head_;
};

}  // namespace bucketalloc::internal

#endif  // BUCKETALLOC_INTERNAL_INTRUSIVE_LIST_H_
