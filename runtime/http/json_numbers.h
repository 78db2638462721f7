// Arrays of JSON numbers to and from buffers of numbers (runtime/http/json_data.py through json_numbers.cc): plain
// C++ with no Python, so that tests/fuzz/json_numbers_fuzzer.cc runs it under libFuzzer as the module does.
//
// parse: the comma-separated numbers of a JSON array's inside, each in JSON's grammar (RFC 8259 section 6), into
// int64, uint64 or double; anything else (another token, a number out of range, an integer kind given a fraction)
// is refused, and the caller decodes the text generically, which gives the precise error.
// format: a numeric buffer as a JSON array; a double as msgspec writes one (the shortest digits that read back as
// the same double, std::to_chars' Ryu; an exponent below 1e-5 and from 1e16, written "1e-6", "1.5e16"), NaN and
// infinities as null, so that the server writes every float the same way, native or not.
#ifndef RUNTIME_HTTP_JSON_NUMBERS_H_
#define RUNTIME_HTTP_JSON_NUMBERS_H_

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>

namespace json_numbers {

inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The end of the JSON number starting at ``p`` (nullptr: not one); ``integer``: whether it has no fraction or
// exponent.
inline const char* NumberEnd(const char* p, const char* end, bool* integer) {
  if (p < end && *p == '-') ++p;
  if (p >= end) return nullptr;
  if (*p == '0') {
    ++p;
  } else if (IsDigit(*p)) {
    while (p < end && IsDigit(*p)) ++p;
  } else {
    return nullptr;
  }
  *integer = true;
  if (p < end && *p == '.') {
    ++p;
    if (p >= end || !IsDigit(*p)) return nullptr;
    while (p < end && IsDigit(*p)) ++p;
    *integer = false;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    ++p;
    if (p < end && (*p == '+' || *p == '-')) ++p;
    if (p >= end || !IsDigit(*p)) return nullptr;
    while (p < end && IsDigit(*p)) ++p;
    *integer = false;
  }
  return p;
}

// Parses text[0:size] into out (``capacity`` elements of T: int64_t, uint64_t or double): how many, or -1 where it is
// not plainly numbers of that type (an integer type takes no fraction or exponent), or more than ``capacity``.
template <typename T>
int64_t Parse(const char* text, size_t size, T* out, size_t capacity) {
  const char* p = text;
  const char* end = text + size;
  size_t count = 0;
  while (p < end && IsSpace(*p)) ++p;
  if (p == end) return 0;  // an empty array
  while (true) {
    while (p < end && IsSpace(*p)) ++p;
    bool integer = false;
    const char* stop = NumberEnd(p, end, &integer);
    if (stop == nullptr || count >= capacity) return -1;
    if (!std::is_floating_point<T>::value && !integer) return -1;
    if (std::is_unsigned<T>::value && *p == '-') return -1;
    T value{};
    std::from_chars_result read = std::from_chars(p, stop, value);
    if (read.ec != std::errc() || read.ptr != stop) return -1;  // out of range (a double past 1.8e308 included)
    if constexpr (std::is_floating_point<T>::value) {
      if (integer && value == 0) value = 0;  // "-0" is the integer 0, as JSON parsers read it (not -0.0)
    }
    out[count++] = value;
    p = stop;
    while (p < end && IsSpace(*p)) ++p;
    if (p == end) return static_cast<int64_t>(count);
    if (*p != ',') return -1;
    ++p;
  }
}

template <typename T>
char* WriteInteger(char* w, T value) {
  return std::to_chars(w, w + 24, value).ptr;  // 20 characters at most (INT64_MIN)
}

constexpr size_t kMaxDoubleChars = 24;  // "-1.2345678901234567e-308", "-0.000012345678901234567"

// A double as msgspec writes it (see the top), at ``w``: kMaxDoubleChars at most.
inline char* WriteDouble(char* w, double value) {
  if (!std::isfinite(value)) {
    std::memcpy(w, "null", 4);
    return w + 4;
  }
  if (std::signbit(value)) {
    *w++ = '-';
    value = -value;
  }
  if (value == 0) {
    std::memcpy(w, "0.0", 3);
    return w + 3;
  }
  char text[40];  // "d.ddde-XXX": the shortest digits that read back as the same double
  char* text_end = std::to_chars(text, text + sizeof(text), value, std::chars_format::scientific).ptr;
  char digits[20];  // the digits without the point: "d" then, after the point, up to 16 more
  const char* p = text;
  digits[0] = *p++;
  int n = 1;
  const char* e_at = p;
  if (*p == '.') {
    e_at = static_cast<const char*>(std::memchr(p, 'e', static_cast<size_t>(text_end - p)));
    n += static_cast<int>(e_at - p - 1);
    std::memcpy(digits + 1, p + 1, static_cast<size_t>(n - 1));
  }
  p = e_at + 1;  // past 'e': a sign, then two or three digits
  bool negative_exponent = *p == '-';
  int exponent = 0;
  for (++p; p < text_end; ++p) exponent = exponent * 10 + (*p - '0');
  if (negative_exponent) exponent = -exponent;
  int point = exponent;  // the first digit's power of ten
  if (point >= 0 && point < 16) {
    if (n <= point + 1) {
      std::memcpy(w, digits, static_cast<size_t>(n));
      w += n;
      for (int i = n; i <= point; ++i) *w++ = '0';
      *w++ = '.';
      *w++ = '0';
      return w;
    }
    std::memcpy(w, digits, static_cast<size_t>(point + 1));
    w += point + 1;
    *w++ = '.';
    std::memcpy(w, digits + point + 1, static_cast<size_t>(n - point - 1));
    return w + (n - point - 1);
  }
  if (point < 0 && point >= -5) {
    *w++ = '0';
    *w++ = '.';
    for (int i = -1; i > point; --i) *w++ = '0';
    std::memcpy(w, digits, static_cast<size_t>(n));
    return w + n;
  }
  *w++ = digits[0];
  if (n > 1) {
    *w++ = '.';
    std::memcpy(w, digits + 1, static_cast<size_t>(n - 1));
    w += n - 1;
  }
  *w++ = 'e';
  return WriteInteger(w, point);
}

struct Boolean {  // numpy's bool: a byte, read as nonzero (a view may hold any byte there)
  uint8_t byte;
};

template <typename T>
constexpr size_t MaxChars() {  // an element's, with its comma
  return (std::is_floating_point<T>::value ? kMaxDoubleChars : 20) + 1;
}

// Writes the array at ``w`` (MaxChars<T>() * count + 2 bytes at most); where it ends.
template <typename T>
char* Format(const T* values, size_t count, char* w) {
  *w++ = '[';
  for (size_t i = 0; i < count; ++i) {
    if (i) *w++ = ',';
    if constexpr (std::is_same<T, Boolean>::value) {
      bool set = values[i].byte != 0;
      std::memcpy(w, set ? "true" : "false", set ? 4 : 5);
      w += set ? 4 : 5;
    } else if constexpr (std::is_floating_point<T>::value) {
      w = WriteDouble(w, static_cast<double>(values[i]));
    } else {
      w = WriteInteger(w, values[i]);
    }
  }
  *w++ = ']';
  return w;
}

}  // namespace json_numbers

#endif  // RUNTIME_HTTP_JSON_NUMBERS_H_
