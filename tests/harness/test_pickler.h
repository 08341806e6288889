// tests/harness/test_pickler.h — writes pickles opcode by opcode (protocol 4, as Python's pickle and
// torch's _dump_snapshot write them), for tests that need a pickle's exact structure: what the memo
// shares, how large, how hostile. The opcodes are CPython's Lib/pickletools.py's.
#ifndef BUCKETALLOC_TESTS_HARNESS_TEST_PICKLER_H_
#define BUCKETALLOC_TESTS_HARNESS_TEST_PICKLER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace bucketalloc::harness::testing_pickle {

class Pickler {
 public:
  Pickler() : out_("\x80\x04", 2) {}

  Pickler& Str(absl::string_view s) {
    out_ += 'X';
    Put32(static_cast<std::uint32_t>(s.size()));
    out_.append(s.data(), s.size());
    return *this;
  }
  Pickler& Int(std::int32_t n) {
    out_ += 'J';
    Put32(static_cast<std::uint32_t>(n));
    return *this;
  }
  // An int of 8 bytes (LONG1), as torch's pickler writes addresses.
  Pickler& Long(std::int64_t n) {
    out_ += '\x8a';
    out_ += '\x08';
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>(static_cast<std::uint64_t>(n) >> (8 * i));
    return *this;
  }
  Pickler& None() { return Op('N'); }
  Pickler& EmptyList() { return Op(']'); }
  Pickler& EmptyDict() { return Op('}'); }
  Pickler& Mark() { return Op('('); }
  Pickler& Append() { return Op('a'); }
  Pickler& Appends() { return Op('e'); }
  Pickler& SetItem() { return Op('s'); }
  Pickler& SetItems() { return Op('u'); }
  Pickler& Pop() { return Op('0'); }
  // MEMOIZE: the value on top goes into the memo; its index is returned by `memoized`.
  Pickler& Memoize(std::uint32_t* memoized = nullptr) {
    if (memoized != nullptr) *memoized = next_memo_;
    ++next_memo_;
    return Op('\x94');
  }
  Pickler& Get(std::uint32_t index) {
    out_ += 'j';
    Put32(index);
    return *this;
  }
  // A string key (memoized the first time, then referenced), as pickle writes a dict's keys.
  Pickler& Key(const std::string& k) {
    for (const auto& [name, index] : keys_) {
      if (name == k) return Get(index);
    }
    std::uint32_t index = 0;
    Str(k).Memoize(&index);
    keys_.emplace_back(k, index);
    return *this;
  }
  std::string Done() {
    out_ += '.';
    return out_;
  }
  std::size_t size() const { return out_.size(); }

 private:
  Pickler& Op(char c) {
    out_ += c;
    return *this;
  }
  void Put32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>(v >> (8 * i));
  }
  std::string out_;
  std::uint32_t next_memo_ = 0;
  std::vector<std::pair<std::string, std::uint32_t>> keys_;
};

}  // namespace bucketalloc::harness::testing_pickle

#endif  // BUCKETALLOC_TESTS_HARNESS_TEST_PICKLER_H_
