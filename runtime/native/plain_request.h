// A plain infer request as a lane takes one, from either protocol: its names, datatypes and shapes as views, and
// its inputs' bytes somewhere in a message held in pieces (gRPC's slices: runtime/grpc/native_wire.h reads a
// ModelInferRequest into this form; an HTTP body's chunks: lanes_module.cc's take_http).
#ifndef RUNTIME_NATIVE_PLAIN_REQUEST_H_
#define RUNTIME_NATIVE_PLAIN_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace plain_request {

// A message in pieces (grpc's slices), read as one without joining them: byte by byte where its fields' keys and
// lengths are read, a range at a time where a field is copied out. Reads move forward, so the piece a position
// lies in is found from the last one read.
class Pieces {
 public:
  void Add(const char* data, size_t size) {
    if (size == 0) return;
    parts_.push_back({data, size, size_});
    size_ += size;
  }
  size_t size() const { return size_; }

  char operator[](size_t pos) const {
    const Part& part = Find(pos);
    return part.data[pos - part.start];
  }

  // ``n`` bytes from ``pos`` to ``out`` (the caller has checked they lie within the message).
  void CopyTo(size_t pos, size_t n, char* out) const {
    while (n > 0) {
      const Part& part = Find(pos);
      size_t offset = pos - part.start;
      size_t take = part.size - offset < n ? part.size - offset : n;
      std::memcpy(out, part.data + offset, take);
      out += take;
      pos += take;
      n -= take;
    }
  }

 private:
  struct Part {
    const char* data;
    size_t size;
    size_t start;  // its first byte's position in the message
  };

  const Part& Find(size_t pos) const {
    if (pos < parts_[last_].start) last_ = 0;
    while (pos >= parts_[last_].start + parts_[last_].size) ++last_;
    return parts_[last_];
  }

  std::vector<Part> parts_;
  size_t size_ = 0;
  mutable size_t last_ = 0;
};

// A ModelInferRequest in its plain form, as tritonclient sends one: model name, version, id, inputs with a name,
// a datatype and a shape only, outputs with a name only, raw input contents (read elsewhere). Views of the bytes
// parsed; shapes as protobuf reads them (int64, packed or not).
struct PlainInput {
  std::string_view name, datatype;
  std::vector<int64_t> shape;
};

struct PlainInferRequest {
  std::string_view model_name, model_version, id;
  std::vector<PlainInput> inputs;
  std::vector<std::string_view> outputs;
};

// Whether ``text`` is UTF-8 as protobuf checks a string field: no overlong forms, no surrogates, nothing past
// U+10FFFF. The plain form holds only such strings; a message with any other is left to protobuf, which refuses it.
inline bool IsUtf8(std::string_view text) {
  size_t i = 0, n = text.size();
  while (i < n) {
    auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char low = 0x80, high = 0xBF;  // the bounds of the second byte
    if (byte >= 0xC2 && byte <= 0xDF) {
      length = 2;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      length = 3;
      if (byte == 0xE0) low = 0xA0;   // overlong
      if (byte == 0xED) high = 0x9F;  // surrogates
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      length = 4;
      if (byte == 0xF0) low = 0x90;   // overlong
      if (byte == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      return false;
    }
    if (n - i < length) return false;
    auto second = static_cast<unsigned char>(text[i + 1]);
    if (second < low || second > high) return false;
    for (size_t k = 2; k < length; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if (next < 0x80 || next > 0xBF) return false;
    }
    i += length;
  }
  return true;
}

}  // namespace plain_request

#endif  // RUNTIME_NATIVE_PLAIN_REQUEST_H_
