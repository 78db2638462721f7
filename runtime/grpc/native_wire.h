// Protobuf's wire format, as much of it as the native edge needs to cut a message's tensors out of it without a
// copy (native_edge.cc): the top-level fields, each kept whole or, for one length-delimited field, located.
#ifndef RUNTIME_GRPC_NATIVE_WIRE_H_
#define RUNTIME_GRPC_NATIVE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace native_wire {

inline bool ReadVarint(const char* data, size_t size, size_t* pos, uint64_t* value) {
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
// what is wrong with it).
inline bool SplitRawField(const char* data, size_t size, uint32_t field, std::string* rest,
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
    rest->append(data + start, pos - start);
  }
  return true;
}

}  // namespace native_wire

#endif  // RUNTIME_GRPC_NATIVE_WIRE_H_
