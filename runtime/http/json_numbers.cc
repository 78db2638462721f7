// The Python module of json_numbers.h (what it reads and writes is described there): numpy's buffers in and out,
// the GIL released while it works.
#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <type_traits>

#include "json_numbers.h"

namespace py = pybind11;

namespace json_numbers {

// A buffer's format as its element type (the struct module's letters numpy gives, with or without a byte order).
inline char FormatLetter(const py::buffer_info& info) {
  std::string format = info.format;
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@' || format[0] == '|')) {
    format.erase(0, 1);
  }
  return format.size() == 1 ? format[0] : '\0';
}

}  // namespace json_numbers

PYBIND11_MODULE(_json_numbers, module) {
  module.doc() = "Arrays of JSON numbers to and from numpy buffers (json_numbers.cc).";
  module.def(
      "parse",
      [](const py::buffer& text, const py::buffer& out) -> int64_t {
        py::buffer_info in = text.request();
        py::buffer_info into = out.request(true);
        char letter = json_numbers::FormatLetter(into);
        if (in.ndim != 1 || in.itemsize != 1 || in.strides[0] != 1 || into.ndim != 1 || into.itemsize != 8 ||
            into.strides[0] != 8 || std::string_view("qlQLd").find(letter) == std::string_view::npos) {
          throw py::value_error("parse takes contiguous text and a contiguous buffer of int64, uint64 or float64");
        }
        const char* data = static_cast<const char*>(in.ptr);
        size_t size = static_cast<size_t>(in.size), capacity = static_cast<size_t>(into.size);
        py::gil_scoped_release released;
        if (letter == 'd') return json_numbers::Parse(data, size, static_cast<double*>(into.ptr), capacity);
        if (letter == 'Q' || letter == 'L') {
          return json_numbers::Parse(data, size, static_cast<uint64_t*>(into.ptr), capacity);
        }
        return json_numbers::Parse(data, size, static_cast<int64_t*>(into.ptr), capacity);
      },
      py::arg("text"), py::arg("out"),
      "How many numbers the inside of a JSON array ``text`` holds, written into ``out`` (int64, uint64 or float64: "
      "an integer type takes no fraction or exponent); -1 where it is not plainly such numbers, or more than ``out`` "
      "holds.");
  module.def(
      "format",
      [](const py::buffer& values) -> py::object {
        py::buffer_info info = values.request();
        if (info.ndim != 1 || info.strides[0] != info.itemsize) {
          throw py::value_error("format takes a contiguous one-dimensional buffer");
        }
        size_t count = static_cast<size_t>(info.size), itemsize = static_cast<size_t>(info.itemsize);
        // the writer for the buffer's element type and its size at most (null: a type it does not write)
        char* (*write)(const void*, size_t, char*) = nullptr;
        size_t each = 0;
        auto as = [&](auto* typed) {
          using T = std::remove_const_t<std::remove_pointer_t<decltype(typed)>>;
          if (itemsize != sizeof(T)) return;
          write = [](const void* p, size_t n, char* w) { return json_numbers::Format(static_cast<const T*>(p), n, w); };
          each = json_numbers::MaxChars<T>();
        };
        switch (json_numbers::FormatLetter(info)) {
          case '?': as(static_cast<const json_numbers::Boolean*>(nullptr)); break;
          case 'b': as(static_cast<const int8_t*>(nullptr)); break;
          case 'B': as(static_cast<const uint8_t*>(nullptr)); break;
          case 'h': as(static_cast<const int16_t*>(nullptr)); break;
          case 'H': as(static_cast<const uint16_t*>(nullptr)); break;
          case 'i': as(static_cast<const int32_t*>(nullptr)); break;
          case 'I': as(static_cast<const uint32_t*>(nullptr)); break;
          case 'l': case 'q': as(static_cast<const int64_t*>(nullptr)); break;
          case 'L': case 'Q': as(static_cast<const uint64_t*>(nullptr)); break;
          case 'f': as(static_cast<const float*>(nullptr)); break;
          case 'd': as(static_cast<const double*>(nullptr)); break;
          default: break;
        }
        if (write == nullptr) throw py::value_error("format takes booleans, integers, float32 or float64");
        if (count > (static_cast<size_t>(PY_SSIZE_T_MAX) - 2) / each) throw py::value_error("too many values");
        PyObject* text = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * each + 2));
        if (text == nullptr) throw py::error_already_set();
        char* start = PyBytes_AS_STRING(text);
        char* end;
        {
          py::gil_scoped_release released;
          end = write(info.ptr, count, start);
        }
        if (_PyBytes_Resize(&text, end - start) != 0) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(text);
      },
      py::arg("values"),
      "The JSON array of a contiguous buffer of booleans, integers or floats (a float as msgspec writes its double; "
      "NaN and infinities as null).");
}
