// Timelines: spans (name, category, thread, start, end) recorded by any layer while tracing is on,
// written as Chrome trace JSON (opens in Perfetto or chrome://tracing) or drawn as an SVG with one
// lane per thread. Off by default; a disabled Span costs one relaxed atomic load.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hpm::trace {

struct Event {
  std::string name, category;
  std::uint64_t thread;          // small integer per recording thread, in order of first use
  double start_us, duration_us;  // since tracing was started
};

void start();  // clears previous events and turns recording on
void stop();
bool enabled();
std::vector<Event> events();                // a copy, sorted by start
void name_thread(const std::string& name);  // a label for the calling thread's lane

// Chrome's trace event format ("X" complete events, thread_name metadata).
std::string chrome_json(const std::vector<Event>& events);
// Lanes per thread, a bar per span coloured by category, a time axis in ms.
std::string svg(const std::vector<Event>& events, const std::string& title, double width_px = 1000);

// A span timed by the caller, for names made at run time (a pipeline stage's "F3").
void record_span(const std::string& name, const std::string& category,
                 std::chrono::steady_clock::time_point begin,
                 std::chrono::steady_clock::time_point end);

namespace detail {
extern std::atomic<bool> on;
void record(const char* name, const char* category, std::chrono::steady_clock::time_point begin,
            std::chrono::steady_clock::time_point end);
}  // namespace detail

// Records [construction, destruction) as one span when tracing is on.
class Span {
 public:
  Span(const char* name, const char* category)
      : name_(name), category_(category), active_(detail::on.load(std::memory_order_relaxed)) {
    if (active_) begin_ = std::chrono::steady_clock::now();
  }
  ~Span() {
    if (active_) detail::record(name_, category_, begin_, std::chrono::steady_clock::now());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  bool active_;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace hpm::trace
