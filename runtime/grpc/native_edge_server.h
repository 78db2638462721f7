// The native edge's grpc++ side (native_edge.cc is Python's): the callback server, each call's reactor, and the
// queue of events handed to Python through one eventfd; a plain ModelInfer call that a lane takes
// (runtime/native/lane.h, from the lane table Python hands the edge) never reaches that queue. No function here takes
// the GIL.
#ifndef RUNTIME_GRPC_NATIVE_EDGE_SERVER_H_
#define RUNTIME_GRPC_NATIVE_EDGE_SERVER_H_

#include <absl/synchronization/mutex.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "native_inflate.h"
#include "native_infer_response.h"
#include "native_wire.h"
#include "runtime/native/event_queue.h"
#include "runtime/native/lane_table.h"

namespace native_edge {

// kUnreadable: an event take() could not hand to Python, ended natively (native_edge.cc).
enum EventKind {
  kStart = 0, kRead = 1, kWriteDone = 2, kCancel = 3, kLane = 4, kUnreadable = 5
};

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
  std::shared_ptr<native_lane::Lane> lane;  // the lane of its model, which counts it until it is done
  grpc::ByteBuffer read_buffer;
  grpc::ByteBuffer write_buffer;
};

struct Event {
  std::shared_ptr<CallState> call;
  int kind;
  bool ok;
  grpc::ByteBuffer payload;  // kLane's: the call's message
  std::unique_ptr<native_lane::HandBack> hand_back;  // kLane's
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
  void Refuse(const grpc::Status& status);
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
       const std::vector<std::string>& decode_methods, std::shared_ptr<native_lane::LaneTable> lanes,
       const std::vector<std::pair<std::string, int>>& status_codes)
      : service_(this),
        lanes_(std::move(lanes)),
        status_codes_(status_codes),
        split_methods_(split_methods.begin(), split_methods.end()),
        decode_methods_(decode_methods.begin(), decode_methods.end()),
        split_field_(split_field),
        split_min_bytes_(split_min_bytes) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    // Compressed messages come as they are, inflated by the edge within the receive limit (native_inflate.h).
    builder.AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
    for (const auto& [name, value] : arguments) {
      if (name == "grpc.max_receive_message_length") {
        builder.SetMaxReceiveMessageSize(value);
        max_receive_ = value < 0 ? SIZE_MAX - 1 : static_cast<size_t>(value);
      } else if (name == kInflatingMaxBytes) {
        inflating_ = std::make_unique<native_inflate::Budget>(value);
      } else if (name == "grpc.max_send_message_length") {
        builder.SetMaxSendMessageSize(value);
      } else {
        builder.AddChannelArgument(name, value);
      }
    }
    server_ = builder.BuildAndStart();
    if (!server_) port_ = 0;
  }

  // Whether nothing of grpc's can reach this edge any more (see EdgeDeleter).
  bool Idle() const { return (!server_ || shut_down_) && live_reactors_.load() == 0; }
  void ReactorStarted() { live_reactors_.fetch_add(1); }
  void ReactorDone() { live_reactors_.fetch_sub(1); }

  int port() const { return port_; }
  size_t max_receive() const { return max_receive_; }
  native_inflate::Budget& inflating() { return *inflating_; }
  int split_field() const { return split_field_; }
  size_t split_min_bytes() const { return split_min_bytes_; }
  bool Splits(const std::string& method) const { return split_methods_.count(method) != 0; }
  bool Decodes(const std::string& method) const { return decode_methods_.count(method) != 0; }
  int fileno() const { return events_.fileno(); }

  // Whether a lane is open (the lane table Python handed over; none: no lanes).
  bool HasLanes() const { return lanes_ && lanes_->HasLanes(); }
  // ModelInfer calls open (from their first byte to their end). A lane takes a call only while it is the only one,
  // and none overlapped another for kQuietNs (runtime/native/lane.h): calls that come together are batched by the core.
  void InferCallStarted() {
    if (infer_calls_.fetch_add(1, std::memory_order_relaxed) >= 1) {
      crowded_at_.store(NowNs(), std::memory_order_relaxed);
    }
  }
  void InferCallDone() { infer_calls_.fetch_sub(1, std::memory_order_relaxed); }
  bool InferCallAlone() const {
    return infer_calls_.load(std::memory_order_relaxed) == 1 &&
           NowNs() - crowded_at_.load(std::memory_order_relaxed) > kQuietNs;
  }
  std::shared_ptr<native_lane::Lane> FindLane(std::string_view model) { return lanes_ ? lanes_->Find(model) : nullptr; }
  // The gRPC code the adapter answers the core's status ``name`` with (runtime/grpc/service.py's GRPC_STATUS).
  grpc::StatusCode StatusCode(std::string_view name) const {
    for (const auto& [status, code] : status_codes_) {
      if (status == name) return static_cast<grpc::StatusCode>(code);
    }
    return grpc::StatusCode::INTERNAL;
  }
  uint64_t NextId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  // Any thread: queue an event for the loop.
  void Push(Event&& event) { events_.Push(std::move(event)); }
  // The loop thread (GIL held): every event queued since the last take.
  std::vector<Event> TakeEvents() { return events_.Take(); }

  // Serve a connection accepted elsewhere (the one port's, runtime/listen/port_acceptor.py) as if it had come to the
  // listening port: grpc owns ``fd`` from here (closed by it, even when the edge no longer serves); false, with
  // ``fd`` closed, once the edge has shut down.
  bool AdoptConnection(int fd) {
    if (!server_ || shut_down_) {
      close(fd);
      return false;
    }
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
    return true;
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
  std::shared_ptr<native_lane::LaneTable> lanes_;  // null: no lanes
  std::vector<std::pair<std::string, int>> status_codes_;
  std::unordered_set<std::string> split_methods_;
  std::unordered_set<std::string> decode_methods_;  // split methods whose ModelInferRequests are read here
  int split_field_;
  size_t split_min_bytes_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
  std::atomic<int> live_reactors_{0};
  std::atomic<uint64_t> next_id_{1};
  native_lane::EventQueue<Event> events_;
  static constexpr int64_t kQuietNs = 10'000'000;
  // Python's argument for the bytes all calls may be inflating at once (not grpc's: the edge keeps it).
  static constexpr const char* kInflatingMaxBytes = "serverless.inflating_max_bytes";
  size_t max_receive_ = 4 << 20;  // grpc's own default
  std::unique_ptr<native_inflate::Budget> inflating_ = std::make_unique<native_inflate::Budget>(int64_t{1} << 30);
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::atomic<int> infer_calls_{0};
  std::atomic<int64_t> crowded_at_{0};
};

