// What a message the native edge received becomes for Python (native_edge.cc's take): its bytes, its split form
// (its raw tensors cut out as views, or copied into a buffer Python offers, each aligned), or a ModelInferRequest's
// plain form (native_wire.h), read here without protobuf.
#ifndef RUNTIME_GRPC_NATIVE_RECEIVED_H_
#define RUNTIME_GRPC_NATIVE_RECEIVED_H_

#include <grpcpp/grpcpp.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "native_wire.h"

namespace native_received {

namespace py = pybind11;

inline py::object ToBytes(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return py::none();
  size_t total = 0;
  for (const auto& slice : slices) total += slice.size();
  PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
  if (bytes == nullptr) throw py::error_already_set();
  char* out = PyBytes_AS_STRING(bytes);
  for (const auto& slice : slices) {
    std::memcpy(out, slice.begin(), slice.size());
    out += slice.size();
  }
  return py::reinterpret_steal<py::object>(bytes);
}

// A memoryview of ``owner`` for each (offset, size) span of its memory.
inline py::list ViewsOf(const py::object& owner, const std::vector<std::pair<size_t, size_t>>& spans) {
  py::object whole = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
  if (!whole) throw py::error_already_set();
  py::list views(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    PyObject* part = PySequence_GetSlice(whole.ptr(), static_cast<Py_ssize_t>(spans[i].first),
                                         static_cast<Py_ssize_t>(spans[i].first + spans[i].second));
    if (part == nullptr) throw py::error_already_set();
    views[i] = py::reinterpret_steal<py::object>(part);
  }
  return views;
}

// The split form of a message lying in ``owner``'s memory (``data``, ``size`` bytes): (the message without its raw
// field, [a memoryview of ``owner`` for each raw field]); None when it does not split into raw fields of
// ``min_bytes`` or more.
inline py::object SplitForm(const py::object& owner, const char* data, size_t size, uint32_t field,
                            size_t min_bytes) {
  std::string rest;
  std::vector<std::pair<size_t, size_t>> raws;
  if (!native_wire::SplitRawField(data, size, field, &rest, &raws) || raws.empty()) return py::none();
  size_t raw_bytes = 0;
  for (const auto& raw : raws) raw_bytes += raw.second;
  if (raw_bytes < min_bytes) return py::none();
  return py::make_tuple(py::bytes(rest), ViewsOf(owner, raws));
}

// A large message's raw fields copied straight into a buffer ``into(size)`` gives (the server's shared tensor
// pool, which a Python worker reads in place), each at an address that is a multiple of RAW_ALIGNMENT, in its
// split form; the rest of the message is read out of grpc's slices without joining them. Its offset in the
// message would leave a tensor misaligned (numpy flags it so: adding 1 to a 600 KB FP32 tensor took 32.6 us
// against 17.0 here, resnet50_pt's forward pass 339 us against 323). None when ``into`` gives no buffer or the
// message does not split: its bytes are then read as the caller would have read them.
constexpr size_t RAW_ALIGNMENT = 64;

inline py::object ReceivedInto(grpc::ByteBuffer& buffer, const py::object& into, uint32_t field,
                               size_t min_bytes) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return py::none();
  native_wire::Pieces pieces;
  for (const auto& slice : slices) pieces.Add(reinterpret_cast<const char*>(slice.begin()), slice.size());
  std::string rest;
  std::vector<std::pair<size_t, size_t>> raws;
  if (!native_wire::SplitRawField(pieces, pieces.size(), field, &rest, &raws) || raws.empty()) return py::none();
  size_t raw_bytes = 0, padded = RAW_ALIGNMENT - 1;  // room to align the first, wherever the buffer starts
  for (const auto& raw : raws) {
    raw_bytes += raw.second;
    padded += (raw.second + RAW_ALIGNMENT - 1) / RAW_ALIGNMENT * RAW_ALIGNMENT;
  }
  if (raw_bytes < min_bytes) return py::none();
  py::object target = into(padded);
  if (target.is_none()) return py::none();
  Py_buffer view;
  if (PyObject_GetBuffer(target.ptr(), &view, PyBUF_WRITABLE) != 0) throw py::error_already_set();
  if (static_cast<size_t>(view.len) < padded) {
    PyBuffer_Release(&view);
    return py::none();
  }
  char* base = static_cast<char*>(view.buf);
  size_t offset = (RAW_ALIGNMENT - reinterpret_cast<uintptr_t>(base) % RAW_ALIGNMENT) % RAW_ALIGNMENT;
  std::vector<std::pair<size_t, size_t>> placed;  // each raw field's (offset, size) in ``target``
  for (const auto& [position, size] : raws) {
    pieces.CopyTo(position, size, base + offset);
    placed.emplace_back(offset, size);
    offset += (size + RAW_ALIGNMENT - 1) / RAW_ALIGNMENT * RAW_ALIGNMENT;
  }
  PyBuffer_Release(&view);  // the memory stays: ``target`` holds it
  return py::make_tuple(py::bytes(rest), ViewsOf(target, placed));
}

