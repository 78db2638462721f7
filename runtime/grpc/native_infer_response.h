// A ModelInferResponse written by the native edge straight from the core's answer, without protobuf: Python hands
// over (model name, version, id, [(output name, datatype, shape, bytes)]) and the message is written into one grpc
// slice, each tensor copied once, as before. Building the protobuf message and serializing it cost 33 us a request
// in the server at gRPC add_sub_batch c=1, 20 at c=32 (docs/benchmarks.md, "A native request and response codec").
#ifndef RUNTIME_GRPC_NATIVE_INFER_RESPONSE_H_
#define RUNTIME_GRPC_NATIVE_INFER_RESPONSE_H_

#include <grpcpp/grpcpp.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace native_infer_response {

namespace py = pybind11;

// grpc_service.proto's field numbers: ModelInferResponse, then InferOutputTensor.
constexpr uint32_t kModelName = 1, kModelVersion = 2, kId = 3, kOutputs = 5, kRawOutputContents = 6;
constexpr uint32_t kOutputName = 1, kOutputDatatype = 2, kOutputShape = 3;

inline size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value > 0x7F) {
    value >>= 7;
    ++size;
  }
  return size;
}

inline uint8_t* PutVarint(uint64_t value, uint8_t* out) {
  while (value > 0x7F) {
    *out++ = static_cast<uint8_t>(value & 0x7F) | 0x80;
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

// A length-delimited field's size: key, length, bytes (the fields here have numbers below 16: a one-byte key).
inline size_t FieldSize(size_t length) { return 1 + VarintSize(length) + length; }

inline uint8_t* PutField(uint32_t field, const char* data, size_t length, uint8_t* out) {
  *out++ = static_cast<uint8_t>(field << 3 | 2);
  out = PutVarint(length, out);
  if (length) std::memcpy(out, data, length);
  return out + length;
}

// A proto3 string field: left out when empty, as protobuf leaves it.
inline size_t StringSize(const std::string_view& text) { return text.empty() ? 0 : FieldSize(text.size()); }

inline uint8_t* PutString(uint32_t field, const std::string_view& text, uint8_t* out) {
  return text.empty() ? out : PutField(field, text.data(), text.size(), out);
}

inline std::string_view Utf8(const py::handle& text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) throw py::error_already_set();
  return {data, static_cast<size_t>(size)};
}

// One output to write: where its name, datatype, shape and bytes lie (the caller keeps them alive).
struct OutputView {
  std::string_view name, datatype;
  const std::vector<uint64_t>* shape;
  std::string_view data;
};

// A ModelInferResponse's bytes, in the order (and with the packing) protobuf's own serializer writes them, into one
// grpc slice: each output's bytes copied once (the core's answer, native_edge.cc; a lane's, native_edge_server.h's
// CallReply).
inline grpc::ByteBuffer Write(std::string_view model, std::string_view version, std::string_view id,
                              const std::vector<OutputView>& outputs) {
  std::vector<std::pair<size_t, size_t>> sizes;  // each output's packed shape and InferOutputTensor message
  sizes.reserve(outputs.size());
  size_t total = StringSize(model) + StringSize(version) + StringSize(id);
  for (const auto& output : outputs) {
    size_t packed = 0;
    for (uint64_t dim : *output.shape) packed += VarintSize(dim);
    size_t body = StringSize(output.name) + StringSize(output.datatype) + (packed ? FieldSize(packed) : 0);
    sizes.emplace_back(packed, body);
    total += FieldSize(body) + FieldSize(output.data.size());
  }
  grpc_slice raw = grpc_slice_malloc(total);
  uint8_t* out = GRPC_SLICE_START_PTR(raw);
  out = PutString(kModelName, model, out);
  out = PutString(kModelVersion, version, out);
  out = PutString(kId, id, out);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [packed, body] = sizes[i];
    *out++ = static_cast<uint8_t>(kOutputs << 3 | 2);
    out = PutVarint(body, out);
    out = PutString(kOutputName, outputs[i].name, out);
    out = PutString(kOutputDatatype, outputs[i].datatype, out);
    if (packed) {
      *out++ = static_cast<uint8_t>(kOutputShape << 3 | 2);
      out = PutVarint(packed, out);
      for (uint64_t dim : *outputs[i].shape) out = PutVarint(dim, out);
    }
  }
  for (const auto& output : outputs) {  // every output's entry, an empty one for an output in shared memory
    out = PutField(kRawOutputContents, output.data.data(), output.data.size(), out);
  }
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

// One output as read from Python; ``data`` is released by Outputs.
struct Output {
  std::string_view name, datatype;
  std::vector<uint64_t> shape;
  Py_buffer data{};  // zeroed until acquired: releasing it then does nothing
};

// The outputs of a tuple form, each one's bytes held (as a buffer) until they are written; every buffer acquired
// is released, also when a later output turns out unreadable.
class Outputs {
 public:
  explicit Outputs(const py::handle& outputs) {
    try {
      Read(outputs);
    } catch (...) {
      Release();
      throw;
    }
  }
  ~Outputs() { Release(); }
  Outputs(const Outputs&) = delete;
  Outputs& operator=(const Outputs&) = delete;

  const std::vector<Output>& items() const { return outputs_; }

 private:
  void Read(const py::handle& outputs) {
    py::sequence items = py::reinterpret_borrow<py::sequence>(outputs);
    outputs_.reserve(items.size());
    for (const auto& item : items) {
      py::tuple fields = py::reinterpret_borrow<py::tuple>(item);
      if (fields.size() != 4) throw py::value_error("an output is (name, datatype, shape, bytes)");
      Output& output = outputs_.emplace_back();
      output.name = Utf8(fields[0]);
      output.datatype = Utf8(fields[1]);
      for (const auto& dim : py::reinterpret_borrow<py::sequence>(fields[2])) {
        long long value = PyLong_AsLongLong(dim.ptr());
        if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
        output.shape.push_back(static_cast<uint64_t>(value));  // int64 on the wire: a negative takes ten bytes
      }
      if (PyObject_GetBuffer(fields[3].ptr(), &output.data, PyBUF_SIMPLE) != 0) throw py::error_already_set();
    }
  }

  void Release() {
    for (auto& output : outputs_) PyBuffer_Release(&output.data);
    outputs_.clear();
  }

  std::vector<Output> outputs_;
};

// The message for Python's tuple form of the core's answer: (model name, version, id, [(name, datatype, shape,
// bytes)]).
inline grpc::ByteBuffer Encode(const py::handle& form) {
  py::tuple fields = py::reinterpret_borrow<py::tuple>(form);
  if (fields.size() != 4) throw py::value_error("a response is (model name, version, id, outputs)");
  std::string_view model = Utf8(fields[0]), version = Utf8(fields[1]), id = Utf8(fields[2]);
  Outputs outputs(fields[3]);
  std::vector<OutputView> views;
  views.reserve(outputs.items().size());
  for (const auto& output : outputs.items()) {
    views.push_back({output.name, output.datatype, &output.shape,
                     std::string_view(static_cast<const char*>(output.data.buf), static_cast<size_t>(output.data.len))});
  }
  return Write(model, version, id, views);
}

}  // namespace native_infer_response

#endif  // RUNTIME_GRPC_NATIVE_INFER_RESPONSE_H_
