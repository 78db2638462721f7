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
#include "native_received.h"
#include "runtime/native/lane_python.h"
#include "runtime/native/lane_table.h"

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
using native_edge::kLane;
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

// One event as Python takes it: (call or None, kind, payload).
py::tuple EventForPython(Event& event, uint32_t field, size_t min_bytes, const py::object& into) {
  py::object payload;
  if (event.kind == kLane) {
    payload = py::make_tuple(native_lane::HandBackFields(*event.hand_back),
                             native_received::Received(event.payload, true, true, field, min_bytes, into));
  } else if (event.kind == kStart || event.kind == kRead) {
    payload = event.ok ? native_received::Received(event.payload, event.call->split, event.call->decode, field,
                                                    min_bytes, into)
                       : py::none();
  } else {
    payload = py::bool_(event.ok);
  }
  return py::make_tuple(Call(event.call), event.kind, std::move(payload));
}

// An event that could not be made into Python objects, ended here with INTERNAL; Python skips it (kUnreadable).
py::tuple UnreadableEvent(Event& event) {
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
  module.attr("UNREADABLE") = static_cast<int>(native_edge::kUnreadable);
  module.attr("LANES_CAPSULE_NAME") = native_lane::kCapsuleName;
  module.attr("GRPC_VERSION") = grpc::Version();
  module.def(
      "infer_response_bytes",
      [](const py::tuple& form) {
        grpc::ByteBuffer buffer = native_infer_response::Encode(form);
        return native_received::ToBytes(buffer);
      },
      "The bytes a ModelInferResponse's tuple form is sent as (what finish writes for it).");
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
  py::class_<Call>(module, "Call")
      .def_property_readonly("id", &Call::id)
      .def_property_readonly("method", &Call::method)
      .def_property_readonly("metadata", &Call::metadata)
      .def("read", &Call::read)
      .def("write", &Call::write)
      .def("finish", &Call::finish);
  py::class_<Edge, std::unique_ptr<Edge, EdgeDeleter>>(module, "Edge")
      .def(py::init([](const std::string& address, const std::vector<std::pair<std::string, int>>& arguments,
                       const std::vector<std::string>& split_methods, int split_field, size_t split_min_bytes,
                       const std::vector<std::string>& decode_methods, const py::object& lanes,
                       const std::vector<std::pair<std::string, int>>& status_codes) {
             std::shared_ptr<native_lane::LaneTable> table;
             if (!lanes.is_none()) {  // the lanes' module's table (runtime/native/lane_table.h), built with this
               void* held = PyCapsule_GetPointer(lanes.ptr(), native_lane::kCapsuleName);
               if (held == nullptr) throw py::error_already_set();  // another build's headers: refused
               table = *static_cast<std::shared_ptr<native_lane::LaneTable>*>(held);
             }
             py::gil_scoped_release release;
             return std::unique_ptr<Edge, EdgeDeleter>(new Edge(address, arguments, split_methods, split_field,
                                                                split_min_bytes, decode_methods, std::move(table),
                                                                status_codes));
           }),
           py::arg("address"), py::arg("arguments"), py::arg("split_methods") = std::vector<std::string>(),
           py::arg("split_field") = 0, py::arg("split_min_bytes") = 0,
           py::arg("decode_methods") = std::vector<std::string>(), py::arg("lanes") = py::none(),
           py::arg("status_codes") = std::vector<std::pair<std::string, int>>())
      .def_property_readonly("port", &Edge::port)
      .def("fileno", &Edge::fileno)
      .def("take", &Take, py::arg("into") = py::none())
      .def("adopt_connection", &Edge::AdoptConnection, py::arg("fd"),
           "Serve a connection accepted elsewhere (grpc owns ``fd`` from here); false once the edge has shut down.")
      .def("shutdown", &Edge::Shutdown, py::call_guard<py::gil_scoped_release>());
}
