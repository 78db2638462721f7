// The native gRPC edge: grpc++'s callback server carries HTTP/2 and gRPC's framing in its own threads and hands
// every call's events (a call's first message, a stream's next one, a write done, a cancellation) to Python in
// batches, through one eventfd that the event loop watches. Python answers with read/write/finish on the call.
//
// Why: grpcio builds Python objects for every completion-queue event and runs each call in a pool thread; this
// edge touches Python once per batch of events, on the loop thread (docs/benchmarks.md, "A native gRPC edge").
// No grpc++ thread ever takes the GIL: Python's side of a call is reached only through take().
#include "native_infer_response.h"
#include "native_received.h"
#include "native_wire.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

enum EventKind { kStart = 0, kRead = 1, kWriteDone = 2, kCancel = 3 };

class EdgeReactor;

// One call as both sides see it; outlives the reactor (Python may hold it after grpc is done with the call).
struct CallState {
  uint64_t id = 0;
  std::string method;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::recursive_mutex mu;
  EdgeReactor* reactor = nullptr;  // null once grpc is done with the call
  bool finishing = false;
  bool split = false;  // its messages' raw field is handed over as views (see SplitRawField)
  bool decode = false;  // its messages are handed over in their plain form where they have one (native_received.h)
  bool started = false;  // the first read completed (grpc threads only: one read at a time)
  grpc::ByteBuffer read_buffer;
  grpc::ByteBuffer write_buffer;
};

struct Event {
  std::shared_ptr<CallState> call;
  int kind;
  bool ok;
  grpc::ByteBuffer payload;
};

class Edge;

class EdgeReactor : public grpc::ServerGenericBidiReactor {
 public:
  EdgeReactor(Edge* edge, grpc::GenericCallbackServerContext* context, uint64_t id);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  Edge* edge_;
  std::shared_ptr<CallState> state_;
};

class EdgeService : public grpc::CallbackGenericService {
 public:
  explicit EdgeService(Edge* edge) : edge_(edge) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

 private:
  Edge* edge_;
};

class Edge {
 public:
  Edge(const std::string& address, const std::vector<std::pair<std::string, int>>& arguments,
       const std::vector<std::string>& split_methods, int split_field, size_t split_min_bytes,
       const std::vector<std::string>& decode_methods)
      : service_(this),
        split_methods_(split_methods.begin(), split_methods.end()),
        decode_methods_(decode_methods.begin(), decode_methods.end()),
        split_field_(split_field),
        split_min_bytes_(split_min_bytes) {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    for (const auto& [name, value] : arguments) {
      if (name == "grpc.max_receive_message_length") {
        builder.SetMaxReceiveMessageSize(value);
      } else if (name == "grpc.max_send_message_length") {
        builder.SetMaxSendMessageSize(value);
      } else {
        builder.AddChannelArgument(name, value);
      }
    }
    server_ = builder.BuildAndStart();
    if (!server_) port_ = 0;
  }

