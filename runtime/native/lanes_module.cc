// The native data path's Python side (runtime/native/lanes.py): the lanes (lane.h), their table (lane_table.h) and
// the HTTP route's way into them (take_http). Built without any protocol library, so that the lanes serve HTTP
// wherever the package is installed, with or without the native gRPC edge, which takes the same table as a capsule.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "http_lane.h"
#include "lane.h"
#include "lane_python.h"
#include "lane_table.h"
#include "plain_request.h"
#include "worker_pickle.h"

namespace py = pybind11;

namespace {

using native_lane::HandBackFields;
using native_lane::LaneTable;
using native_lane::LaneText;
using native_lane::TableEvent;

using InputSpecs = std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, size_t>>;

native_lane::LaneSpec MakeSpec(const std::string& model, const std::string& version, const InputSpecs& inputs,
                               const std::vector<std::string>& outputs, int64_t max_batch_size,
                               int64_t buffer_segment, double timeout_s, size_t max_details) {
  native_lane::LaneSpec spec{model, version, {}, outputs, max_batch_size, buffer_segment, timeout_s, max_details};
  for (const auto& [name, datatype, dims, element_size] : inputs) {
    spec.inputs.push_back({name, datatype, dims, element_size});
  }
  return spec;
}

// An HTTP answer's body, read by Python in place (a large one is copied only into the chunks it is sent in).
struct HttpBody {
  std::string bytes;
};

// An HTTP request's outcome (http_lane.h): ("answer", body, JSON header's length), ("error", status, message) or
// ("back", hand-back fields).
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
bool TakeHttp(LaneTable& table, uint64_t token, const std::string& model, const std::string& version,
              const std::string& id, const InputSpecs& inputs, const std::vector<std::string>& outputs,
              const py::list& chunks, size_t header_length) {
  std::shared_ptr<native_lane::Lane> lane = table.Find(model);
  if (!lane || !lane->Ready()) return false;
  plain_request::PlainInferRequest request;
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
  plain_request::Pieces pieces;
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
        std::make_unique<native_http_lane::HttpReply>(token, table.HttpDeliver());
    taken = lane->Take(reinterpret_cast<const void*>(token), request, pieces, raws, reply);
  }
  for (auto& view : views) PyBuffer_Release(&view);
  return taken;
}

// One event as Python takes it: (kind, payload).
py::tuple TableEventForPython(TableEvent& event) {
  if (event.kind == TableEvent::kFree) return py::make_tuple(static_cast<int>(event.kind), event.lane);
  return py::make_tuple(static_cast<int>(event.kind), py::make_tuple(event.http->token, HttpOutcome(*event.http)));
}

