// src/harness/replay/snapshot_pickle.h — reads a PyTorch memory snapshot pickle (layer L5, the benchmark
// harness): the file torch.cuda.memory._dump_snapshot() writes (Python's pickle of the snapshot dict,
// reference/pytorch.md §4.2), or torch's own C++ pickler (_memory_snapshot_pickled).
//
// Owns: `PlainPickle`, the plain-data subset of Python's pickle format, protocols 0 to 5, parsed into
// a compact tree that refers to its input: None, booleans, integers, floats, strings and bytes
// (views of the input; protocol 0's escaped text decoded once), lists, tuples (as lists), sets and
// dicts; the memo (PUT/GET, MEMOIZE) and protocol 4's framing. A value the memo shares is held once,
// however many references it has (torch's pickler shares strings and frame dicts): the tree holds at
// most one 16-byte node per opcode and a 4-byte reference per item (small integers inside the
// reference). A snapshot's tree is about 2 bytes per byte of its input; the worst case, a pickle of
// one-byte container opcodes, 20 bytes per byte (docs/harness.md, "Reading a snapshot").
// Every opcode that names or calls code (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
// EXT*, PERSID) is refused before anything of the file is used, as tools/import_torch_snapshot.py's
// restricted unpickler refuses them: a memory snapshot holds only plain data, so a file that needs
// them is not one, or is hostile.
// `ParsePlainPickle` writes a tree as JSON (the tests' and the fuzzer's view), writing a shared value
// once per reference as Python's json module would, within a budget of values and string bytes in
// proportion to the input: references that expand without bound (a memoized string referenced
// 20,000 times, lists of lists of the one before) are refused, not expanded. A container that holds
// itself is refused there too. Readers of the tree (harness/replay/snapshot_import.h) walk only
// what they use, with a budget of their own.
// Limits: nesting at most kMaxPickleDepth deep in JSON; a length beyond the end of the input, a
// string of 4 GiB or more, more than 2^31 values are errors.
// Thread-safety: a PlainPickle is immutable once parsed (any threads may read it).
//
// Example:
//   absl::StatusOr<PlainPickle> p = PlainPickle::Parse(std::move(bytes), "snapshot.pickle");
//   std::optional<PickleValue> traces = p->root().Find("device_traces");
#ifndef BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_
#define BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {

inline constexpr int kMaxPickleDepth = 256;
// The values and string bytes ParsePlainPickle may write per byte of its input (a snapshot's JSON
// holds about 3; its shared frames expanded, about 10).
inline constexpr std::uint64_t kPickleExpansionPerByte = 16;

class PlainPickle;

// One value of a parsed pickle (a view: valid while its PlainPickle lives).
class PickleValue {
 public:
  enum class Kind : std::uint8_t { kNone, kBool, kInt, kFloat, kString, kList, kDict };

  Kind kind() const;
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_string() const { return kind() == Kind::kString; }
  // What the value is, for messages: "None", "a bool", "an int", "a float", "a str", "a list", "a dict".
  absl::string_view KindName() const;

  bool boolean() const;  // a bool's value
  // An int's value: `Signed` for one in [-2^63, 2^63), `Unsigned` for one in [0, 2^64); nullopt
  // when it is not such an int (a bool is not an int here).
  std::optional<std::int64_t> Signed() const;
  std::optional<std::uint64_t> Unsigned() const;
  // An int or a float as a double (nullopt for any other kind).
  std::optional<double> Number() const;
  absl::string_view text() const;  // a string's (or bytes') bytes

  // A list's items, or a dict's entries (in insertion order; a key set twice is there twice).
  std::size_t size() const;
  PickleValue item(std::size_t i) const;  // a list's
  PickleValue key(std::size_t i) const;   // a dict's
  PickleValue value(std::size_t i) const;
  // A dict's value for the string key `k` (the last set, as Python's dict keeps), or nullopt.
  // Linear in the dict's entries.
  std::optional<PickleValue> Find(absl::string_view k) const;

  // The value's identity in its pickle: equal for two references to one shared value (and for two
  // equal small ints, which are held in the reference).
  std::uint32_t identity() const { return ref_; }

 private:
  friend class PlainPickle;
  PickleValue(const PlainPickle* pickle, std::uint32_t ref) : pickle_(pickle), ref_(ref) {}
  const PlainPickle* pickle_;
  std::uint32_t ref_;
};

class PlainPickle {
 public:
  // Parses `bytes` (kept: the tree's strings are views of it). InvalidArgument names `source`, the
  // opcode and its offset: one that would run code ("refusing to load module.name"), one this
  // reader does not know, a truncated or malformed input.
  static absl::StatusOr<PlainPickle> Parse(std::string bytes, absl::string_view source = "pickle");

  PlainPickle(PlainPickle&&) noexcept;
  PlainPickle& operator=(PlainPickle&&) noexcept;
  ~PlainPickle();

  PickleValue root() const;
  std::size_t input_bytes() const;
  // The bytes the tree holds besides its input (its nodes, references, memo and decoded text).
  std::size_t tree_bytes() const;
  const std::string& source() const;

  struct Tree;  // snapshot_pickle.cc's

 private:
  friend class PickleValue;
  explicit PlainPickle(std::unique_ptr<Tree> tree);
  std::unique_ptr<Tree> tree_;
};

// True when `bytes` starts as a pickle of protocol 2 or later does (the PROTO opcode; what
// _dump_snapshot writes is protocol 4 or 5). Protocols 0 and 1 have no mark of their own: their
// bytes are read by ParsePlainPickle when a caller knows them to be a pickle.
bool LooksLikePickle(absl::string_view bytes);

// `v` as JSON (dict keys that are not strings become their JSON text). InvalidArgument naming
// `source`: data nested deeper than kMaxPickleDepth, a container that holds itself, or shared
// references that expand to more than kPickleExpansionPerByte values and string bytes per byte of
// the input.
absl::StatusOr<nlohmann::json> PickleToJson(const PickleValue& v, const PlainPickle& pickle);

// The plain data of a pickle as JSON: Parse, then PickleToJson of its root.
absl::StatusOr<nlohmann::json> ParsePlainPickle(absl::string_view bytes, absl::string_view source = "pickle");

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_
