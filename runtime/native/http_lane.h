// An HTTP request's side of a native lane (lane.h): a lone infer request with binary tensors that the HTTP
// route hands over (runtime/http/lane_route.py) is served by its model's lane, straight from the body's chunks to
// the worker's buffer, and its answer is written here as the route writes one (runtime/http/codec.py's
// encode_infer_response: the JSON header, then each output's bytes), off the event loop; it reaches Python through
// the lane table's events (lane_table.h). No function here takes the GIL.
#ifndef RUNTIME_NATIVE_HTTP_LANE_H_
#define RUNTIME_NATIVE_HTTP_LANE_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "lane.h"

namespace native_http_lane {

// A request's outcome, for the route: an answer (``body`` with its JSON header's length), the model's error, or
// the request given back (``hand_back``: Python finishes it in the core's words).
struct HttpAnswer {
  enum Kind { kAnswer, kError, kGivenBack } kind = kAnswer;
  uint64_t token = 0;
  std::string body;
  size_t json_length = 0;
  std::string status_name, message;  // the model's error: the core's status, its words
  std::unique_ptr<native_lane::HandBack> hand_back;
};

// ``text`` as a JSON string, escaped as msgspec escapes it (quote, backslash, control characters; UTF-8 as is).
inline void AppendJsonString(std::string_view text, std::string* out) {
  out->push_back('"');
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (byte < 0x20) {
          char escaped[7];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
          out->append(escaped);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// The answer's body: its JSON header (every output as binary data) and the outputs' bytes after it.
inline std::string Body(const native_lane::LaneSpec& lane, const std::string& id, const native_lane::Answer& answer,
                        size_t* json_length) {
  std::string body = "{\"model_name\":";
  AppendJsonString(lane.model, &body);
  body.append(",\"model_version\":");
  AppendJsonString(lane.version, &body);
  if (!id.empty()) {
    body.append(",\"id\":");
    AppendJsonString(id, &body);
  }
  body.append(",\"outputs\":[");
  size_t data = 0;
  for (size_t i = 0; i < answer.outs.size(); ++i) {
    const native_lane::Produced& out = *answer.outs[i];
    body.append(i ? ",{\"name\":" : "{\"name\":");
    AppendJsonString(out.name, &body);
    body.append(",\"datatype\":");
    AppendJsonString(out.datatype, &body);
    body.append(",\"shape\":[");
    for (size_t d = 0; d < out.shape.size(); ++d) {
      if (d) body.push_back(',');
      body.append(std::to_string(out.shape[d]));
    }
    body.append("],\"parameters\":{\"binary_data_size\":");
    body.append(std::to_string(out.data.size()));
    body.append("}}");
    data += out.data.size();
  }
  body.append("]}");
  *json_length = body.size();
  body.reserve(body.size() + data);
  for (const native_lane::Produced* out : answer.outs) body.append(out->data);
  return body;
}

// How a lane ends an HTTP request: its outcome handed to ``deliver`` (the lane table's events to Python).
class HttpReply : public native_lane::Reply {
 public:
  using Deliver = std::function<void(std::unique_ptr<HttpAnswer>)>;
  HttpReply(uint64_t token, Deliver deliver) : token_(token), deliver_(std::move(deliver)) {}

  void Write(const native_lane::LaneSpec& lane, const std::string& id, const native_lane::Answer& answer) override {
    outcome_ = std::make_unique<HttpAnswer>();
    outcome_->token = token_;
    if (answer.kind == native_lane::Answer::kResponse) {
      outcome_->body = Body(lane, id, answer, &outcome_->json_length);
    } else {
      outcome_->kind = HttpAnswer::kError;
      outcome_->status_name = std::string(answer.status_name);
      outcome_->message = std::string(answer.message);
    }
  }
  void Send() override { deliver_(std::move(outcome_)); }

  void GiveBack(std::unique_ptr<native_lane::HandBack> hand_back) override {
    auto outcome = std::make_unique<HttpAnswer>();
    outcome->kind = HttpAnswer::kGivenBack;
    outcome->token = token_;
    outcome->hand_back = std::move(hand_back);
    deliver_(std::move(outcome));
  }

 private:
  uint64_t token_;
  Deliver deliver_;
  std::unique_ptr<HttpAnswer> outcome_;  // written, to send
};

}  // namespace native_http_lane

#endif  // RUNTIME_NATIVE_HTTP_LANE_H_