// A lane's way to end a call it took: as Call::finish does (a ModelInferResponse written as native_infer_response.h
// writes the core's; the model's error with its status's gRPC code and its message as it is, as
// runtime/grpc/service.py answers it), or given back to Python as a kLane event with the call's message (the read
// buffer, which nothing else touches while a lane holds the call).
class CallReply : public native_lane::Reply {
 public:
  CallReply(Edge* edge, std::shared_ptr<CallState> state) : edge_(edge), state_(std::move(state)) {}
  void GiveBack(std::unique_ptr<native_lane::HandBack> hand_back) override {
    Event event{state_, kLane, true, {}, std::move(hand_back)};
    {
      std::lock_guard<std::recursive_mutex> lock(state_->mu);
      event.payload.Swap(&state_->read_buffer);
    }
    edge_->Push(std::move(event));
  }
  void Write(const native_lane::LaneSpec& lane, const std::string& id, const native_lane::Answer& answer) override {
    if (answer.kind == native_lane::Answer::kResponse) {
      std::vector<native_infer_response::OutputView> views;
      views.reserve(answer.outs.size());
      for (const native_lane::Produced* out : answer.outs) {
        views.push_back({out->name, out->datatype, &out->shape, out->data});
      }
      message_ = native_infer_response::Write(lane.model, lane.version, id, views);
    } else {
      status_ = grpc::Status(edge_->StatusCode(answer.status_name), std::string(answer.message));
      failed_ = true;
    }
  }
  void Send() override {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    if (state_->reactor == nullptr || state_->finishing) return;
    state_->finishing = true;
    if (failed_) {
      state_->reactor->Finish(status_);
    } else {
      state_->write_buffer.Swap(&message_);
      state_->reactor->StartWriteAndFinish(&state_->write_buffer, grpc::WriteOptions(), grpc::Status::OK);
    }
  }

 private:
  Edge* edge_;
  std::shared_ptr<CallState> state_;
  grpc::ByteBuffer message_;  // written, to send
  grpc::Status status_;
  bool failed_ = false;
};

