// A coverage-guided fuzz target (libFuzzer) over what a native lane reads from clients: a ModelInferRequest's raw
// contents split out (native_wire.h SplitRawField), its plain form (ParsePlainInferRequest), the lane's accept rule
// (runtime/native/lane_request.h Accepts) against three models, and the worker's message written for an accepted request
// (BatchMessage), read back by the pickle reader the lane reads answers with (worker_pickle.h Read). Every request a
// lane accepts must hold what the core checks (reliability checklist 35): strings UTF-8, each element count at most
// 2^40 and computed without wrapping, raw sizes that add up, a batch size read off an input that exists.
//
// The first byte picks the model (or, with its high bit set, feeds the rest to the pickle reader alone); the rest
// is the message. Built and run by scripts/fuzz_native.sh (clang's
// -fsanitize=fuzzer,address,undefined) over tests/fuzz/corpus/lane_request; tests/fuzz/make_corpus.py wrote the
// seeds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/grpc/native_wire.h"
#include "runtime/native/lane_request.h"
#include "runtime/native/plain_request.h"
#include "runtime/native/worker_pickle.h"

namespace {

constexpr uint32_t kRawField = 7;  // ModelInferRequest.raw_input_contents
constexpr size_t kBufferBytes = 1 << 20;

std::vector<native_lane::LaneSpec> Models() {
  native_lane::LaneSpec batched;  // max_batch_size 8, IN: FP32 [-1]
  batched.model = "batched";
  batched.version = "1";
  batched.inputs = {{"IN", "FP32", {-1}, 4}};
  batched.outputs = {"OUT"};
  batched.max_batch_size = 8;
  native_lane::LaneSpec flat;  // no batching, IN: INT64 [-1, -1], MASK: BOOL [3]
  flat.model = "flat";
  flat.version = "1";
  flat.inputs = {{"IN", "INT64", {-1, -1}, 8}, {"MASK", "BOOL", {3}, 1}};
  flat.outputs = {"OUT", "SAME"};
  native_lane::LaneSpec empty;  // batched, no inputs
  empty.model = "empty";
  empty.version = "1";
  empty.outputs = {"PID"};
  empty.max_batch_size = 4;
  return {batched, flat, empty};
}

// UTF-8 as Python's strict decoder reads it, written independently of native_wire::IsUtf8.
bool Utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    uint32_t first = static_cast<uint8_t>(text[i]);
    size_t length = first < 0x80 ? 1 : (first >> 5) == 6 ? 2 : (first >> 4) == 14 ? 3 : (first >> 3) == 30 ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    uint32_t point = length == 1 ? first : first & (0x7F >> length);
    for (size_t k = 1; k < length; ++k) {
      uint32_t next = static_cast<uint8_t>(text[i + k]);
      if ((next >> 6) != 2) return false;
      point = point << 6 | (next & 0x3F);
    }
    static constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (point < kLeast[length] || point > 0x10FFFF || (point >= 0xD800 && point <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

void Require(bool holds) {
  if (!holds) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<native_lane::LaneSpec> models = Models();
  static std::vector<char> buffer(kBufferBytes);
  if (size < 1) return 0;
  if (data[0] & 0x80) {  // the pickle reader alone, over any bytes (what a lane reads a worker's answer with)
    native_pickle::Read(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  const native_lane::LaneSpec& lane = models[data[0] % models.size()];
  const char* message = reinterpret_cast<const char*>(data + 1);
  size_t length = size - 1;
  native_wire::Pieces pieces;  // in two pieces, as grpc's slices come
  pieces.Add(message, length / 2);
  pieces.Add(message + length / 2, length - length / 2);
  std::string rest;
  std::vector<std::pair<size_t, size_t>> raws;
  if (!native_wire::SplitRawField(pieces, pieces.size(), kRawField, &rest, &raws)) return 0;
  for (const auto& [position, bytes] : raws) Require(position <= length && bytes <= length - position);
  native_wire::PlainInferRequest request;
  if (!native_wire::ParsePlainInferRequest(rest, &request)) return 0;
  Require(Utf8(request.model_name) && Utf8(request.model_version) && Utf8(request.id));
  for (const auto& input : request.inputs) Require(Utf8(input.name) && Utf8(input.datatype));
  for (const auto& output : request.outputs) Require(Utf8(output));
  if (!native_lane::Accepts(lane, buffer.size(), request, raws)) return 0;
  // What the core would check of an accepted request, computed without a product that can wrap.
  Require(request.inputs.size() == lane.inputs.size());
  Require(lane.max_batch_size == 0 || !request.inputs.empty());
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    unsigned __int128 elements = 1;
    for (int64_t dim : request.inputs[i].shape) {
      Require(dim >= 0 && dim <= (int64_t{1} << 40));
      elements *= static_cast<unsigned __int128>(dim);
      Require(elements <= (unsigned __int128){1} << 40 || elements == 0);
    }
    const native_lane::InputSpec* spec = nullptr;
    for (const auto& candidate : lane.inputs) {
      if (candidate.name == request.inputs[i].name) spec = &candidate;
    }
    Require(spec != nullptr);
    Require(elements * spec->element_size == raws[i].second);
  }
  std::vector<std::pair<size_t, size_t>> placed;
  std::string framed = native_lane::BatchMessage(lane, 7, request, pieces, raws, buffer.data(), &placed);
  Require(framed.size() >= 4);
  native_pickle::ValuePtr read = native_pickle::Read(std::string_view(framed).substr(4));
  Require(read != nullptr && read->kind == native_pickle::Value::kTuple && read->items.size() == 4);
  for (const auto& [offset, bytes] : placed) Require(offset == native_lane::kNotPlaced || offset + bytes <= buffer.size());
  return 0;
}