inline py::str Text(const std::string_view& utf8) {
  PyObject* text = PyUnicode_DecodeUTF8(utf8.data(), static_cast<Py_ssize_t>(utf8.size()), nullptr);
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

// The plain form of a ModelInferRequest (native_wire.h) whose raw input contents are ``raws`` (views or bytes):
// (model name, version, id, [(input name, datatype, shape)], [output name], raws), which Python makes its request
// from without protobuf (33 us a request in the server at gRPC add_sub_batch c=1, parsing and reading the
// message). None where ``rest`` (the message without its raw contents) has more than the plain form, a string that
// is not UTF-8, or not one raw content for each input: protobuf then parses it, and the error is worded as before.
inline py::object PlainForm(const std::string_view& rest, const py::list& raws) {
  native_wire::PlainInferRequest request;
  if (!native_wire::ParsePlainInferRequest(rest, &request) || request.inputs.size() != raws.size()) {
    return py::none();
  }
  try {
    py::list inputs(request.inputs.size());
    for (size_t i = 0; i < request.inputs.size(); ++i) {
      const auto& input = request.inputs[i];
      py::tuple shape(input.shape.size());
      for (size_t d = 0; d < input.shape.size(); ++d) shape[d] = py::int_(input.shape[d]);
      inputs[i] = py::make_tuple(Text(input.name), Text(input.datatype), std::move(shape));
    }
    py::list outputs(request.outputs.size());
    for (size_t i = 0; i < request.outputs.size(); ++i) outputs[i] = Text(request.outputs[i]);
    return py::make_tuple(Text(request.model_name), Text(request.model_version), Text(request.id),
                          std::move(inputs), std::move(outputs), raws);
  } catch (py::error_already_set&) {
    return py::none();
  }
}

// A split form's plain form where it has one, else the split form.
inline py::object PlainOrSplit(const py::object& split_form) {
  py::tuple parts = py::reinterpret_borrow<py::tuple>(split_form);
  py::object rest = parts[0];
  std::string_view bytes(PyBytes_AS_STRING(rest.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(rest.ptr())));
  py::object plain = PlainForm(bytes, py::reinterpret_borrow<py::list>(parts[1]));
  return plain.is_none() ? split_form : plain;
}

// A small message's plain form, its raw contents copied into bytes of their own; else the message's bytes.
inline py::object PlainOrWhole(const py::object& whole, const char* data, size_t size, uint32_t field) {
  std::string rest;
  std::vector<std::pair<size_t, size_t>> spans;
  if (!native_wire::SplitRawField(data, size, field, &rest, &spans)) return whole;
  py::list raws(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) raws[i] = py::bytes(data + spans[i].first, spans[i].second);
  py::object plain = PlainForm(rest, raws);
  return plain.is_none() ? whole : plain;
}

// A received message for Python: its bytes, or for a call that splits, (the message without its raw field,
// [a memoryview of each raw field's bytes]) when they come to ``min_bytes`` or more: protobuf then never copies
// the tensors (smaller ones cost less to copy than the views do to make and read).  ``into`` (None: not
// offered) gives a buffer a large message's tensors are received into instead of bytes of its own.  For a call
// that decodes, the message's plain form (PlainForm) where it has one, whatever its size.
inline py::object Received(grpc::ByteBuffer& buffer, bool split, bool decode, uint32_t field, size_t min_bytes,
                           const py::object& into) {
  if (split && !into.is_none() && buffer.Length() >= min_bytes) {
    py::object received;
    try {
      received = ReceivedInto(buffer, into, field, min_bytes);
    } catch (py::error_already_set&) {
      received = py::none();  // ``into`` failed: the message is read into bytes of its own, as without it
    }
    if (!received.is_none()) return decode ? PlainOrSplit(received) : received;
  }
  py::object whole = ToBytes(buffer);
  if (!split || whole.is_none()) return whole;
  const char* data = PyBytes_AS_STRING(whole.ptr());
  size_t size = static_cast<size_t>(PyBytes_GET_SIZE(whole.ptr()));
  if (size < min_bytes) return decode ? PlainOrWhole(whole, data, size, field) : whole;
  py::object split_form = SplitForm(whole, data, size, field, min_bytes);
  if (split_form.is_none()) return whole;
  return decode ? PlainOrSplit(split_form) : split_form;
}

}  // namespace native_received

#endif  // RUNTIME_GRPC_NATIVE_RECEIVED_H_
