// src/harness/replay/snapshot_pickle.cc — the plain-data subset of Python's pickle format
// (harness/replay/snapshot_pickle.h). The opcodes are those of CPython's Lib/pickletools.py.
#include "harness/replay/snapshot_pickle.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "harness/replay/trace.h"

namespace bucketalloc::harness {

// The tree. A reference (a stack slot, a container's item, a memo entry) is 32 bits: with its top
// bit set, an int in [0, 2^31 - 1) held in the reference itself (most ints of a snapshot: sizes, line
// numbers, small addresses); otherwise a node's index. Nodes 0 to 2 are None, True and False, shared
// by every reference to them. A container's references lie in `refs` at `payload`, `count` of them
// (a dict's are key, value pairs) in a region of Capacity(node): exactly `count` when it was built
// whole (kExact: LIST, TUPLE, DICT, TUPLE1-3); a container filled by several opcodes (APPENDS,
// SETITEMS) grows in place when its region is the last, or moves to the end into a region twice as
// large, so filling costs amortized O(1) per item and the regions left behind at most as much again.
// Invariants: every reference in `refs`, the memo and `root` is an inline int or a node index below
// nodes.size(); a string's [payload, payload + count) lies in `input` (or `decoded` when kDecoded).
struct PlainPickle::Tree {
  enum Flag : std::uint8_t { kUnsignedBig = 1, kDecoded = 2, kExact = 4 };
  struct Node {
    PickleValue::Kind kind = PickleValue::Kind::kNone;
    std::uint8_t flags = 0;
    std::uint32_t count = 0;    // a string's bytes; a container's references
    std::uint64_t payload = 0;  // an int's or a float's bits; a string's or a container's offset
  };
  static constexpr std::uint32_t kInline = 0x80000000u;
  // The largest int held in a reference: 2^31 - 2, so that no reference is 0xFFFFFFFF (the parser's
  // mark of a memo slot never PUT).
  static constexpr std::uint32_t kMaxInline = 0x7FFFFFFEu;
  static constexpr std::uint32_t kNoneRef = 0, kTrueRef = 1, kFalseRef = 2;

  static bool IsInline(std::uint32_t ref) { return (ref & kInline) != 0; }
  // A container's region: exactly its items when built whole (kExact), else room to double into.
  static std::uint64_t Capacity(const Node& n) {
    if ((n.flags & kExact) != 0 || n.count == 0) return n.count;
    return GrowthCapacity(n.count);
  }
  static std::uint64_t GrowthCapacity(std::uint64_t count) { return std::max<std::uint64_t>(4, std::bit_ceil(count)); }
  const Node& At(std::uint32_t ref) const { return nodes[ref]; }

  std::string input;
  std::string source;
  std::string decoded;  // protocol 0's UNICODE text, decoded to UTF-8
  std::vector<Node> nodes;
  std::vector<std::uint32_t> refs;
  std::uint32_t root = kNoneRef;
  std::size_t memo_bytes = 0;  // what the memo held while parsing (freed after)
};

namespace {

using Kind = PickleValue::Kind;
using Tree = PlainPickle::Tree;

class Parser {
 public:
  explicit Parser(Tree* tree) : t_(*tree), in_(tree->input) {
    t_.nodes.resize(3);  // None, True, False
    t_.nodes[Tree::kTrueRef] = {Kind::kBool, 0, 0, 1};
    t_.nodes[Tree::kFalseRef] = {Kind::kBool, 0, 0, 0};
  }

  absl::Status Run() {
    while (true) {
      if (pos_ >= in_.size()) return Error("the input ends before its STOP opcode");
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (absl::Status s = Step(op, at); !s.ok()) return s;
      if (stopped_) break;
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      return Error(absl::StrCat("STOP leaves ", stack_.size() + marks_.size(),
                                " values and marks on the stack; a pickle leaves one value"));
    }
    t_.root = stack_.back();
    t_.memo_bytes = memo_.capacity() * sizeof(std::uint32_t) + sparse_memo_.size() * 2 * sizeof(std::uint64_t);
    return absl::OkStatus();
  }

 private:
  static constexpr std::uint32_t kUnset = 0xFFFFFFFFu;  // a dense memo slot never PUT (no node has this index)
  static constexpr std::size_t kMaxStack = std::size_t{1} << 24;

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(t_.source, ": ", what, " (at byte ", op_at_, ")"));
  }

