// The lanes open (lane.h), by model name, shared by every adapter that hands them requests: the HTTP route through
// lanes_module.cc's take_http, and the native gRPC edge (runtime/grpc/native_edge_server.h), another extension
// module, which gets the table from Python as a capsule (kCapsuleName). And the queue of what the lanes tell Python
// that belongs to no protocol's call (a lane free again, an HTTP request's outcome), handed over through one eventfd
// the event loop watches. No function here takes the GIL.
//
// The edge runs its own compiled copy of these headers on objects this module made: both are built in one setup.py
// run from the same headers, and the capsule's name carries a digest of them (NATIVE_LANES_ABI, which setup.py
// defines from the headers' bytes), so that an edge built from other headers is refused instead of misreading one.
#ifndef RUNTIME_NATIVE_LANE_TABLE_H_
#define RUNTIME_NATIVE_LANE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "event_queue.h"
#include "http_lane.h"
#include "lane.h"

#ifndef NATIVE_LANES_ABI
#define NATIVE_LANES_ABI "unstamped"
#endif

namespace native_lane {

constexpr const char* kCapsuleName = "runtime.native.LaneTable/" NATIVE_LANES_ABI;

// What the table hands Python: a lane free again (``lane``: its number), or an HTTP request's outcome.
struct TableEvent {
  enum Kind { kFree = 0, kHttp = 1 } kind = kFree;
  uint64_t lane = 0;
  std::unique_ptr<native_http_lane::HttpAnswer> http;
};

class LaneTable : public std::enable_shared_from_this<LaneTable> {
 public:
  int fileno() const { return events_.fileno(); }

  // A lane takes its model's requests from now on (replacing any other of that model); it tells here when free.
  void Add(std::shared_ptr<Lane> lane) {
    std::weak_ptr<LaneTable> table = weak_from_this();
    lane->SetFreed([table](uint64_t id) {
      if (auto alive = table.lock()) {
        TableEvent event;
        event.lane = id;
        alive->Push(std::move(event));
      }
    });
    std::lock_guard<std::mutex> lock(mu_);
    lanes_[lane->model()] = std::move(lane);
    has_lanes_.store(true);
  }

  void Remove(const std::shared_ptr<Lane>& lane) {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = lanes_.find(lane->model());
    if (found != lanes_.end() && found->second == lane) lanes_.erase(found);
    has_lanes_.store(!lanes_.empty());
  }

  bool HasLanes() const { return has_lanes_.load(std::memory_order_relaxed); }

  // The model's lane; null where none.
  std::shared_ptr<Lane> Find(std::string_view model) {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = lanes_.find(std::string(model));
    return found == lanes_.end() ? nullptr : found->second;
  }

  // How a lane's HTTP request reaches Python: a kHttp event (dropped once the table is gone).
  native_http_lane::HttpReply::Deliver HttpDeliver() {
    std::weak_ptr<LaneTable> table = weak_from_this();
    return [table](std::unique_ptr<native_http_lane::HttpAnswer> outcome) {
      if (auto alive = table.lock()) {
        TableEvent event;
        event.kind = TableEvent::kHttp;
        event.http = std::move(outcome);
        alive->Push(std::move(event));
      }
    };
  }

  void Push(TableEvent&& event) { events_.Push(std::move(event)); }
  std::vector<TableEvent> TakeEvents() { return events_.Take(); }

 private:
  std::mutex mu_;  // lanes_
  std::unordered_map<std::string, std::shared_ptr<Lane>> lanes_;
  std::atomic<bool> has_lanes_{false};
  EventQueue<TableEvent> events_;
};

}  // namespace native_lane

#endif  // RUNTIME_NATIVE_LANE_TABLE_H_
