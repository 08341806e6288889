// src/harness/replay/snapshot_pickle.cc — the plain-data subset of Python's pickle format
// (harness/replay/snapshot_pickle.h). The opcodes are those of CPython's Lib/pickletools.py.
#include "harness/replay/snapshot_pickle.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
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
namespace {

// A value of the pickle: shared, as the memo shares it (a container filled after it was memoized
// is seen filled through every reference).
struct Value;
using Ref = std::shared_ptr<Value>;
struct Value {
  enum class Kind : std::uint8_t { kNone, kBool, kInt, kFloat, kString, kList, kDict, kMark };
  Kind kind = Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;
  bool unsigned_big = false;  // an integer in [2^63, 2^64): `integer` holds its bits
  double real = 0.0;
  std::string text;
  std::vector<Ref> items;                    // a list or tuple
  std::vector<std::pair<Ref, Ref>> entries;  // a dict, in insertion order
};

class Reader {
 public:
  Reader(absl::string_view bytes, absl::string_view source) : in_(bytes), source_(source) {}
  // A container may hold itself (through the memo): every container is emptied, so that no cycle
  // of references outlives the reader.
  ~Reader() {
    for (const Ref& v : made_) {
      v->items.clear();
      v->entries.clear();
    }
  }

  absl::StatusOr<nlohmann::json> Run() {
    while (true) {
      if (pos_ >= in_.size()) return Error("the input ends before its STOP opcode");
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      absl::Status s = Step(op, at);
      if (!s.ok()) return s;
      if (stopped_) break;
    }
    if (stack_.size() != 1 || stack_.back()->kind == Value::Kind::kMark) {
      return Error(absl::StrCat("STOP leaves ", stack_.size(), " values on the stack; a pickle leaves one"));
    }
    nlohmann::json out;
    if (absl::Status s = ToJson(*stack_.back(), 0, &out); !s.ok()) return s;
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", what, " (at byte ", op_at_, ")"));
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

  absl::StatusOr<Ref> Pop() {
    if (stack_.empty()) return Error("an opcode needs a value and the stack is empty");
    Ref v = std::move(stack_.back());
    stack_.pop_back();
    if (v->kind == Value::Kind::kMark) return Error("an opcode needs a value and finds the mark");
    return v;
  }
  absl::StatusOr<Ref> Top() {
    if (stack_.empty() || stack_.back()->kind == Value::Kind::kMark) return Error("an opcode needs a value");
    return stack_.back();
  }
  // The values above the last mark, which is removed with them.
  absl::StatusOr<std::vector<Ref>> PopToMark() {
    std::size_t i = stack_.size();
    while (i > 0 && stack_[i - 1]->kind != Value::Kind::kMark) --i;
    if (i == 0) return Error("an opcode needs a mark and there is none");
    std::vector<Ref> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(i)),
                           std::make_move_iterator(stack_.end()));
    stack_.resize(i - 1);
    return items;
  }
  absl::Status Push(Ref v) {
    if (stack_.size() >= kMaxStack) return Error("the stack grows past its limit");
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::Status PushInt(std::int64_t n) {
    Ref v = Make(Value::Kind::kInt);
    v->integer = n;
    return Push(std::move(v));
  }
  absl::Status PushString(absl::string_view s) {
    Ref v = Make(Value::Kind::kString);
    v->text = std::string(s);
    return Push(std::move(v));
  }
  absl::Status PushLengthString(int length_bytes) {
    absl::StatusOr<std::uint64_t> n = Unsigned(length_bytes);
    if (!n.ok()) return n.status();
    absl::StatusOr<absl::string_view> s = Take(*n);
    if (!s.ok()) return s.status();
    return PushString(*s);
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
    Ref r = Make(Value::Kind::kInt);
    r->integer = static_cast<std::int64_t>(v);
    r->unsigned_big = big;
    return Push(std::move(r));
  }

  // A key set again replaces its value (ToJson writes the entries in order: the last one stays).
  absl::Status SetItems(const Ref& dict, std::vector<Ref> kv) {
    if (dict->kind != Value::Kind::kDict) return Error("SETITEM(S) on a value that is not a dict");
    if (kv.size() % 2 != 0) return Error("SETITEMS with an odd number of keys and values");
    for (std::size_t i = 0; i < kv.size(); i += 2) dict->entries.emplace_back(std::move(kv[i]), std::move(kv[i + 1]));
    return absl::OkStatus();
  }

  absl::Status Memo(std::uint64_t index) {
    absl::StatusOr<Ref> top = Top();
    if (!top.ok()) return top.status();
    memo_[index] = *top;
    return absl::OkStatus();
  }
  absl::Status Get(std::uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Error(absl::StrCat("GET of memo entry ", index, ", which was never PUT"));
    return Push(it->second);
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
      case '(':
        return Push(Make(Value::Kind::kMark));  // MARK
      case '}':
        return Push(Make(Value::Kind::kDict));  // EMPTY_DICT
      case ']':
        return Push(Make(Value::Kind::kList));  // EMPTY_LIST
      case ')':
        return Push(Make(Value::Kind::kList));  // EMPTY_TUPLE
      case 0x8f:
        return Push(Make(Value::Kind::kList));  // EMPTY_SET (as a list)
      case 'N':
        return Push(Make(Value::Kind::kNone));  // NONE
      case 0x88:                                // NEWTRUE
      case 0x89: {                              // NEWFALSE
        Ref v = Make(Value::Kind::kBool);
        v->boolean = op == 0x88;
        return Push(std::move(v));
      }
      case 'J': {  // BININT: 4 bytes, signed
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
        if (op == 'I' && (t == "01" || t == "00")) {
          Ref v = Make(Value::Kind::kBool);
          v->boolean = t == "01";
          return Push(std::move(v));
        }
        if (op == 'L' && !t.empty() && t.back() == 'L') t.remove_suffix(1);
        std::int64_t n = 0;
        if (absl::SimpleAtoi(t, &n)) return PushInt(n);
        std::uint64_t u = 0;
        if (!absl::SimpleAtoi(t, &u))
          return Error(absl::StrCat("an integer \"", Excerpt(t), "\" that does not fit in 64 bits"));
        Ref v = Make(Value::Kind::kInt);
        v->integer = static_cast<std::int64_t>(u);
        v->unsigned_big = true;
        return Push(std::move(v));
      }
      case 'G': {  // BINFLOAT: 8 bytes, big-endian
        absl::StatusOr<absl::string_view> b = Take(8);
        if (!b.ok()) return b.status();
        std::uint64_t bits = 0;
        for (char c : *b) bits = (bits << 8) | static_cast<unsigned char>(c);
        Ref v = Make(Value::Kind::kFloat);
        std::memcpy(&v->real, &bits, sizeof bits);
        return Push(std::move(v));
      }
      case 'F': {  // FLOAT (text)
        absl::StatusOr<absl::string_view> line = Line();
        if (!line.ok()) return line.status();
        Ref v = Make(Value::Kind::kFloat);
        if (!absl::SimpleAtod(*line, &v->real)) return Error(absl::StrCat("a float \"", Excerpt(*line), "\""));
        return Push(std::move(v));
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
        absl::StatusOr<std::string> text = RawUnicodeEscape(*line);
        if (!text.ok()) return text.status();
        return PushString(*text);
      }
      case 'a': {  // APPEND
        absl::StatusOr<Ref> v = Pop();
        if (!v.ok()) return v.status();
        absl::StatusOr<Ref> list = Top();
        if (!list.ok()) return list.status();
        if ((*list)->kind != Value::Kind::kList) return Error("APPEND to a value that is not a list");
        (*list)->items.push_back(std::move(*v));
        return absl::OkStatus();
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS (to a set, kept as a list)
        absl::StatusOr<std::vector<Ref>> items = PopToMark();
        if (!items.ok()) return items.status();
        absl::StatusOr<Ref> list = Top();
        if (!list.ok()) return list.status();
        if ((*list)->kind != Value::Kind::kList) return Error("APPENDS to a value that is not a list");
        for (Ref& v : *items) (*list)->items.push_back(std::move(v));
        return absl::OkStatus();
      }
      case 'l':     // LIST
      case 't':     // TUPLE
      case 0x91: {  // FROZENSET
        absl::StatusOr<std::vector<Ref>> items = PopToMark();
        if (!items.ok()) return items.status();
        Ref v = Make(Value::Kind::kList);
        v->items = std::move(*items);
        return Push(std::move(v));
      }
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const int n = op - 0x84;
        Ref v = Make(Value::Kind::kList);
        v->items.resize(n);
        for (int i = n - 1; i >= 0; --i) {
          absl::StatusOr<Ref> item = Pop();
          if (!item.ok()) return item.status();
          v->items[i] = std::move(*item);
        }
        return Push(std::move(v));
      }
      case 'd': {  // DICT
        absl::StatusOr<std::vector<Ref>> kv = PopToMark();
        if (!kv.ok()) return kv.status();
        Ref dict = Make(Value::Kind::kDict);
        if (absl::Status s = SetItems(dict, std::move(*kv)); !s.ok()) return s;
        return Push(std::move(dict));
      }
      case 's': {  // SETITEM
        absl::StatusOr<Ref> value = Pop();
        if (!value.ok()) return value.status();
        absl::StatusOr<Ref> key = Pop();
        if (!key.ok()) return key.status();
        absl::StatusOr<Ref> dict = Top();
        if (!dict.ok()) return dict.status();
        return SetItems(*dict, {std::move(*key), std::move(*value)});
      }
      case 'u': {  // SETITEMS
        absl::StatusOr<std::vector<Ref>> kv = PopToMark();
        if (!kv.ok()) return kv.status();
        absl::StatusOr<Ref> dict = Top();
        if (!dict.ok()) return dict.status();
        return SetItems(*dict, std::move(*kv));
      }
      case '0': {  // POP
        absl::StatusOr<Ref> v = Pop();
        return v.ok() ? absl::OkStatus() : v.status();
      }
      case '1': {  // POP_MARK
        absl::StatusOr<std::vector<Ref>> items = PopToMark();
        return items.ok() ? absl::OkStatus() : items.status();
      }
      case '2': {  // DUP
        absl::StatusOr<Ref> v = Top();
        if (!v.ok()) return v.status();
        return Push(*v);
      }
      case 0x94:
        return Memo(memo_.size());  // MEMOIZE
      case 'q':                     // BINPUT
      case 'r': {                   // LONG_BINPUT
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
        if (stack_.size() >= 2 && stack_[stack_.size() - 2]->kind == Value::Kind::kString &&
            stack_.back()->kind == Value::Kind::kString) {
          what = absl::StrCat(Excerpt(stack_[stack_.size() - 2]->text), ".", Excerpt(stack_.back()->text));
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

  // Python's raw-unicode-escape: bytes are Latin-1 characters, \uXXXX and \UXXXXXXXX escapes the
  // others; as UTF-8.
  absl::StatusOr<std::string> RawUnicodeEscape(absl::string_view in) const {
    std::string out;
    auto put = [&](std::uint32_t c) {
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if (c < 0x800) {
        out += static_cast<char>(0xC0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        out += static_cast<char>(0xE0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
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
    return out;
  }

  absl::Status Refuse(absl::string_view what) const {
    return Error(absl::StrCat("refusing to load ", what,
                              ": a memory snapshot holds only plain data (dicts, lists, strings, numbers), so this "
                              "file is not one, or is hostile"));
  }

  // `v` as JSON. A shared value (the memo's GET) is written once per reference, as Python's own
  // json module would: the nodes written are counted against a budget in proportion to the
  // input, so that a few bytes of references to references cannot expand without bound; a
  // container met again inside itself is refused at once.
  absl::Status ToJson(const Value& v, int depth, nlohmann::json* out) {
    if (depth > kMaxPickleDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ": data nested deeper than ", kMaxPickleDepth, " levels"));
    }
    if (++nodes_ > NodeBudget()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ": its shared references expand to more than ", NodeBudget(), " values (",
                       kNodesPerByte, " per byte of the pickle); a memory snapshot shares only strings"));
    }
    const bool container = v.kind == Value::Kind::kList || v.kind == Value::Kind::kDict;
    if (container && !open_.insert(&v).second) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": a container holds itself"));
    }
    absl::Status s = Convert(v, depth, out);
    if (container) open_.erase(&v);
    return s;
  }
  std::uint64_t NodeBudget() const { return kNodesPerByte * in_.size() + 1024; }

