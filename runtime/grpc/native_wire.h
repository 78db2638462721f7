// Protobuf's wire format, as much of it as the native edge needs to cut a message's tensors out of it without a
// copy (native_edge.cc): the top-level fields, each kept whole or, for one length-delimited field, located.
#ifndef RUNTIME_GRPC_NATIVE_WIRE_H_
#define RUNTIME_GRPC_NATIVE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace native_wire {

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

}  // namespace native_wire

#endif  // RUNTIME_GRPC_NATIVE_WIRE_H_
