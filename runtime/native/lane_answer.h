// A native lane's side of an answer (lane.h): the worker's results message read (worker_pickle.h) into the
// outputs the core's response would carry (runtime/responses.py: the outputs asked for in the config's order, else
// every one produced, the config's first), or the model's error; each protocol's reply writes it in its own form
// (a ModelInferResponse in runtime/grpc/native_edge_server.h, an HTTP body in http_lane.h). An answer the lane does
// not write itself (response parameters, a missing output, a reschedule, a long error, anything unexpected) goes back
// to Python.
#ifndef RUNTIME_NATIVE_LANE_ANSWER_H_
#define RUNTIME_NATIVE_LANE_ANSWER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lane_request.h"
#include "worker_pickle.h"

namespace native_lane {

// One output as the worker returned it: its bytes in the message, or the request's input of that number.
struct Produced {
  std::string_view name, datatype, data;
  std::vector<uint64_t> shape;
};

// What the lane answers, as views of the worker's message and the lane's buffer (valid until the lane's next call).
struct Answer {
  enum Kind { kGiveBack, kResponse, kError } kind = kGiveBack;
  std::vector<Produced> produced;           // kResponse's: every output the worker returned
  std::vector<Produced*> outs;              // ... those the response carries, in its order
  std::string_view status_name, message;    // kError's: the core's status (runtime/errors.py), the model's words
};

// The error the model answered with (a message longer than the adapter lets through is cut by Python).
inline Answer ModelError(const LaneSpec& lane, const native_pickle::Value& result) {
  using native_pickle::Value;
  const auto& message = result.items[1];
  const auto& status = result.items[2];
  if (!message || message->kind != Value::kStr || !status || status->kind != Value::kStr ||
      message->text.size() > lane.max_details) {
    return {};
  }
  Answer answer;
  answer.kind = Answer::kError;
  answer.status_name = status->text;
  answer.message = message->text;
  return answer;
}

// What the lane answers a request (its ``requested`` outputs, its inputs ``placed`` in ``buffer``) with, from the
// worker's results message ``frame``.
inline Answer ReadAnswer(const LaneSpec& lane, const std::string& frame, const std::vector<std::string>& requested,
                         const std::vector<std::pair<size_t, size_t>>& placed, const char* buffer) {
  using native_pickle::Value;
  using native_pickle::ValuePtr;
  auto is = [](const ValuePtr& value, Value::Kind kind, size_t items = 0) {
    return value && value->kind == kind && value->items.size() >= items;
  };
  Answer answer;
  ValuePtr message = native_pickle::Read(frame);
  if (!is(message, Value::kTuple, 3) || !is(message->items[2], Value::kList, 1)) return {};
  const ValuePtr& result = message->items[2]->items[0];
  if (!is(result, Value::kTuple, 3) || !is(result->items[0], Value::kStr)) return {};
  if (result->items[0]->text == "error") return ModelError(lane, *result);
  if (result->items[0]->text != "ok" || !is(result->items[1], Value::kList)) return {};
  const ValuePtr& parameters = result->items[2];
  if (!(is(parameters, Value::kNone) || (is(parameters, Value::kStr) && parameters->text == "{}"))) return {};
  std::vector<Produced>& produced = answer.produced;
  produced.reserve(result->items[1]->items.size());  // the response's pointers stay valid
  for (const auto& ref : result->items[1]->items) {
    if (!is(ref, Value::kTuple, 7) || !is(ref->items[0], Value::kStr) || !is(ref->items[1], Value::kStr) ||
        !is(ref->items[2], Value::kTuple) || !is(ref->items[3], Value::kInt) || !is(ref->items[4], Value::kInt)) {
      return {};
    }
    Produced& out = produced.emplace_back();
    out.name = ref->items[0]->text;
    out.datatype = ref->items[1]->text;
    for (const auto& dim : ref->items[2]->items) {
      if (!is(dim, Value::kInt) || dim->number < 0) return {};
      out.shape.push_back(static_cast<uint64_t>(dim->number));
    }
    int64_t segment = ref->items[3]->number, index = ref->items[4]->number;
    if (segment == kInline && is(ref->items[6], Value::kBytes)) {
      out.data = ref->items[6]->text;
    } else if (segment == kRequestInput && index >= 0 && static_cast<size_t>(index) < placed.size() &&
               placed[static_cast<size_t>(index)].first != kNotPlaced) {
      const auto& [offset, size] = placed[static_cast<size_t>(index)];
      out.data = std::string_view(buffer + offset, size);
    } else {
      return {};
    }
  }
  auto find = [&produced](std::string_view name) -> Produced* {
    for (auto& out : produced) {
      if (out.name == name) return &out;
    }
    return nullptr;
  };
  std::vector<Produced*>& outs = answer.outs;
  for (const auto& name : lane.outputs) {
    bool wanted = requested.empty();
    for (const auto& asked : requested) wanted = wanted || asked == name;
    if (!wanted) continue;
    Produced* out = find(name);
    if (out == nullptr && !requested.empty()) return {};  // the core's "did not produce output" error
    if (out != nullptr) outs.push_back(out);
  }
  if (requested.empty()) {  // then the undeclared ones, each once, in the model's order
    for (auto& out : produced) {
      bool declared = false;
      for (const auto& name : lane.outputs) declared = declared || out.name == name;
      if (!declared && find(out.name) == &out) outs.push_back(&out);
    }
  }
  answer.kind = Answer::kResponse;
  return answer;
}

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_LANE_ANSWER_H_
