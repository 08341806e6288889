#include "internal/intrusive_list.h"

#include <gtest/gtest.h>

#include "internal/bits.h"
#include "internal/object_pool.h"

namespace bucketalloc::internal {
namespace {

struct Item {
  ListNode node;
  int value = 0;
};
using List = IntrusiveList<Item, &Item::node>;

TEST(IntrusiveListTest, PushPopUnlinkKeepOrder) {
  List list;
  Item a{.value = 1}, b{.value = 2}, c{.value = 3};
  EXPECT_TRUE(list.empty());
  list.PushBack(&a);
  list.PushBack(&b);
  list.PushFront(&c);  // c a b
  EXPECT_EQ(list.front(), &c);
  EXPECT_EQ(list.back(), &b);
  EXPECT_EQ(list.next(&c), &a);
  EXPECT_EQ(list.next(&b), nullptr);
  EXPECT_TRUE(a.node.linked());
  List::Unlink(&a);  // c b
  EXPECT_FALSE(a.node.linked());
  EXPECT_EQ(list.next(&c), &b);
  EXPECT_EQ(list.PopFront(), &c);
  EXPECT_EQ(list.PopFront(), &b);
  EXPECT_EQ(list.PopFront(), nullptr);
  EXPECT_TRUE(list.empty());
}

TEST(ObjectPoolTest, RecyclesObjects) {
  ObjectPool<Item, 4> pool;
  std::vector<Item*> items;
  for (int i = 0; i < 10; ++i) items.push_back(pool.New());
  EXPECT_EQ(pool.live(), 10u);
  Item* first = items[3];
  pool.Delete(first);
  EXPECT_EQ(pool.New(), first);  // reused, not a new allocation
  for (Item* it : items) pool.Delete(it);
  EXPECT_EQ(pool.live(), 0u);
}

TEST(BitsTest, Arithmetic) {
  EXPECT_TRUE(IsPowerOfTwo(4096));
  EXPECT_FALSE(IsPowerOfTwo(0));
  EXPECT_FALSE(IsPowerOfTwo(3000));
  EXPECT_EQ(RoundUp(3000, 512), 3072u);
  EXPECT_EQ(RoundUp(3072, 512), 3072u);
  EXPECT_EQ(Log2Floor(4096), 12);
  EXPECT_EQ(Log2Floor(4097), 12);
  EXPECT_EQ(Log2Ceil(4097), 13);
  EXPECT_EQ(Log2Ceil(1), 0);
}

}  // namespace
}  // namespace bucketalloc::internal
