// runtime/http/json_numbers.h under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer
// (scripts/fuzz_native.sh). The first byte picks the kind ('d', 'i', 'u'), the rest is an array's inside: whatever
// it is, parsing stays within the buffer it is given, and what it reads is written and read back the same (the
// writer's text is JSON the parser takes, each double to the same bits). The input's bytes are also written as
// doubles, within the room the writer claims.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../runtime/http/json_numbers.h"

namespace {

template <typename T>
void RoundTrip(const char* text, size_t size) {
  std::vector<T> values(size / 2 + 1);
  int64_t count = json_numbers::Parse(text, size, values.data(), values.size());
  if (count < 0) return;
  if (static_cast<size_t>(count) > values.size()) __builtin_trap();
  std::string written(json_numbers::MaxChars<T>() * static_cast<size_t>(count) + 2, '\0');
  char* end = json_numbers::Format(values.data(), static_cast<size_t>(count), written.data());
  size_t length = static_cast<size_t>(end - written.data());
  if (length > written.size() || written[0] != '[' || written[length - 1] != ']') __builtin_trap();
  std::vector<T> again(static_cast<size_t>(count) + 1);
  int64_t reread = json_numbers::Parse(written.data() + 1, length - 2, again.data(), again.size());
  if (reread != count) __builtin_trap();
  for (int64_t i = 0; i < count; ++i) {
    if (std::memcmp(&values[i], &again[i], sizeof(T)) != 0) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* text = reinterpret_cast<const char*>(data + 1);
  switch (data[0] % 3) {
    case 0: RoundTrip<double>(text, size - 1); break;
    case 1: RoundTrip<int64_t>(text, size - 1); break;
    default: RoundTrip<uint64_t>(text, size - 1); break;
  }
  std::vector<double> doubles((size - 1) / sizeof(double));
  if (!doubles.empty()) std::memcpy(doubles.data(), data + 1, doubles.size() * sizeof(double));
  std::string written(json_numbers::MaxChars<double>() * doubles.size() + 2, '\0');
  char* end = json_numbers::Format(doubles.data(), doubles.size(), written.data());
  if (static_cast<size_t>(end - written.data()) > written.size()) __builtin_trap();
  return 0;
}