  ~Edge() {
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  // Whether nothing of grpc's can reach this edge any more (see EdgeDeleter).
  bool Idle() const { return (!server_ || shut_down_) && live_reactors_.load() == 0; }
  void ReactorStarted() { live_reactors_.fetch_add(1); }
  void ReactorDone() { live_reactors_.fetch_sub(1); }

  int port() const { return port_; }
  int split_field() const { return split_field_; }
  size_t split_min_bytes() const { return split_min_bytes_; }
  bool Splits(const std::string& method) const { return split_methods_.count(method) != 0; }
  bool Decodes(const std::string& method) const { return decode_methods_.count(method) != 0; }
  int fileno() const { return wake_fd_; }
  uint64_t NextId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  // Any thread: queue an event, and wake the loop unless a wake-up is already on its way.
  void Push(Event&& event) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(event));
      wake = !signaled_;
      signaled_ = true;
    }
    if (wake) {
      uint64_t one = 1;
      ssize_t written = write(wake_fd_, &one, sizeof one);
      (void)written;
    }
  }

  // The loop thread (GIL held): every event queued since the last take.
  std::vector<Event> TakeEvents() {
    uint64_t count;
    ssize_t got = read(wake_fd_, &count, sizeof count);
    (void)got;
    std::vector<Event> events;
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(pending_);
    signaled_ = false;
    return events;
  }

  // Stop taking calls; those running get ``grace`` seconds, then are cancelled (GIL released by the binding). It
  // returns once every call has ended, so Python must go on taking events meanwhile (and finish the cancelled).
  void Shutdown(double grace) {
    if (!server_) return;
    auto deadline = std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
    server_->Shutdown(deadline);
    server_->Wait();
    shut_down_ = true;
  }

 private:
  EdgeService service_;
  std::unordered_set<std::string> split_methods_;
  std::unordered_set<std::string> decode_methods_;  // split methods whose ModelInferRequests are read here
  int split_field_;
  size_t split_min_bytes_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int wake_fd_ = -1;
  bool shut_down_ = false;
  std::atomic<int> live_reactors_{0};
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;
  std::vector<Event> pending_;
  bool signaled_ = false;
};

EdgeReactor::EdgeReactor(Edge* edge, grpc::GenericCallbackServerContext* context, uint64_t id)
    : edge_(edge), state_(std::make_shared<CallState>()) {
  state_->id = id;
  state_->method = context->method();
  state_->split = edge->Splits(state_->method);
  state_->decode = state_->split && edge->Decodes(state_->method);
  const auto& metadata = context->client_metadata();
  state_->metadata.reserve(metadata.size());
  for (const auto& [key, value] : metadata) {
    state_->metadata.emplace_back(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
  }
  state_->reactor = this;
  edge->ReactorStarted();
  StartRead(&state_->read_buffer);
}

void EdgeReactor::OnReadDone(bool ok) {
  Event event{state_, state_->started ? kRead : kStart, ok, {}};
  state_->started = true;
  if (ok) event.payload.Swap(&state_->read_buffer);
  edge_->Push(std::move(event));
}

void EdgeReactor::OnWriteDone(bool ok) { edge_->Push(Event{state_, kWriteDone, ok, {}}); }

void EdgeReactor::OnCancel() { edge_->Push(Event{state_, kCancel, false, {}}); }

void EdgeReactor::OnDone() {
  {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    state_->reactor = nullptr;
  }
  edge_->ReactorDone();
  delete this;
}

grpc::ServerGenericBidiReactor* EdgeService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  return new EdgeReactor(edge_, context, edge_->NextId());
}

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

py::list Take(Edge& edge, const py::object& into) {
  uint32_t field = static_cast<uint32_t>(edge.split_field());
  size_t min_bytes = edge.split_min_bytes();
  std::vector<Event> events = edge.TakeEvents();
  py::list out(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    Event& event = events[i];
    py::object payload;
    if (event.kind == kStart || event.kind == kRead) {
      payload = event.ok ? native_received::Received(event.payload, event.call->split, event.call->decode, field,
                                                      min_bytes, into)
                         : py::none();
    } else {
      payload = py::bool_(event.ok);
    }
    out[i] = py::make_tuple(Call(std::move(event.call)), event.kind, std::move(payload));
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
      .def(py::init<const std::string&, const std::vector<std::pair<std::string, int>>&,
                    const std::vector<std::string>&, int, size_t, const std::vector<std::string>&>(),
           py::arg("address"), py::arg("arguments"), py::arg("split_methods") = std::vector<std::string>(),
           py::arg("split_field") = 0, py::arg("split_min_bytes") = 0,
           py::arg("decode_methods") = std::vector<std::string>(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &Edge::port)
      .def("fileno", &Edge::fileno)
      .def("take", &Take, py::arg("into") = py::none())
      .def("shutdown", &Edge::Shutdown, py::call_guard<py::gil_scoped_release>());
}
