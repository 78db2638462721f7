// Protobuf's wire format, as much of it as the native edge needs to cut a message's tensors out of it without a
// copy (native_edge.cc): the top-level fields, each kept whole or, for one length-delimited field, located.
#ifndef RUNTIME_GRPC_NATIVE_WIRE_H_
#define RUNTIME_GRPC_NATIVE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/native/plain_request.h"

namespace native_wire {

using plain_request::Pieces;

inline void AppendRange(const char* data, size_t pos, size_t n, std::string* out) { out->append(data + pos, n); }

inline void AppendRange(const Pieces& data, size_t pos, size_t n, std::string* out) {
  size_t old = out->size();
  out->resize(old + n);
  if (n) data.CopyTo(pos, n, &(*out)[old]);
}

template <typename Bytes>
bool ReadVarint(const Bytes& data, size_t size, size_t* pos, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && *pos < size; shift += 7) {
    uint8_t byte = static_cast<uint8_t>(data[(*pos)++]);
    result |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  return false;
}

// The message's top-level fields but ``field`` (a length-delimited one) in ``rest``, and where each occurrence of
// ``field`` lies in ``raws``. False for anything it cannot read: protobuf then parses the message whole (and says
// what is wrong with it). ``data``: the message's bytes (``const char*``) or its Pieces.
template <typename Bytes>
bool SplitRawField(const Bytes& data, size_t size, uint32_t field, std::string* rest,
                   std::vector<std::pair<size_t, size_t>>* raws) {
  size_t pos = 0;
  while (pos < size) {
    size_t start = pos;
    uint64_t key, value;
    if (!ReadVarint(data, size, &pos, &key) || (key >> 3) == 0) return false;
    switch (key & 7) {
      case 0:
        if (!ReadVarint(data, size, &pos, &value)) return false;
        break;
      case 1:
        if (size - pos < 8) return false;
        pos += 8;
        break;
      case 5:
        if (size - pos < 4) return false;
        pos += 4;
        break;
      case 2:
        if (!ReadVarint(data, size, &pos, &value) || value > size - pos) return false;
        if ((key >> 3) == field) {
          raws->emplace_back(pos, static_cast<size_t>(value));
          pos += value;
          continue;
        }
        pos += value;
        break;
      default:  // groups
        return false;
    }
    AppendRange(data, start, pos - start, rest);
  }
  return true;
}

// The message's first field, where it is the length-delimited field ``field`` of at most 4 KiB (``out``: its bytes);
// false otherwise.
template <typename Bytes>
bool LeadingString(const Bytes& data, uint32_t field, std::string* out) {
  size_t pos = 0, size = data.size();
  uint64_t key, length;
  if (!ReadVarint(data, size, &pos, &key) || key != (uint64_t{field} << 3 | 2)) return false;
  if (!ReadVarint(data, size, &pos, &length) || length > 4096 || length > size - pos) return false;
  AppendRange(data, pos, static_cast<size_t>(length), out);
  return true;
}

using plain_request::PlainInferRequest;
using plain_request::PlainInput;

using plain_request::IsUtf8;

// A length-delimited field's bytes at ``*pos`` (its key read), moving past them.
inline bool ReadBytes(const char* data, size_t size, size_t* pos, std::string_view* out) {
  uint64_t length;
  if (!ReadVarint(data, size, pos, &length) || length > size - *pos) return false;
  *out = std::string_view(data + *pos, static_cast<size_t>(length));
  *pos += length;
  return true;
}

// A field's key at ``*pos``: its number and wire type (false past the largest field number protobuf allows).
inline bool ReadKey(const std::string_view& message, size_t* pos, uint64_t* number, uint32_t* wire_type) {
  uint64_t key;
  if (!ReadVarint(message.data(), message.size(), pos, &key)) return false;
  *number = key >> 3;
  *wire_type = static_cast<uint32_t>(key & 7);
  return *number != 0 && *number < (1u << 29);
}

// A length-delimited field of ``message`` at ``*pos``: its number and its bytes. False for any other wire type:
// only length-delimited fields make the plain form, anything else goes to protobuf.
inline bool ReadField(const std::string_view& message, size_t* pos, uint64_t* number, std::string_view* bytes) {
  uint32_t wire_type;
  return ReadKey(message, pos, number, &wire_type) && wire_type == 2 &&
         ReadBytes(message.data(), message.size(), pos, bytes);
}

inline bool ParsePlainInput(const std::string_view& message, PlainInput* input) {
  size_t pos = 0;
  while (pos < message.size()) {
    uint64_t number;
    uint32_t wire_type;
    if (!ReadKey(message, &pos, &number, &wire_type)) return false;
    if (number == 3 && wire_type == 0) {  // one dim of the shape, unpacked
      uint64_t dim;
      if (!ReadVarint(message.data(), message.size(), &pos, &dim)) return false;
      input->shape.push_back(static_cast<int64_t>(dim));
      continue;
    }
    std::string_view bytes;
    if (wire_type != 2 || !ReadBytes(message.data(), message.size(), &pos, &bytes)) return false;
    if (number == 1) {
      input->name = bytes;
    } else if (number == 2) {
      input->datatype = bytes;
    } else if (number == 3) {  // the shape, packed
      size_t at = 0;
      while (at < bytes.size()) {
        uint64_t dim;
        if (!ReadVarint(bytes.data(), bytes.size(), &at, &dim)) return false;
        input->shape.push_back(static_cast<int64_t>(dim));
      }
    } else {
      return false;  // parameters, typed contents
    }
  }
  return true;
}

inline bool ParsePlainOutput(const std::string_view& message, std::string_view* name) {
  size_t pos = 0;
  while (pos < message.size()) {
    uint64_t number;
    std::string_view bytes;
    if (!ReadField(message, &pos, &number, &bytes) || number != 1) return false;  // parameters: protobuf's
    *name = bytes;
  }
  return true;
}

// ParsePlainInferRequest's reading of the fields, their strings as they are.
inline bool ParsePlainFields(const std::string_view& message, PlainInferRequest* out) {
  size_t pos = 0;
  while (pos < message.size()) {
    uint64_t number;
    std::string_view bytes;
    if (!ReadField(message, &pos, &number, &bytes)) return false;
    switch (number) {
      case 1:
        out->model_name = bytes;
        break;
      case 2:
        out->model_version = bytes;
        break;
      case 3:
        out->id = bytes;
        break;
      case 5:
        out->inputs.emplace_back();
        if (!ParsePlainInput(bytes, &out->inputs.back())) return false;
        break;
      case 6:
        out->outputs.emplace_back();
        if (!ParsePlainOutput(bytes, &out->outputs.back())) return false;
        break;
      default:  // request parameters, raw contents left in, unknown fields
        return false;
    }
  }
  return true;
}

// ``message`` (a ModelInferRequest without its raw input contents) in its plain form; false where it has more
// (parameters, typed contents, unknown fields), a string that is not UTF-8, or cannot be read: protobuf then parses
// it and says what is wrong.
inline bool ParsePlainInferRequest(const std::string_view& message, PlainInferRequest* out) {
  if (!ParsePlainFields(message, out) || !IsUtf8(out->model_name) || !IsUtf8(out->model_version) ||
      !IsUtf8(out->id)) {
    return false;
  }
  for (const auto& input : out->inputs) {
    if (!IsUtf8(input.name) || !IsUtf8(input.datatype)) return false;
  }
  for (const auto& output : out->outputs) {
    if (!IsUtf8(output)) return false;
  }
  return true;
}

}  // namespace native_wire

#endif  // RUNTIME_GRPC_NATIVE_WIRE_H_