// A call's first message, served by a lane where one takes it (grpc's thread).
inline bool ServedByLane(Edge* edge, const std::shared_ptr<CallState>& state, grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  native_wire::Pieces pieces;
  for (const auto& slice : slices) pieces.Add(reinterpret_cast<const char*>(slice.begin()), slice.size());
  std::shared_ptr<native_lane::Lane> lane;
  auto found = [&state, &lane]() {
    std::lock_guard<std::recursive_mutex> lock(state->mu);
    state->lane = lane;  // told if its client leaves
    return lane->Ready();
  };
  std::string model;  // the model's name, where the message begins with it (as protobuf writes one): a call the
  if (native_wire::LeadingString(pieces, 1, &model)) {  // lane will not take is let go before the rest is read
    lane = edge->FindLane(model);
    if (!lane || !found()) return false;
  }
  std::string rest;
  std::vector<std::pair<size_t, size_t>> raws;
  if (!native_wire::SplitRawField(pieces, pieces.size(), static_cast<uint32_t>(edge->split_field()), &rest, &raws)) {
    return false;
  }
  native_wire::PlainInferRequest request;
  if (!native_wire::ParsePlainInferRequest(rest, &request)) return false;
  if (!lane) {
    lane = edge->FindLane(request.model_name);
    if (!lane || !found()) return false;
  }
  std::unique_ptr<native_lane::Reply> reply = std::make_unique<CallReply>(edge, state);
  return lane->Take(state.get(), request, pieces, raws, reply);
}

inline EdgeReactor::EdgeReactor(Edge* edge, grpc::GenericCallbackServerContext* context, uint64_t id)
    : edge_(edge), state_(std::make_shared<CallState>()) {
  state_->id = id;
  state_->method = context->method();
  state_->split = edge->Splits(state_->method);
  state_->decode = state_->split && edge->Decodes(state_->method);
  if (state_->decode) edge->InferCallStarted();
  const auto& metadata = context->client_metadata();
  state_->metadata.reserve(metadata.size());
  for (const auto& [key, value] : metadata) {
    state_->metadata.emplace_back(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
  }
  state_->reactor = this;
  edge->ReactorStarted();
  StartRead(&state_->read_buffer);
}

inline void EdgeReactor::OnReadDone(bool ok) {
  if (ok) {
    native_inflate::Inflated inflated =
        native_inflate::Inflate(state_->read_buffer, edge_->max_receive(), edge_->inflating());
    if (inflated.kind == native_inflate::Inflated::kRefused) return Refuse(inflated.status);
  }
  if (ok && !state_->started && state_->decode && edge_->HasLanes() && edge_->InferCallAlone() &&
      ServedByLane(edge_, state_, state_->read_buffer)) {
    state_->started = true;
    return;
  }
  Event event{state_, state_->started ? kRead : kStart, ok, {}, nullptr};
  state_->started = true;
  if (ok) event.payload.Swap(&state_->read_buffer);
  edge_->Push(std::move(event));
}

// A message the edge will not take (native_inflate.h) ends its call here; Python, if it has seen the call, is told
// it was cancelled.
inline void EdgeReactor::Refuse(const grpc::Status& status) {
  {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    if (state_->reactor == nullptr || state_->finishing) return;
    state_->finishing = true;
    Finish(status);
  }
  if (state_->started) edge_->Push(Event{state_, kCancel, false, {}, nullptr});
}

inline void EdgeReactor::OnWriteDone(bool ok) { edge_->Push(Event{state_, kWriteDone, ok, {}, nullptr}); }

inline void EdgeReactor::OnCancel() {
  std::shared_ptr<native_lane::Lane> lane;
  {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    lane = state_->lane;
  }
  if (lane) lane->Cancel(state_.get());
  edge_->Push(Event{state_, kCancel, false, {}, nullptr});
}

inline void EdgeReactor::OnDone() {
  {
    std::lock_guard<std::recursive_mutex> lock(state_->mu);
    state_->reactor = nullptr;
    state_->lane.reset();
  }
  if (state_->decode) edge_->InferCallDone();
  edge_->ReactorDone();
  delete this;
}

inline grpc::ServerGenericBidiReactor* EdgeService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  return new EdgeReactor(edge_, context, edge_->NextId());
}

}  // namespace native_edge

#endif  // RUNTIME_GRPC_NATIVE_EDGE_SERVER_H_
