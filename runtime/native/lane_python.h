// What a lane hands Python, as Python objects (the GIL held): shared by the lanes' module (lanes_module.cc) and the
// native gRPC edge (runtime/grpc/native_edge.cc), which hands back the gRPC calls a lane gives back.
#ifndef RUNTIME_NATIVE_LANE_PYTHON_H_
#define RUNTIME_NATIVE_LANE_PYTHON_H_

#include <pybind11/pybind11.h>

#include <string>

#include "lane.h"

namespace native_lane {

// Text a lane holds, for Python: never raises (a lane takes only UTF-8 strings, plain_request.h; were one to slip
// through, its bad bytes are replaced rather than a whole batch of events lost with an exception).
inline pybind11::str LaneText(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::str>(decoded);
}

// A hand-back's fields as Python reads them (runtime/native/lanes.py's settle).
inline pybind11::tuple HandBackFields(const HandBack& back) {
  pybind11::list inputs, requested;
  for (const auto& input : back.inputs) inputs.append(pybind11::bytes(input));
  for (const auto& name : back.requested) requested.append(LaneText(name));
  return pybind11::make_tuple(back.lane, LaneText(back.why), pybind11::bytes(back.frame), LaneText(back.id), inputs,
                              requested, back.batch_size, back.elapsed_ns);
}

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_LANE_PYTHON_H_
