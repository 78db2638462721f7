// Compressed gRPC messages inflated by the native edge itself (native_edge_server.h), a piece at a time and never
// past the receive limit. grpc++ 1.51 inflates a message whole before it checks its size (a 1 MB gzip message grew
// the server by 1,090 MB before its refusal), so the edge turns grpc's own decompression off
// (grpc.per_message_decompression) and receives compressed messages as they came; each is inflated here, in grpc's
// thread, into slices of its own, and refused as soon as it passes the limit. Bytes being inflated at once by every
// call together are bounded too: past that bound a call is refused rather than held.
#ifndef RUNTIME_GRPC_NATIVE_INFLATE_H_
#define RUNTIME_GRPC_NATIVE_INFLATE_H_

#include <grpc/compression.h>
#include <grpcpp/grpcpp.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace grpc {
namespace internal {
// grpc++ names this class a friend of ByteBuffer for reaching its C buffer (its own tests define it the same way):
// a received message's compression algorithm lies there.
class GrpcByteBufferPeer {
 public:
  explicit GrpcByteBufferPeer(ByteBuffer* buffer) : buffer_(buffer) {}
  grpc_byte_buffer* c_buffer() { return buffer_->c_buffer(); }

 private:
  ByteBuffer* buffer_;
};
}  // namespace internal
}  // namespace grpc

namespace native_inflate {

constexpr size_t kPiece = 1 << 20;  // inflated a MiB at a time

// Bytes being inflated by every call at once (any thread).
class Budget {
 public:
  explicit Budget(int64_t limit) : limit_(limit) {}
  bool Take(int64_t bytes) {
    int64_t used = used_.fetch_add(bytes) + bytes;
    if (used <= limit_ || used == bytes) return true;  // one message alone may always be inflated
    used_.fetch_sub(bytes);
    return false;
  }
  void Give(int64_t bytes) { used_.fetch_sub(bytes); }

 private:
  int64_t limit_;
  std::atomic<int64_t> used_{0};
};

// What inflating a received message came to; for kRefused, the gRPC status to end its call with.
struct Inflated {
  enum Kind { kPlain, kInflated, kRefused } kind = kPlain;
  grpc::Status status;
};

// The algorithm ``buffer`` came compressed with (GRPC_COMPRESS_NONE: as it is).
inline grpc_compression_algorithm Algorithm(grpc::ByteBuffer& buffer) {
  grpc_byte_buffer* raw = grpc::internal::GrpcByteBufferPeer(&buffer).c_buffer();
  if (raw == nullptr || raw->type != GRPC_BB_RAW) return GRPC_COMPRESS_NONE;
  return raw->data.raw.compression;
}

inline grpc::Status TooLarge(size_t limit) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "Received message larger than max (more than " +
                                                                std::to_string(limit) +
                                                                " bytes once decompressed vs. " +
                                                                std::to_string(limit) + ")");
}

// ``buffer`` inflated in place where it came compressed, at most ``limit`` bytes of it.
inline Inflated Inflate(grpc::ByteBuffer& buffer, size_t limit, Budget& budget) {
  grpc_compression_algorithm algorithm = Algorithm(buffer);
  if (algorithm == GRPC_COMPRESS_NONE) return {};
  if (algorithm != GRPC_COMPRESS_DEFLATE && algorithm != GRPC_COMPRESS_GZIP) {
    const char* name = nullptr;
    grpc_compression_algorithm_name(algorithm, &name);
    return {Inflated::kRefused, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, std::string("Compression algorithm '") +
                                                                                  (name ? name : "?") +
                                                                                  "' is not supported")};
  }
  const grpc::Status corrupt(grpc::StatusCode::INTERNAL, "a message could not be decompressed");
  std::vector<grpc::Slice> compressed;
  if (!buffer.Dump(&compressed).ok()) return {Inflated::kRefused, corrupt};
  z_stream stream{};
  if (inflateInit2(&stream, algorithm == GRPC_COMPRESS_GZIP ? 15 + 16 : 15) != Z_OK) {
    return {Inflated::kRefused, corrupt};
  }
  std::vector<grpc::Slice> out;
  grpc_slice piece{};                          // the slice being filled
  size_t capacity = 0, filled = 0, total = 0;  // its size, its bytes so far; the message's so far
  int64_t taken = 0;
  auto keep_piece = [&]() {
    if (capacity == 0) return;
    grpc::Slice owned(piece, grpc::Slice::STEAL_REF);
    if (filled > 0) out.push_back(filled == capacity ? owned : owned.sub(0, filled));
    capacity = filled = 0;
  };
  Inflated result{Inflated::kInflated, grpc::Status::OK};
  size_t next = 0;  // the next compressed slice
  while (true) {
    if (stream.avail_in == 0 && next < compressed.size()) {
      stream.next_in = const_cast<Bytef*>(compressed[next].begin());
      stream.avail_in = static_cast<uInt>(compressed[next].size());
      ++next;
    }
    if (filled == capacity) {  // room for a piece more, within the limit and the server's budget
      keep_piece();
      if (total > limit) {
        result = {Inflated::kRefused, TooLarge(limit)};
        break;
      }
      size_t room = std::min(kPiece, limit + 1 - total);
      if (!budget.Take(static_cast<int64_t>(room))) {
        result = {Inflated::kRefused, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                                   "the server is decompressing too many messages at once")};
        break;
      }
      taken += static_cast<int64_t>(room);
      piece = grpc_slice_malloc(room);
      capacity = room;
    }
    stream.next_out = GRPC_SLICE_START_PTR(piece) + filled;
    stream.avail_out = static_cast<uInt>(capacity - filled);
    int code = inflate(&stream, Z_NO_FLUSH);
    size_t produced = capacity - filled - stream.avail_out;
    filled += produced;
    total += produced;
    if (code == Z_STREAM_END) break;
    bool starved = stream.avail_in == 0 && next == compressed.size() && stream.avail_out > 0;
    if ((code != Z_OK && code != Z_BUF_ERROR) || (starved && produced == 0)) {
      result = {Inflated::kRefused, corrupt};  // not deflate, or it ended before its end
      break;
    }
  }
  keep_piece();
  inflateEnd(&stream);
  budget.Give(taken);
  if (result.kind == Inflated::kRefused) return result;
  if (total > limit) return {Inflated::kRefused, TooLarge(limit)};
  grpc::ByteBuffer inflated(out.data(), out.size());
  buffer.Swap(&inflated);
  return result;
}

}  // namespace native_inflate

#endif  // RUNTIME_GRPC_NATIVE_INFLATE_H_
