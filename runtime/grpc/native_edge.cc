// The native gRPC edge: grpc++'s callback server (native_edge_server.h) carries HTTP/2 and gRPC's framing in its own
// threads and hands every call's events (a call's first message, a stream's next one, a write done, a cancellation,
// a call a lane gives back) to Python in batches, through one eventfd that the event loop watches. Python answers
// with read/write/finish on the call; this file is its side.
//
// Why: grpcio builds Python objects for every completion-queue event and runs each call in a pool thread; this
// edge touches Python once per batch of events, on the loop thread (docs/benchmarks.md, "A native gRPC edge").
// No grpc++ thread ever takes the GIL: Python's side of a call is reached only through take().
#include "native_edge_server.h"
#include "native_infer_response.h"
#include "native_lane.h"
#include "native_received.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using native_edge::CallState;
using native_edge::Edge;
using native_edge::Event;
using native_edge::kCancel;
using native_edge::kHttp;
using native_edge::kLane;
using native_edge::kLaneFree;
using native_edge::kRead;
using native_edge::kStart;
using native_edge::kWriteDone;

// A message to send, copied once into grpc's buffer (grpc may send it after Python lets go): bytes, a list of
// buffers (bytes, memoryviews) that together make the message, so that a tensor is not joined into bytes first,
// or a ModelInferResponse's tuple form (native_infer_response.h), written without protobuf.
grpc::ByteBuffer ToSend(const py::handle& message) {
  if (PyTuple_Check(message.ptr())) return native_infer_response::Encode(message);
  if (PyBytes_Check(message.ptr())) {
    grpc::Slice slice(PyBytes_AS_STRING(message.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(message.ptr())));
    return grpc::ByteBuffer(&slice, 1);
  }
  std::vector<Py_buffer> views;
  size_t total = 0;
  auto release = [&views]() {
    for (auto& view : views) PyBuffer_Release(&view);
  };
  for (const auto& part : message) {
    Py_buffer view;
    if (PyObject_GetBuffer(part.ptr(), &view, PyBUF_SIMPLE) != 0) {
      release();
      throw py::error_already_set();
    }
    views.push_back(view);
    total += static_cast<size_t>(view.len);
  }
  grpc_slice raw = grpc_slice_malloc(total);
  uint8_t* out = GRPC_SLICE_START_PTR(raw);
  for (const auto& view : views) {
    std::memcpy(out, view.buf, static_cast<size_t>(view.len));
    out += view.len;
  }
  release();
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

// Python's handle on a call: what grpc told of it, and the three things Python may do with it.
class Call {
 public:
  explicit Call(std::shared_ptr<CallState> state) : state_(std::move(state)) {}

  uint64_t id() const { return state_->id; }
  py::str method() const { return py::str(state_->method); }

  // (key, value) pairs as grpcio gives them: ``-bin`` values as bytes, the others as str.
  py::tuple metadata() const {
    const auto& pairs = state_->metadata;
    py::tuple out(pairs.size());
    for (size_t i = 0; i < pairs.size(); ++i) {
      const auto& [key, value] = pairs[i];
      bool binary = key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
      py::object decoded = binary ? py::object(py::bytes(value))
                                  : py::reinterpret_steal<py::object>(
                                        PyUnicode_DecodeLatin1(value.data(), value.size(), nullptr));
      out[i] = py::make_tuple(py::str(key), decoded);
    }
    return out;
  }

  // Ask for the stream's next message (a kRead event brings it, or None at its end).
  bool read() {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    if (state_->reactor == nullptr || state_->finishing) return false;
    state_->reactor->StartRead(&state_->read_buffer);
    return true;
  }

  // Send one message (a kWriteDone event says it went); one write at a time.
  bool write(const py::object& message) {
    grpc::ByteBuffer buffer = ToSend(message);
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    if (state_->reactor == nullptr || state_->finishing) return false;
    state_->write_buffer.Swap(&buffer);
    state_->reactor->StartWrite(&state_->write_buffer);
    return true;
  }

  // End the call with this status, sending ``message`` first unless it is None.
  bool finish(int code, const std::string& details, const py::object& message) {
    grpc::ByteBuffer buffer;
    if (!message.is_none()) buffer = ToSend(message);
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    if (state_->reactor == nullptr || state_->finishing) return false;
    state_->finishing = true;
    grpc::Status status(static_cast<grpc::StatusCode>(code), details);
    if (message.is_none()) {
      state_->reactor->Finish(status);
    } else {
      state_->write_buffer.Swap(&buffer);
      state_->reactor->StartWriteAndFinish(&state_->write_buffer, grpc::WriteOptions(), status);
    }
    return true;
  }

 private:
  std::shared_ptr<CallState> state_;
};

// Python's reference to an edge dropped: the edge is deleted only when grpc can no longer reach it (shut down, its
// last call done); otherwise it is left to the process's end (a server dropped while it serves, or at the
// interpreter's exit): a call still open would call into a deleted edge, and waiting for it would never end,
// since calls end only when Python finishes them.
struct EdgeDeleter {
  void operator()(Edge* edge) const {
    if (edge->Idle()) delete edge;
  }
};

// Text a lane holds, for Python: never raises (a lane takes only UTF-8 strings, native_wire.h; were one to slip
// through, its bad bytes are replaced rather than the whole batch of events lost with an exception in take()).
py::str LaneText(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

// A hand-back's fields as Python reads them (native_lanes.py), but for the request's message.
py::tuple HandBackFields(const native_lane::HandBack& back) {
  py::list inputs, requested;
  for (const auto& input : back.inputs) inputs.append(py::bytes(input));
  for (const auto& name : back.requested) requested.append(LaneText(name));
  return py::make_tuple(back.lane, LaneText(back.why), py::bytes(back.frame), LaneText(back.id), inputs, requested,
                        back.batch_size, back.elapsed_ns);
}

// An HTTP answer's body, read by Python in place (a large one is copied only into the chunks it is sent in).
struct HttpBody {
  std::string bytes;
};

// An HTTP request's outcome (native_http_lane.h): ("answer", body, JSON header's length), ("error", status, message)
// or ("back", hand-back fields).
py::tuple HttpOutcome(native_http_lane::HttpAnswer& http) {
  using native_http_lane::HttpAnswer;
  if (http.kind == HttpAnswer::kGivenBack) return py::make_tuple("back", HandBackFields(*http.hand_back));
  if (http.kind == HttpAnswer::kError) {
    return py::make_tuple("error", LaneText(http.status_name), LaneText(http.message));
  }
  py::object body = py::cast(std::make_unique<HttpBody>(HttpBody{std::move(http.body)}));
  return py::make_tuple("answer", py::memoryview(body), http.json_length);
}

// The route's lone infer request (runtime/http/lane_route.py), served by its model's lane where one takes it: its
// inputs (name, datatype, shape, bytes) lie one after another in the body's ``chunks`` from ``header_length`` on.
// Its outcome comes as a kHttp event carrying ``token``; false: nothing was taken or touched.
bool TakeHttp(Edge& edge, uint64_t token, const std::string& model, const std::string& version, const std::string& id,
              const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, size_t>>& inputs,
              const std::vector<std::string>& outputs, const py::list& chunks, size_t header_length) {
  std::shared_ptr<native_lane::Lane> lane = edge.FindLane(model);
  if (!lane || !lane->Ready()) return false;
  native_wire::PlainInferRequest request;
  request.model_name = model;
  request.model_version = version;
  request.id = id;
  std::vector<std::pair<size_t, size_t>> raws;
  size_t at = header_length;
  for (const auto& [name, datatype, shape, size] : inputs) {
    request.inputs.push_back({name, datatype, shape});
    raws.emplace_back(at, size);
    at += size;
  }
  for (const auto& name : outputs) request.outputs.push_back(name);
  std::vector<Py_buffer> views;
  views.reserve(chunks.size());
  native_wire::Pieces pieces;
  bool readable = true;
  for (const auto& chunk : chunks) {
    Py_buffer view;
    if (PyObject_GetBuffer(chunk.ptr(), &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      readable = false;
      break;
    }
    views.push_back(view);
    pieces.Add(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  }
  bool taken = false;
  if (readable && at == pieces.size()) {
    std::unique_ptr<native_lane::Reply> reply =
        std::make_unique<native_http_lane::HttpReply>(token, edge.HttpDeliver());
    taken = lane->Take(reinterpret_cast<const void*>(token), request, pieces, raws, grpc::ByteBuffer(), reply);
  }
  for (auto& view : views) PyBuffer_Release(&view);
  return taken;
}

// One event as Python takes it: (call or None, kind, payload).
py::tuple EventForPython(Event& event, uint32_t field, size_t min_bytes, const py::object& into) {
  py::object payload;
  if (event.kind == kLaneFree) return py::make_tuple(py::none(), event.kind, event.lane);
  if (event.kind == kHttp) {
    return py::make_tuple(py::none(), event.kind, py::make_tuple(event.http->token, HttpOutcome(*event.http)));
  }
  if (event.kind == kLane) {
    native_lane::HandBack& back = *event.hand_back;
    payload = py::make_tuple(HandBackFields(back),
                             native_received::Received(back.original, true, true, field, min_bytes, into));
  } else if (event.kind == kStart || event.kind == kRead) {
    payload = event.ok ? native_received::Received(event.payload, event.call->split, event.call->decode, field,
                                                    min_bytes, into)
                       : py::none();
  } else {
    payload = py::bool_(event.ok);
  }
  return py::make_tuple(Call(event.call), event.kind, std::move(payload));
}

// An event that could not be made into Python objects, ended here: a call with INTERNAL, an HTTP request with the
// core's INTERNAL error; Python skips it (kUnreadable), or settles the HTTP request.
py::tuple UnreadableEvent(Event& event) {
  if (event.kind == kHttp && event.http) {
    return py::make_tuple(py::none(), event.kind,
                          py::make_tuple(event.http->token,
                                         py::make_tuple("error", "INTERNAL", "the server could not read this answer")));
  }
  if (event.call) Call(event.call).finish(13, "the server could not read this call", py::none());
  return py::make_tuple(py::none(), static_cast<int>(native_edge::kUnreadable), py::none());
}

py::list Take(Edge& edge, const py::object& into) {
  uint32_t field = static_cast<uint32_t>(edge.split_field());
  size_t min_bytes = edge.split_min_bytes();
  std::vector<Event> events = edge.TakeEvents();
  py::list out(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    try {
      out[i] = EventForPython(events[i], field, min_bytes, into);
    } catch (py::error_already_set& error) {  // one event's failure never costs the others theirs
      error.discard_as_unraisable("reading a native edge's event");
      out[i] = UnreadableEvent(events[i]);
    }
  }
  return out;
}

// A value the lane's pickle reader read, as Python's pickle would give it (a mark, which is no value, as Ellipsis).
py::object PickledValue(const native_pickle::Value& value) {
  using native_pickle::Value;
  switch (value.kind) {
    case Value::kNone:
      return py::none();
    case Value::kBool:
      return py::bool_(value.number != 0);
    case Value::kInt:
      return py::int_(value.number);
    case Value::kFloat:
      return py::float_(value.real);
    case Value::kStr:
      return py::str(value.text.data(), value.text.size());
    case Value::kBytes:
      return py::bytes(value.text.data(), value.text.size());
    case Value::kTuple: {
      py::tuple items(value.items.size());
      for (size_t i = 0; i < value.items.size(); ++i) items[i] = PickledValue(*value.items[i]);
      return std::move(items);
    }
    case Value::kList: {
      py::list items;
      for (const auto& item : value.items) items.append(PickledValue(*item));
      return std::move(items);
    }
    case Value::kDict: {
      py::dict items;
      for (size_t i = 0; i + 1 < value.items.size(); i += 2) {
        items[PickledValue(*value.items[i])] = PickledValue(*value.items[i + 1]);
      }
      return std::move(items);
    }
    case Value::kMark:
      return py::ellipsis();
  }
  return py::none();
}

}  // namespace

PYBIND11_MODULE(_native_edge, module) {
  module.doc() = "grpc++'s callback server, its calls handed to Python in batches (runtime/grpc/native.py)";
  // Debian builds abseil without NDEBUG, so every absl::Mutex that grpc takes also records lock order for
  // deadlock detection (GraphCycles, 1-2% of the server's CPU under load); a release build of grpc, Triton's
  // among them, has it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  module.attr("START") = static_cast<int>(kStart);
  module.attr("READ") = static_cast<int>(kRead);
  module.attr("WRITE_DONE") = static_cast<int>(kWriteDone);
  module.attr("CANCEL") = static_cast<int>(kCancel);
  module.attr("LANE") = static_cast<int>(kLane);
  module.attr("LANE_FREE") = static_cast<int>(kLaneFree);
  module.attr("HTTP") = static_cast<int>(kHttp);
  module.attr("UNREADABLE") = static_cast<int>(native_edge::kUnreadable);
  // what the lane writes of the Python worker's wire, read back by a test against the Python side's constants
  module.attr("WORKER_INLINE_MAX_BYTES") = native_lane::kInlineMaxBytes;
  module.attr("WORKER_INLINE") = native_lane::kInline;
  module.attr("WORKER_REQUEST_INPUT") = native_lane::kRequestInput;
  module.attr("WORKER_DIRECT_EXECUTION") = native_lane::kDirectExecution;
  module.attr("GRPC_VERSION") = grpc::Version();
  module.def(
      "infer_response_bytes",
      [](const py::tuple& form) {
        grpc::ByteBuffer buffer = native_infer_response::Encode(form);
        return native_received::ToBytes(buffer);
      },
      "The bytes a ModelInferResponse's tuple form is sent as (what finish writes for it).");
  module.def(
      "read_pickled",
      [](const py::bytes& message) -> py::object {
        std::string_view data = message;
        native_pickle::ValuePtr value = native_pickle::Read(data);
        if (value == nullptr) return py::make_tuple(false, py::none());
        return py::make_tuple(true, PickledValue(*value));
      },
      "(read, value): what the lane's reader of the worker's answers (native_pickle.h) makes of a pickled message, "
      "for the tests that hold it to Python's pickle.");
  module.def(
      "lane_batch_message",
      [](const std::string& model, const std::string& version,
         const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, size_t>>& inputs,
         const std::vector<std::string>& outputs, int64_t max_batch_size, size_t buffer_size, int64_t buffer_segment,
         int64_t batch_id, const std::string& request_model, const std::string& request_version,
         const std::string& request_id,
         const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, py::bytes>>& request_inputs,
         const std::vector<std::string>& request_outputs) -> py::object {
        native_lane::LaneSpec spec{model, version, {}, outputs, max_batch_size, buffer_segment, 0, {}, 0};
        for (const auto& [name, datatype, dims, element_size] : inputs) {
          spec.inputs.push_back({name, datatype, dims, element_size});
        }
        native_wire::PlainInferRequest request;
        request.model_name = request_model;
        request.model_version = request_version;
        request.id = request_id;
        std::string body;  // the inputs' bytes one after another, as a request's body holds them
        std::vector<std::pair<size_t, size_t>> raws;
        for (const auto& [name, datatype, shape, data] : request_inputs) {
          request.inputs.push_back({name, datatype, shape});
          std::string_view bytes = data;
          raws.emplace_back(body.size(), bytes.size());
          body.append(bytes);
        }
        for (const auto& name : request_outputs) request.outputs.push_back(name);
        if (!native_lane::Accepts(spec, buffer_size, request, raws)) return py::none();
        native_wire::Pieces pieces;
        pieces.Add(body.data(), body.size());
        std::string buffer(buffer_size, '\0');
        std::vector<std::pair<size_t, size_t>> placed;
        std::string message = native_lane::BatchMessage(spec, batch_id, request, pieces, raws, buffer.data(), &placed);
        return py::make_tuple(py::bytes(message), py::bytes(buffer));
      },
      "(framed message, buffer) a lane writes for a request, or None where it declines it (native_lane_request.h's "
      "Accepts and BatchMessage), for the tests that hold them to the worker's reader and runtime/validation.py.");
  module.def(
      "lane_cancel_message", [](int64_t batch_id) { return py::bytes(native_lane::CancelMessage(batch_id)); },
      "The framed message a lane writes to cancel batch ``batch_id``'s request (native_lane_request.h).");
  module.def(
      "plain_form",
      [](const py::bytes& message, uint32_t field) {
        std::string_view bytes = message;
        py::object plain = native_received::PlainOrWhole(message, bytes.data(), bytes.size(), field);
        return plain.is(message) ? py::none() : plain;
      },
      py::arg("message"), py::arg("field"),
      "The plain form a call that decodes hands over for this ModelInferRequest (``field``: its raw contents' "
      "number), None where it has none (protobuf parses it).");
  py::class_<HttpBody>(module, "HttpBody", py::buffer_protocol()).def_buffer([](HttpBody& body) {
    return py::buffer_info(body.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(body.bytes.size())}, {1}, true);
  });
  py::class_<Call>(module, "Call")
      .def_property_readonly("id", &Call::id)
      .def_property_readonly("method", &Call::method)
      .def_property_readonly("metadata", &Call::metadata)
      .def("read", &Call::read)
      .def("write", &Call::write)
      .def("finish", &Call::finish);
  py::class_<native_lane::Lane, std::shared_ptr<native_lane::Lane>>(module, "Lane")
      .def(py::init([](const std::string& model, const std::string& version,
                       const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, size_t>>& inputs,
                       const std::vector<std::string>& outputs, int64_t max_batch_size, double timeout_s,
                       const std::vector<std::pair<std::string, int>>& status_codes, size_t max_details,
                       int socket_fd, int buffer_fd, size_t buffer_size, int64_t buffer_segment) {
             native_lane::LaneSpec spec{model, version, {}, outputs, max_batch_size, buffer_segment, timeout_s,
                                        status_codes, max_details};
             for (const auto& [name, datatype, dims, element_size] : inputs) {
               spec.inputs.push_back({name, datatype, dims, element_size});
             }
             return std::make_shared<native_lane::Lane>(std::move(spec), socket_fd, buffer_fd, buffer_size);
           }),
           py::arg("model"), py::arg("version"), py::arg("inputs"), py::arg("outputs"), py::arg("max_batch_size"),
           py::arg("timeout_s"), py::arg("status_codes"), py::arg("max_details"), py::arg("socket_fd"),
           py::arg("buffer_fd"), py::arg("buffer_size"), py::arg("buffer_segment"))
      .def("set_idle", &native_lane::Lane::SetIdle)
      .def("stop", &native_lane::Lane::Stop)
      .def("shutdown", &native_lane::Lane::Shutdown)
      .def_property_readonly("busy", &native_lane::Lane::Busy)
      .def("tell_when_free", &native_lane::Lane::TellWhenFree)
      .def_property_readonly("open", &native_lane::Lane::Open)
      .def_property_readonly("id", &native_lane::Lane::id)
      .def_property_readonly("taken", &native_lane::Lane::Taken)
      .def("take_served", [](native_lane::Lane& lane) {
        native_lane::Served served = lane.TakeServed();
        py::list rows;
        for (const auto& [batch_size, counts] : served.by_batch_size) {
          rows.append(py::make_tuple(batch_size, counts.requests, counts.total_ns, counts.input_ns, counts.infer_ns,
                                     counts.output_ns));
        }
        return py::make_tuple(rows, served.failed, served.failed_ns, served.last_wall_ns);
      }, "What the lane served since last asked: ([(batch size, requests, total, input, infer, output ns)], "
         "failed, failed ns, the last one's wall-clock ns).");
  py::class_<Edge, std::unique_ptr<Edge, EdgeDeleter>>(module, "Edge")
      .def(py::init<const std::string&, const std::vector<std::pair<std::string, int>>&,
                    const std::vector<std::string>&, int, size_t, const std::vector<std::string>&>(),
           py::arg("address"), py::arg("arguments"), py::arg("split_methods") = std::vector<std::string>(),
           py::arg("split_field") = 0, py::arg("split_min_bytes") = 0,
           py::arg("decode_methods") = std::vector<std::string>(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &Edge::port)
      .def("fileno", &Edge::fileno)
      .def("take", &Take, py::arg("into") = py::none())
      .def("add_lane", &Edge::AddLane)
      .def("remove_lane", &Edge::RemoveLane)
      .def("adopt_connection", &Edge::AdoptConnection, py::arg("fd"),
           "Serve a connection accepted elsewhere (grpc owns ``fd`` from here); false once the edge has shut down.")
      .def("take_http", &TakeHttp, py::arg("token"), py::arg("model"), py::arg("version"), py::arg("id"),
           py::arg("inputs"), py::arg("outputs"), py::arg("chunks"), py::arg("header_length"))
      .def("cancel_http", [](Edge& edge, const std::string& model, uint64_t token) {
        std::shared_ptr<native_lane::Lane> lane = edge.FindLane(model);
        if (lane) lane->Cancel(reinterpret_cast<const void*>(token));
      }, "The client of the HTTP request ``token`` went away: the worker is told, where a lane serves it.")
      .def("shutdown", &Edge::Shutdown, py::call_guard<py::gil_scoped_release>());
}
