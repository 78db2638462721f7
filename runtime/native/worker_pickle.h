// The part of pickle's format (protocol 5, as Python's C pickler writes it) that the Python worker's messages use:
// tuples, lists and dicts of None, booleans, ints, floats, str and bytes. The native lane (lane.h) writes a
// batch's message in it and reads the worker's answer without the interpreter; anything else it cannot read. What
// it reads, Python's pickle reads the same (tests/test_worker_pickle.py: round trips, truncations, byte edits); a
// str must be UTF-8 without surrogates (pickle's own allow them: such a message is refused here).
#ifndef RUNTIME_NATIVE_WORKER_PICKLE_H_
#define RUNTIME_NATIVE_WORKER_PICKLE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "plain_request.h"

namespace native_pickle {

// Writes one message; the caller nests tuples with Mark() ... EndTuple().
class Writer {
 public:
  Writer() { out_.assign("\x80\x04", 2); }  // PROTO 4: every opcode used here
  void None() { out_ += 'N'; }
  void Bool(bool value) { out_ += value ? '\x88' : '\x89'; }
  void Int(int64_t value) {
    if (value >= 0 && value < 256) {
      out_ += 'K';
      out_ += static_cast<char>(value);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';
      Put32(static_cast<uint32_t>(static_cast<int32_t>(value)));
    } else {
      out_ += '\x8a';  // LONG1: eight bytes, little-endian two's complement
      out_ += '\x08';
      Put64(static_cast<uint64_t>(value));
    }
  }
  // A length past 4 GiB takes the 8-byte form (a string or bytes of any size is written whole).
  void Str(std::string_view text) {
    if (text.size() < 256) {
      out_ += '\x8c';
      out_ += static_cast<char>(text.size());
    } else if (text.size() <= UINT32_MAX) {
      out_ += 'X';
      Put32(static_cast<uint32_t>(text.size()));
    } else {
      out_ += '\x8d';  // BINUNICODE8
      Put64(text.size());
    }
    out_.append(text.data(), text.size());
  }
  void Bytes(const char* data, size_t size) {
    if (size < 256) {
      out_ += 'C';
      out_ += static_cast<char>(size);
    } else if (size <= UINT32_MAX) {
      out_ += 'B';
      Put32(static_cast<uint32_t>(size));
    } else {
      out_ += '\x8e';  // BINBYTES8
      Put64(size);
    }
    out_.append(data, size);
  }
  void Mark() { out_ += '('; }
  void EndTuple() { out_ += 't'; }
  void EmptyTuple() { out_ += ')'; }
  void EmptyList() { out_ += ']'; }
  void Appends() { out_ += 'e'; }  // the items since the Mark() after EmptyList()
  // The message with multiprocessing's frame in front (a 4-byte big-endian length), as recv_pickled reads it.
  std::string Framed() {
    out_ += '.';
    std::string framed(4, '\0');
    uint32_t size = static_cast<uint32_t>(out_.size());
    for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>(size >> (24 - 8 * i));
    framed += out_;
    return framed;
  }

 private:
  void Put32(uint32_t value) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>(value >> (8 * i));
  }
  void Put64(uint64_t value) {
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>(value >> (8 * i));
  }
  std::string out_;
};

// A value read back; strings and bytes are views of the message (which must outlive it).
struct Value {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kMark } kind = kNone;
  int64_t number = 0;
  double real = 0;
  std::string_view text;
  std::vector<std::shared_ptr<Value>> items;  // a tuple's or list's items; a dict's keys and values in turn
};
using ValuePtr = std::shared_ptr<Value>;

constexpr int kMaxDepth = 32;  // the worker's messages nest 6 deep; a deeper one (or a cycle) is not read

// The deepest nesting under ``value``, or more than kMaxDepth for a deeper one or a cycle (``known``: what was
// found so far, a value in progress counting as too deep; a shared value is walked once).
inline int Depth(const Value* value, std::unordered_map<const Value*, int>& known, int level) {
  if (level > kMaxDepth) return kMaxDepth + 1;
  auto found = known.find(value);
  if (found != known.end()) return found->second;
  known[value] = kMaxDepth + 1;
  int deepest = 0;
  for (const auto& item : value->items) {
    int depth = Depth(item.get(), known, level + 1);
    deepest = std::max(deepest, depth + 1);
    if (deepest > kMaxDepth) break;
  }
  known[value] = deepest;
  return deepest;
}