  // `n` bytes of the input.
  absl::StatusOr<absl::string_view> Take(std::uint64_t n) {
    if (n > in_.size() - pos_) {
      return Error(
          absl::StrCat("a length of ", n, " runs past the end of the input (", in_.size() - pos_, " bytes left)"));
    }
    absl::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // A little-endian unsigned integer of `n` bytes.
  absl::StatusOr<std::uint64_t> Unsigned(int n) {
    absl::StatusOr<absl::string_view> b = Take(n);
    if (!b.ok()) return b.status();
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>((*b)[i]);
    return v;
  }
  // A text line (protocol 0's arguments), without its newline.
  absl::StatusOr<absl::string_view> Line() {
    const std::size_t end = in_.find('\n', pos_);
    if (end == absl::string_view::npos) return Error("a text argument has no end of line");
    absl::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  // A new node's reference.
  absl::StatusOr<std::uint32_t> Make(Kind kind, std::uint8_t flags = 0, std::uint32_t count = 0,
                                     std::uint64_t payload = 0) {
    if (t_.nodes.size() >= Tree::kInline) return Error("more than 2^31 values; accepted: fewer");
    t_.nodes.push_back({kind, flags, count, payload});
    return static_cast<std::uint32_t>(t_.nodes.size() - 1);
  }
  absl::Status PushNew(Kind kind, std::uint8_t flags = 0, std::uint32_t count = 0, std::uint64_t payload = 0) {
    absl::StatusOr<std::uint32_t> ref = Make(kind, flags, count, payload);
    if (!ref.ok()) return ref.status();
    return Push(*ref);
  }
  absl::Status Push(std::uint32_t ref) {
    if (stack_.size() >= kMaxStack) return Error("the stack grows past its limit");
    stack_.push_back(ref);
    return absl::OkStatus();
  }
  bool AtMark() const { return !marks_.empty() && marks_.back() == stack_.size(); }
  absl::StatusOr<std::uint32_t> Pop() {
    if (stack_.empty()) return Error("an opcode needs a value and the stack is empty");
    if (AtMark()) return Error("an opcode needs a value and finds the mark");
    const std::uint32_t ref = stack_.back();
    stack_.pop_back();
    return ref;
  }
  absl::StatusOr<std::uint32_t> Top() {
    if (stack_.empty() || AtMark()) return Error("an opcode needs a value");
    return stack_.back();
  }
  // The values above the last mark, which is removed with them.
  absl::StatusOr<std::vector<std::uint32_t>> PopToMark() {
    if (marks_.empty()) return Error("an opcode needs a mark and there is none");
    const std::size_t from = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return items;
  }

  absl::Status PushInt(std::int64_t n) {
    if (n >= 0 && n <= static_cast<std::int64_t>(Tree::kMaxInline)) {
      return Push(Tree::kInline | static_cast<std::uint32_t>(n));
    }
    return PushNew(Kind::kInt, 0, 0, static_cast<std::uint64_t>(n));
  }
  absl::Status PushUnsigned(std::uint64_t n) {
    if (n <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return PushInt(static_cast<std::int64_t>(n));
    }
    return PushNew(Kind::kInt, Tree::kUnsignedBig, 0, n);
  }
  // A string of the input (a view of it).
  absl::Status PushInputString(absl::string_view s) {
    if (s.size() >= Tree::kInline * std::uint64_t{2}) {
      return Error(absl::StrCat("a string of ", s.size(), " bytes; accepted: below 4 GiB"));
    }
    return PushNew(Kind::kString, 0, static_cast<std::uint32_t>(s.size()),
                   static_cast<std::uint64_t>(s.data() - in_.data()));
  }
  absl::Status PushLengthString(int length_bytes) {
    absl::StatusOr<std::uint64_t> n = Unsigned(length_bytes);
    if (!n.ok()) return n.status();
    absl::StatusOr<absl::string_view> s = Take(*n);
    if (!s.ok()) return s.status();
    return PushInputString(*s);
  }
  // A two's-complement little-endian integer of `bytes` (LONG1, LONG4): one of 64 bits, or an
  // unsigned one below 2^64 (which takes 9 bytes, the last a zero sign byte).
  absl::Status PushLong(absl::string_view bytes) {
    const bool negative = !bytes.empty() && (static_cast<unsigned char>(bytes.back()) & 0x80) != 0;
    bool big = false;
    if (bytes.size() > 8) {
      const char fill = negative ? '\xFF' : '\0';
      const bool top = (static_cast<unsigned char>(bytes[7]) & 0x80) != 0;
      for (std::size_t i = 8; i < bytes.size(); ++i) {
        if (bytes[i] != fill) return Error("an integer that does not fit in 64 bits");
      }
      if (negative && !top) return Error("an integer that does not fit in 64 bits");
      big = !negative && top;
      bytes = bytes.substr(0, 8);
    }
    std::uint64_t v = 0;
    for (std::size_t i = bytes.size(); i > 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i - 1]);
    if (negative && bytes.size() < 8) v |= ~std::uint64_t{0} << (8 * bytes.size());
    return big ? PushUnsigned(v) : PushInt(static_cast<std::int64_t>(v));
  }

  // Appends `items` to container `ref` (Tree's comment: in place, or moved to a region twice as large).
  absl::Status Append(std::uint32_t ref, const std::uint32_t* items, std::size_t n) {
    if (n == 0) return absl::OkStatus();
    Tree::Node& c = t_.nodes[ref];
    const std::uint64_t need = std::uint64_t{c.count} + n;
    if (need > std::numeric_limits<std::uint32_t>::max()) return Error("a container of more than 2^32 items");
    const std::uint64_t cap = Tree::Capacity(c);
    if (need > cap) {
      c.flags &= ~Tree::kExact;  // filled again: from now on it doubles
      if (c.count > 0 && c.payload + cap == t_.refs.size()) {
        t_.refs.resize(c.payload + Tree::GrowthCapacity(need));
      } else {
        const std::uint64_t to = t_.refs.size();
        t_.refs.resize(to + Tree::GrowthCapacity(need));
        std::copy_n(t_.refs.begin() + static_cast<std::ptrdiff_t>(c.payload), c.count,
                    t_.refs.begin() + static_cast<std::ptrdiff_t>(to));
        c.payload = to;
      }
    }
    std::copy_n(items, n, t_.refs.begin() + static_cast<std::ptrdiff_t>(c.payload + c.count));
    c.count = static_cast<std::uint32_t>(need);
    return absl::OkStatus();
  }
  absl::Status AppendTo(Kind kind, const char* opcode, std::uint32_t container,
                        const std::vector<std::uint32_t>& items) {
    if (Tree::IsInline(container) || t_.nodes[container].kind != kind) {
      return Error(absl::StrCat(opcode, " on a value that is not a ", kind == Kind::kList ? "list" : "dict"));
    }
    if (kind == Kind::kDict && items.size() % 2 != 0) return Error("SETITEMS with an odd number of keys and values");
    return Append(container, items.data(), items.size());
  }
  // A container built whole (LIST, TUPLE, DICT, TUPLE1-3): its items in a region of their number.
  absl::Status PushContainer(Kind kind, const std::vector<std::uint32_t>& items) {
    if (kind == Kind::kDict && items.size() % 2 != 0) return Error("DICT with an odd number of keys and values");
    if (items.size() > std::numeric_limits<std::uint32_t>::max()) return Error("a container of more than 2^32 items");
    absl::StatusOr<std::uint32_t> ref =
        Make(kind, Tree::kExact, static_cast<std::uint32_t>(items.size()), t_.refs.size());
    if (!ref.ok()) return ref.status();
    t_.refs.insert(t_.refs.end(), items.begin(), items.end());
    return Push(*ref);
  }

  absl::Status Memo(std::uint64_t index) {
    absl::StatusOr<std::uint32_t> top = Top();
    if (!top.ok()) return top.status();
    if (index <= pos_) {  // Python's memo indices count up from 0: dense
      if (index >= memo_.size()) memo_.resize(std::max<std::size_t>(index + 1, memo_.size() * 2), kUnset);
      memo_[index] = *top;
    } else {
      sparse_memo_[index] = *top;
    }
    return absl::OkStatus();
  }
  // The last PUT of `index`: its dense slot once set (a PUT of an index the input has passed goes
  // there, and is later than any sparse one of it), else its sparse entry.
  absl::Status Get(std::uint64_t index) {
    std::uint32_t ref = index < memo_.size() ? memo_[index] : kUnset;
    if (ref == kUnset) {
      if (auto it = sparse_memo_.find(index); it != sparse_memo_.end()) ref = it->second;
    }
    if (ref == kUnset) return Error(absl::StrCat("GET of memo entry ", index, ", which was never PUT"));
    return Push(ref);
  }

  absl::Status Step(unsigned char op, std::size_t at) {
    op_at_ = at;
    switch (op) {
      case 0x80: {  // PROTO
        absl::StatusOr<std::uint64_t> v = Unsigned(1);
        if (!v.ok()) return v.status();
        if (*v > 5) return Error(absl::StrCat("protocol ", *v, "; accepted: 0 to 5"));
        return absl::OkStatus();
      }
      case 0x95: {  // FRAME: its length; the frame's opcodes follow as usual
        absl::StatusOr<std::uint64_t> v = Unsigned(8);
        return v.ok() ? absl::OkStatus() : v.status();
      }
      case '.':
        stopped_ = true;
        return absl::OkStatus();  // STOP
      case '(':                   // MARK
        if (marks_.size() >= kMaxStack) return Error("the stack grows past its limit");
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case '}':
        return PushNew(Kind::kDict);  // EMPTY_DICT
      case ']':                       // EMPTY_LIST
      case ')':                       // EMPTY_TUPLE
      case 0x8f:                      // EMPTY_SET (as a list)
        return PushNew(Kind::kList);
      case 'N':
        return Push(Tree::kNoneRef);  // NONE
      case 0x88:
        return Push(Tree::kTrueRef);  // NEWTRUE
      case 0x89:
        return Push(Tree::kFalseRef);  // NEWFALSE
      case 'J': {                      // BININT: 4 bytes, signed
        absl::StatusOr<std::uint64_t> v = Unsigned(4);
        if (!v.ok()) return v.status();
        return PushInt(static_cast<std::int32_t>(static_cast<std::uint32_t>(*v)));
      }
      case 'K':    // BININT1
      case 'M': {  // BININT2
        absl::StatusOr<std::uint64_t> v = Unsigned(op == 'K' ? 1 : 2);
        if (!v.ok()) return v.status();
        return PushInt(static_cast<std::int64_t>(*v));
      }
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        absl::StatusOr<std::uint64_t> n = Unsigned(op == 0x8a ? 1 : 4);
        if (!n.ok()) return n.status();
        absl::StatusOr<absl::string_view> b = Take(*n);
        if (!b.ok()) return b.status();
        return PushLong(*b);
      }
      case 'I':    // INT (text; "01" and "00" are True and False)
      case 'L': {  // LONG (text, an "L" suffix)
        absl::StatusOr<absl::string_view> line = Line();
        if (!line.ok()) return line.status();
        absl::string_view t = absl::StripAsciiWhitespace(*line);
        if (op == 'I' && (t == "01" || t == "00")) return Push(t == "01" ? Tree::kTrueRef : Tree::kFalseRef);
        if (op == 'L' && !t.empty() && t.back() == 'L') t.remove_suffix(1);
        std::int64_t n = 0;
        if (absl::SimpleAtoi(t, &n)) return PushInt(n);
        std::uint64_t u = 0;
        if (!absl::SimpleAtoi(t, &u)) {
          return Error(absl::StrCat("an integer \"", Excerpt(t), "\" that does not fit in 64 bits"));
        }
        return PushUnsigned(u);
      }
      case 'G': {  // BINFLOAT: 8 bytes, big-endian
        absl::StatusOr<absl::string_view> b = Take(8);
        if (!b.ok()) return b.status();
        std::uint64_t bits = 0;
        for (char c : *b) bits = (bits << 8) | static_cast<unsigned char>(c);
        return PushNew(Kind::kFloat, 0, 0, bits);
      }
      case 'F': {  // FLOAT (text)
        absl::StatusOr<absl::string_view> line = Line();
        if (!line.ok()) return line.status();
        double real = 0.0;
        if (!absl::SimpleAtod(*line, &real)) return Error(absl::StrCat("a float \"", Excerpt(*line), "\""));
        return PushNew(Kind::kFloat, 0, 0, std::bit_cast<std::uint64_t>(real));
      }
      case 'X':
        return PushLengthString(4);  // BINUNICODE
      case 0x8c:
        return PushLengthString(1);  // SHORT_BINUNICODE
      case 0x8d:
        return PushLengthString(8);  // BINUNICODE8
      case 'T':
        return PushLengthString(4);  // BINSTRING
      case 'U':
        return PushLengthString(1);  // SHORT_BINSTRING
      case 'B':
        return PushLengthString(4);  // BINBYTES
      case 'C':
        return PushLengthString(1);  // SHORT_BINBYTES
      case 0x8e:
        return PushLengthString(8);  // BINBYTES8
      case 0x96:
        return PushLengthString(8);  // BYTEARRAY8
      case 'V': {                    // UNICODE: raw-unicode-escape text
        absl::StatusOr<absl::string_view> line = Line();
        if (!line.ok()) return line.status();
        const std::size_t from = t_.decoded.size();
        if (absl::Status s = RawUnicodeEscape(*line, &t_.decoded); !s.ok()) return s;
        return PushNew(Kind::kString, Tree::kDecoded, static_cast<std::uint32_t>(t_.decoded.size() - from), from);
      }
      case 'a': {  // APPEND
        absl::StatusOr<std::uint32_t> v = Pop();
        if (!v.ok()) return v.status();
        absl::StatusOr<std::uint32_t> list = Top();
        if (!list.ok()) return list.status();
        return AppendTo(Kind::kList, "APPEND", *list, {*v});
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS (to a set, kept as a list)
        absl::StatusOr<std::vector<std::uint32_t>> items = PopToMark();
        if (!items.ok()) return items.status();
        absl::StatusOr<std::uint32_t> list = Top();
        if (!list.ok()) return list.status();
        return AppendTo(Kind::kList, "APPENDS", *list, *items);
      }
      case 'l':     // LIST
      case 't':     // TUPLE
      case 0x91: {  // FROZENSET
        absl::StatusOr<std::vector<std::uint32_t>> items = PopToMark();
        if (!items.ok()) return items.status();
        return PushContainer(Kind::kList, *items);
      }
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const int n = op - 0x84;
        std::vector<std::uint32_t> items(n);
        for (int i = n - 1; i >= 0; --i) {
          absl::StatusOr<std::uint32_t> item = Pop();
          if (!item.ok()) return item.status();
          items[i] = *item;
        }
        return PushContainer(Kind::kList, items);
      }
      case 'd': {  // DICT
        absl::StatusOr<std::vector<std::uint32_t>> kv = PopToMark();
        if (!kv.ok()) return kv.status();
        return PushContainer(Kind::kDict, *kv);
      }
      case 's': {  // SETITEM
        absl::StatusOr<std::uint32_t> value = Pop();
        if (!value.ok()) return value.status();
        absl::StatusOr<std::uint32_t> key = Pop();
        if (!key.ok()) return key.status();
        absl::StatusOr<std::uint32_t> dict = Top();
        if (!dict.ok()) return dict.status();
        return AppendTo(Kind::kDict, "SETITEM", *dict, {*key, *value});
      }
      case 'u': {  // SETITEMS
        absl::StatusOr<std::vector<std::uint32_t>> kv = PopToMark();
        if (!kv.ok()) return kv.status();
        absl::StatusOr<std::uint32_t> dict = Top();
        if (!dict.ok()) return dict.status();
        return AppendTo(Kind::kDict, "SETITEMS", *dict, *kv);
      }
      case '0': {  // POP
        absl::StatusOr<std::uint32_t> v = Pop();
        return v.ok() ? absl::OkStatus() : v.status();
      }
      case '1': {  // POP_MARK
        absl::StatusOr<std::vector<std::uint32_t>> items = PopToMark();
        return items.ok() ? absl::OkStatus() : items.status();
      }
      case '2': {  // DUP
        absl::StatusOr<std::uint32_t> v = Top();
        if (!v.ok()) return v.status();
        return Push(*v);
      }
      case 0x94:
        return Memo(next_memoize_++);  // MEMOIZE: the next index
      case 'q':                        // BINPUT
      case 'r': {                      // LONG_BINPUT
        absl::StatusOr<std::uint64_t> i = Unsigned(op == 'q' ? 1 : 4);
        if (!i.ok()) return i.status();
        return Memo(*i);
      }
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        absl::StatusOr<std::uint64_t> i = Unsigned(op == 'h' ? 1 : 4);
        if (!i.ok()) return i.status();
        return Get(*i);
      }
      case 'p':    // PUT (text index)
      case 'g': {  // GET
        absl::StatusOr<absl::string_view> line = Line();
        if (!line.ok()) return line.status();
        std::uint64_t i = 0;
        if (!absl::SimpleAtoi(*line, &i)) return Error(absl::StrCat("a memo index \"", Excerpt(*line), "\""));
        return op == 'p' ? Memo(i) : Get(i);
      }
      case 'c':    // GLOBAL
      case 'i': {  // INST
        absl::StatusOr<absl::string_view> module = Line();
        if (!module.ok()) return module.status();
        absl::StatusOr<absl::string_view> name = Line();
        if (!name.ok()) return name.status();
        return Refuse(absl::StrCat(Excerpt(*module), ".", Excerpt(*name)));
      }
      case 0x93: {  // STACK_GLOBAL
        std::string what = "a global";
        if (stack_.size() >= 2 && IsString(stack_[stack_.size() - 2]) && IsString(stack_.back())) {
          what = absl::StrCat(Excerpt(Text(stack_[stack_.size() - 2])), ".", Excerpt(Text(stack_.back())));
        }
        return Refuse(what);
      }
      case 'R':
        return Refuse("a call (REDUCE)");
      case 'b':
        return Refuse("an object's state (BUILD)");
      case 'o':
        return Refuse("an object (OBJ)");
      case 0x81:
        return Refuse("an object (NEWOBJ)");
      case 0x92:
        return Refuse("an object (NEWOBJ_EX)");
      case 'P':
        return Refuse("a persistent id (PERSID)");
      case 'Q':
        return Refuse("a persistent id (BINPERSID)");
      case 0x82:
      case 0x83:
      case 0x84:
        return Refuse("an extension-registry object (EXT)");
      case 0x97:
        return Refuse("an out-of-band buffer (NEXT_BUFFER)");
      default:
        return Error(absl::StrCat("opcode 0x", absl::Hex(op, absl::kZeroPad2), ", which no plain-data pickle holds"));
    }
  }

  bool IsString(std::uint32_t ref) const { return !Tree::IsInline(ref) && t_.At(ref).kind == Kind::kString; }
  absl::string_view Text(std::uint32_t ref) const {
    const Tree::Node& n = t_.At(ref);
    const std::string& from = (n.flags & Tree::kDecoded) != 0 ? t_.decoded : t_.input;
    return absl::string_view(from).substr(n.payload, n.count);
  }

  // Python's raw-unicode-escape: bytes are Latin-1 characters, \uXXXX and \UXXXXXXXX escapes the
  // others; appended to `out` as UTF-8.
  absl::Status RawUnicodeEscape(absl::string_view in, std::string* out) const {
    auto put = [&](std::uint32_t c) {
      if (c < 0x80) {
        *out += static_cast<char>(c);
      } else if (c < 0x800) {
        *out += static_cast<char>(0xC0 | (c >> 6));
        *out += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        *out += static_cast<char>(0xE0 | (c >> 12));
        *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        *out += static_cast<char>(0xF0 | (c >> 18));
        *out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (c & 0x3F));
      }
    };
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::size_t digits = in[i] == '\\' && i + 1 < in.size() ? (in[i + 1] == 'u'   ? 4
                                                                       : in[i + 1] == 'U' ? 8
                                                                                          : 0)
                                                                    : 0;
      if (digits == 0) {
        put(static_cast<unsigned char>(in[i]));
        continue;
      }
      std::uint32_t c = 0;
      if (i + 2 + digits > in.size() || !absl::SimpleHexAtoi(in.substr(i + 2, digits), &c) || c > 0x10FFFF) {
        return Error("a malformed \\u escape in a UNICODE argument");
      }
      put(c);
      i += 1 + digits;
    }
    return absl::OkStatus();
  }

  absl::Status Refuse(absl::string_view what) const {
    return Error(absl::StrCat("refusing to load ", what,
                              ": a memory snapshot holds only plain data (dicts, lists, strings, numbers), so this "
                              "file is not one, or is hostile"));
  }

  Tree& t_;
  absl::string_view in_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  bool stopped_ = false;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;   // the stack's size at each MARK
  std::vector<std::uint32_t> memo_;  // dense: indices up to the bytes read when PUT (Python's count up)
  absl::flat_hash_map<std::uint64_t, std::uint32_t> sparse_memo_;  // any other index
  std::uint64_t next_memoize_ = 0;
};