py::list TakeEvents(LaneTable& table) {
  std::vector<TableEvent> events = table.TakeEvents();
  py::list out(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    try {
      out[i] = TableEventForPython(events[i]);
    } catch (py::error_already_set& error) {  // one event's failure never costs the others theirs: the HTTP
      error.discard_as_unraisable("reading a lane's event");  // request ends with the core's INTERNAL error
      uint64_t token = events[i].http ? events[i].http->token : 0;
      out[i] = py::make_tuple(static_cast<int>(TableEvent::kHttp),
                              py::make_tuple(token, py::make_tuple("error", "INTERNAL",
                                                                   "the server could not read this answer")));
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

// The table as a capsule for the native gRPC edge: a heap-held shared_ptr, released with the capsule.
py::capsule TableCapsule(const std::shared_ptr<LaneTable>& table) {
  auto* held = new std::shared_ptr<LaneTable>(table);
  return py::capsule(held, native_lane::kCapsuleName, [](PyObject* capsule) {
    delete static_cast<std::shared_ptr<LaneTable>*>(PyCapsule_GetPointer(capsule, native_lane::kCapsuleName));
  });
}

}  // namespace

PYBIND11_MODULE(_native_lanes, module) {
  module.doc() = "the native data path's lanes, shared by the HTTP route and the native gRPC edge "
                 "(runtime/native/lanes.py)";
  module.attr("FREE") = static_cast<int>(TableEvent::kFree);
  module.attr("HTTP") = static_cast<int>(TableEvent::kHttp);
  module.attr("CAPSULE_NAME") = native_lane::kCapsuleName;
  // what the lane writes of the Python worker's wire, read back by a test against the Python side's constants
  module.attr("WORKER_INLINE_MAX_BYTES") = native_lane::kInlineMaxBytes;
  module.attr("WORKER_INLINE") = native_lane::kInline;
  module.attr("WORKER_REQUEST_INPUT") = native_lane::kRequestInput;
  module.attr("WORKER_DIRECT_EXECUTION") = native_lane::kDirectExecution;
  module.def(
      "read_pickled",
      [](const py::bytes& message) -> py::object {
        std::string_view data = message;
        native_pickle::ValuePtr value = native_pickle::Read(data);
        if (value == nullptr) return py::make_tuple(false, py::none());
        return py::make_tuple(true, PickledValue(*value));
      },
      "(read, value): what the lane's reader of the worker's answers (worker_pickle.h) makes of a pickled message, "
      "for the tests that hold it to Python's pickle.");
  module.def(
      "lane_batch_message",
      [](const std::string& model, const std::string& version, const InputSpecs& inputs,
         const std::vector<std::string>& outputs, int64_t max_batch_size, size_t buffer_size, int64_t buffer_segment,
         int64_t batch_id, const std::string& request_model, const std::string& request_version,
         const std::string& request_id,
         const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, py::bytes>>& request_inputs,
         const std::vector<std::string>& request_outputs) -> py::object {
        native_lane::LaneSpec spec = MakeSpec(model, version, inputs, outputs, max_batch_size, buffer_segment, 0, 0);
        plain_request::PlainInferRequest request;
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
        plain_request::Pieces pieces;
        pieces.Add(body.data(), body.size());
        std::string buffer(buffer_size, '\0');
        std::vector<std::pair<size_t, size_t>> placed;
        std::string message = native_lane::BatchMessage(spec, batch_id, request, pieces, raws, buffer.data(), &placed);
        return py::make_tuple(py::bytes(message), py::bytes(buffer));
      },
      "(framed message, buffer) a lane writes for a request, or None where it declines it (lane_request.h's "
      "Accepts and BatchMessage), for the tests that hold them to the worker's reader and runtime/validation.py.");
  module.def(
      "lane_cancel_message", [](int64_t batch_id) { return py::bytes(native_lane::CancelMessage(batch_id)); },
      "The framed message a lane writes to cancel batch ``batch_id``'s request (lane_request.h).");
  py::class_<HttpBody>(module, "HttpBody", py::buffer_protocol()).def_buffer([](HttpBody& body) {
    return py::buffer_info(body.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(body.bytes.size())}, {1}, true);
  });
  py::class_<native_lane::Lane, std::shared_ptr<native_lane::Lane>>(module, "Lane")
      .def(py::init([](const std::string& model, const std::string& version, const InputSpecs& inputs,
                       const std::vector<std::string>& outputs, int64_t max_batch_size, double timeout_s,
                       size_t max_details, int socket_fd, int buffer_fd, size_t buffer_size,
                       int64_t buffer_segment) {
             return std::make_shared<native_lane::Lane>(
                 MakeSpec(model, version, inputs, outputs, max_batch_size, buffer_segment, timeout_s, max_details),
                 socket_fd, buffer_fd, buffer_size);
           }),
           py::arg("model"), py::arg("version"), py::arg("inputs"), py::arg("outputs"), py::arg("max_batch_size"),
           py::arg("timeout_s"), py::arg("max_details"), py::arg("socket_fd"), py::arg("buffer_fd"),
           py::arg("buffer_size"), py::arg("buffer_segment"))
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
  py::class_<LaneTable, std::shared_ptr<LaneTable>>(module, "LaneTable")
      .def(py::init([]() { return std::make_shared<LaneTable>(); }))
      .def("fileno", &LaneTable::fileno)
      .def("add", &LaneTable::Add)
      .def("remove", &LaneTable::Remove)
      .def("take", &TakeEvents, "Every event since the last take: [(FREE, lane id) or (HTTP, (token, outcome))].")
      .def("capsule", &TableCapsule, "The table for the native gRPC edge (Edge's ``lanes``).")
      .def("take_http", &TakeHttp, py::arg("token"), py::arg("model"), py::arg("version"), py::arg("id"),
           py::arg("inputs"), py::arg("outputs"), py::arg("chunks"), py::arg("header_length"))
      .def("cancel_http", [](LaneTable& table, const std::string& model, uint64_t token) {
        std::shared_ptr<native_lane::Lane> lane = table.Find(model);
        if (lane) lane->Cancel(reinterpret_cast<const void*>(token));
      }, "The client of the HTTP request ``token`` went away: the worker is told, where a lane serves it.");
}
