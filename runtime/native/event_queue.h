// A queue of events handed from any thread to the event loop in batches, through one eventfd the loop watches: a
// push wakes the loop only where no wake-up is on its way already. Used by the lanes' table (lane_table.h) and the
// native gRPC edge (runtime/grpc/native_edge_server.h). No function here takes the GIL.
#ifndef RUNTIME_NATIVE_EVENT_QUEUE_H_
#define RUNTIME_NATIVE_EVENT_QUEUE_H_

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace native_lane {

template <typename Event>
class EventQueue {
 public:
  EventQueue() {
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~EventQueue() { close(fd_); }
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  int fileno() const { return fd_; }

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
      ssize_t written = write(fd_, &one, sizeof one);
      (void)written;
    }
  }

  // The loop thread: every event queued since the last take.
  std::vector<Event> Take() {
    uint64_t count;
    ssize_t got = read(fd_, &count, sizeof count);
    (void)got;
    std::vector<Event> events;
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(pending_);
    signaled_ = false;
    return events;
  }

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::vector<Event> pending_;
  bool signaled_ = false;
};

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_EVENT_QUEUE_H_