// A value as JSON (PickleToJson's comment): the values and string bytes written are counted against
// a budget in proportion to the input; a container met again inside itself is refused at once.
class JsonWriter {
 public:
  explicit JsonWriter(const PlainPickle& p)
      : source_(p.source()), budget_(kPickleExpansionPerByte * p.input_bytes() + 1024) {}

  absl::Status Write(const PickleValue& v, int depth, nlohmann::json* out) {
    if (depth > kMaxPickleDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ": data nested deeper than ", kMaxPickleDepth, " levels"));
    }
    if (absl::Status s = Spend(1 + (v.is_string() ? v.text().size() : 0)); !s.ok()) return s;
    switch (v.kind()) {
      case Kind::kNone:
        *out = nullptr;
        return absl::OkStatus();
      case Kind::kBool:
        *out = v.boolean();
        return absl::OkStatus();
      case Kind::kInt:
        if (std::optional<std::uint64_t> u = v.Unsigned()) {
          *out = *u;
        } else {
          *out = *v.Signed();
        }
        return absl::OkStatus();
      case Kind::kFloat:
        *out = *v.Number();
        return absl::OkStatus();
      case Kind::kString:
        *out = std::string(v.text());
        return absl::OkStatus();
      case Kind::kList:
      case Kind::kDict:
        break;
    }
    std::optional<Open> open = Enter(v);
    if (!open.has_value()) return absl::InvalidArgumentError(absl::StrCat(source_, ": a container holds itself"));
    if (v.is_list()) {
      *out = nlohmann::json::array();
      for (std::size_t i = 0; i < v.size(); ++i) {
        nlohmann::json j;
        if (absl::Status s = Write(v.item(i), depth + 1, &j); !s.ok()) return s;
        out->push_back(std::move(j));
      }
      return absl::OkStatus();
    }
    *out = nlohmann::json::object();
    for (std::size_t i = 0; i < v.size(); ++i) {
      nlohmann::json k, j;
      if (absl::Status s = Write(v.key(i), depth + 1, &k); !s.ok()) return s;
      if (absl::Status s = Write(v.value(i), depth + 1, &j); !s.ok()) return s;
      // A key that is not a string becomes its JSON text (bytes that are not UTF-8 replaced).
      (*out)[k.is_string() ? k.get<std::string>() : k.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)] =
          std::move(j);
    }
    return absl::OkStatus();
  }

 private:
  // The containers Write is inside; an Open leaves its container on destruction.
  class Open {
   public:
    Open(JsonWriter* w, std::uint32_t id) : w_(w), id_(id) {}
    Open(Open&& o) noexcept : w_(std::exchange(o.w_, nullptr)), id_(o.id_) {}
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
    Open& operator=(Open&&) = delete;
    ~Open() {
      if (w_ != nullptr) w_->open_.erase(id_);
    }

   private:
    JsonWriter* w_;
    std::uint32_t id_;
  };
  std::optional<Open> Enter(const PickleValue& v) {
    if (!open_.insert(v.identity()).second) return std::nullopt;
    return Open(this, v.identity());
  }

  absl::Status Spend(std::uint64_t n) {
    spent_ += n;
    if (spent_ <= budget_) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": its shared references expand to more than ", budget_, " values and string bytes (",
        kPickleExpansionPerByte, " per byte of the pickle); a memory snapshot shares only strings and frames"));
  }

  std::string source_;
  std::uint64_t budget_;
  std::uint64_t spent_ = 0;
  absl::flat_hash_set<std::uint32_t> open_;
};

}  // namespace