// Read's reading; every container it makes goes in ``made`` (so that a message refused halfway, which may hold a
// cycle, is taken apart).
inline ValuePtr ReadValues(std::string_view data, std::vector<ValuePtr>* made);

// The message's value; null for anything outside the format above (the caller then cannot read it), nested more
// than kMaxDepth deep, or holding a cycle.
inline ValuePtr Read(std::string_view data) {
  std::vector<ValuePtr> made;
  ValuePtr value = ReadValues(data, &made);
  std::unordered_map<const Value*, int> known;
  if (value != nullptr && Depth(value.get(), known, 0) <= kMaxDepth) return value;
  for (const auto& container : made) container->items.clear();  // no cycle outlives the message
  return nullptr;
}

inline ValuePtr ReadValues(std::string_view data, std::vector<ValuePtr>* made) {
  std::vector<ValuePtr> stack;
  std::vector<ValuePtr> memo;
  size_t pos = 0;
  auto need = [&](size_t n) { return data.size() - pos >= n; };
  auto little = [&](size_t n) {
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(data[pos + i])) << (8 * i);
    pos += n;
    return value;
  };
  auto make = [made](Value::Kind kind) {
    auto value = std::make_shared<Value>();
    value->kind = kind;
    if (kind == Value::kTuple || kind == Value::kList || kind == Value::kDict) made->push_back(value);
    return value;
  };
  auto text = [&](Value::Kind kind, size_t size) -> ValuePtr {
    if (!need(size)) return nullptr;
    std::string_view found = data.substr(pos, size);
    if (kind == Value::kStr && !plain_request::IsUtf8(found)) return nullptr;
    auto value = make(kind);
    value->text = found;
    pos += size;
    return value;
  };
  // Whether any of the top ``n`` items is a mark: pickle keeps marks apart from values, so an opcode that takes
  // values finds none there (Python's reader fails on it; so does this one).
  auto marks_in_top = [&](size_t n) {
    for (size_t i = stack.size() - n; i < stack.size(); ++i) {
      if (stack[i]->kind == Value::kMark) return true;
    }
    return false;
  };
  // The items above the topmost mark, taken off the stack with it; false when there is no mark.
  auto since_mark = [&](std::vector<ValuePtr>* items) {
    for (size_t i = stack.size(); i-- > 0;) {
      if (stack[i]->kind == Value::kMark) {
        items->assign(stack.begin() + static_cast<long>(i) + 1, stack.end());
        stack.resize(i);
        return true;
      }
    }
    return false;
  };
  while (need(1)) {
    char op = data[pos++];
    ValuePtr pushed;
    switch (op) {
      case '\x80':  // PROTO: one Python knows (5 at most, as its reader checks)
        if (!need(1) || static_cast<uint8_t>(data[pos]) > 5) return nullptr;
        ++pos;
        continue;
      case '\x95': {  // FRAME: the bytes it announces must be there (as Python's reader checks)
        if (!need(8)) return nullptr;
        uint64_t frame = little(8);
        if (!need(frame)) return nullptr;
        continue;
      }
      case '.':  // STOP
        return stack.size() == 1 && stack[0]->kind != Value::kMark ? stack[0] : nullptr;
      case 'N':
        pushed = make(Value::kNone);
        break;
      case '\x88':
      case '\x89':
        pushed = make(Value::kBool);
        pushed->number = op == '\x88';
        break;
      case 'K':
        if (!need(1)) return nullptr;
        pushed = make(Value::kInt);
        pushed->number = static_cast<int64_t>(little(1));
        break;
      case 'M':
        if (!need(2)) return nullptr;
        pushed = make(Value::kInt);
        pushed->number = static_cast<int64_t>(little(2));
        break;
      case 'J':
        if (!need(4)) return nullptr;
        pushed = make(Value::kInt);
        pushed->number = static_cast<int32_t>(static_cast<uint32_t>(little(4)));
        break;
      case '\x8a': {  // LONG1
        if (!need(1)) return nullptr;
        size_t n = static_cast<uint8_t>(data[pos++]);
        if (n > 8 || !need(n)) return nullptr;
        uint64_t bits = little(n);
        if (n > 0 && n < 8 && (bits >> (8 * n - 1)) & 1) bits |= ~0ULL << (8 * n);  // sign-extend
        pushed = make(Value::kInt);
        pushed->number = static_cast<int64_t>(bits);
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        if (!need(8)) return nullptr;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = bits << 8 | static_cast<uint8_t>(data[pos + i]);
        pos += 8;
        pushed = make(Value::kFloat);
        std::memcpy(&pushed->real, &bits, 8);
        break;
      }
      case '\x8c':  // SHORT_BINUNICODE
      case 'C':     // SHORT_BINBYTES
        if (!need(1)) return nullptr;
        pushed = text(op == 'C' ? Value::kBytes : Value::kStr, static_cast<uint8_t>(data[pos++]));
        break;
      case 'X':  // BINUNICODE
      case 'B':  // BINBYTES
        if (!need(4)) return nullptr;
        pushed = text(op == 'B' ? Value::kBytes : Value::kStr, little(4));
        break;
      case '\x8d':  // BINUNICODE8
      case '\x8e':  // BINBYTES8
        if (!need(8)) return nullptr;
        pushed = text(op == '\x8e' ? Value::kBytes : Value::kStr, little(8));
        break;
      case ')':
        pushed = make(Value::kTuple);
        break;
      case ']':
        pushed = make(Value::kList);
        break;
      case '}':
        pushed = make(Value::kDict);
        break;
      case '(':
        pushed = make(Value::kMark);
        break;
      case '\x85':
      case '\x86':
      case '\x87': {  // TUPLE1-3
        size_t n = static_cast<size_t>(op - '\x85' + 1);
        if (stack.size() < n || marks_in_top(n)) return nullptr;
        pushed = make(Value::kTuple);
        pushed->items.assign(stack.end() - static_cast<long>(n), stack.end());
        stack.resize(stack.size() - n);
        break;
      }
      case 't':
        pushed = make(Value::kTuple);
        if (!since_mark(&pushed->items)) return nullptr;
        break;
      case 'l':
        pushed = make(Value::kList);
        if (!since_mark(&pushed->items)) return nullptr;
        break;
      case 'a':  // APPEND
        if (stack.size() < 2 || stack[stack.size() - 2]->kind != Value::kList || marks_in_top(1)) return nullptr;
        stack[stack.size() - 2]->items.push_back(stack.back());
        stack.pop_back();
        continue;
      case 'e':    // APPENDS
      case 'u': {  // SETITEMS
        std::vector<ValuePtr> items;
        if (!since_mark(&items) || stack.empty()) return nullptr;
        Value& target = *stack.back();
        if (target.kind != (op == 'e' ? Value::kList : Value::kDict)) return nullptr;
        if (op == 'u' && items.size() % 2) return nullptr;
        target.items.insert(target.items.end(), items.begin(), items.end());
        continue;
      }
      case 's':  // SETITEM
        if (stack.size() < 3 || stack[stack.size() - 3]->kind != Value::kDict || marks_in_top(2)) return nullptr;
        stack[stack.size() - 3]->items.push_back(stack[stack.size() - 2]);
        stack[stack.size() - 3]->items.push_back(stack.back());
        stack.resize(stack.size() - 2);
        continue;
      case '\x94':  // MEMOIZE
        if (stack.empty() || marks_in_top(1)) return nullptr;
        memo.push_back(stack.back());
        continue;
      case 'h':  // BINGET
      case 'j': {  // LONG_BINGET
        size_t width = op == 'h' ? 1 : 4;
        if (!need(width)) return nullptr;
        size_t index = little(width);
        if (index >= memo.size()) return nullptr;
        pushed = memo[index];
        break;
      }
      default:
        return nullptr;
    }
    if (pushed == nullptr) return nullptr;  // a string or bytes longer than what is left
    stack.push_back(std::move(pushed));
  }
  return nullptr;
}

}  // namespace native_pickle

#endif  // RUNTIME_NATIVE_WORKER_PICKLE_H_
