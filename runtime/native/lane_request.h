// A native lane's side of a request (lane.h): whether it serves the call exactly as the core would (the
// core's checks of a plain request, runtime/validation.py, where the lane declines anything they would refuse or
// treat otherwise), and the batch's message for the model's worker, as handlers/python/batch.py writes one.
#ifndef RUNTIME_NATIVE_LANE_REQUEST_H_
#define RUNTIME_NATIVE_LANE_REQUEST_H_

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker_pickle.h"
#include "plain_request.h"

namespace native_lane {

struct InputSpec {
  std::string name, datatype;
  std::vector<int64_t> dims;  // -1: any size
  size_t element_size = 0;    // 0: a type the lane does not take (BYTES)
};

// What Python tells a lane about its model (runtime/native/lanes.py).
struct LaneSpec {
  std::string model, version;
  std::vector<InputSpec> inputs;
  std::vector<std::string> outputs;  // in the config's order
  int64_t max_batch_size = 0;
  int64_t buffer_segment = 0;  // the buffer's segment number to the worker
  double timeout_s = 0;
  size_t max_details = 1024;  // a longer error message goes back to Python, which cuts it as the adapter does
};

constexpr size_t kInlineMaxBytes = 16 * 1024;  // transport.py's INLINE_MAX_BYTES
constexpr int64_t kInline = -1, kRequestInput = -2;  // transport.py's INLINE, REQUEST_INPUT
constexpr int64_t kDirectExecution = -1;             // runtime/direct_path.py's DIRECT_EXECUTION
// (the module exports all four as WORKER_*: tests/test_worker_pickle.py holds them to Python's)
constexpr size_t kAlignment = 64;
constexpr size_t kNotPlaced = SIZE_MAX;
// What a batch's message may carry (the request's id, names and inline inputs): far below the frame's 2 GiB, so that
// its length is never wrapped; a request past it is left to the core.
constexpr size_t kMaxMessageBytes = size_t{64} << 20;

// Whether the lane can serve ``request`` exactly as the core would: the model's inputs, each once, of its
// datatypes and shapes, with as many bytes as those say; outputs the config names; room in the buffer.
inline bool Accepts(const LaneSpec& lane, size_t buffer_size, const plain_request::PlainInferRequest& request,
                    const std::vector<std::pair<size_t, size_t>>& raws) {
  if (request.model_name != lane.model) return false;
  if (!request.model_version.empty() && request.model_version != lane.version) return false;
  if (request.inputs.size() != lane.inputs.size() || raws.size() != lane.inputs.size()) return false;
  // A batched model's batch size is read off its first input: a request with none is left to the core.
  if (lane.max_batch_size > 0 && request.inputs.empty()) return false;
  size_t batched = lane.max_batch_size > 0 ? 1 : 0, placed = 0;
  size_t carried = request.id.size();  // what the message carries; each term bounded by the request's own size
  int64_t batch = -1;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const auto& input = request.inputs[i];
    const InputSpec* spec = nullptr;
    for (const auto& candidate : lane.inputs) {
      if (candidate.name == input.name) spec = &candidate;
    }
    if (spec == nullptr || spec->datatype != input.datatype || spec->element_size == 0) return false;
    for (size_t j = 0; j < i; ++j) {
      if (request.inputs[j].name == input.name) return false;
    }
    if (input.shape.size() != spec->dims.size() + batched) return false;
    if (batched) {
      if (input.shape[0] < 1 || input.shape[0] > lane.max_batch_size) return false;
      if (batch >= 0 && input.shape[0] != batch) return false;
      batch = input.shape[0];
    }
    // The element count is checked before each product, so that it never wraps (a shape whose count passes
    // 2^40 is left to the core, which refuses it in its own words).
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t elements = 1;
    for (size_t d = 0; d < input.shape.size(); ++d) {
      int64_t dim = input.shape[d];
      if (dim < 0 || static_cast<uint64_t>(dim) > kMaxElements) return false;
      if (d >= batched && spec->dims[d - batched] != -1 && spec->dims[d - batched] != dim) return false;
      if (dim != 0 && elements > kMaxElements / static_cast<uint64_t>(dim)) return false;
      elements *= static_cast<uint64_t>(dim);
    }
    if (elements * spec->element_size != raws[i].second) return false;  // at most 2^40 elements of 8 bytes
    if (raws[i].second > kInlineMaxBytes) {
      placed += (raws[i].second + kAlignment - 1) / kAlignment * kAlignment;
    } else {
      carried += raws[i].second;
    }
    carried += input.name.size();
  }
  if (placed > buffer_size) return false;
  for (size_t i = 0; i < request.outputs.size(); ++i) {
    bool known = false;
    for (const auto& output : lane.outputs) known = known || output == request.outputs[i];
    for (size_t j = 0; j < i; ++j) known = known && request.outputs[j] != request.outputs[i];
    if (!known) return false;
    carried += request.outputs[i].size();
  }
  return carried <= kMaxMessageBytes;
}