// ---- PickleValue ------------------------------------------------------------------------------

Kind PickleValue::kind() const { return Tree::IsInline(ref_) ? Kind::kInt : pickle_->tree_->At(ref_).kind; }

absl::string_view PickleValue::KindName() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a str";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
  }
  return "a value";
}

bool PickleValue::boolean() const { return kind() == Kind::kBool && pickle_->tree_->At(ref_).payload != 0; }

std::optional<std::int64_t> PickleValue::Signed() const {
  if (Tree::IsInline(ref_)) return static_cast<std::int64_t>(ref_ & ~Tree::kInline);
  const Tree::Node& n = pickle_->tree_->At(ref_);
  if (n.kind != Kind::kInt || (n.flags & Tree::kUnsignedBig) != 0) return std::nullopt;
  return static_cast<std::int64_t>(n.payload);
}

std::optional<std::uint64_t> PickleValue::Unsigned() const {
  if (Tree::IsInline(ref_)) return ref_ & ~Tree::kInline;
  const Tree::Node& n = pickle_->tree_->At(ref_);
  if (n.kind != Kind::kInt) return std::nullopt;
  if ((n.flags & Tree::kUnsignedBig) == 0 && static_cast<std::int64_t>(n.payload) < 0) return std::nullopt;
  return n.payload;
}

