// A native lane: a plain infer request to a Python-backend model served from the adapter's own thread (grpc's for a
// ModelInfer call, the HTTP route's for a lone request with binary tensors) to the model's worker process and back,
// without the server's interpreter (runtime/native/lanes.py opens one where the core offers a direct path:
// runtime/direct_path.py). The lane writes the request's large tensors into a buffer the worker maps, sends the
// worker the batch's message (lane_request.h), reads the answer in a thread of its own and has the request's Reply
// write it in the protocol's form (lane_answer.h). The adapter hands it a request only while that request is the
// only one open there, and it takes it only while the model's own queue is idle, so that requests arriving together
// are batched by the core; a request it cannot serve exactly as the core would (a parameter, any check the core
// would fail) it declines untouched, and one whose answer it does not write itself it gives back to Python. Nothing
// here knows a protocol or takes the GIL.
#ifndef RUNTIME_NATIVE_LANE_H_
#define RUNTIME_NATIVE_LANE_H_

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "lane_answer.h"
#include "lane_request.h"
#include "plain_request.h"

namespace native_lane {

// A call the lane gives back to Python (lanes.py): ``why`` is "answer" (the worker's answer is one the lane
// does not write itself: response parameters, a missing output, a reschedule, a long error; the frame and the
// inputs that lay in the buffer go with it), "lost" or "timeout" (the worker went away or did not answer in time:
// Python says so in the core's words, and has a late worker restarted). The request's own message, where Python
// needs it, is its Reply's to keep.
struct HandBack {
  uint64_t lane = 0;  // the lane's number (Lane::id)
  std::string why, frame, id;
  std::vector<std::string> inputs;  // for "answer": each input that lay in the buffer (an output may be one of them)
  std::vector<std::string> requested;
  int64_t batch_size = 0;
  uint64_t elapsed_ns = 0;
};

// How the lane ends a call it took, in the call's protocol (runtime/grpc/native_edge_server.h: a gRPC call's reactor;
// http_lane.h: an HTTP request's answer, through the lane table's events to Python).
class Reply {
 public:
  virtual ~Reply() = default;
  // The answer (kResponse or kError) written in the protocol's form while its views are valid (``id``: the
  // request's), then sent once the lane is free again (the client's next request finds it free).
  virtual void Write(const LaneSpec& lane, const std::string& id, const Answer& answer) = 0;
  virtual void Send() = 0;
  virtual void GiveBack(std::unique_ptr<HandBack> hand_back) = 0;
};

// What a lane has served since Python last asked, for the model's statistics.
struct Counts {
  uint64_t requests = 0, total_ns = 0, input_ns = 0, infer_ns = 0, output_ns = 0;
};
struct Served {
  std::vector<std::pair<int64_t, Counts>> by_batch_size;
  uint64_t failed = 0, failed_ns = 0;
  int64_t last_wall_ns = 0;
};

inline uint64_t Since(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

class Lane {
 public:
  Lane(LaneSpec spec, int socket_fd, int buffer_fd, size_t buffer_size)
      : id_number_(NextLaneId()), spec_(std::move(spec)), socket_fd_(dup(socket_fd)), buffer_size_(buffer_size) {
    if (socket_fd_ < 0) throw std::runtime_error("the lane's socket cannot be used");
    int flags = fcntl(socket_fd_, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK)) fcntl(socket_fd_, F_SETFL, flags & ~O_NONBLOCK);  // whole frames
    wake_fd_ = eventfd(0, EFD_CLOEXEC);
    void* mapped = mmap(nullptr, buffer_size, PROT_READ | PROT_WRITE, MAP_SHARED, buffer_fd, 0);
    if (mapped == MAP_FAILED || wake_fd_ < 0) {
      if (mapped != MAP_FAILED) munmap(mapped, buffer_size);
      if (wake_fd_ >= 0) close(wake_fd_);
      close(socket_fd_);
      throw std::runtime_error("the lane's buffer cannot be mapped");
    }
    buffer_ = static_cast<char*>(mapped);
    reader_ = std::thread([this] { ReadAnswers(); });
  }

  ~Lane() {
    Stop();
    Shutdown();
    if (reader_.joinable()) reader_.join();
    munmap(buffer_, buffer_size_);
    close(wake_fd_);
    close(socket_fd_);
  }

  const std::string& model() const { return spec_.model; }
  uint64_t id() const { return id_number_; }
  // Calls taken so far (Python notes the server active while this moves).
  uint64_t Taken() const { return taken_.load(); }

  // Python's word on the model's own scheduling: whether nothing is queued or executing there.
  void SetIdle(bool idle) { idle_.store(idle, std::memory_order_release); }
  // Whether the lane would take a call now (Take checks again).
  bool Ready() const { return open_.load() && idle_.load(std::memory_order_acquire); }
  // Take no more calls (the one under way, if any, is still answered).
  void Stop() { open_.store(false); }
  // The reader ends (giving back a call still under way as lost); the socket stays open for a later lane.
  void Shutdown() {
    uint64_t one = 1;
    ssize_t written = write(wake_fd_, &one, sizeof one);
    (void)written;
  }
  bool Busy() const { return busy_.load(); }
  // Python's scheduler wants the model's instance: true where a call of the lane holds it (``freed(id)`` is
  // called once it is free again), false where it is free now.
  bool TellWhenFree() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!busy_.load()) return false;
    tell_free_ = true;
    return true;
  }
  // How the lane tells that it is free again (set by the lane table before the lane takes calls).
  void SetFreed(std::function<void(uint64_t)> freed) { freed_ = std::move(freed); }
  bool Open() const { return open_.load(); }

  Served TakeServed() {
    std::lock_guard<std::mutex> lock(mu_);
    Served served;
    served.by_batch_size.assign(served_.begin(), served_.end());
    served.failed = failed_;
    served.failed_ns = failed_ns_;
    served.last_wall_ns = last_wall_ns_;
    served_.clear();
    failed_ = failed_ns_ = 0;
    return served;
  }

  // The client of ``call`` went away: the worker is told, where the lane is serving it (the model may notice).
  void Cancel(const void* call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_ || pending_call_ != call) return;
    WriteAll(CancelMessage(pending_batch_));
  }

  // The adapter's thread: serve ``request`` (its raw contents at ``raws`` in ``pieces``) here, ending it through
  // ``reply`` (taken from the caller where the lane takes the request); false where Python is to (nothing touched).
  bool Take(const void* call, const plain_request::PlainInferRequest& request, const plain_request::Pieces& pieces,
            const std::vector<std::pair<size_t, size_t>>& raws, std::unique_ptr<Reply>& reply) {
    if (!Ready()) return false;
    if (!Accepts(spec_, buffer_size_, request, raws)) return false;
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) return false;
    if (!open_.load()) {  // stopped meanwhile: Python waits for busy_ to clear after stopping
      Free();
      return false;
    }
    taken_.fetch_add(1);
    auto started = std::chrono::steady_clock::now();
    std::vector<std::pair<size_t, size_t>> placed;
    int64_t batch_id = static_cast<int64_t>(++batch_id_);
    std::string framed = BatchMessage(spec_, batch_id, request, pieces, raws, buffer_, &placed);
    for (const auto& [offset, size] : placed) {
      if (offset != kNotPlaced) written_.store(std::max(written_.load(), offset + size));
    }
    bool gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = reader_done_;
      pending_ = std::move(reply);
      pending_call_ = call;
      pending_batch_ = batch_id;
      id_ = std::string(request.id);
      requested_.assign(request.outputs.begin(), request.outputs.end());
      placed_ = std::move(placed);
      batch_size_ = spec_.max_batch_size > 0 ? request.inputs[0].shape[0] : 1;
      started_ = started;
      sent_ = std::chrono::steady_clock::now();
    }
    if (gone || !WriteAll(framed)) GiveBack("lost");
    return true;
  }

 private:
  // One frame on the socket (a cancellation may come while a batch is being written).
  bool WriteAll(const std::string& bytes) {
    std::lock_guard<std::mutex> lock(write_mu_);
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = send(socket_fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool ReadAll(char* out, size_t size) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = read(socket_fd_, out + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // The call under way goes back to Python (``frame``: the worker's answer, for "answer"); the lane stays open
  // only for an answer or a reschedule.
  void GiveBack(const std::string& why, std::string frame = {}) {
    auto hand_back = std::make_unique<HandBack>();
    std::unique_ptr<Reply> reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reply = std::move(pending_);
      hand_back->lane = id_number_;
      hand_back->why = why;
      hand_back->frame = std::move(frame);
      hand_back->id = std::move(id_);
      if (why == "answer") {
        for (const auto& [offset, size] : placed_) {
          hand_back->inputs.emplace_back(offset == kNotPlaced ? std::string() : std::string(buffer_ + offset, size));
        }
      }
      placed_.clear();
      hand_back->requested = std::move(requested_);
      hand_back->batch_size = batch_size_;
      hand_back->elapsed_ns = Since(started_, std::chrono::steady_clock::now());
      if (why == "lost" || why == "timeout") open_.store(false);
    }
    if (reply) reply->GiveBack(std::move(hand_back));  // before the lane is free: Python finds it then
    Free();
  }

  // The reader thread: each answer the worker sends on the lane's socket, until the socket ends.
  void ReadAnswers() {
    std::string frame;
    while (true) {
      pollfd watch[2] = {{socket_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int ready = poll(watch, 2, PollTimeoutMs());
      if (ready < 0 && errno == EINTR) continue;
      if (watch[1].revents) return End("lost");  // Shutdown: a call still under way is given back
      if (ready == 0) {
        bool waiting;
        {
          std::lock_guard<std::mutex> lock(mu_);
          waiting = pending_ != nullptr;
          if (waiting && Since(sent_, std::chrono::steady_clock::now()) < spec_.timeout_s * 1e9) continue;
        }
        if (!waiting) {
          GiveBackIdleBuffer();
          continue;
        }
      }
      if (ready == 0) return End("timeout");  // a call sent and unanswered past the model's execute timeout
      char header[4];
      uint32_t size = 0;
      bool whole = ReadAll(header, 4);
      for (int i = 0; whole && i < 4; ++i) size = size << 8 | static_cast<uint8_t>(header[i]);
      if (whole) {
        frame.resize(size);
        whole = ReadAll(frame.data(), size);
      }
      if (!whole) return End("lost");  // the worker went away
      if (!Answered(frame)) GiveBack("answer", std::move(frame));
      frame = std::string();
    }
  }

  // How long the reader may sleep: a call under way is held to its timeout every kBusyPollMs; an idle lane wakes
  // only to give its buffer back (kIdlePollMs: ten wake-ups a second were most of an idle server's CPU), and no
  // later than a call sent meanwhile could fall due.
  int PollTimeoutMs() {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_ != nullptr) return kBusyPollMs;
    double timeout_ms = spec_.timeout_s * 1e3;
    return timeout_ms < kIdlePollMs ? std::max(1, static_cast<int>(timeout_ms)) : kIdlePollMs;
  }

  // The buffer's pages written by large inputs go back to the system once the lane has been idle a while: they
  // are shared memory outside the tensor pool's bound (six 48 MB calls kept 275 MB), and the worker maps them too.
  // The lane holds itself busy meanwhile (a call arriving then is left to the core).
  void GiveBackIdleBuffer() {
    size_t written = written_.load();
    if (written < kKeptBufferBytes) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (Since(ended_, std::chrono::steady_clock::now()) < kIdleBeforeGivingBackNs) return;
    }
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) return;
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t length = written >= buffer_size_ ? buffer_size_ : (written + page - 1) / page * page;
    madvise(buffer_, length, MADV_REMOVE);
    written_.store(0);
    Free();
  }

  // The reader ends: no call is taken from now on, and one under way goes back to Python.
  void End(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reader_done_ = true;
    }
    open_.store(false);
    if (busy_.load()) GiveBack(why);
  }


  // The worker's answer, written here where the lane writes it itself (false: it goes back to Python).
  bool Answered(const std::string& frame) {
    auto answered = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    Answer answer = ReadAnswer(spec_, frame, requested_, placed_, buffer_);
    if (answer.kind == Answer::kGiveBack) return false;
    auto done = std::chrono::steady_clock::now();
    if (answer.kind == Answer::kError) {
      failed_ += 1;
      failed_ns_ += Since(started_, answered);
    } else {
      Counts& counts = served_[batch_size_];
      counts.requests += 1;
      counts.total_ns += Since(started_, done);
      counts.input_ns += Since(started_, sent_);
      counts.infer_ns += Since(sent_, answered);
      counts.output_ns += Since(answered, done);
    }
    last_wall_ns_ = WallNs();
    Finish(answer);
    return true;
  }

  // The call under way ends (mu_ held); the lane is free again.
  void Finish(const Answer& answer) {
    std::unique_ptr<Reply> reply = std::move(pending_);
    if (reply) reply->Write(spec_, id_, answer);  // before the buffer is the next call's
    placed_.clear();
    bool tell = ReleaseLocked();
    if (reply) reply->Send();
    if (tell) freed_(id_number_);
  }

  // The lane is free again (mu_ held); whether Python asked to be told.
  bool ReleaseLocked() {
    ended_ = std::chrono::steady_clock::now();
    busy_.store(false);
    bool tell = tell_free_ && freed_;
    tell_free_ = false;
    return tell;
  }

  void Free() {
    bool tell;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tell = ReleaseLocked();
    }
    if (tell) freed_(id_number_);
  }

  static int64_t WallNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  static uint64_t NextLaneId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }

  uint64_t id_number_;
  LaneSpec spec_;
  int socket_fd_;
  int wake_fd_ = -1;
  char* buffer_ = nullptr;
  size_t buffer_size_;
  std::atomic<bool> open_{true}, idle_{false}, busy_{false};
  std::atomic<uint64_t> taken_{0};
  // the buffer's bytes written since its pages were last given back (at first: all, as far as this lane knows,
  // since a lane it replaced on the same worker may have written them)
  std::atomic<size_t> written_{SIZE_MAX};
  static constexpr int kBusyPollMs = 100;
  static constexpr int kIdlePollMs = 1000;
  static constexpr size_t kKeptBufferBytes = 4 << 20;  // less than this stays mapped and written
  static constexpr uint64_t kIdleBeforeGivingBackNs = 1'000'000'000;
  std::chrono::steady_clock::time_point ended_ = std::chrono::steady_clock::now();  // the last call's end (mu_)
  uint64_t batch_id_ = 0;  // the adapters' threads, one call at a time (busy_)
  std::mutex mu_;          // the call under way and the counts
  std::mutex write_mu_;    // the socket's writing end
  std::unique_ptr<Reply> pending_;
  const void* pending_call_ = nullptr;
  int64_t pending_batch_ = 0;
  std::string id_;
  std::vector<std::string> requested_;
  std::vector<std::pair<size_t, size_t>> placed_;
  int64_t batch_size_ = 0;
  std::chrono::steady_clock::time_point started_, sent_;
  std::map<int64_t, Counts> served_;
  uint64_t failed_ = 0, failed_ns_ = 0;
  int64_t last_wall_ns_ = 0;
  bool reader_done_ = false;  // the reader has ended: a call taken now goes back at once
  bool tell_free_ = false;    // Python waits for the call under way to end
  std::function<void(uint64_t)> freed_;
  std::thread reader_;
};

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_LANE_H_
