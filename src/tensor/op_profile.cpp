#include "hpm/tensor/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "hpm/tensor/device.h"

namespace hpm::op_profile {

namespace detail {
std::atomic<bool> on{false};
}  // namespace detail

namespace {

using Key = std::tuple<std::string, std::string, std::string, std::string>;

struct Pending {
  Key key;
  std::shared_ptr<Event> begin, end;
  double host_seconds;
};

struct Recorder {
  std::mutex mu;
  std::deque<Pending> pending;
  std::map<Key, Row> done;

  void add(const Pending& p) {
    Row& r = done[p.key];
    if (r.calls == 0) std::tie(r.name, r.detail, r.dtype, r.device) = p.key;
    ++r.calls;
    r.seconds += p.end->seconds_since(*p.begin);
    r.host_seconds += p.host_seconds;
  }
  // Folds in the oldest records whose ops have finished, so that a long run holds few events.
  void settle_ready() {
    while (!pending.empty() && pending.front().end->ready()) {
      add(pending.front());
      pending.pop_front();
    }
  }
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // outlives threads still finishing an op at exit
  return *r;
}

int& depth() {
  thread_local int d = 0;
  return d;
}

constexpr std::size_t kSettleEvery = 4096;

}  // namespace

void start() { detail::on.store(true); }

void reset() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  r.pending.clear();
  r.done.clear();
}

void stop() { detail::on.store(false); }

bool enabled() { return detail::on.load(); }

std::vector<Row> rows() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  for (Pending& p : r.pending) {
    p.end->synchronize();
    r.add(p);
  }
  r.pending.clear();
  std::vector<Row> out;
  for (const auto& [key, row] : r.done) out.push_back(row);
  std::sort(out.begin(), out.end(),
            [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return out;
}

std::string table(const std::vector<Row>& rows, double wall_seconds, std::int64_t steps) {
  const double per = steps > 0 ? 1.0 / static_cast<double>(steps) : 1.0;
  const double wall = wall_seconds > 0 ? wall_seconds : 1.0;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %-16s %-5s %-7s %10s %10s %10s %7s\n", "op", "detail",
                "dtype", "device", "ms/step", "host ms", "calls/step", "share");
  out += line;
  double sum = 0, host = 0;
  for (const Row& r : rows) {
    sum += r.seconds;
    host += r.host_seconds;
    std::snprintf(line, sizeof line, "%-22s %-16s %-5s %-7s %10.3f %10.3f %10.1f %6.1f%%\n",
                  r.name.c_str(), r.detail.empty() ? "-" : r.detail.c_str(), r.dtype.c_str(),
                  r.device.c_str(), r.seconds * per * 1e3, r.host_seconds * per * 1e3,
                  static_cast<double>(r.calls) * per, 100.0 * r.seconds / wall);
    out += line;
  }
  if (sum <= wall_seconds) {
    std::snprintf(line, sizeof line, "%-49s %10.3f %10s %10s %6.1f%%\n", "(outside ops)",
                  (wall_seconds - sum) * per * 1e3, "", "", 100.0 * (wall_seconds - sum) / wall);
  } else {  // replicas or stages on threads: their ops ran at once
    std::snprintf(line, sizeof line, "%-49s %10.3f\n", "(ops of several threads overlapped; sum)",
                  sum * per * 1e3);
  }
  out += line;
  // The step's wall time, and the host's time inside its ops.
  std::snprintf(line, sizeof line, "%-49s %10.3f %10.3f %10s %6.1f%%\n", "(step)",
                wall_seconds * per * 1e3, host * per * 1e3, "", 100.0);
  out += line;
  return out;
}

void Scope::begin(const char* name, DType dtype, Device& device) {
  active_ = true;
  if (depth()++ > 0) return;
  name_ = name;
  dtype_ = dtype;
  device_ = &device;
  begin_ = device.stream().record_timed();
  host_begin_ = std::chrono::steady_clock::now();
}

void Scope::end() noexcept {
  --depth();
  if (!begin_) return;
  try {
    record_end();
  } catch (...) {
    // A device error here surfaces at the op's next synchronization; the profile loses one op.
  }
}

void Scope::record_end() {
  const double host =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - host_begin_).count();
  Pending p{
      {name_, detail_ ? detail_ : "", dtype_name(dtype_), device_type_name(device_->id().type)},
      std::move(begin_),
      device_->stream().record_timed(),
      host};
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  if (!detail::on.load()) return;  // stopped meanwhile: rows() may be reading
  r.pending.push_back(std::move(p));
  if (r.pending.size() % kSettleEvery == 0) r.settle_ready();
}

}  // namespace hpm::op_profile