std::optional<double> PickleValue::Number() const {
  if (kind() == Kind::kFloat) return std::bit_cast<double>(pickle_->tree_->At(ref_).payload);
  if (std::optional<std::int64_t> s = Signed()) return static_cast<double>(*s);
  if (std::optional<std::uint64_t> u = Unsigned()) return static_cast<double>(*u);
  return std::nullopt;
}

absl::string_view PickleValue::text() const {
  if (kind() != Kind::kString) return {};
  const Tree& t = *pickle_->tree_;
  const Tree::Node& n = t.At(ref_);
  const std::string& from = (n.flags & Tree::kDecoded) != 0 ? t.decoded : t.input;
  return absl::string_view(from).substr(n.payload, n.count);
}

std::size_t PickleValue::size() const {
  const Kind k = kind();
  if (k != Kind::kList && k != Kind::kDict) return 0;
  const std::uint32_t count = pickle_->tree_->At(ref_).count;
  return k == Kind::kDict ? count / 2 : count;
}

PickleValue PickleValue::item(std::size_t i) const {
  const Tree& t = *pickle_->tree_;
  return PickleValue(pickle_, t.refs[t.At(ref_).payload + i]);
}
PickleValue PickleValue::key(std::size_t i) const {
  const Tree& t = *pickle_->tree_;
  return PickleValue(pickle_, t.refs[t.At(ref_).payload + 2 * i]);
}
PickleValue PickleValue::value(std::size_t i) const {
  const Tree& t = *pickle_->tree_;
  return PickleValue(pickle_, t.refs[t.At(ref_).payload + 2 * i + 1]);
}