  absl::Status Convert(const Value& v, int depth, nlohmann::json* out) {
    switch (v.kind) {
      case Value::Kind::kNone:
        *out = nullptr;
        return absl::OkStatus();
      case Value::Kind::kBool:
        *out = v.boolean;
        return absl::OkStatus();
      case Value::Kind::kInt:
        if (v.unsigned_big || v.integer >= 0) {
          *out = static_cast<std::uint64_t>(v.integer);
        } else {
          *out = v.integer;
        }
        return absl::OkStatus();
      case Value::Kind::kFloat:
        *out = v.real;
        return absl::OkStatus();
      case Value::Kind::kString:
        *out = v.text;
        return absl::OkStatus();
      case Value::Kind::kList: {
        *out = nlohmann::json::array();
        for (const Ref& item : v.items) {
          nlohmann::json j;
          if (absl::Status s = ToJson(*item, depth + 1, &j); !s.ok()) return s;
          out->push_back(std::move(j));
        }
        return absl::OkStatus();
      }
      case Value::Kind::kDict: {
        *out = nlohmann::json::object();
        for (const auto& [key, value] : v.entries) {
          nlohmann::json k, j;
          if (absl::Status s = ToJson(*key, depth + 1, &k); !s.ok()) return s;
          if (absl::Status s = ToJson(*value, depth + 1, &j); !s.ok()) return s;
          // A key that is not a string becomes its JSON text (bytes that are not UTF-8 replaced).
          (*out)[k.is_string() ? k.get<std::string>()
                               : k.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)] = std::move(j);
        }
        return absl::OkStatus();
      }
      case Value::Kind::kMark:
        break;
    }
    return absl::InvalidArgumentError(absl::StrCat(source_, ": a mark left inside the data"));
  }

  Ref Make(Value::Kind kind) {
    auto v = std::make_shared<Value>();
    v->kind = kind;
    if (kind == Value::Kind::kList || kind == Value::Kind::kDict) made_.push_back(v);
    return v;
  }

  static constexpr std::size_t kMaxStack = std::size_t{1} << 24;
  static constexpr std::uint64_t kNodesPerByte = 16;
  absl::string_view in_;
  std::string source_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  bool stopped_ = false;
  std::vector<Ref> stack_;
  absl::flat_hash_map<std::uint64_t, Ref> memo_;
  std::vector<Ref> made_;                   // the containers
  std::uint64_t nodes_ = 0;                 // written by ToJson
  absl::flat_hash_set<const Value*> open_;  // the containers ToJson is inside
};

}  // namespace

bool LooksLikePickle(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 &&
         static_cast<unsigned char>(bytes[1]) >= 2 && static_cast<unsigned char>(bytes[1]) <= 5;
}

absl::StatusOr<nlohmann::json> ParsePlainPickle(absl::string_view bytes, absl::string_view source) {
  return Reader(bytes, source).Run();
}

absl::StatusOr<nlohmann::json> ParseSnapshotPickle(absl::string_view bytes, absl::string_view source,
                                                   absl::string_view accepted) {
  absl::StatusOr<nlohmann::json> j = ParsePlainPickle(bytes, source);
  if (!j.ok()) return j.status();
  if (!j->is_object() || !j->contains("device_traces")) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " is a pickle but not a memory snapshot (a dict with \"device_traces\"); ", accepted));
  }
  if (!j->contains("segments")) (*j)["segments"] = nlohmann::json::array();
  return j;
}

}  // namespace bucketalloc::harness
