// Op profile: where a device's time goes, op by op, without a profiler. While on, every op that
// kernels.h dispatches and every copy between host and device is bracketed by two timed events of
// its device's stream, and the time between them is summed per op name, detail (the binary or
// unary function) and dtype. On a GPU that span runs from when the stream reaches the op to when
// its last kernel ends: when the device is ahead of the host it includes the host's own work
// inside the op (launches, a synchronization), which is what the step loses there. What no op
// accounts for (the host between ops: autograd, allocation, the Python-free loop) is the wall time
// less the rows' sum. Each row also has the host's own time inside the op (checks, allocation,
// launches): on a GPU, an op whose host time is near its device time is launch-bound, and a step
// whose host time (inside ops and between them) is near its wall time is host-bound. Only the
// outermost op of a thread counts (an op that calls others is one). Ops of several threads at
// once (replicas, pipeline stages) all count, so their rows may add up to more than the step.
// Off by default; an op pays one relaxed atomic load then.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpm/tensor/dtype.h"

namespace hpm {
class Device;
class Event;
}  // namespace hpm

namespace hpm::op_profile {

void start();  // turns recording on (adding to what was recorded before)
void stop();   // turns it off; what was recorded stays for rows()
void reset();  // forgets what was recorded
bool enabled();

struct Row {
  std::string name;    // "matmul", "binary", "copy to host"
  std::string detail;  // "mul", "gelu"; empty when the op has one meaning
  std::string dtype;   // its first input's
  std::string device;  // "cpu", "cuda"
  std::int64_t calls = 0;
  double seconds = 0;       // on the device's stream
  double host_seconds = 0;  // on the host, from the op's call to its return
};
// Waits for the recorded ops to finish; one row per (name, detail, dtype, device), most time first.
std::vector<Row> rows();

// The rows as a text table: per-step milliseconds over `steps` (device and host), calls per step,
// each row's share of `wall_seconds`, and last lines for the time no op accounts for and the step.
std::string table(const std::vector<Row>& rows, double wall_seconds, std::int64_t steps);

namespace detail {
extern std::atomic<bool> on;
}  // namespace detail

// Brackets one op on `device` while recording is on (dispatch and the copies use it).
class Scope {
 public:
  Scope(const char* name, DType dtype, Device& device) {
    if (detail::on.load(std::memory_order_relaxed)) begin(name, dtype, device);
  }
  ~Scope() {
    if (active_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  // The function of a binary or unary op ("mul"); a literal, kept by pointer.
  void set_detail(const char* detail) { detail_ = detail; }
  // A detail made for this op (a product's M x N x K), kept by the scope.
  void set_detail(std::string detail) {
    owned_detail_ = std::move(detail);
    detail_ = owned_detail_.c_str();
  }
  bool active() const { return active_; }

 private:
  void begin(const char* name, DType dtype, Device& device);
  void end() noexcept;
  void record_end();

  const char* name_ = nullptr;
  const char* detail_ = nullptr;
  std::string owned_detail_;
  DType dtype_ = DType::F32;
  Device* device_ = nullptr;
  bool active_ = false;
  std::chrono::steady_clock::time_point host_begin_;
  std::shared_ptr<Event> begin_;  // null for an op inside another
};

}  // namespace hpm::op_profile
