// Each thread's pool key (src/backend/stream_keys.h) and the public Allocator::PoolKey and
// StreamOfKey (bucketalloc/allocator.h, inline for the header's callers): the same answers.
#include "backend/stream_keys.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "bucketalloc/allocator.h"

namespace bucketalloc {
namespace {

TEST(StreamKeysTest, ThePublicKeysAreTheInternalOnes) {
  Stream other_thread_key = nullptr;
  std::thread([&] { other_thread_key = internal::PerThreadKey(); }).join();
  const Stream own = internal::PerThreadKey();
  ASSERT_TRUE(IsPseudoStream(own));
  EXPECT_EQ(own, internal::PerThreadKey());  // stable on a thread
  EXPECT_NE(own, other_thread_key);          // unique per thread
  EXPECT_EQ(Allocator::PoolKey(kPerThreadStream), own);
  const std::vector<Stream> streams = {nullptr, reinterpret_cast<Stream>(0x7f0000001000), kPerThreadStream, own,
                                       other_thread_key};
  for (Stream s : streams) {
    SCOPED_TRACE(reinterpret_cast<std::uintptr_t>(s));
    EXPECT_EQ(Allocator::StreamOfKey(s), internal::StreamOfKey(s));
    if (s != kPerThreadStream) {
      EXPECT_EQ(Allocator::PoolKey(s), s);  // any other stream is its own key
    }
  }
  EXPECT_EQ(internal::StreamOfKey(own), kPerThreadStream);               // this thread's key: its stream
  EXPECT_EQ(internal::StreamOfKey(other_thread_key), other_thread_key);  // another's stays a key
}

}  // namespace
}  // namespace bucketalloc