std::optional<PickleValue> PickleValue::Find(absl::string_view k) const {
  if (!is_dict()) return std::nullopt;
  for (std::size_t i = size(); i > 0; --i) {
    const PickleValue key_i = key(i - 1);
    if (key_i.is_string() && key_i.text() == k) return value(i - 1);
  }
  return std::nullopt;
}

// ---- PlainPickle ------------------------------------------------------------------------------

PlainPickle::PlainPickle(std::unique_ptr<Tree> tree) : tree_(std::move(tree)) {}
PlainPickle::PlainPickle(PlainPickle&&) noexcept = default;
PlainPickle& PlainPickle::operator=(PlainPickle&&) noexcept = default;
PlainPickle::~PlainPickle() = default;

absl::StatusOr<PlainPickle> PlainPickle::Parse(std::string bytes, absl::string_view source) {
  auto tree = std::make_unique<Tree>();
  tree->input = std::move(bytes);
  tree->source = std::string(source);
  if (absl::Status s = Parser(tree.get()).Run(); !s.ok()) return s;
  return PlainPickle(std::move(tree));
}

PickleValue PlainPickle::root() const { return PickleValue(this, tree_->root); }
std::size_t PlainPickle::input_bytes() const { return tree_->input.size(); }
std::size_t PlainPickle::tree_bytes() const {
  return tree_->nodes.capacity() * sizeof(Tree::Node) + tree_->refs.capacity() * sizeof(std::uint32_t) +
         tree_->decoded.capacity() + tree_->memo_bytes;
}
const std::string& PlainPickle::source() const { return tree_->source; }

bool LooksLikePickle(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 &&
         static_cast<unsigned char>(bytes[1]) >= 2 && static_cast<unsigned char>(bytes[1]) <= 5;
}

absl::StatusOr<nlohmann::json> PickleToJson(const PickleValue& v, const PlainPickle& pickle) {
  nlohmann::json out;
  if (absl::Status s = JsonWriter(pickle).Write(v, 0, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<nlohmann::json> ParsePlainPickle(absl::string_view bytes, absl::string_view source) {
  absl::StatusOr<PlainPickle> p = PlainPickle::Parse(std::string(bytes), source);
  if (!p.ok()) return p.status();
  return PickleToJson(p->root(), *p);
}

}  // namespace bucketalloc::harness