// Batch ``batch_id``'s message, as handlers/python/batch.py's batch_message writes one request's, framed; large
// inputs copied into ``buffer`` (``placed``: where each input lies, kNotPlaced for one carried in the message).
inline std::string BatchMessage(const LaneSpec& lane, int64_t batch_id, const plain_request::PlainInferRequest& request,
                                const plain_request::Pieces& pieces, const std::vector<std::pair<size_t, size_t>>& raws,
                                char* buffer, std::vector<std::pair<size_t, size_t>>* placed) {
  native_pickle::Writer message;
  message.Mark();
  message.Str("direct");
  message.Int(batch_id);
  message.EmptyList();
  message.Mark();
  message.Mark();  // (key, refs, id, outputs, parameters, correlation id, flags, timeout, BLS chain, execution)
  message.Mark();
  message.Int(-batch_id);  // a key of its own: the server's own keys count up from 0
  message.EndTuple();
  message.EmptyList();
  message.Mark();
  size_t offset = 0;
  std::string bytes;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const auto& input = request.inputs[i];
    const auto& [position, size] = raws[i];
    message.Mark();
    message.Str(input.name);
    message.Str(input.datatype);
    message.Mark();
    for (int64_t dim : input.shape) message.Int(dim);
    message.EndTuple();
    if (size <= kInlineMaxBytes) {
      bytes.resize(size);
      if (size) pieces.CopyTo(position, size, bytes.data());
      message.Int(kInline);
      message.Int(0);
      message.Int(static_cast<int64_t>(size));
      message.Bytes(bytes.data(), size);
      placed->emplace_back(kNotPlaced, size);
    } else {
      pieces.CopyTo(position, size, buffer + offset);
      message.Int(lane.buffer_segment);
      message.Int(static_cast<int64_t>(offset));
      message.Int(static_cast<int64_t>(size));
      message.None();
      placed->emplace_back(offset, size);
      offset += (size + kAlignment - 1) / kAlignment * kAlignment;
    }
    message.EndTuple();
  }
  message.Appends();
  message.Str(request.id);
  message.EmptyList();
  if (!request.outputs.empty()) {
    message.Mark();
    for (const auto& name : request.outputs) message.Str(name);
    message.Appends();
  }
  message.Str("{}");
  message.Int(0);
  message.Int(0);
  message.Int(0);
  message.EmptyTuple();
  message.Int(kDirectExecution);
  message.EndTuple();
  message.Appends();
  message.Bool(false);
  message.EndTuple();
  return message.Framed();
}

// The message telling the worker that batch ``batch_id``'s request was cancelled, as the supervisor's send_cancel
// writes one (its key, as BatchMessage gave it), framed.
inline std::string CancelMessage(int64_t batch_id) {
  native_pickle::Writer message;
  message.Mark();
  message.Str("cancel");
  message.Mark();
  message.Int(-batch_id);
  message.EndTuple();
  message.EndTuple();
  return message.Framed();
}

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_LANE_REQUEST_H_
